"""A run folder: `manifest.json` (what produced the run), `requests.jsonl` (one object per finished
request, appended, flushed and synced as each one ends) and the summaries written at the end.

A killed run loses no finished request; a resumed run skips every request already recorded (keyed by
system, question, turn, temperature and concurrency) and refuses settings that differ from the
manifest's. A served run also appends `waves.jsonl`: per wave of requests sent together, what the
server's counters grew by.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import asdict
from pathlib import Path

from dspark.errors import DSparkError
from harness.analysis.records import MANIFEST, REQUESTS, read_manifest
from harness.runs.owner import LOCK
from harness.specs.experiments import Experiment
from harness.backends.base import LEFTOVERS


class RunFolder:
    def __init__(self, path: Path):
        self.path = Path(path)

    def manifest(self) -> dict | None:
        return read_manifest(self.path)

    def check_new(self, named: bool = False) -> None:
        """Exit (DSparkError) if a run was started here: a new run never writes into another's folder. A
        folder the user `named` (checked before anything is written; a backend may write its logs there
        before the manifest) must also hold nothing else: a run's files never mix with someone else's. What
        a run that failed before its manifest leaves (a backend's logs, `LEFTOVERS`) is not someone else's."""
        if (self.path / MANIFEST).exists() or (self.path / REQUESTS).exists():
            raise DSparkError(f"{self.path} already holds a run; use --resume {self.path} or another --out")
        if named and self.path.is_dir() and any(p.name != LOCK and not any(p.match(g) for g in LEFTOVERS)
                                                for p in self.path.iterdir()):  # (LOCK: `harness.runs.owner`)
            raise DSparkError(f"--out {self.path}: the folder holds other files, not a run; choose an empty or new "
                              "folder (or --resume DIR to finish an unfinished run)")

    def create(self, manifest: dict) -> None:
        """The manifest, and an empty `requests.jsonl` beside it: a run stopped before its first request
        (during warm-up) is one with none done, not one whose requests were deleted."""
        self.check_new()
        self.path.mkdir(parents=True, exist_ok=True)
        self.write_json(MANIFEST, manifest)
        (self.path / REQUESTS).touch()

    def resumable(self) -> dict:
        """The manifest of the run to resume, or a one-line refusal saying what the folder is instead."""
        manifest = self.manifest()
        if manifest is not None:
            return manifest
        if not self.path.is_dir():
            raise DSparkError(f"--resume {self.path}: no such folder; give the folder of the unfinished run (the "
                              "one `run` printed, or gave --out)")
        if (self.path / "profile.json").is_file():
            raise DSparkError(f"--resume {self.path}: a profile's folder, not a run's; finish it with dspark-bench "
                              f"profile --resume {self.path}")
        raise DSparkError(f"--resume {self.path}: not a run folder (no {MANIFEST}, which `run` writes before its first "
                          "request); give the folder of the unfinished run, or start a new run with --out")

    def check_experiment(self, exp: Experiment) -> None:
        """Exit (DSparkError) if the experiment file changed since the run started, naming each key that
        differs (`systems[2].method: "dflash" -> "ngram"`) and what to do: a resumed run must not mix two
        experiments' requests."""
        manifest = self.resumable()
        was = (manifest.get("settings") or {}).get("experiment_sha256")
        if was is None or was == exp.sha256:
            return
        recorded = manifest.get("experiment") or {}
        if "toml" in recorded:
            then, now = _flat(tomllib.loads(recorded["toml"])), _flat(tomllib.loads(experiment_text(exp)))
        else:  # (a run from before the file was recorded: its systems only)
            then, now = _flat({"systems": recorded.get("systems", [])}), _flat(json.loads(json.dumps(
                {"systems": [asdict(s) for s in exp.systems]})))
        changed = [f"{k}: {_shown(then, k)} -> {_shown(now, k)}" for k in list(then) + [k for k in now if k not in then]
                   if then.get(k, _ABSENT) != now.get(k, _ABSENT)]
        what = ("; ".join(changed[:8]) + (f"; and {len(changed) - 8} more" if len(changed) > 8 else "") if changed
                else "only comments or layout" if "toml" in recorded else "keys not recorded by runs this old")
        raise DSparkError(f"--resume {self.path}: the experiment file {exp.path} changed since the run started "
                          f"({what}); restore the file as it was to finish this run, or start a new run of the edited "
                          "experiment with --out DIR")

    def check_resume(self, settings: dict) -> None:
        """Exit (DSparkError) unless `settings` equal those the run was started with (its experiment file is
        held against the run's first, key by key, by `check_experiment`: `run` calls it before resolving them)."""
        manifest = self.resumable()
        before = manifest.get("settings") or {}
        for key in sorted(set(before) | set(settings)):
            if before.get(key) != settings.get(key):
                old = "" if "options" in manifest else " (this run predates resuming from the folder alone)"
                raise DSparkError(f"--resume {self.path}: '{key}' was {json.dumps(before.get(key))}, now "
                                  f"{json.dumps(settings.get(key))}; resume with the run's own arguments{old}")

    def check_inputs(self, inputs: dict) -> None:
        """Exit unless the prompts, data files and models are those the run started with: a resumed run
        must not mix other prompts or weights into its requests."""
        manifest = self.manifest() or {}
        for key, now in inputs.items():
            if manifest.get(key) != now:
                raise DSparkError(f"--resume {self.path}: the {key} differ from the run's (changed files, "
                                  "another hub revision or other weights); start a new run")

    def update_manifest(self, key: str, value) -> None:
        """Replace one entry of the manifest (what a backend learns as its engines start)."""
        self.write_json(MANIFEST, (self.manifest() or {}) | {key: value})

    def append(self, record: dict, name: str = REQUESTS) -> None:
        with (self.path / name).open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def write_json(self, name: str, data) -> None:
        tmp = self.path / f".{name}.tmp"
        tmp.write_text(json.dumps(data, indent=1, default=str))
        os.replace(tmp, self.path / name)

    def write_text(self, name: str, text: str) -> None:
        tmp = self.path / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.path / name)


def experiment_text(exp: Experiment) -> str:
    """The experiment file as the run read it (recorded in the manifest, so a resume can name what changed)."""
    return Path(exp.path).read_bytes().decode("utf-8")


_ABSENT = object()


def _flat(table: dict, prefix: str = "") -> dict:
    """A TOML document's values by key path: `sampling.output_len`, `systems[2].method` (a list of tables
    by index; any other list is one value)."""
    out = {}
    for key, value in table.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out |= _flat(value, path + ".")
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for i, item in enumerate(value):
                out |= _flat(item, f"{path}[{i}].")
        else:
            out[path] = value
    return out


def _shown(values: dict, key: str) -> str:
    return json.dumps(values[key], default=str) if key in values else "(absent)"

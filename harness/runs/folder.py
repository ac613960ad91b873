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
from pathlib import Path

from dspark.errors import DSparkError
from harness.analysis.records import MANIFEST, REQUESTS, read_manifest


class RunFolder:
    def __init__(self, path: Path):
        self.path = Path(path)

    def manifest(self) -> dict | None:
        return read_manifest(self.path)

    def check_new(self, named: bool = False) -> None:
        """Exit (DSparkError) if a run was started here: a new run never writes into another's folder. A
        folder the user `named` (checked before anything is written; a backend may write its logs there
        before the manifest) must also hold nothing else: a run's files never mix with someone else's."""
        if (self.path / MANIFEST).exists() or (self.path / REQUESTS).exists():
            raise DSparkError(f"{self.path} already holds a run; use --resume {self.path} or another --out")
        if named and self.path.is_dir() and any(self.path.iterdir()):
            raise DSparkError(f"--out {self.path}: the folder holds other files, not a run; choose an empty or new "
                              "folder (or --resume DIR to finish an unfinished run)")

    def create(self, manifest: dict) -> None:
        self.check_new()
        self.path.mkdir(parents=True, exist_ok=True)
        self.write_json(MANIFEST, manifest)

    def check_resume(self, settings: dict) -> None:
        """Exit (DSparkError) unless `settings` equal those the run was started with."""
        manifest = self.manifest()
        if manifest is None:
            raise DSparkError(f"--resume {self.path}: no {MANIFEST} there; not a run folder")
        before = manifest["settings"]
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

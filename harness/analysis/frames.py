"""Run folders, profile folders and trace summaries as pandas frames, for notebooks and reports. Needs
neither torch nor rich.

- `load_runs(paths)`: `requests` (one row per request, failed ones flagged), `rounds` (one row per
  verify round: drafts proposed and accepted), `summary` (the summary rows), and `meta` (what
  produced each run: backend, device, target, split, date, git revision);
- `positions(rounds)`: per system, the joint and conditional acceptance of each draft position;
- `load_profiles(paths, summarize=...)`: a profile folder (`<system>.summary.json`, or the
  `<system>.sqlite` / `<system>/trace.torch.json` it summarises), or one trace or summary file:
  kernel categories, NVTX step ranges, launches, and the diagnoses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from dspark.errors import DSparkError
from harness.analysis.metrics import acceptance
from harness.analysis.records import MANIFEST, REQUESTS, read_requests
from harness.analysis.summary import summarize_folder

RUN_COLUMNS = ("system", "method", "temperature", "category", "question_id", "turn")


@dataclass
class Runs:
    requests: pd.DataFrame
    rounds: pd.DataFrame
    summary: pd.DataFrame
    meta: pd.DataFrame  # one row per run

    def caption(self) -> str:
        """What produced these runs, for a figure's title: backend, device, target, date."""
        parts = [f"{m.run}: {m.backend} on {m.device}, {m.target}, {m.date}" for m in self.meta.itertuples()]
        return "; ".join(parts)


def is_run(path: Path) -> bool:
    return (Path(path) / MANIFEST).is_file() or (Path(path) / REQUESTS).is_file()


def load_runs(paths: list[Path | str], progress=None) -> Runs:
    """Every given run folder (a folder that is not one is refused in one line). `progress(name)` is
    called as each run is read."""
    requests, rounds, summaries, meta = [], [], [], []
    for path in map(Path, paths):
        if not is_run(path):
            raise DSparkError(f"{path}: not a run folder (no manifest.json or requests.jsonl); give a folder "
                              "written by dspark-bench run")
        if progress is not None:
            progress(path.name)
        manifest = json.loads((path / MANIFEST).read_text()) if (path / MANIFEST).is_file() else {}
        settings = manifest.get("settings") or {}
        prov = manifest.get("provenance") or {}
        label = path.name
        meta.append({"run": label, "path": str(path), "backend": settings.get("backend", "native"),
                     "device": prov.get("gpu") or prov.get("device") or settings.get("device", "?"),
                     "target": settings.get("target", "?"), "split": settings.get("split"),
                     "date": (prov.get("time_utc") or "")[:10] or "?", "git": (prov.get("git") or {}).get("commit")})
        for r in read_requests(path):
            base = {"run": label, **{k: r.get(k) for k in RUN_COLUMNS},
                    "max_concurrency": r.get("max_concurrency", 1), "failed": bool(r.get("failed"))}
            lengths = r.get("acceptance_lengths") or []
            requests.append(base | {k: r.get(k) for k in ("prompt_tokens", "output_tokens", "ttft_ms", "tpot_ms",
                                                          "e2el_ms", "num_rounds", "matches_baseline")}
                            | {"acceptance_length": sum(lengths) / len(lengths) if lengths else None,
                               "target_confidence": r.get("target_confidence")})
            accepted = r.get("accepted_counts") or [a - 1 for a in lengths]
            for i, (d, a) in enumerate(zip(r.get("proposal_lengths") or [], accepted)):
                rounds.append(base | {"round": i, "proposed": d, "accepted": a})
        summary = summarize_folder(path)
        summaries += [{"run": label, **row} for row in summary["rows"]]
    return Runs(pd.DataFrame(requests), pd.DataFrame(rounds, columns=["run", *RUN_COLUMNS, "max_concurrency",
                                                                      "failed", "round", "proposed", "accepted"]),
                pd.DataFrame(summaries), pd.DataFrame(meta))


def positions(rounds: pd.DataFrame, by: tuple[str, ...] = ("run", "system", "temperature")) -> pd.DataFrame:
    """Per group and draft position k: the joint acceptance (rounds accepting k / rounds proposing k)
    and the conditional one (given k - 1 accepted), as `metrics.acceptance` defines them."""
    rows = []
    for key, group in rounds.groupby(list(by), sort=False):
        got = acceptance([a + 1 for a in group["accepted"]], list(group["proposed"]), list(group["accepted"]))
        for k, (joint, cond) in enumerate(zip(got["spec_decode_per_position_acceptance_rates"],
                                              got["spec_decode_conditional_acceptance_rates"]), start=1):
            rows.append(dict(zip(by, key)) | {"position": k, "joint": joint, "conditional": cond})
    return pd.DataFrame(rows)


@dataclass
class Profiles:
    categories: pd.DataFrame  # profile, system, category, instances, total_ns, share
    ranges: pd.DataFrame  # profile, system, range, instances, total_ns, avg_ns
    launches: pd.DataFrame  # profile, system, kernels, graph_launches, gpu_ns, output_tokens
    diagnosis: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # per profile: what recorded it

    def caption(self) -> str:
        return "; ".join(self.sources)


def _summaries(path: Path, summarize) -> list[tuple[str, dict, int | None]]:
    """(system, trace summary, output tokens) of a profile folder or of one trace or summary file; a raw
    trace goes through `summarize` (`harness.profiling.traces.summarize`, which the caller brings: the
    analysis layer imports no profiling code)."""

    def read(trace: Path) -> dict:
        if trace.name.endswith(".summary.json"):
            return json.loads(trace.read_text())
        if summarize is None:
            raise DSparkError(f"{trace}: a raw trace; give its summary (dspark-bench profile writes "
                              "<system>.summary.json) or pass summarize=harness.profiling.traces.summarize")
        return summarize(trace)

    if path.is_file():
        return [(path.name.removesuffix(".summary.json").removesuffix(".sqlite").removesuffix(".json"), read(path),
                 None)]
    if not path.is_dir():
        raise DSparkError(f"{path}: no such profile folder or trace file")
    found = {}
    for f in sorted(path.glob("*.summary.json")):
        found[f.name.removesuffix(".summary.json")] = json.loads(f.read_text())
    for f in sorted(path.glob("*.sqlite")) + sorted(path.glob("*/trace.torch.json")):
        system = f.stem if f.suffix == ".sqlite" else f.parent.name
        if system not in found:
            found[system] = read(f)
    if not found:
        raise DSparkError(f"{path}: not a profile folder (no <system>.summary.json, .sqlite or trace.torch.json); "
                          "give a folder written by dspark-bench profile, or a trace file")
    out = []
    for system, summary in found.items():
        run = path / system
        tokens = None
        if is_run(run):
            tokens = sum(r.get("output_tokens") or 0 for r in read_requests(run))
        out.append((system, summary, tokens))
    return out


def load_profiles(paths: list[Path | str], progress=None, summarize=None) -> Profiles:
    """Profile folders or trace files as frames; `summarize` reads a raw trace (see `_summaries`)."""
    cats, ranges, launches, notes, sources = [], [], [], [], []
    for path in map(Path, paths):
        if progress is not None:
            progress(path.name)
        found = _summaries(path, summarize)
        sources.append(_source(path, found[0][0], found[0][1]))
        for system, s, tokens in found:
            where = {"profile": path.name, "system": system}
            cats += [where | {k: c.get(k) for k in ("category", "instances", "total_ns", "share")}
                     for c in s.get("categories") or []]
            ranges += [where | {"range": r.get("range"), "instances": r.get("instances"), "total_ns": r.get("total_ns"),
                                "avg_ns": r.get("avg_ns")} for r in s.get("nvtx") or []]
            gpu_ns = sum(k.get("total_ns") or 0 for k in s.get("kernels") or [])
            launch = s.get("launches") or {}
            launches.append(where | {"kernels": launch.get("kernels"), "graph_launches": launch.get("graph_launches"),
                                     "gpu_ns": gpu_ns, "output_tokens": tokens})
            notes += [f"{path.name}/{system}: {d}" for d in s.get("diagnosis") or []]
    return Profiles(pd.DataFrame(cats), pd.DataFrame(ranges), pd.DataFrame(launches), notes, sources)


def _source(path: Path, system: str, summary: dict) -> str:
    """What recorded a profile: its folder's profile.json (the tool) and the run a system's child wrote
    (backend, device, date), else the trace's own tool version."""
    tool = f"nsys {summary['nsys_version']}" if summary.get("nsys_version") else "PyTorch profiler"
    child = path / system / MANIFEST if path.is_dir() else None
    if child is None or not child.is_file():
        return f"{path.name}: {tool} trace"
    manifest = json.loads(child.read_text())
    settings, prov = manifest.get("settings") or {}, manifest.get("provenance") or {}
    return (f"{path.name}: {tool}, {settings.get('backend', 'native')} backend on {prov.get('gpu') or prov.get('device')}, "
            f"{settings.get('target')}, {(prov.get('time_utc') or '')[:10]}")


def newest_run(root: Path | str = "results") -> Path | None:
    """The most recently written run folder under `root` (a notebook's default input)."""
    runs = [p for p in Path(root).glob("*") if is_run(p)] if Path(root).is_dir() else []
    return max(runs, key=lambda p: p.stat().st_mtime, default=None)

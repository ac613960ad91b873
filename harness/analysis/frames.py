"""Run folders, profile folders and trace summaries as pandas frames, for notebooks and reports. Needs
neither torch nor rich. Every frame has its columns even when a run has no row for it (a run of
plain decoding only, an interrupted or failed one, a vLLM run that reports only totals), so a reader
never meets a missing column.

- `load_runs(paths)`: `requests` (one row per request, failed ones flagged; drafted rounds and accepted
  drafts from the rounds or from the backend's totals), `rounds` (one row per verify round: drafts
  proposed and accepted, each slot's confidence where the draft has a confidence head), `counts` (per
  request, or per served wave where only the server counted, and draft position: the rounds of the
  request or wave, and those that proposed, reached and accepted it), `summary` (the summary rows),
  `meta` (what produced each run: backend, device, target, split, categories, date, git revision) and
  `warnings` (each run's summary warnings: incomplete, failed requests, contention);
- `positions(counts)`: per system, the joint and conditional acceptance of each draft position, with
  Wilson 95 % intervals from the counts;
- `acceptance_intervals`: the acceptance length's 95 % t interval over requests (`metrics.length_interval`);
- `load_profiles(paths, summarize=...)`: a profile folder (`<system>.summary.json`, or the
  `<system>.sqlite` / `<system>/trace.torch.json` it summarises), or one trace or summary file:
  kernel categories, NVTX step ranges, launches, host operators (a PyTorch trace's self times), and
  the diagnoses.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from dspark.errors import DSparkError
from harness.analysis.metrics import length_interval, wilson
from harness.analysis.records import MANIFEST, REQUESTS, not_a_run, read_manifest, read_requests, read_waves, trace_name
from harness.analysis.study import measured_vs_derived
from harness.analysis.summary import BASELINE, summarize_folder

RUN_COLUMNS = ("system", "method", "temperature", "category", "question_id", "turn")
KEY = ("run", *RUN_COLUMNS, "max_concurrency", "failed")
REQUEST_COLUMNS = (*KEY, "prompt_tokens", "output_tokens", "ttft_ms", "tpot_ms", "e2el_ms", "num_rounds",
                   "matches_baseline", "spec_rounds", "spec_accepted", "acceptance_length", "acceptance_from",
                   "target_confidence")
ROUND_COLUMNS = (*KEY, "round", "proposed", "accepted", "confidences")
POSITION_COUNTS = ("position", "rounds", "proposed", "reached", "accepted")  # (`_position_counts`' tuple)
COUNT_COLUMNS = ("run", "system", "method", "temperature", "max_concurrency", "position", "rounds", "proposed",
                 "reached", "accepted")
META_COLUMNS = ("run", "path", "backend", "device", "cpu", "cores", "target", "split", "categories", "systems",
                "date", "git", "dirty", "requests_done", "requests_expected", "complete")
SUMMARY_COLUMNS = ("run", "system", "method", "temperature", "max_concurrency", "category", "requests",
                   "completed", "failed", "mean_tpot_ms", "speedup", "speedup_ci95", "speedup_pairs",
                   "speedup_ci95_reason", "spec_decode_acceptance_length", "spec_decode_acceptance_rate", "num_rounds",
                   "output_throughput", "throughput_speedup", "matches_baseline", "matches_baseline_of",
                   "requests_expected")
OPERATOR_COLUMNS = ("profile", "system", "name", "calls", "self_ns", "share")  # a CPU trace's host operators


@dataclass
class Runs:
    requests: pd.DataFrame
    rounds: pd.DataFrame
    summary: pd.DataFrame
    meta: pd.DataFrame  # one row per run
    counts: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=COUNT_COLUMNS))
    warnings: dict[str, list[str]] = field(default_factory=dict)  # run -> its summary's warnings
    # synthetic-acceptance systems (`study.measured_vs_derived`, in-run step costs): profile, check, measured and
    # derived speedups per run, system and level
    synthetic: pd.DataFrame = field(default_factory=pd.DataFrame)

    def caption(self) -> str:
        """What produced these runs, for a figure's title: backend, device, target, date, and a run's label
        (random weights, synthetic acceptance: <profile>) and Triton's interpreter where it has them."""
        parts = [f"{m.run}: {m.backend} on {m.device}, {m.target}, {m.date}"
                 + "".join(f" [{v}]" for v in (getattr(m, "label", None), getattr(m, "interpreted", None))
                           if isinstance(v, str)) for m in self.meta.itertuples()]
        return "; ".join(parts)


def is_run(path: Path) -> bool:
    return (Path(path) / MANIFEST).is_file() or (Path(path) / REQUESTS).is_file()


def _labels(paths: list[Path]) -> list[str]:
    """Each run's name in tables and legends: its folder's name, with its parent's where two share it."""
    names = [p.name for p in paths]
    return [f"{p.parent.name}/{p.name}" if names.count(p.name) > 1 else p.name for p in paths]


def _meta(label: str, path: Path, manifest: dict, summary: dict) -> dict:
    settings = manifest.get("settings") or {}
    prov = manifest.get("provenance") or {}
    git = prov.get("git") or {}
    return {"run": label, "path": str(path), "backend": settings.get("backend", "native"),
            "device": prov.get("gpu") or prov.get("device") or settings.get("device") or "?",
            "cpu": prov.get("cpu"), "cores": prov.get("cores"), "target": settings.get("target") or "?",
            "split": settings.get("split"), "categories": ", ".join(settings.get("categories") or []) or "all",
            "systems": ", ".join(settings.get("systems") or []), "date": (prov.get("time_utc") or "")[:10] or "?",
            "git": git.get("commit"), "dirty": git.get("dirty"), "requests_done": summary.get("requests_done"),
            "requests_expected": summary.get("requests_expected"), "complete": summary.get("complete"),
            "label": summary.get("label"), "parallel": summary.get("parallel"),
            "interpreted": summary.get("interpreted")}


def _position_counts(proposed: list[int], accepted: list[int]) -> list[tuple[int, int, int, int, int]]:
    """(position k, the request's rounds, rounds proposing k, rounds that could accept k: accepted k - 1
    and proposed k, rounds accepting k) from one request's rounds; position 1 always, so that a request
    whose rounds proposed nothing (n-gram without a match) still counts its rounds."""
    out = []
    for k in range(1, max(max(proposed, default=0), 1 if proposed else 0) + 1):
        out.append((k, len(proposed), sum(d >= k for d in proposed),
                    sum(a >= k - 1 and d >= k for a, d in zip(accepted, proposed)), sum(a >= k for a in accepted)))
    return out


def _total_counts(totals: dict) -> list[tuple[int, int, int, int, int]]:
    """The same from a backend's totals (vLLM's per request, or a server's counters over a wave): as vLLM
    counts them, every speculative step proposes every position."""
    steps, per_pos = totals.get("num_spec_steps") or 0, totals.get("accepted_per_pos") or []
    return [(k, steps, steps, steps if k == 1 else per_pos[k - 2], per_pos[k - 1])
            for k in range(1, len(per_pos) + 1) if steps]


def load_runs(paths: list[Path | str], progress=None) -> Runs:
    """Every given run folder (a folder that is not one is refused in one line). `progress(name)` is
    called as each run is read."""
    paths = [Path(p) for p in paths]
    for path in paths:
        if not is_run(path):
            raise DSparkError(f"{path}: {not_a_run(path)}; give a folder written by dspark-bench run")
    requests, rounds, counts, summaries, meta, notes, synthetic = [], [], [], [], [], {}, []
    for path, label in zip(paths, _labels(paths)):
        if progress is not None:
            progress(path.name)
        manifest = read_manifest(path) or {}
        summary = summarize_folder(path)
        meta.append(_meta(label, path, manifest, summary))
        notes[label] = list(summary.get("warnings") or [])
        counted_waves = set()
        for r in read_requests(path):
            base = {"run": label, **{k: r.get(k) for k in RUN_COLUMNS},
                    "temperature": float(r.get("temperature") or 0.0),
                    "max_concurrency": r.get("max_concurrency", 1), "failed": bool(r.get("failed"))}
            lengths = r.get("acceptance_lengths") or []
            proposed = r.get("proposal_lengths") or []
            accepted = r.get("accepted_counts") or [a - 1 for a in lengths]
            totals = r.get("acceptance_totals") or {}
            where = {k: base[k] for k in ("run", "system", "method", "temperature", "max_concurrency")}
            if lengths:
                spec = (len(lengths), sum(accepted), "rounds")
                counts += [where | dict(zip(POSITION_COUNTS, c))
                           for c in _position_counts(proposed, accepted)]
            elif totals.get("num_spec_steps"):
                spec = (totals["num_spec_steps"], totals.get("num_accepted_draft_tokens") or 0, "totals")
                counts += [where | dict(zip(POSITION_COUNTS, c))
                           for c in _total_counts(totals)]
            else:
                spec = (None, None, None)
                if r.get("wave") and str(r.get("acceptance_source") or "").startswith("server counters"):
                    counted_waves.add(r["wave"])
            requests.append(base | {k: r.get(k) for k in REQUEST_COLUMNS if k not in base and k in r}
                            | {"spec_rounds": spec[0], "spec_accepted": spec[1], "acceptance_from": spec[2],
                               "acceptance_length": 1 + spec[1] / spec[0] if spec[0] else None})
            confidences = r.get("draft_confidences") or []
            for i, (d, a) in enumerate(zip(proposed, accepted)):
                rounds.append(base | {"round": i, "proposed": d, "accepted": a,
                                      "confidences": confidences[i] if i < len(confidences) else None})
        methods = {m["system"]: m["method"] for m in requests if m["run"] == label}
        for w in read_waves(path):  # a server's counters: per wave, not per request
            if w.get("wave") in counted_waves and w.get("spec_counters"):
                where = {"run": label, "system": w.get("system"), "method": methods.get(w.get("system")),
                         "temperature": float(w.get("temperature") or 0.0), "max_concurrency": w.get("max_concurrency", 1)}
                counts += [where | dict(zip(POSITION_COUNTS, c))
                           for c in _total_counts(w["spec_counters"])]
        summaries += [{"run": label, **row} for row in summary["rows"]]
        synthetic += [{"run": label, **row} for row in measured_vs_derived(summary, label)]
    return Runs(_frame(requests, REQUEST_COLUMNS), _frame(rounds, ROUND_COLUMNS), _frame(summaries, SUMMARY_COLUMNS),
                _frame(meta, META_COLUMNS), _frame(counts, COUNT_COLUMNS), notes, pd.DataFrame(synthetic))


def _frame(rows: list[dict], columns: tuple[str, ...]) -> pd.DataFrame:
    """The rows as a frame with at least `columns` (in that order, then any others the rows have)."""
    extra = list(dict.fromkeys(k for r in rows for k in r if k not in columns))
    return pd.DataFrame(rows, columns=[*columns, *extra])


def positions(counts: pd.DataFrame, by: tuple[str, ...] = ("run", "system", "temperature")) -> pd.DataFrame:
    """Per group and draft position k: the joint acceptance (rounds accepting k / all the group's rounds:
    a round that proposed fewer than k drafts accepts nothing at k, so the joint rates sum to the
    acceptance length - 1) and the conditional one (given k - 1 accepted and k proposed), as
    `metrics.acceptance` defines them, each with its Wilson 95 % interval and the rounds behind it."""
    cols = [*by, "position", "rounds", "proposed", "reached", "accepted", "joint", "joint_lo", "joint_hi",
            "conditional", "conditional_lo", "conditional_hi"]
    if counts.empty:
        return pd.DataFrame(columns=cols)
    summed = counts.groupby([*by, "position"], sort=False)[["proposed", "reached", "accepted"]].sum().reset_index()
    # every request or wave with rounds has a position-1 row: the group's rounds are theirs
    rounds = counts[counts["position"] == 1].groupby(list(by), sort=False)["rounds"].sum().reset_index()
    summed = summed.merge(rounds, on=list(by), how="left").fillna({"rounds": 0})
    rows = []
    for r in summed.to_dict("records"):
        joint, cond = wilson(r["accepted"], r["rounds"]), wilson(r["accepted"], r["reached"])
        rows.append(r | {"joint": r["accepted"] / r["rounds"] if r["rounds"] else math.nan,
                         "joint_lo": joint[0], "joint_hi": joint[1],
                         "conditional": r["accepted"] / r["reached"] if r["reached"] else math.nan,
                         "conditional_lo": cond[0], "conditional_hi": cond[1]})
    return pd.DataFrame(rows, columns=cols)


def acceptance_intervals(requests: pd.DataFrame,
                         by: tuple[str, ...] = ("run", "system", "temperature", "max_concurrency")) -> pd.DataFrame:
    """Per group, the acceptance length (macro over categories, as the summary's) and its 95 % t interval
    over requests, stratified by category, by the speedups' rule (`metrics.length_interval`: none below
    MIN_PAIRS requests, `acceptance_ci95_reason` then says why); groups whose requests carry no counts
    are left out."""
    cols = [*by, "acceptance_length", "acceptance_ci95", "acceptance_ci95_reason", "requests"]
    done = requests[~requests["failed"].astype(bool) & (requests["spec_rounds"].fillna(0) > 0)]
    rows = []
    for key, g in done.groupby(list(by), sort=False):
        strata = [list(zip(c["spec_rounds"], c["spec_accepted"])) for _, c in g.groupby("category", sort=True)]
        got = length_interval(strata)
        rows.append(dict(zip(by, key)) | {"acceptance_length": got["centre"], "acceptance_ci95": got["ci"],
                                          "acceptance_ci95_reason": got["reason"], "requests": len(g)})
    return pd.DataFrame(rows, columns=cols)


@dataclass
class Profiles:
    categories: pd.DataFrame  # profile, system, category, instances, total_ns, share
    ranges: pd.DataFrame  # profile, system, range, instances, total_ns, avg_ns
    launches: pd.DataFrame  # profile, system, kernels, graph_launches, gpu_ns, output_tokens (no GPU work: None)
    diagnosis: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # per profile: what recorded it
    operators: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=OPERATOR_COLUMNS))  # host operators

    def caption(self) -> str:
        return "; ".join(self.sources)


def profile_files(path: Path | str) -> dict[str, Path]:
    """Per system, the file a profile folder holds for it: its `<system>.summary.json`, else its nsys
    `<system>.sqlite` or PyTorch `<system>/trace.torch.json[.gz]`; or the one trace or summary file
    given. A path that is neither is refused in one line (before any trace is read)."""
    path = Path(path)
    if path.is_file():
        return {trace_name(path): path}
    if not path.is_dir():
        raise DSparkError(f"{path}: no such profile folder or trace file")
    found = {f.name.removesuffix(".summary.json"): f for f in sorted(path.glob("*.summary.json"))}
    for f in sorted(path.glob("*.sqlite")) + sorted(path.glob("*/trace.torch.json*")):
        found.setdefault(f.stem if f.suffix == ".sqlite" else f.parent.name, f)
    if not found:
        raise DSparkError(f"{path}: not a profile folder (no <system>.summary.json, .sqlite or trace.torch.json); "
                          "give a folder written by dspark-bench profile, or a trace file")
    return found


def _summaries(path: Path, summarize) -> list[tuple[str, dict, int | None]]:
    """(system, trace summary, output tokens) of a profile folder or of one trace or summary file; a raw
    trace goes through `summarize` (`harness.profiling.traces.summarize`, which the caller brings: the
    analysis layer imports no profiling code)."""
    out = []
    for system, trace in profile_files(path).items():
        if trace.name.endswith(".summary.json"):
            summary = json.loads(trace.read_text())
        elif summarize is None:
            raise DSparkError(f"{trace}: a raw trace; give its summary (dspark-bench profile writes "
                              "<system>.summary.json) or pass summarize=harness.profiling.traces.summarize")
        else:
            summary = summarize(trace)
        run = path / system if path.is_dir() else None
        tokens = sum(r.get("output_tokens") or 0 for r in read_requests(run)) if run and is_run(run) else None
        out.append((system, summary, tokens))
    return out


def load_profiles(paths: list[Path | str], progress=None, summarize=None) -> Profiles:
    """Profile folders or trace files as frames; `summarize` reads a raw trace (see `_summaries`)."""
    cats, ranges, launches, notes, sources, operators = [], [], [], [], [], []
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
            gpu = s.get("kernels") is not None or s.get("categories") is not None  # (None: a CPU-only trace)
            gpu_ns = sum(k.get("total_ns") or 0 for k in s.get("kernels") or [])
            launch = s.get("launches") or {}
            launches.append(where | {"kernels": launch.get("kernels") if gpu else None,
                                     "graph_launches": launch.get("graph_launches") if gpu else None,
                                     "gpu_ns": gpu_ns if gpu else None, "output_tokens": tokens})
            operators += [where | {k: o.get(k) for k in OPERATOR_COLUMNS[2:]}
                          for o in (s.get("host") or {}).get("operators") or []]
            notes += [f"{path.name}/{system}: {d}" for d in s.get("diagnosis") or []]
    return Profiles(_frame(cats, ("profile", "system", "category", "instances", "total_ns", "share")),
                    _frame(ranges, ("profile", "system", "range", "instances", "total_ns", "avg_ns")),
                    _frame(launches, ("profile", "system", "kernels", "graph_launches", "gpu_ns", "output_tokens")),
                    notes, sources, _frame(operators, OPERATOR_COLUMNS))


def _source(path: Path, system: str, summary: dict) -> str:
    """What recorded a profile: its folder's profile.json (the tool) and the run a system's child wrote
    (backend, device, date), else the trace's own tool version."""
    tool = f"nsys {summary['nsys_version']}" if summary.get("nsys_version") else "PyTorch profiler"
    manifest = read_manifest(path / system) if path.is_dir() else None
    if manifest is None:
        return f"{path.name}: {tool} trace"
    settings, prov = manifest.get("settings") or {}, manifest.get("provenance") or {}
    return (f"{path.name}: {tool}, {settings.get('backend', 'native')} backend on {prov.get('gpu') or prov.get('device')}, "
            f"{settings.get('target')}, {(prov.get('time_utc') or '')[:10]}")


def newest_run(root: Path | str = "results") -> Path | None:
    """The most recently written run folder under `root` (a notebook's default input)."""
    runs = [p for p in Path(root).glob("*") if is_run(p)] if Path(root).is_dir() else []
    return max(runs, key=lambda p: p.stat().st_mtime, default=None)


SPEEDUP_COLUMNS = ["run", "system", "temperature", "category", "max_concurrency", "question_id", "speedup",
                   "acceptance_length"]


def prompt_speedups(runs: Runs) -> pd.DataFrame:
    """Per prompt, plain decoding's TPOT over each system's (the same prompt ids, level and temperature),
    with the request's acceptance length."""
    req = runs.requests[~runs.requests["failed"].astype(bool)].dropna(subset=["tpot_ms"])
    key = ["run", "question_id", "turn", "temperature", "max_concurrency"]
    base = req[req["method"] == BASELINE].set_index(key)["tpot_ms"]
    rows = []
    for r in req[req["method"] != BASELINE].itertuples():
        b = base.get((r.run, r.question_id, r.turn, r.temperature, r.max_concurrency))
        if b is not None and r.tpot_ms:
            rows.append({"run": r.run, "system": r.system, "temperature": r.temperature, "category": r.category,
                         "max_concurrency": r.max_concurrency, "question_id": r.question_id,
                         "speedup": b / r.tpot_ms, "acceptance_length": r.acceptance_length})
    return pd.DataFrame(rows, columns=SPEEDUP_COLUMNS)

"""Any trace to its summary (an nsys export, a .nsys-rep exported first, a PyTorch trace), and
systems side by side: the inputs of `trace compare` and of `profile`'s closing table, with, where the
requests are known, the host time per decoded token (inside operators and outside them) and the
profiler's overhead against the same requests timed unprofiled."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

from dspark.errors import DSparkError
from harness.analysis.records import UNPROFILED, read_requests, trace_name
from harness.profiling.nsys import export_sqlite, find_nsys, sqlite_export
from harness.profiling.torch_trace import SUFFIXES, summarize_torch
from harness.profiling.traces import summarize

REFERENCE = UNPROFILED  # a profile folder's run of the same requests without a profiler
TOP_OPERATORS = 8  # operators per system in the comparison


def summarize_any(path: Path, expect_method: str | None = None, engine: str | None = None) -> dict:
    """A .sqlite export, a PyTorch profiler .json or .json.gz trace, or a .nsys-rep (exported to SQLite
    first). `engine` "vllm": the trace of a vLLM run (its processes are checked; a PyTorch trace is its
    worker's). A path that is no file is called so before anything else (a missing .nsys-rep was answered
    "no working nsys found", a missing .json.gz "not a PyTorch profiler Chrome trace")."""
    path = Path(path)
    if path.is_dir():
        raise DSparkError(folder_given(path))
    if not path.is_file():
        raise DSparkError(f"{path}: no such file; give a .sqlite export, a .nsys-rep or a PyTorch .json / .json.gz "
                          "trace")
    if path.name.endswith(SUFFIXES):
        return summarize_torch(path, expect_method)  # (vLLM's: its worker's own trace)
    if path.suffix == ".nsys-rep":
        if export_due(path):
            export_sqlite(find_nsys(), path)
        path = sqlite_export(path)
    return summarize(path, expect_method, engine)


# the trace files `profile` writes in its folder and each system's run folder (`<system>.nsys-rep` and its export
# `<system>.sqlite`, `<system>/trace.torch.json.gz`, plain where vLLM's profiler wrote it), and PyTorch's own
# `*.pt.trace.json` (its TensorBoard handler's)
FOLDER_TRACES = (".nsys-rep", ".sqlite", ".torch.json.gz", ".torch.json", ".pt.trace.json", ".pt.trace.json.gz")


def folder_given(path: Path, most: int = 6) -> str:
    """The line for a folder given where a trace file belongs (`trace summarize RUN_OR_PROFILE_DIR` answered
    "no such trace file"): the traces in it and its subfolders to give instead, and `trace compare` for a
    profile's folder, which reads all of its systems."""
    found = sorted(p for pattern in ("*", "*/*") for p in path.glob(pattern)
                   if p.is_file() and p.name.endswith(FOLDER_TRACES))
    compare = f"; or compare its systems with: dspark-bench trace compare {path}" \
        if (path / "profile.json").is_file() else ""
    if not found:
        return (f"{path}: a folder, not a trace file, and it holds none; give a .sqlite export, a .nsys-rep or a PyTorch .json / "
                f".json.gz trace{compare}")
    listed = ", ".join(str(p) for p in found[:most]) + (f" and {len(found) - most} more" if len(found) > most else "")
    return f"{path}: a folder, not a trace file; give one of its traces: {listed}{compare}"


def export_due(report: Path) -> bool:
    """Whether reading `report` (a .nsys-rep) writes its export first: none yet, or one older than it."""
    sqlite_path = sqlite_export(report)
    return not sqlite_path.is_file() or sqlite_path.stat().st_mtime < report.stat().st_mtime


STEP_RANGES = ("prefill", "target_verify", "decode_sample", "ar_decode")
# vLLM's model runner names each step by its batch, `execute_context_<n>(<tokens>)_generation_<m>(<tokens>)`:
# a step with no prompt tokens is a decode step (or a speculative round), one with some a prefill
VLLM_STEP = re.compile(r"execute_context_(\d+)\(\d+\)_generation_\d+\(\d+\)")


def vllm_steps(ranges: dict[str, dict]) -> dict[str, dict]:
    """vLLM's per-batch step ranges summed into `vllm_prefill` and `vllm_decode` ({"total_ns",
    "instances"}), so that its steps sit beside our engine's ranges; empty for any other trace."""
    out: dict[str, dict] = {}
    for name, r in ranges.items():
        m = VLLM_STEP.fullmatch(name or "")
        if m:
            step = out.setdefault("vllm_prefill" if int(m.group(1)) else "vllm_decode", {"total_ns": 0, "instances": 0})
            step["total_ns"] += r["total_ns"]
            step["instances"] += r["instances"]
    return out


def distinct_names(items: list[dict]) -> None:
    """Names that repeat (two `trace.torch.json` of two folders, the same system of two profiles) get
    the shortest suffix of their folder's path that tells each apart: a/trace.torch and b/trace.torch
    (the same file given twice: a number)."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for it in items:
        groups[it["name"]].append(it)
    for name, group in groups.items():
        if len(group) < 2:
            continue
        parents = [Path(it["where"]).resolve().parent.parts for it in group]
        for k, (it, parent) in enumerate(zip(group, parents)):
            depth = next((d for d in range(1, len(parent) + 1)
                          if [p[-d:] for p in parents].count(parent[-d:]) == 1), None)
            it["name"] = "/".join(parent[-depth:] + (name,)) if depth else f"{name} ({k + 1})"


def load_inputs(paths: list[Path]) -> list[dict]:
    """Each input as {"name", "summary", "output_tokens", "records", "unprofiled"}: a trace file, or a
    profile folder written by `dspark-bench profile` (one summary per system, its requests, which count
    the tokens, and the same requests timed unprofiled when the profile measured its overhead)."""
    items = []
    for path in map(Path, paths):
        if path.is_dir():
            summaries = sorted(path.glob("*.summary.json"))
            order = path / "profile.json"
            if order.is_file():  # the systems in the order they ran
                names = list(json.loads(order.read_text())["commands"])
                summaries.sort(key=lambda f: names.index(f.name.removesuffix(".summary.json"))
                               if f.name.removesuffix(".summary.json") in names else len(names))
            if not summaries:
                raise DSparkError(f"{path}: no *.summary.json; give trace files or a folder written by "
                                  "dspark-bench profile")
            reference = read_requests(path / REFERENCE)
            for f in summaries:
                system = f.name.removesuffix(".summary.json")
                records = read_requests(path / system)
                tokens = sum(r["output_tokens"] for r in records) if records else None
                items.append({"name": system, "where": path / system, "summary": json.loads(f.read_text()),
                              "output_tokens": tokens, "records": records,
                              "unprofiled": [r for r in reference if r["system"] == system]})
        else:
            items.append({"name": trace_name(path), "where": path, "summary": summarize_any(path),
                          "output_tokens": None, "records": [], "unprofiled": []})
    distinct_names(items)
    return items


def decode_time(records: list[dict], keys: set | None = None) -> tuple[float, int]:
    """(ms, tokens) of decoding after the first token, summed over the finished requests (of `keys`:
    (question, turn, temperature), when given): their ratio is the requests' TPOT, token-weighted."""
    ms = tokens = 0
    for r in records:
        if r.get("failed") or r.get("ttft_ms") is None or r.get("e2el_ms") is None or r["output_tokens"] < 2:
            continue
        if keys is not None and _key(r) not in keys:
            continue
        ms += r["e2el_ms"] - r["ttft_ms"]
        tokens += r["output_tokens"] - 1
    return ms, tokens


def _key(r: dict) -> tuple:
    return r["question_id"], r["turn"], float(r["temperature"])


def host_figures(summary: dict, records: list[dict], unprofiled: list[dict]) -> dict | None:
    """Per decoded token, in ms: the profiled requests' decode time (`tpot_ms`), the part of it inside
    the trace's operators (outside prefill ranges) and the rest (`host_ms`: Python and the engine's own
    host work), and the same requests' unprofiled time (`unprofiled_tpot_ms`) with the `overhead`.
    None without a host-operator trace or requests that decoded (or above one request at a time)."""
    host = summary.get("host")
    ms, tokens = decode_time(records)
    if not host or not tokens or any(r.get("max_concurrency", 1) != 1 for r in records):
        return None
    tpot = ms / tokens
    ops = (host["thread_ns"] - host["prefill_ns"]) / 1e6 / tokens
    keys = {_key(r) for r in records if not r.get("failed")}
    ref_ms, ref_tokens = decode_time(unprofiled, keys)
    ref = ref_ms / ref_tokens if ref_tokens else None
    contended = sum(bool((r.get("contention") or {}).get("contended")) for r in records + unprofiled)
    return {"decode_tokens": tokens, "tpot_ms": tpot, "operators_ms": ops, "host_ms": tpot - ops,
            "unprofiled_tpot_ms": ref, "unprofiled_requests": len({_key(r) for r in unprofiled} & keys),
            "overhead_ms": tpot - ref if ref else None, "overhead_share": (tpot - ref) / ref if ref else None,
            "contended_requests": contended}


def compare(items: list[dict]) -> dict:
    """Side by side: kernel-category shares and instances, step ranges' presence, total time and calls,
    and per generated token (when the tokens are known) kernel launches, graph launches and GPU time
    (these three only where the trace has kernels: a CPU-only trace has none to count); from a PyTorch
    trace the top host operators by self time and, with the requests, the host time per decoded token
    and the profiler's overhead."""
    rows = []
    for it in items:
        s = it["summary"]
        ranges = {r["range"]: r for r in s["nvtx"]}
        ranges |= vllm_steps(ranges)
        names = list(STEP_RANGES) + [r for r in ranges if r and r.endswith("_propose")]
        names += [n for n in ("vllm_prefill", "vllm_decode") if n in ranges]
        tokens = it["output_tokens"]
        gpu = s["categories"] is not None  # None: the profiler saw no GPU work (a CPU run)
        gpu_ns = sum(c["total_ns"] for c in s["categories"] or [])
        host = host_figures(s, it.get("records") or [], it.get("unprofiled") or [])
        decoded = host["decode_tokens"] if host else None
        operators = [o | {"us_per_token": (o["self_ns"] - o["prefill_ns"]) / 1e3 / decoded if decoded else None}
                     for o in (s.get("host") or {}).get("operators", [])[:TOP_OPERATORS]]
        rows.append({
            "name": it["name"],
            "categories": {c["category"]: {"share": c["share"], "instances": c["instances"]}
                           for c in s["categories"] or []},
            "ranges_ns": {n: ranges[n]["total_ns"] if n in ranges else None for n in names},
            "ranges_calls": {n: ranges[n]["instances"] if n in ranges else None for n in names},
            "kernels": s["launches"]["kernels"], "graph_launches": s["launches"]["graph_launches"],
            "gpu_ns": gpu_ns if gpu else None, "output_tokens": tokens,
            "kernels_per_token": s["launches"]["kernels"] / tokens if tokens and gpu else None,
            "graph_launches_per_token": s["launches"]["graph_launches"] / tokens if tokens and gpu else None,
            "gpu_us_per_token": gpu_ns / tokens / 1e3 if tokens and gpu else None,
            "host": host, "operators": operators,
            "diagnosis": s["diagnosis"],
        })
    return {"rows": rows}

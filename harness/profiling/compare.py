"""Any trace to its summary (an nsys export, a .nsys-rep exported first, a PyTorch trace), and
systems side by side: the inputs of `trace compare` and of `profile`'s closing table."""

from __future__ import annotations

import json
from pathlib import Path

from dspark.errors import DSparkError
from harness.analysis.records import read_requests
from harness.profiling.nsys import export_sqlite, find_nsys
from harness.profiling.torch_trace import summarize_torch
from harness.profiling.traces import summarize


def summarize_any(path: Path, expect_method: str | None = None, engine: str | None = None) -> dict:
    """A .sqlite export, a PyTorch profiler .json trace, or a .nsys-rep (exported to SQLite first).
    `engine` "vllm": the trace of a vLLM run (its processes are checked; a PyTorch trace is its worker's)."""
    path = Path(path)
    if path.suffix == ".json":
        return summarize_torch(path, expect_method)  # (vLLM's: its worker's own trace)
    if path.suffix == ".nsys-rep":
        sqlite_path = path.parent / (path.name.removesuffix(".nsys-rep") + ".sqlite")
        if not sqlite_path.is_file() or sqlite_path.stat().st_mtime < path.stat().st_mtime:
            export_sqlite(find_nsys(), path)
        path = sqlite_path
    return summarize(path, expect_method, engine)


STEP_RANGES = ("prefill", "target_verify", "decode_sample", "ar_decode")


def load_inputs(paths: list[Path]) -> list[dict]:
    """Each input as {"name", "summary", "output_tokens"}: a trace file, or a profile folder written by
    `dspark-bench profile` (one summary per system, and their requests, which count the tokens)."""
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
            for f in summaries:
                system = f.name.removesuffix(".summary.json")
                records = read_requests(path / system)
                tokens = sum(r["output_tokens"] for r in records) if records else None
                items.append({"name": system, "summary": json.loads(f.read_text()), "output_tokens": tokens})
        else:
            items.append({"name": path.stem, "summary": summarize_any(path), "output_tokens": None})
    return items


def compare(items: list[dict]) -> dict:
    """Side by side: kernel-category shares and instances, step ranges' presence, total time and calls,
    and per generated token (when the tokens are known) kernel launches, graph launches and GPU time
    (these three only where the trace has kernels: a CPU-only trace has none to count)."""
    rows = []
    for it in items:
        s = it["summary"]
        ranges = {r["range"]: r for r in s["nvtx"]}
        names = list(STEP_RANGES) + [r for r in ranges if r and r.endswith("_propose")]
        tokens = it["output_tokens"]
        gpu = s["categories"] is not None  # None: the profiler saw no GPU work (a CPU run)
        gpu_ns = sum(c["total_ns"] for c in s["categories"] or [])
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
            "diagnosis": s["diagnosis"],
        })
    return {"rows": rows}

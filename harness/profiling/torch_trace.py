"""The PyTorch profiler's (Kineto) Chrome trace, plain or gzipped, in the schema of our nsys summary,
aggregated by the same SQL (`harness.profiling.traces`), with the host operators' self times
(`harness.profiling.operators`)."""

from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path

from dspark.errors import DSparkError
from harness.profiling.operators import operator_times
from harness.profiling.traces import _categories, _rows, _stats, diagnose, kernel_category

SUFFIXES = (".json", ".json.gz")  # a PyTorch profiler trace, as written plain or gzipped


def summarize_torch(path: Path, expect_method: str | None = None) -> dict:
    """The same summary from a PyTorch profiler (Kineto) Chrome trace: ranges are its
    `user_annotation` events, kernels `kernel`, memory operations `gpu_memcpy`/`gpu_memset`, API calls
    `cuda_runtime`/`cuda_driver`, projections `gpu_user_annotation`; `host` the operators' self times
    (`cpu_op` events). What a Kineto trace cannot give is null and named in `unavailable`. The events
    are loaded into an in-memory SQLite database and aggregated by the same SQL as nsys exports."""
    path = Path(path)
    try:
        with (gzip.open(path, "rb") if path.name.endswith(".gz") else path.open("rb")) as f:
            trace = json.load(f)
        events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    except (OSError, EOFError, ValueError, KeyError, TypeError) as exc:
        raise DSparkError(f"{path}: not a PyTorch profiler Chrome trace ({type(exc).__name__})") from None
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE ev (cat TEXT, name TEXT, pid INTEGER, dur INTEGER)")
    conn.executemany("INSERT INTO ev VALUES (?, ?, ?, ?)",  # (host operators, most of a CPU trace, go to `host`)
                     [(e.get("cat"), e.get("name"), e.get("pid") if isinstance(e.get("pid"), int) else -1,
                       round(float(e.get("dur", 0)) * 1000)) for e in events if e.get("cat") != "cpu_op"])

    def cat_rows(cats: str, keys: list[str], count_name: str = "instances") -> list[dict]:
        return _rows(conn, _stats(f"SELECT NULL AS domain, name AS range, 'PushPop' AS style, name, dur FROM ev "
                                  f"WHERE cat IN ({cats})", keys, count_name))

    out: dict = {"file": str(path), "schema": {"format": "pytorch-chrome-trace",
                                                "schemaVersion": trace.get("schemaVersion")}, "capture": {},
                           "nsys_version": None}
    out["nvtx"] = cat_rows("'user_annotation'", ["domain", "range", "style"])
    out["kernels"] = cat_rows("'kernel'", ["name"])
    for row in out["kernels"]:
        row["category"] = kernel_category(row["name"])
    out["memory_ops"] = cat_rows("'gpu_memcpy', 'gpu_memset'", ["name"], "count")
    out["categories"] = _categories(out["kernels"], out["memory_ops"])
    out["api"] = cat_rows("'cuda_runtime', 'cuda_driver'", ["name"], "calls")
    ranges = {r["range"]: r for r in out["nvtx"]}
    out["projection"] = [{"domain": None, "range": r["name"], "style": "PushPop",
                          "range_instances": ranges.get(r["name"], {}).get("instances"),
                          "range_total_ns": ranges.get(r["name"], {}).get("total_ns"),
                          "proj_total_ns": r["total_ns"], "gpu_ops": None, "gpu_busy_ns": None}
                         for r in _rows(conn, _stats("SELECT name, dur FROM ev WHERE cat = 'gpu_user_annotation'",
                                                     ["name"]))]
    out["busy"] = []
    out["host"] = operator_times(*_spans(events))
    kernels = conn.execute("SELECT COUNT(*) FROM ev WHERE cat = 'kernel'").fetchone()[0]
    graph = conn.execute("SELECT COUNT(*) FROM ev WHERE cat IN ('cuda_runtime', 'cuda_driver') AND "
                         "(name LIKE 'cudaGraphLaunch%' OR name LIKE 'cuGraphLaunch%')").fetchone()[0]
    out["launches"] = {"kernels": kernels, "graph_launches": graph, "kernels_from_graphs_share": None,
                       "graph_trace_rows": 0}
    out["processes"] = [{"pid": pid, "name": None, "nvtx_rows": n, "api_rows": a, "kernel_rows": k,
                         "did_gpu_work": k > 0} for pid, n, a, k in conn.execute(
        "SELECT pid, SUM(cat = 'user_annotation'), SUM(cat IN ('cuda_runtime', 'cuda_driver')), SUM(cat = 'kernel') "
        "FROM ev WHERE cat IN ('user_annotation', 'cuda_runtime', 'cuda_driver', 'kernel') GROUP BY pid")]
    unavailable = ["projection.gpu_ops", "projection.gpu_busy_ns", "busy", "launches.kernels_from_graphs_share",
                   "capture"]
    if not kernels:
        unavailable += ["kernels", "categories", "memory_ops", "api", "projection", "launches.graph_launches"]
    out["unavailable"] = unavailable
    for key in unavailable:  # what the profiler cannot provide is null, not empty
        if "." not in key:
            out[key] = None
    # a CPU-only trace has no GPU work by design: keep only the notes that do not depend on it
    out["diagnosis"] = [d for d in diagnose(out, {}, expect_method)
                        if kernels or not ("kernel rows" in d or "GPU work" in d)]
    conn.close()
    return out


def _spans(events: list[dict]) -> tuple[list[tuple], list[tuple]]:
    """The host operators (`cpu_op`) and the ranges (`user_annotation`), each as (pid, tid, start_ns,
    dur_ns, name)."""
    ops, ranges = [], []
    for e in events:
        cat = e.get("cat")
        if cat == "cpu_op" or cat == "user_annotation":
            (ops if cat == "cpu_op" else ranges).append(
                (e.get("pid"), e.get("tid"), round(float(e.get("ts", 0)) * 1000), round(float(e.get("dur", 0)) * 1000),
                 e.get("name")))
    return ops, ranges

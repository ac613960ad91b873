"""Time `dspark-bench trace summarize` on a 1 GB Nsight Systems export (issue 6: under 60 s on 2 cores),
and `nsys stats` on the same file where nsys is given.

    python benchmarks/trace_1gb.py --out /tmp/big.sqlite [--nsys PATH] [--kernels 7500000 --ranges 1500000]

The export is built from the real schema: a copy of one of our recorded exports
(tests/fixtures/nsys/engine_dspark.sqlite, nsys 2025.3) whose NVTX, runtime-API, kernel and memory
tables are emptied and refilled by SQL: `--kernels` launch calls (cudaLaunchKernel, one kernel each,
60 kernel names; call durations spread over 30,000 ns values (0.2 to 30 us), kernel durations over 4 us in the 32 ns
steps GPU timestamps take) on one thread, and `--ranges` push/pop ranges over them (four
names as plain strings, as torch.cuda.nvtx writes them; each range holds kernels/ranges launches).
Rows take what they take in our real exports (84 bytes a kernel, 38 an API call, 49 a range), so the
issue's 5 M kernels, 5 M calls and 1 M ranges make 0.67 GB; the defaults (7.5 M, 7.5 M, 1.5 M) make
the 1 GB file. Prints the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from harness.profiling.traces import summarize  # noqa: E402

TEMPLATE = ROOT / "tests" / "fixtures" / "nsys" / "engine_dspark.sqlite"
PID = (1 << 48) | (4242 << 24)
TID = PID | 4243
BASE = 20_000_000_000  # ns since the session's start, as in a real capture
SPACING = 40_000  # ns from one launch call to the next on the thread (calls never overlap)
RANGES = ("prefill", "dspark_propose", "target_verify", "decode_sample")
REPORTS = ("nvtx_sum", "cuda_gpu_kern_sum", "cuda_api_sum", "nvtx_gpu_proj_sum", "cuda_gpu_mem_time_sum")


def build(out: Path, kernels: int, ranges: int) -> None:
    shutil.copy(TEMPLATE, out)
    conn = sqlite3.connect(out)
    conn.executescript("PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;")
    for table in ("NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL",
                  "CUPTI_ACTIVITY_KIND_MEMCPY", "StringIds"):
        conn.execute(f"DELETE FROM {table}")
    names = [f"void gen_kernel_{i}<float, {i % 7}>(T1 *, const T1 *, int)" for i in range(60)]
    strings = ["cudaLaunchKernel_v7000", *RANGES, *names]
    conn.executemany("INSERT INTO StringIds VALUES (?, ?)", enumerate(strings, start=1))
    per, first = kernels // ranges, 1 + len(RANGES) + 1
    conn.execute(f"""
        WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < {kernels})
        INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, nameId, returnValue)
        SELECT {BASE} + i * {SPACING}, {BASE} + i * {SPACING} + 200 + ((i * 2654435761) % 1000003) % 30000, 1, {TID}, i + 1,
               1, 0 FROM n""")
    conn.execute(f"""
        INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, correlationId, globalPid,
            demangledName, shortName, mangledName, launchType, cacheConfig, registersPerThread, gridX, gridY, gridZ,
            blockX, blockY, blockZ, staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal,
            gridId, sharedMemoryExecuted, sharedMemoryLimitConfig)
        SELECT start + 500, start + 500 + 1000 + ((correlationId * 2654435761) % 100003) % 4000 / 32 * 32, 0, 1, 7,
               correlationId, {PID}, {first} + correlationId % 60, {first} + correlationId % 60,
               {first} + correlationId % 60, 0, 0, 32 + correlationId % 96, 132 + correlationId % 1000, 1, 1,
               128, 1, 1, 1024, 49152, 0, 55050240, correlationId, 65536, 1
        FROM CUPTI_ACTIVITY_KIND_RUNTIME""")
    conn.execute(f"""
        WITH RECURSIVE n(j) AS (SELECT 0 UNION ALL SELECT j + 1 FROM n WHERE j + 1 < {ranges})
        INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, text)
        SELECT {BASE} + j * {per} * {SPACING} - 10 - (j * 7919) % 5000,
               {BASE} + (j * {per} + {per} - 1) * {SPACING} + 30300 + (j * 104729) % 7000, 59, {TID},
               CASE j % 4 WHEN 0 THEN 'prefill' WHEN 1 THEN 'dspark_propose' WHEN 2 THEN 'target_verify'
                          ELSE 'decode_sample' END FROM n""")
    conn.commit()
    conn.execute("VACUUM")
    conn.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "trace_1gb.sqlite")
    ap.add_argument("--kernels", type=int, default=7_500_000)
    ap.add_argument("--ranges", type=int, default=1_500_000)
    ap.add_argument("--nsys", help="also time `nsys stats` of the same reports on the same file, one at a time")
    ap.add_argument("--nsys-timeout", type=float, default=600, help="seconds allowed to each nsys report")
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.out.is_file():  # reused only when it holds what was asked for
        with sqlite3.connect(args.out) as conn:
            have = [conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                    for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS")]
        if have != [args.kernels, args.ranges]:
            raise SystemExit(f"{args.out} holds {have[0]} kernels and {have[1]} ranges; remove it or give other "
                             "--kernels/--ranges")
    else:
        build(args.out, args.kernels, args.ranges)
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    s = summarize(args.out)
    ours = time.perf_counter() - t0
    figures = {"file_bytes": args.out.stat().st_size, "kernels": s["launches"]["kernels"],
               "api_calls": sum(a["calls"] for a in s["api"]), "nvtx_ranges": sum(r["instances"] for r in s["nvtx"]),
               "build_s": round(built, 1), "summarize_s": round(ours, 1), "cpus": os.cpu_count(),
               "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
               "machine": platform.processor() or platform.machine()}
    if args.nsys:
        figures["nsys"] = subprocess.run([args.nsys, "--version"], capture_output=True, text=True).stdout.strip()
        figures["nsys_stats_s"] = {}
        with tempfile.TemporaryDirectory() as tmp:
            for report in REPORTS:
                t0 = time.perf_counter()
                try:
                    subprocess.run([args.nsys, "stats", "--report", report, "--format", "csv", "--output",
                                    str(Path(tmp) / "r"), str(args.out)], check=True, capture_output=True,
                                   timeout=args.nsys_timeout)
                    figures["nsys_stats_s"][report] = round(time.perf_counter() - t0, 1)
                except subprocess.TimeoutExpired:
                    figures["nsys_stats_s"][report] = f"> {args.nsys_timeout:g} (stopped)"
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

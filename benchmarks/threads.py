"""The README's main command at 1 and 2 intra-op threads, on an idle machine and beside competing
CPU-bound processes: the measurement behind `harness/runs/threads.py`'s default.

    python benchmarks/threads.py [--threads 1,2] [--competitors 0,1] [--num-prompts 8] [--limit-s 900]
        [--out benchmarks/results/threads_cpu.json]

Each cell runs `dspark-bench run --split qualitative --category coding --threads N` in a fresh
process and a fresh folder; a competitor is a Python busy loop, started before the run and stopped
after it. A run still going after `--limit-s` is stopped and recorded as such. Prints one JSON line
per cell and writes them all, with the machine's description, to `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.runs.provenance import provenance

BUSY = "import time\nend = time.monotonic() + {limit}\nwhile time.monotonic() < end:\n    pass\n"


def run_cell(threads: int, competitors: int, num_prompts: int, limit_s: float) -> dict:
    busy = [subprocess.Popen([sys.executable, "-c", BUSY.format(limit=limit_s + 60)]) for _ in range(competitors)]
    try:
        time.sleep(2 if competitors else 0)  # the competitors are running before the run starts
        load_before = os.getloadavg()[0]
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [str(Path(sys.executable).with_name("dspark-bench")), "run", "--split", "qualitative", "--category",
                   "coding", "--num-prompts", str(num_prompts), "--threads", str(threads), "--out", f"{tmp}/run",
                   "--json"]
            start = time.perf_counter()
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit_s,
                                      env={k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS",)})
                wall = time.perf_counter() - start
                finished = proc.returncode == 0
                summary = json.loads(proc.stdout) if finished else None
            except subprocess.TimeoutExpired:
                wall, finished, summary = time.perf_counter() - start, False, None
    finally:
        for p in busy:
            p.kill()
            p.wait()
    cell = {"threads": threads, "competitors": competitors, "num_prompts": num_prompts, "finished": finished,
            "wall_s": round(wall, 1), "limit_s": limit_s, "load_avg_before": load_before}
    if summary is not None:
        overall = {(r["system"], r["temperature"]): r for r in summary["rows"] if r["category"] == "overall"}
        cell["tpot_ms"] = {f"{s} T={t:g}": round(r["mean_tpot_ms"], 2) for (s, t), r in overall.items()}
        cell["speedup"] = {f"{s} T={t:g}": round(r["speedup"], 2) for (s, t), r in overall.items()
                           if r["speedup"] is not None and s != summary["baseline"]}
        cell["load_avg_max"] = summary["load_avg_max"]
    return cell


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--competitors", default="0,1")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--limit-s", type=float, default=900)
    ap.add_argument("--out", default="benchmarks/results/threads_cpu.json")
    args = ap.parse_args()
    cells = []
    for competitors in map(int, args.competitors.split(",")):
        for threads in map(int, args.threads.split(",")):
            cells.append(run_cell(threads, competitors, args.num_prompts, args.limit_s))
            print(json.dumps(cells[-1]), flush=True)
    Path(args.out).write_text(json.dumps({"cells": cells, "provenance": provenance("cpu")}, indent=1) + "\n")


if __name__ == "__main__":
    main()

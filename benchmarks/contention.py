"""Issue 33's contention case, this checkout against another source tree, alternated: three CPU-bound
processes started `--lead-s` seconds before `run --systems plain,dspark --num-prompts 3 --temperature 0
--category coding`, and the same run on the quiet machine.

    python benchmarks/contention.py --other-src /tmp/old [--repeats 2] [--busy 3] [--lead-s 20]
        [--out benchmarks/results/contention_cpu.json]

`--other-src` is a checkout of another revision (`git worktree add /tmp/old b15b89f`); it runs with
the same Python, the tree on PYTHONPATH. Each repeat: the busy processes start; after the lead, this
tree's run and the other's, in turn (their order alternates between repeats); the busy processes stop;
the two quiet runs, in the same order. Prints one JSON line per run (DSpark's speedup and interval, its
wall-time-only interval, plain decoding's TPOT, how many requests the run flagged as contended) and
writes them all, with the machine's description, to `--out`.
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

from harness.runs.provenance import git_revision, provenance
from threads import BUSY  # benchmarks/threads.py's competitor: the same busy loop

HERE = Path(__file__).resolve().parents[1]
RUN = ["run", "--split", "qualitative", "--category", "coding", "--systems", "plain,dspark", "--num-prompts", "3",
       "--temperature", "0", "--json"]


def one_run(src: Path, busy: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PYTHONPATH=str(src))
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "harness.cli", *RUN, "--out", f"{tmp}/run"], capture_output=True,
                              text=True, cwd=tmp, env=env, timeout=900)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"{src}: run failed: {proc.stderr[-2000:]}")
        summary = json.loads(proc.stdout)
    rows = {r["system"]: r for r in summary["rows"] if r["category"] == "overall"}
    dspark, plain = rows["dspark"], rows["plain"]
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=src, capture_output=True, text=True).stdout
    return {"src": str(src), "revision": rev.strip(), "busy_processes": busy, "wall_s": round(wall, 1),
            "speedup": dspark["speedup"], "speedup_ci95": dspark["speedup_ci95"],
            "speedup_ci95_timed": dspark.get("speedup_ci95_timed"), "plain_tpot_ms": plain["mean_tpot_ms"],
            "dspark_tpot_ms": dspark["mean_tpot_ms"], "contended_requests": summary.get("contended_requests"),
            "requests": summary["requests_done"], "warnings": summary.get("warnings", []),
            "load_avg_max": summary.get("load_avg_max")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--other-src", type=Path, required=True)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--busy", type=int, default=3)
    p.add_argument("--lead-s", type=float, default=20.0)
    p.add_argument("--out", type=Path, default=HERE / "benchmarks" / "results" / "contention_cpu.json")
    args = p.parse_args()
    results = []
    for rep in range(args.repeats):
        order = [HERE, args.other_src.resolve()][:: 1 if rep % 2 == 0 else -1]
        procs = [subprocess.Popen([sys.executable, "-c", BUSY.format(limit=3600)]) for _ in range(args.busy)]
        try:
            time.sleep(args.lead_s)
            for src in order:
                results.append(one_run(src, args.busy) | {"repeat": rep})
                print(json.dumps(results[-1]), flush=True)
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
        time.sleep(5)
        for src in order:
            results.append(one_run(src, 0) | {"repeat": rep})
            print(json.dumps(results[-1]), flush=True)
    args.out.write_text(json.dumps({"machine": provenance("cpu"), "git": git_revision(), "command": RUN,
                                    "busy_processes": args.busy, "lead_s": args.lead_s, "runs": results}, indent=1)
                        + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

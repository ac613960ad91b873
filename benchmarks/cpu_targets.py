"""Issue 43's targets for the CPU path, measured: `engine-bench --device cpu` eager and compiled, alternated
(eager, compiled, eager, compiled: each a fresh process), and optionally the README's main command timed twice.

    python benchmarks/cpu_targets.py [--runs 2] [--main-command 2] [--out benchmarks/results/cpu_targets.json]

Per mode and run it reads engine-bench's figures (each the median of 5 alternated passes, their range beside
it) and checks them against the targets: the plain step at least 40 % of the copy-rate limit and at least twice
transformers' `generate`, the draft step at most 0.55 of the plain step, a round at most 1.6 of it. Figures
that repeat: the runs of a mode agree within 10 % on every ratio (the largest over the smallest run). The
compiled mode's first run compiles into a fresh inductor cache (its compile seconds recorded), its later runs
read that cache. `--main-command N` times `dspark-bench run --split qualitative --category coding` N times in
fresh folders (the first on this machine's state as it is) and reads DSpark's T = 0 speedup and interval from
each run's summary. The load average before and after every measurement is recorded: run it on a quiet machine.
Random weights at the demo's shapes: these figures time the engine, not any draft's quality.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from harness.runs.provenance import provenance  # noqa: E402

TARGETS = {  # figure: (comparison, bound)
    "decode_fraction_of_limit": (">=", 0.40), "decode_over_hf": (">=", 2.0),
    "draft_over_decode": ("<=", 0.55), "round_over_decode": ("<=", 1.6),
}
RATIOS = ("decode_fraction_of_limit", "decode_over_hf", "verify8_over_decode", "draft_over_decode", "round_over_decode")
AGREE = 0.10


def engine_bench(compile: bool, cache: Path) -> dict:
    args = [sys.executable, "-m", "harness.cli", "engine-bench", "--device", "cpu", "--json"]
    env = os.environ | {"DSPARK_CACHE": str(cache)}
    load = os.getloadavg()[0]
    start = time.perf_counter()
    out = subprocess.run(args + (["--compile"] if compile else []), cwd=ROOT, env=env, check=True, capture_output=True,
                         text=True).stdout
    result = json.loads(out)
    result["decode_over_hf"] = result["decode_tok_s"] / result["hf_generate_tok_s"]
    return {"wall_s": time.perf_counter() - start, "load_before": load, "load_after": os.getloadavg()[0],
            "figures": {k: result[k] for k in RATIOS}, "ranges_ms": result["ranges_ms"],
            "ms": {k: result[k] for k in ("decode_ms", "verify8_ms", "draft_ms", "round_ms")},
            "hf_generate_tok_s": result["hf_generate_tok_s"], "compiled": result.get("compiled")}


def main_command(folder: Path) -> dict:
    args = [sys.executable, "-m", "harness.cli", "run", "--split", "qualitative", "--category", "coding", "--out",
            str(folder)]
    load = os.getloadavg()[0]
    start = time.perf_counter()
    subprocess.run(args, cwd=ROOT, check=True, capture_output=True)
    wall = time.perf_counter() - start
    rows = json.loads((folder / "summary.json").read_text())["rows"]
    dspark = next(r for r in rows if r["system"] == "dspark" and r["temperature"] == 0)
    return {"wall_s": wall, "load_before": load, "load_after": os.getloadavg()[0], "dspark_t0_speedup": dspark["speedup"],
            "dspark_t0_ci95": dspark["speedup_ci95"],
            "plain_t0_tpot_ms": next(r for r in rows if r["system"] == "plain" and r["temperature"] == 0)["mean_tpot_ms"],
            "dspark_t0_tpot_ms": dspark["mean_tpot_ms"]}


def verdicts(runs: list[dict]) -> dict:
    """Per target: each run's figure and whether every run meets it; per ratio: largest / smallest run - 1."""
    out = {}
    for name, (op, bound) in TARGETS.items():
        values = [r["figures"][name] for r in runs]
        met = all(v >= bound if op == ">=" else v <= bound for v in values)
        out[name] = {"target": f"{op} {bound}", "runs": values, "met": met}
    spread = {k: max(r["figures"][k] for r in runs) / min(r["figures"][k] for r in runs) - 1 for k in RATIOS}
    return {"targets": out, "spread": spread, "repeat_within_10pct": all(v <= AGREE for v in spread.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2, help="engine-bench runs per mode, alternated")
    ap.add_argument("--main-command", type=int, default=0, help="also time the README's main command this many times")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    result: dict = {"provenance": provenance("cpu"), "weights": "random normal(0, 0.02) (engine-bench), the demo pair "
                    "(main command)", "order": "eager, compiled, alternated", "modes": {"eager": [], "compiled": []}}
    with tempfile.TemporaryDirectory() as scratch:
        cache = Path(scratch) / "cache"  # a fresh inductor cache: the first compiled run compiles everything
        for i in range(args.runs):
            for mode in ("eager", "compiled"):
                run = engine_bench(mode == "compiled", cache)
                result["modes"][mode].append(run)
                print(json.dumps({"mode": mode, "run": i + 1} | {k: round(v, 3) for k, v in run["figures"].items()}
                                 | {"wall_s": round(run["wall_s"], 1), "load": round(run["load_before"], 2)}), flush=True)
        result["main_command"] = []
        for i in range(args.main_command):
            run = main_command(Path(scratch) / f"main{i}")
            result["main_command"].append(run)
            print(json.dumps({"main_command": i + 1} | {k: v for k, v in run.items()}), flush=True)
    result["verdicts"] = {mode: verdicts(runs) for mode, runs in result["modes"].items()}
    print(json.dumps(result["verdicts"], indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()

"""vLLM's DSpark with and without adaptive verification, from served runs of the two systems in opposite
orders (device.sh's `adaptive` stage): the table of `harness.analysis.policy_sweep`.

    python benchmarks/vllm_adaptive.py RUN_AB RUN_BA [--all dspark] [--adaptive dspark-schedule] [--json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from harness.analysis.policy_sweep import compare


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", type=Path, nargs="+")
    p.add_argument("--all", default="dspark", help="the system that verifies every draft")
    p.add_argument("--adaptive", default="dspark-schedule", help="the system with adaptive verification")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rows = compare(args.runs, args.all, args.adaptive)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    a, b = args.all, args.adaptive
    print(f"{'T':>3} {'c':>3}  {a + ' tok/s':>18}  {b + ' tok/s':>18}  {'ratio per run':>14} {'geomean':>7}  "
          f"{'AL':>11}  {'verified/round':>14}  T=0 same tokens (between systems; {a} run to run)")
    for r in rows:
        eq, ctl = r["greedy_equal"], r[f"greedy_equal_{a}_run_to_run"]
        print(f"{r['temperature']:>3g} {r['concurrency']:>3}  {'/'.join(f'{v:.0f}' for v in r[a + '_tok_s']):>18}  "
              f"{'/'.join(f'{v:.0f}' for v in r[b + '_tok_s']):>18}  "
              f"{'/'.join(f'{v:.3f}' for v in r['ratio_per_run']):>14} {r['ratio_geomean']:>7.3f}  "
              f"{fmt(r[a + '_al'])}/{fmt(r[b + '_al'])}  "
              f"{fmt(r[a + '_verified_per_round'])}/{fmt(r[b + '_verified_per_round'])}  "
              f"{'-' if eq is None else f'{eq[0]}/{eq[1]}'}; {'-' if ctl is None else f'{ctl[0]}/{ctl[1]}'}")


if __name__ == "__main__":
    main()

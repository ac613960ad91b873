"""What each proposal-length policy buys, replayed on a run's recorded full-block rounds against a cost
table (`harness.analysis.policies`): all drafts, DeepSpec's thresholds, the prefix scheduler (and with
STS temperatures). Costs come from an `engine-bench --json` file (`round_by_verified_ms`: Qwen3-8B shapes
on the GPU) or from the run's own start-up measurement (`schedule_costs_ms` in its manifest).

    python benchmarks/confidence_policies.py RUN [--engine-bench FILE] [--sts FILE] [--system dspark] [--json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from harness.analysis import calibration, policies
from harness.analysis.frames import load_runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--engine-bench", type=Path, help="costs: round_by_verified_ms of this engine-bench --json file")
    ap.add_argument("--sts", type=Path, help="temperatures written by dspark-bench calibrate --fit-sts (applied to the "
                    "rows of the sampling temperature they were fitted at)")
    ap.add_argument("--system", default="dspark")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.engine_bench:
        bench = json.loads(args.engine_bench.read_text())
        if "round_by_verified_ms" not in bench:
            raise SystemExit(f"{args.engine_bench} has no round_by_verified_ms: write it with dspark-bench engine-bench "
                             "--json (a draft with a confidence head)")
        costs, source = bench["round_by_verified_ms"], f"{args.engine_bench} ({bench.get('device_name')})"
    else:
        manifest = json.loads((args.run / "manifest.json").read_text())
        found = (manifest.get("backend") or {}).get("schedule_costs_ms") or {}
        if not found:
            raise SystemExit(f"{args.run} measured no cost table (only a confidence = \"schedule\" system does): give "
                             "--engine-bench FILE, from dspark-bench engine-bench --json")
        costs, source = next(iter(found.values())), f"{args.run} start-up measurement"
    sts = json.loads(args.sts.read_text()) if args.sts else None
    out = []
    for (run, system, temp), r in calibration.groups(load_runs([args.run]).rounds).items():
        if system == args.system:
            temps = sts["temperatures"] if sts and sts.get("temperature", temp) == temp else None  # (fitted per T)
            out.append({"system": system, "temperature": temp, "costs_ms": costs, "costs_from": source,
                        "policies": policies.compare(r, costs, temperatures=temps)})
    if args.json:
        print(json.dumps(out))
        return
    for g in out:
        print(f"\n{g['system']} T={g['temperature']:g}; costs (ms, 0..N drafts verified) from {g['costs_from']}: "
              + " ".join(f"{c:.3f}" for c in g["costs_ms"]))
        print(f"{'policy':<16} {'rounds':>6} {'AL':>6} {'verified':>8} {'tok/ms':>8} {'vs all':>7}")
        for p in g["policies"]:
            print(f"{p['policy']:<16} {p['rounds']:>6} {p['acceptance_length']:>6.3f} {p['verified_per_round']:>8.2f} "
                  f"{p['tokens_per_cost']:>8.4f} {p['vs_full']:>7.3f}")


if __name__ == "__main__":
    main()

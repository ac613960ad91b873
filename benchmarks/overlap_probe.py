"""The products launched as programmatic dependents (issue 44) or plainly: the plain decode step and verify of 8
at Qwen3-8B shapes (random bf16 weights, 1k context), each captured once per mode and the captures replayed in
alternated passes (off, on, off, on, ...); each figure the median of its pass medians with their range. Also
checks that both modes' decode steps sample the same token and write the same cache. Random weights time the
engine; they say nothing of any draft's quality.

    PYTHONPATH=$PWD python benchmarks/overlap_probe.py [--modes 0 1] [--context 1024] [--passes 5]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from dspark import kernels
from dspark.presets import TARGETS, build_random
from harness.backends.timing import cuda_median_ms
from harness.microbench.step_timers import decode_step, verify_step
from harness.runs.provenance import provenance


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--target", default="qwen3-8b")
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    with torch.inference_mode():
        target, _ = build_random(TARGETS[args.target], None, "cuda", torch.bfloat16)
        prompt = torch.randint(0, 1000, (args.context,), generator=torch.Generator().manual_seed(0)).tolist()
        steps = {}
        for mode in args.modes:
            with kernels.overlap_mode(bool(mode)):
                decode, reset, engine = decode_step(target, prompt, graphs=True)
                steps[mode] = {"decode": (decode, reset, engine), "verify8": verify_step(target, (1, 2), prompt, 8)}
        same = check_same(steps)
        times = {mode: {"decode_ms": [], "verify8_ms": []} for mode in args.modes}
        for _ in range(args.passes):
            for mode, s in steps.items():
                decode, reset, _ = s["decode"]
                times[mode]["decode_ms"].append(cuda_median_ms(decode, args.repeats, reset))
                times[mode]["verify8_ms"].append(cuda_median_ms(s["verify8"], args.repeats))
    out = {"provenance": provenance("cuda"), "target": args.target, "context": args.context, "weights": "random bf16",
           "order": "modes alternated within each pass", "same_outputs": same, "modes": {}}
    for mode, figs in times.items():
        out["modes"][str(mode)] = {k: {"median": statistics.median(v), "range": [min(v), max(v)]} for k, v in figs.items()}
    print(json.dumps(out, indent=1))


def check_same(steps: dict) -> bool:
    """One decode step of each capture from the same state (anchor, position, RNG offset): the same sampled
    token and the same K rows in the last layer's cache."""
    outs = []
    for s in steps.values():
        decode, reset, engine = s["decode"]
        engine.state.anchor.fill_(7)
        reset()
        decode()
        torch.cuda.synchronize()
        pos = int(engine.state.position)
        outs.append((engine.state.anchor.clone(), engine.cache.k[-1][..., :pos, :].clone()))
    return all(torch.equal(a[0], outs[0][0]) and torch.equal(a[1], outs[0][1]) for a in outs[1:])


if __name__ == "__main__":
    main()

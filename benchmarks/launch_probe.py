"""The products launched as programmatic dependents (`DSPARK_OVERLAP`, mode 1) or plainly (mode 0), timed against
each other at Qwen3-8B shapes (random bf16 weights, 1k context). Per mode: the attention halves of all layers alone
(the q/k/v product, then the q/k norm, attention and o_proj; per layer), the plain decode step and verify of 8, each
captured once per mode and the captures replayed in alternated passes (off, on, off, on, ...); each figure the
median of its pass medians with their range. Also checks that both modes' decode steps sample the same token and
how far apart the caches they write are (bit-equal). Random weights time the engine; they say nothing of any
draft's quality. (Issue 44's `--setting persistent`, the attention half as one persistent launch, went with that
launch in issue 53; benchmarks/RESULTS.md keeps its figures.)

    PYTHONPATH=$PWD python benchmarks/launch_probe.py [--modes 0 1] [--passes 5]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from dspark import kernels
from dspark.models.layers import AttentionStep
from dspark.synthetic.presets import TARGETS, build_random
from harness.backends.timing import cuda_median_ms
from harness.engine_bench.step_timers import decode_step, verify_step
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
                steps[mode] = {"decode": (decode, reset, engine), "verify8": verify_step(target, (1, 2), prompt, 8),
                               "attention_halves": attention_halves(target, args.context)}
        same = compare(steps)
        times = {mode: {"attention_half_ms": [], "decode_ms": [], "verify8_ms": []} for mode in args.modes}
        layers = len(target.model.layers)
        for _ in range(args.passes):
            for mode, s in steps.items():
                decode, reset, _ = s["decode"]
                times[mode]["attention_half_ms"].append(cuda_median_ms(s["attention_halves"], args.repeats) / layers)
                times[mode]["decode_ms"].append(cuda_median_ms(decode, args.repeats, reset))
                times[mode]["verify8_ms"].append(cuda_median_ms(s["verify8"], args.repeats))
    out = {"provenance": provenance("cuda"), "setting": "overlap", "target": args.target, "context": args.context,
           "weights": "random bf16", "order": "modes alternated within each pass", **same, "modes": {}}
    for mode, figs in times.items():
        out["modes"][str(mode)] = {k: {"median": statistics.median(v), "range": [min(v), max(v)]} for k, v in figs.items()}
    print(json.dumps(out, indent=1))


def attention_halves(target, context: int):
    """A graph of every layer's attention half for one decode row at `context` (its q/k/v product, then attention
    through o_proj and the residual add), each layer with its own weights, as a decode step streams them."""
    cfg = target.config.backbone
    cache = target.new_cache(context + 16)
    pos = torch.tensor([[context]], device="cuda")
    step = AttentionStep.build(pos, pos, context + 1, cfg, torch.bfloat16, tables=cache.rope)
    x = torch.randn(1, 1, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)

    def run():
        y = x
        for i, layer in enumerate(target.model.layers):
            qkv = layer.self_attn.project_normed(y, layer.input_layernorm)
            y = layer.self_attn(qkv, step, cache, i, residual=y)

    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()

    def replay():  # holds the cache, the step and x: the graph reads their memory
        graph.replay()
        return cache, step, x

    return replay


def compare(steps: dict) -> dict:
    """One decode step of each capture from the same state (anchor, position, RNG offset): whether they sample the
    same token, and the largest relative difference between the K rows they leave in the last layer's cache."""
    outs = []
    for s in steps.values():
        decode, reset, engine = s["decode"]
        engine.state.anchor.fill_(7)
        reset()
        decode()
        torch.cuda.synchronize()
        pos = int(engine.state.position)
        outs.append((engine.state.anchor.clone(), engine.cache.k[-1][..., :pos, :].float()))
    return {"same_token": all(torch.equal(a[0], outs[0][0]) for a in outs[1:]),
            "cache_rel_diff": max([float((a[1] - outs[0][1]).norm() / outs[0][1].norm()) for a in outs[1:]], default=0.0)}


if __name__ == "__main__":
    main()

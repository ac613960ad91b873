"""Prefill time: the target's forward over a prompt from position 0, and the engine's time to first token.

A prefill from position 0 (`positions=None`) runs attention as SDPA's causal kernel with no mask built;
the same forward given explicit positions runs the masked path that verification uses. This times both
per prompt length, with their relative difference ||causal - masked|| / ||masked|| as a check, then the
engine's TTFT (`GenerationResult.prefill_s`: prefill, first token sampled, and for a drafter its start
on the tapped features), plain and with a DSpark draft. The forward's FLOPs (linear layers plus causal
attention, no LM head) over the time give TFLOP/s, set beside a bf16 matrix product of 8192^3 timed in
the same run: the machine's own ceiling. Eager, as the engine runs a prefill: short prompts are bound by
kernel launches, not by the GPU.

    python benchmarks/prefill_bench.py [--target qwen3-8b] [--lengths 512 2048 8192] [--json out.json]
    python benchmarks/prefill_bench.py --target demo --device cpu --lengths 64 256   # a CPU smoke run

Random weights at the published shapes (`dspark.presets`), or the shipped demo pair with `--target demo`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from dspark.checkpoint import load_draft, load_target
from dspark.config import BackboneConfig
from dspark.drafters import BlockDrafter
from dspark.engine import Engine, GenerationConfig
from dspark.presets import DRAFTS, TARGETS, build_random
from harness.provenance import provenance


def forward_flops(b: BackboneConfig, length: int) -> float:
    """Multiply-adds x 2 of one prefill forward: every decoder layer's linears, plus QK^T and PV over the
    causal half of the length x length scores."""
    q, kv = b.num_heads * b.head_dim, b.num_kv_heads * b.head_dim
    linear = b.hidden_size * (2 * q + 2 * kv) + 3 * b.hidden_size * b.intermediate_size
    attention = 2 * b.num_heads * b.head_dim * length * (length + 1)  # 2 products x 2 flops x (L(L+1)/2) x heads x d
    return b.num_layers * (2 * linear * length + attention)


def median_s(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    fn()  # warm-up: kernels chosen and compiled outside the timing
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_ceiling_tflops(device: torch.device, dtype: torch.dtype, n: int = 8192) -> float | None:
    if device.type != "cuda":
        return None
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    return 2 * n**3 / median_s(lambda: a @ b, device, 10) / 1e12


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen3-8b", choices=[*TARGETS, "demo"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 2048, 8192, 16384])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    device = torch.device(args.device)
    if args.target == "demo":
        target = load_target("demo", device).model
        draft = load_draft("demo-dspark", target).model
    else:
        draft_cfg = DRAFTS[f"dspark-{args.target}-block7"]() if f"dspark-{args.target}-block7" in DRAFTS else None
        target, draft = build_random(TARGETS[args.target], draft_cfg, args.device, torch.bfloat16)
    b = target.config.backbone
    dtype = target.lm_head.weight.dtype
    ceiling = matmul_ceiling_tflops(device, dtype)
    engines = {"plain": Engine(target)} | ({"dspark": Engine(target, BlockDrafter(draft))} if draft is not None else {})
    gen = torch.Generator().manual_seed(0)
    rows = []
    for n in args.lengths:
        ids = torch.randint(0, min(b.vocab_size, 100_000), (1, n), generator=gen).to(device)
        positions = torch.arange(n, device=device)[None]
        cache = target.new_cache(n + 1)
        causal = target(ids, None, cache, n)[0]
        masked = target(ids, positions, cache, n)[0]
        row = {"length": n, "rel_diff": ((causal.float() - masked.float()).norm() / masked.float().norm()).item(),
               "causal_ms": median_s(lambda: target(ids, None, cache, n), device, args.reps) * 1e3,
               "masked_ms": median_s(lambda: target(ids, positions, cache, n), device, args.reps) * 1e3}
        row["causal_tflops"] = forward_flops(b, n) / row["causal_ms"] / 1e9
        cfg = GenerationConfig(max_new_tokens=1)
        for name, engine in engines.items():
            engine.generate(ids[0].tolist(), cfg)  # allocates and captures outside the timing
            row[f"ttft_{name}_ms"] = statistics.median(
                engine.generate(ids[0].tolist(), cfg).prefill_s for _ in range(args.reps)) * 1e3
            engine.release()
        rows.append(row)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    out = {"target": args.target, "dtype": str(dtype), "matmul_ceiling_tflops": ceiling, "rows": rows,
           "provenance": provenance(args.device)}
    print(f"\n{'length':>7} {'causal ms':>10} {'masked ms':>10} {'x':>5} {'TFLOP/s':>8} {'of ceiling':>10} "
          + " ".join(f"{'TTFT ' + name + ' ms':>16}" for name in engines))
    for r in rows:
        share = f"{r['causal_tflops'] / ceiling:.0%}" if ceiling else "-"
        print(f"{r['length']:>7} {r['causal_ms']:>10.2f} {r['masked_ms']:>10.2f} {r['masked_ms'] / r['causal_ms']:>5.2f} "
              f"{r['causal_tflops']:>8.1f} {share:>10} " + " ".join(f"{r[f'ttft_{name}_ms']:>16.2f}" for name in engines))
    if ceiling:
        print(f"ceiling: bf16 matrix product 8192^3 in this run, {ceiling:.0f} TFLOP/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()

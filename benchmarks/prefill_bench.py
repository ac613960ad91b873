"""Prefill time: the target's forward over a prompt from position 0, and the engine's time to first token.

A prefill from position 0 (`positions=None`) runs attention as SDPA's causal kernel with no mask built
(in half precision). The same forward given explicit positions runs SDPA with a boolean mask, the path of
any forward of more than 16 query rows per sequence at explicit positions, and the prefill's path before
the causal one. Per prompt length this times both, with their relative difference
||causal - masked|| / ||masked|| (reported, not asserted), then the engine's time to first token
(`GenerationResult.prefill_s`: prefill, first token sampled, and for a drafter its start on the tapped
features), plain and with a DSpark draft, the two interleaved; and the draft's start alone. The forward's
FLOPs (linear layers plus causal attention, no LM head) over its time give TFLOP/s, set beside an 8192^3
matrix product in the target's dtype timed by CUDA events in the same run: the machine's own ceiling.
Times are medians with their minimum and maximum; eager, as the engine runs a prefill.

`--fp32-lengths` also runs those lengths with the same weights in float32 (TF32 off) and gives each
path's relative distance from it: how much of the causal-masked gap is the half precision's own rounding.

    python benchmarks/prefill_bench.py [--target qwen3-8b] [--lengths 512 2048 8192] [--fp32-lengths 512] [--json F]
    python benchmarks/prefill_bench.py --target demo --device cpu --lengths 64 256   # a CPU smoke run

Random weights at the published shapes (`dspark.synthetic.presets`), or the shipped demo pair with `--target demo`.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from torch import Tensor

from dspark.checkpoint import load_draft, load_target
from dspark.drafters import BlockDrafter
from dspark.engine import Engine, GenerationConfig
from dspark.models.config import BackboneConfig
from dspark.models.target import Qwen3Target
from dspark.synthetic.presets import DRAFTS, TARGETS, build_random
from harness.backends.timing import cuda_median_ms, host_times_ms
from harness.runs.provenance import provenance


def forward_flops(b: BackboneConfig, length: int) -> float:
    """Multiply-adds x 2 of one prefill forward: every decoder layer's linears, plus QK^T and PV over the
    causal half of the length x length scores."""
    q, kv = b.num_heads * b.head_dim, b.num_kv_heads * b.head_dim
    linear = b.hidden_size * (2 * q + 2 * kv) + 3 * b.hidden_size * b.intermediate_size
    attention = 2 * b.num_heads * b.head_dim * length * (length + 1)  # 2 products x 2 flops x (L(L+1)/2) x heads x d
    return b.num_layers * (2 * linear * length + attention)


def summary(times_ms: list[float]) -> dict[str, float]:
    return {"median": statistics.median(times_ms), "min": min(times_ms), "max": max(times_ms)}


def relative(a: Tensor, b: Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def matmul_ceiling_tflops(device: torch.device, dtype: torch.dtype, n: int = 8192) -> float | None:
    if device.type != "cuda":
        return None
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    return 2 * n**3 / cuda_median_ms(lambda: a @ b, 10) / 1e9


def ttft_ms(engines: dict[str, Engine], ids: list[int], reps: int) -> dict[str, dict[str, float]]:
    """Each engine's `prefill_s`, the engines taking turns, after one request each that allocates and
    captures its graphs."""
    cfg = GenerationConfig(max_new_tokens=1)
    times = {name: [] for name in engines}
    for i in range(reps + 1):
        for name, engine in engines.items():
            prefill_s = engine.generate(ids, cfg).prefill_s
            if i:
                times[name].append(prefill_s * 1e3)
    return {name: summary(t) for name, t in times.items()}


def fp32_distances(target: Qwen3Target, outputs: dict[int, tuple[Tensor, Tensor, Tensor]]) -> dict[int, dict]:
    """Per length, each path's relative distance from the same weights in float32 with TF32 off. The
    weights are converted in place and back, which is exact from bf16 or fp16."""
    dtype, tf32 = target.lm_head.weight.dtype, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    target.float()
    try:
        found = {}
        for n, (ids, causal, masked) in outputs.items():
            ref = target(ids, torch.arange(n, device=ids.device)[None], target.new_cache(n + 1), n)[0]
            found[n] = {"causal_vs_fp32": relative(causal, ref), "masked_vs_fp32": relative(masked, ref)}
        return found
    finally:
        target.to(dtype)
        torch.backends.cuda.matmul.allow_tf32 = tf32


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen3-8b", choices=[*TARGETS, "demo"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 2048, 8192, 16384])
    ap.add_argument("--fp32-lengths", type=int, nargs="*", default=[], help="lengths (of --lengths) to check in float32")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    device = torch.device(args.device)
    if args.target == "demo":
        target = load_target("demo", device).model
        draft = load_draft("demo-dspark", target).model
    else:
        name = f"dspark-{args.target}-block7"
        draft_cfg = DRAFTS[name]() if name in DRAFTS else None
        target, draft = build_random(TARGETS[args.target], draft_cfg, args.device, torch.bfloat16)
    b = target.config.backbone
    dtype = target.lm_head.weight.dtype
    ceiling = matmul_ceiling_tflops(device, dtype)
    engines = {"plain": Engine(target)} | ({"dspark": Engine(target, BlockDrafter(draft))} if draft is not None else {})
    gen = torch.Generator().manual_seed(0)
    rows, kept = [], {}
    for n in args.lengths:
        ids = torch.randint(0, b.vocab_size, (1, n), generator=gen).to(device)
        positions = torch.arange(n, device=device)[None]
        cache = target.new_cache(n + 1)
        causal = target(ids, None, cache, n)[0]
        masked = target(ids, positions, cache, n)[0]
        if n in args.fp32_lengths:
            kept[n] = (ids, causal, masked)
        row = {"length": n, "rel_diff": relative(causal, masked),
               "causal_ms": summary(host_times_ms(lambda: target(ids, None, cache, n), args.reps, device=device)),
               "masked_ms": summary(host_times_ms(lambda: target(ids, positions, cache, n), args.reps, device=device))}
        row["causal_tflops"] = forward_flops(b, n) / row["causal_ms"]["median"] / 1e9
        row["ttft_ms"] = ttft_ms(engines, ids[0].tolist(), args.reps)
        if "dspark" in engines:
            drafter, state = engines["dspark"].drafter, engines["dspark"].state
            feats = target(ids, None, cache, n, drafter.taps)[1]
            row["draft_start_ms"] = summary(host_times_ms(lambda: drafter.start(state, feats, ids), args.reps, device=device))
        for engine in engines.values():
            engine.release()
        rows.append(row)
        print(json.dumps(row), flush=True)
    distances = fp32_distances(target, kept) if kept else {}
    for row in rows:
        row |= distances.get(row["length"], {})
    out = {"target": args.target, "dtype": str(dtype), "matmul_ceiling_tflops": ceiling, "rows": rows,
           "provenance": provenance(args.device)}
    columns = [(f"TTFT {name}", lambda r, name=name: r["ttft_ms"][name]) for name in engines]
    if "dspark" in engines:
        columns.append(("draft start", lambda r: r["draft_start_ms"]))
    print(f"\n{'length':>7} {'causal ms':>10} {'masked ms':>10} {'x':>5} {'TFLOP/s':>8} {'of ceiling':>10} {'rel diff':>9} "
          + " ".join(f"{label:>16}" for label, _ in columns))
    for r in rows:
        share = f"{r['causal_tflops'] / ceiling:.0%}" if ceiling else "-"
        cells = [cell(r)["median"] for _, cell in columns]
        print(f"{r['length']:>7} {r['causal_ms']['median']:>10.2f} {r['masked_ms']['median']:>10.2f} "
              f"{r['masked_ms']['median'] / r['causal_ms']['median']:>5.2f} {r['causal_tflops']:>8.1f} {share:>10} "
              f"{r['rel_diff']:>9.4f} " + " ".join(f"{c:>16.2f}" for c in cells))
    if ceiling:
        print(f"ceiling: {dtype} matrix product 8192^3 in this run, {ceiling:.0f} TFLOP/s")
    for n, d in distances.items():
        print(f"float32 check at {n}: causal {d['causal_vs_fp32']:.4f}, masked {d['masked_vs_fp32']:.4f} from float32")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()

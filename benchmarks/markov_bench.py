"""How close the Markov loop's slot kernel comes to streaming w2 at the GPU's rate, by launch shape.

The vanilla Markov head's slot k needs w2 @ w1[prev_k] over the whole draft vocabulary, so each of the
7 slots reads w2 (151,936 x 256 bf16, 77.8 MB at Qwen3-8B shapes) once. This times the 7 slot launches
of `kernels.markov_sample` (captured in a CUDA graph, so no launch gaps count) for several programs'
widths, rank tiles and warp counts, against one read of w2 by cuBLAS's matrix-vector product and a
plain device copy of it. Prints one JSON line per shape; the fastest shape is what the kernel should use.

    python benchmarks/markov_bench.py [--reps 50]
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch

from dspark.kernels import sampling as S
from dspark.kernels.launch import triton


def graph_time(fn, reps: int) -> float:
    """Median milliseconds of one replay of `fn` captured in a CUDA graph."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--greedy", action="store_true", help="T = 0 (no noise, no softmax partials); default T = 1")
    args = ap.parse_args()
    dev, n, vocab, target_vocab, rank = "cuda", 7, 151936, 152064, 256
    gen = torch.Generator(device=dev).manual_seed(0)
    logits = torch.randn(n, vocab, device=dev, generator=gen)
    w1 = (torch.randn(target_vocab, rank, device=dev, generator=gen) * 0.05).bfloat16()
    w2 = (torch.randn(vocab, rank, device=dev, generator=gen) * 0.05).bfloat16()
    to_target = torch.arange(vocab, device=dev)
    anchor = torch.tensor([3], device=dev)
    noise = None if args.greedy else torch.empty(n, vocab, device=dev).exponential_(generator=gen)
    temperature = 0.0 if args.greedy else 1.0
    w2_bytes = w2.numel() * w2.element_size()
    e = w1[5].clone()
    copy = torch.empty_like(w2)
    base = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "w2_mb": w2_bytes / 1e6, "temperature": temperature}
    mv_ms = graph_time(lambda: torch.mv(w2, e), args.reps)
    copy_ms = graph_time(lambda: copy.copy_(w2), args.reps)
    print(json.dumps(base | {"what": "cuBLAS w2 @ e (one read)", "ms": mv_ms, "tbps": w2_bytes / mv_ms / 1e9}))
    print(json.dumps(base | {"what": "copy of w2 (read + write)", "ms": copy_ms, "tbps": 2 * w2_bytes / copy_ms / 1e9}))
    whole = graph_time(lambda: S.markov_sample(logits, w1, w2, to_target, anchor, noise, temperature, args.greedy),
                       args.reps)
    print(json.dumps(base | {"what": "kernels.markov_sample as shipped (7 slots + q)", "ms": whole,
                             "block": S.MARKOV_BLOCK}))
    x = logits.float().contiguous()
    corrected, prevs = torch.empty_like(x), torch.empty(n, dtype=torch.long, device=dev)
    noise_arg = x if noise is None else noise
    inv_t = 0.0 if args.greedy else 1.0 / temperature
    for block, rb, warps in itertools.product((128, 256, 512, 1024), (32, 64), (4, 8)):
        nb = triton.cdiv(vocab, block)
        parts = torch.empty(4, n, nb, dtype=torch.float32, device=dev)

        def slots(block=block, rb=rb, warps=warps, nb=nb, parts=parts):
            for k in range(n):
                S._markov_sample_kernel[(nb,)](
                    x, w1, w2, to_target, anchor, noise_arg, parts, corrected, prevs, k, vocab, n, nb, temperature,
                    inv_t, RANK=rank, RB=rb, BLOCK=block, NBP=triton.next_power_of_2(nb), NOISE=noise is not None,
                    SOFTMAX=not args.greedy, num_warps=warps)
        try:
            ms = graph_time(slots, args.reps)
        except Exception as exc:  # a shape the compiler refuses (registers, shared memory): reported, not fatal
            print(json.dumps(base | {"what": "slots", "block": block, "rb": rb, "warps": warps,
                                     "error": f"{type(exc).__name__}: {str(exc)[:200]}"}))
            continue
        print(json.dumps(base | {"what": "slots", "block": block, "rb": rb, "warps": warps, "programs": nb,
                                 "ms": ms, "us_per_slot": 1e3 * ms / n, "tbps": n * w2_bytes / ms / 1e9}), flush=True)


if __name__ == "__main__":
    main()

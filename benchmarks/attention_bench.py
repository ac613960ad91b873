"""Attention over the KV cache: the split-KV Triton kernel against PyTorch's SDPA, by query rows.

`kernels.attention` sends a forward with at most `SPLIT_KV_MAX_QUERIES` query rows per sequence to the
split-KV kernel and the rest to SDPA; this prints, per shape, the microseconds of each candidate so
that the crossover can be read off:

- `split_kv`: our Triton kernel (one program per query row and KV head);
- `sdpa_mask_repeat`: SDPA with the boolean mask over K/V repeated to the query heads (what
  `kernels.attention_ref` does in float32);
- `sdpa_mask_gqa`: SDPA with the mask and `enable_gqa` (what it does in half precision);
- `sdpa_causal`: SDPA with `is_causal=True` (flash): what a half-precision prefill from position 0 runs.

Shapes: the demo trainer's target pass (float32, batch 32, 4/2 heads of 64, 450 rows) and a
Qwen3-8B-like layer in bfloat16 (32/8 heads of 128) from decode-sized to prefill-sized query counts.

    python benchmarks/attention_bench.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from dspark import kernels as K
from harness.runs.provenance import provenance

SHAPES = [  # (name, batch, q heads, kv heads, head dim, query rows, keys, dtype)
    ("demo-train-target", 32, 4, 2, 64, 450, 450, torch.float32),
    ("qwen3-8b-verify", 1, 32, 8, 128, 8, 2048, torch.bfloat16),
    ("qwen3-8b-16", 1, 32, 8, 128, 16, 2048, torch.bfloat16),
    ("qwen3-8b-32", 1, 32, 8, 128, 32, 2048, torch.bfloat16),
    ("qwen3-8b-64", 1, 32, 8, 128, 64, 2048, torch.bfloat16),
    ("qwen3-8b-prefill-512", 1, 32, 8, 128, 512, 512, torch.bfloat16),
    ("qwen3-8b-prefill-4096", 1, 32, 8, 128, 4096, 4096, torch.bfloat16),
]


def time_us(fn, reps: int = 20) -> float:
    """Microseconds per call, replayed from a CUDA graph (as the engine runs decoding), so that Python's
    launch cost does not hide the kernels' own time."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / reps


def bench(name, b, hq, hkv, d, t, kv_len, dtype) -> dict:
    q = torch.randn(b, hq, t, d, device="cuda", dtype=dtype)
    ck, cv = (torch.randn(b, hkv, kv_len, d, device="cuda", dtype=dtype) for _ in range(2))
    limits = (kv_len - t + torch.arange(t, device="cuda"))[None].expand(b, t).contiguous()  # causal, last rows
    mask = (torch.arange(kv_len, device="cuda") <= limits[..., None])[:, None]
    rep = hq // hkv
    fns = {
        "split_kv": lambda: K.split_kv_attention(q, ck, cv, limits, kv_len),
        "sdpa_mask_repeat": lambda: F.scaled_dot_product_attention(q, ck.repeat_interleave(rep, 1),
                                                                   cv.repeat_interleave(rep, 1), attn_mask=mask),
        "sdpa_mask_gqa": lambda: F.scaled_dot_product_attention(q, ck, cv, attn_mask=mask, enable_gqa=True),
    }
    if t == kv_len:
        fns["sdpa_causal"] = lambda: F.scaled_dot_product_attention(q, ck, cv, is_causal=True, enable_gqa=True)
    ref = K.attention_ref(q, ck, cv, limits, kv_len).float()
    row = {"shape": name, "batch": b, "heads": f"{hq}/{hkv}", "head_dim": d, "queries": t, "keys": kv_len,
           "dtype": str(dtype).removeprefix("torch.")}
    for key, fn in fns.items():
        err = float((fn().float() - ref).norm() / ref.norm())
        row[key + "_us"] = round(time_us(fn), 1)
        row[key + "_rel_err"] = float(f"{err:.2e}")
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the rows and provenance to this file")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = [bench(*shape) for shape in SHAPES]
    for row in rows:
        timings = "  ".join(f"{k.removesuffix('_us')}={v}" for k, v in row.items() if k.endswith("_us"))
        print(f"{row['shape']:<24} q={row['queries']:<5} kv={row['keys']:<5} {row['dtype']:<9} {timings}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "split_kv_max_queries": K.SPLIT_KV_MAX_QUERIES,
                       "provenance": provenance("cuda")}, f, indent=1)


if __name__ == "__main__":
    main()

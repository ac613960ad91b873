"""What folding a layer's small operations into the matrix-vector kernel buys, per Qwen3-8B decode projection.

For each Qwen3-8B decode projection (M = 1, bf16) this captures a CUDA graph of 8 back-to-back calls on
8 copies of the weight (so no call finds its weight in L2) and reports the median time per call and the
weight bandwidth: for q/k/v and gate/up the RMSNorm as a kernel of its own before the product, or inside
it as the engine runs it (and for gate/up SiLU*mul as a kernel of its own, or in the epilogue); for
o_proj and down the product alone, or with the residual add in its epilogue as the engine runs it. The
recorded runs in `gemv_fusion_h200*.jsonl` (older API) also compared programmatic dependent launch and
a norm in the product's prologue that reduced every step, both since removed (benchmarks/RESULTS.md).

    python benchmarks/gemv_fusion_bench.py
"""

from __future__ import annotations

import json
import statistics

import torch

from dspark import kernels as K

HIDDEN, INTER = 4096, 12288
CALLS = 8


def graph_us(fn, reps: int = 30) -> float:
    """Median microseconds per call of `fn(i)` over CALLS calls replayed from one CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(CALLS):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(CALLS):
            fn(i)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / CALLS)
    return statistics.median(times)


@torch.inference_mode()
def main() -> None:
    torch.manual_seed(0)
    dt = torch.bfloat16
    x = torch.randn(1, HIDDEN, device="cuda", dtype=dt)
    r = torch.randn(1, HIDDEN, device="cuda", dtype=dt)
    nw = torch.rand(HIDDEN, device="cuda", dtype=dt) + 0.5
    act = torch.randn(1, INTER, device="cuda", dtype=dt)
    shapes = {"qkv": (6144, HIDDEN), "o_proj": (HIDDEN, HIDDEN), "gate_up": (2 * INTER, HIDDEN),
              "down": (HIDDEN, INTER), "lm_head": (151936, HIDDEN)}
    rows = []
    for name, (n, k) in shapes.items():
        ws = [torch.randn(n, k, device="cuda", dtype=dt) * 0.02 for _ in range(CALLS)]
        nbytes = n * k * 2
        a = act if k == INTER else x
        cases = {"product": lambda i: K.linear(a, ws[i])}
        if name in ("o_proj", "down"):
            cases["product with the residual add"] = lambda i: K.linear(a, ws[i], residual=r)
        elif name == "qkv":
            cases = {"norm kernel, product": lambda i: K.linear(K.rms_norm(x, nw, 1e-6), ws[i]),
                     "norm in the product": lambda i: K.norm_linear(x, nw, 1e-6, ws[i])}
        elif name == "gate_up":
            cases = {"norm kernel, product, silu*mul": lambda i: K.silu_mul(K.linear(K.rms_norm(x, nw, 1e-6), ws[i])),
                     "norm and SwiGLU in the product": lambda i: K.norm_linear(x, nw, 1e-6, ws[i], gated=True)}
        for case, fn in cases.items():
            us = graph_us(fn)
            rows.append({"shape": name, "case": case, "us": round(us, 2),
                         "weight_tbps": round(nbytes / (us * 1e-6) / 1e12, 3)})
            print(json.dumps(rows[-1]), flush=True)
        ws.clear()


if __name__ == "__main__":
    main()

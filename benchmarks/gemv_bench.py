"""Can a Triton matrix-vector product stream weights faster than cuBLAS at decode shapes?

For each Qwen3-8B projection (x [M, K] times W [N, K]^T, bf16, M = 1 and 8) this times
`torch.nn.functional.linear` (cuBLAS) and a split-N Triton kernel over a small grid of tile
configurations, each checked against cuBLAS first, and prints the best achieved weight bandwidth.
Usage: python benchmarks/gemv_bench.py
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

SHAPES = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
          "lm_head": (151936, 4096)}


@triton.jit
def gemv_kernel(x_ptr, w_ptr, y_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=rn[:, None] < N, other=0.0)
        x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=rm[:, None] < M, other=0.0)
        acc += tl.dot(x, tl.trans(w))
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def triton_linear(x, w, block_n, block_k, warps, stages):
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    gemv_kernel[(triton.cdiv(n, block_n),)](x, w, y, m, n, k, BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k,
                                            num_warps=warps, num_stages=stages)
    return y


def bench(fn, reps=50):
    return triton.testing.do_bench(fn, warmup=10, rep=reps, return_mode="median")


def main():
    torch.manual_seed(0)
    configs = list(itertools.product((16, 32, 64), (128, 256, 512), (4, 8), (3, 5)))
    print(f"{'shape':8s} {'M':>2s} {'cuBLAS TB/s':>12s} {'best Triton TB/s':>17s}  config (block_n, block_k, warps, stages)")
    for (name, (n, k)), m in itertools.product(SHAPES.items(), (1, 8)):
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(3)]  # rotate: beat L2
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        nbytes = n * k * 2
        ref = F.linear(x, ws[0])
        i = [0]

        def cublas():
            i[0] = (i[0] + 1) % 3
            F.linear(x, ws[i[0]])

        base = nbytes / (bench(cublas) * 1e-3) / 1e12
        best, best_cfg = 0.0, None
        for cfg in configs:
            try:
                out = triton_linear(x, ws[0], *cfg)
            except Exception:  # a configuration that does not fit shared memory
                continue
            if (out.float() - ref.float()).norm() / ref.float().norm() > 1e-2:
                raise SystemExit(f"{name} {cfg}: wrong result")

            def trit(cfg=cfg):
                i[0] = (i[0] + 1) % 3
                triton_linear(x, ws[i[0]], *cfg)

            tbps = nbytes / (bench(trit) * 1e-3) / 1e12
            if tbps > best:
                best, best_cfg = tbps, cfg
        print(f"{name:8s} {m:2d} {base:12.2f} {best:17.2f}  {best_cfg}", flush=True)


if __name__ == "__main__":
    main()

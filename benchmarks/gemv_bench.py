"""Can a Triton matrix-vector product stream weights faster than cuBLAS at decode shapes?

For each Qwen3-8B projection (x [M, K] times W [N, K]^T, bf16, M = 1 and 8) this times
`torch.nn.functional.linear` (cuBLAS) and a split-N Triton kernel over a small grid of tile
configurations, each checked against cuBLAS first, and prints the best achieved weight bandwidth.
With `--split-k` it instead asks whether the short products (q/k/v, o_proj, down: one wave of
programs or less at the engine's tiles) stream faster split along K: each (column block, K slice)
program adds its partial product into a float32 output with atomics (zeroed in the timed call, as a
consumer would have to), against the engine's own tiles (`dspark.kernels.gemv`) and cuBLAS, each timed
in a CUDA graph as the engine runs them.
Usage: python benchmarks/gemv_bench.py [--split-k]
"""

from __future__ import annotations

import itertools
import sys

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


@triton.jit
def gemv_splitk_kernel(x_ptr, w_ptr, y_ptr, M, N, K, K_PER, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_start = tl.program_id(1) * K_PER
    rm = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_start, k_start + K_PER, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=rn[:, None] < N, other=0.0)
        x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=rm[:, None] < M, other=0.0)
        acc += tl.dot(x, tl.trans(w))
    tl.atomic_add(y_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def splitk_linear(x, w, y, split, block_n, block_k, stages):
    """y (float32, [M, N]) zeroed, then x @ w^T added into it by `split` slices of K."""
    m, k = x.shape
    n = w.shape[0]
    y.zero_()
    gemv_splitk_kernel[(triton.cdiv(n, block_n), split)](x, w, y, m, n, k, k // split, BLOCK_M=16, BLOCK_N=block_n,
                                                         BLOCK_K=block_k, num_warps=4, num_stages=stages)
    return y


def split_k_table():
    from dspark.kernels.gemv import linear as engine_linear

    torch.manual_seed(0)
    configs = [c for c in itertools.product((1, 2, 4, 8), (16, 32, 64), (128, 256), (3, 4, 5))
               if 4096 % (c[0] * c[2]) == 0]
    print(f"{'shape':8s} {'M':>2s} {'cuBLAS':>7s} {'engine':>7s} {'split-K':>8s} TB/s  best (split, block_n, block_k, stages)")
    for (name, (n, k)), m in itertools.product([(s, SHAPES[s]) for s in ("qkv", "o_proj", "down")], (1, 8)):
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(3)]  # rotate: beat L2
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(m, n, device="cuda", dtype=torch.float32)
        nbytes, ref = n * k * 2, F.linear(x, ws[0]).float()

        def rate(fn):  # in a CUDA graph, as the engine runs them: the three weights in turn (beyond L2)
            def step():
                for w in ws:
                    fn(w)
            step()
            return 3 * nbytes / (triton.testing.do_bench_cudagraph(step, rep=100, return_mode="median") * 1e-3) / 1e12

        cublas, engine = rate(lambda w: F.linear(x, w)), rate(lambda w: engine_linear(x, w))
        best, best_cfg = 0.0, None
        for cfg in configs:
            if k % (cfg[0] * cfg[2]):
                continue
            out = splitk_linear(x, ws[0], y, *cfg)
            if (out - ref).norm() / ref.norm() > 1e-2:
                raise SystemExit(f"{name} {cfg}: wrong result")
            tbps = rate(lambda w, cfg=cfg: splitk_linear(x, w, y, *cfg))
            if tbps > best:
                best, best_cfg = tbps, cfg
        print(f"{name:8s} {m:2d} {cublas:7.2f} {engine:7.2f} {best:8.2f}       {best_cfg}", flush=True)


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
    with torch.inference_mode():  # (with gradients on, dspark.kernels runs its references: cuBLAS)
        split_k_table() if "--split-k" in sys.argv[1:] else main()

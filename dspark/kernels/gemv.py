"""Matrix products of up to 16 rows (decoding, verification, drafting), SwiGLU in the gate/up product's epilogue."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from dspark.kernels.activation import silu_mul, silu_mul_ref
from dspark.kernels.launch import tl, triton, use_triton
from dspark.kernels.norms import add_rms_norm, add_rms_norm_ref


def norm_linear_ref(x: Tensor, delta: Tensor | None, norm_weight: Tensor, eps: float, weight: Tensor,
                    bias: Tensor | None = None, gated: bool = False) -> tuple[Tensor, Tensor]:
    """(x + delta, the product of its RMSNorm), the product passed through SwiGLU when `gated`."""
    x, h = add_rms_norm_ref(x, delta, norm_weight, eps)
    y = F.linear(h, weight, bias)
    return x, silu_mul_ref(y) if gated else y


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    if not _gemv_fits(x, weight, bias):
        return F.linear(x, weight, bias)
    return _gemv(x, weight)


def norm_linear(x: Tensor, delta: Tensor | None, norm_weight: Tensor, eps: float, weight: Tensor,
                bias: Tensor | None = None, gated: bool = False) -> tuple[Tensor, Tensor]:
    """`norm_linear_ref` on the GPU: the add+RMSNorm kernel, then the product; `gated` (W is [gate; up]):
    silu(gate) * up in the product's epilogue, for up to 16 rows.

    The norm stays a kernel of its own: folded into the product's prologue (each program adding the
    residual and summing squares as it streams W) it made the q/k/v and gate/up products 2.9x slower
    on the H200, the transformed x no longer loading asynchronously beside W (benchmarks/RESULTS.md)."""
    x, h = add_rms_norm(x, delta, norm_weight, eps)
    if not _gemv_fits(h, weight, bias):  # many rows (a prefill), autograd, a bias
        y = F.linear(h, weight, bias)
        return x, silu_mul(y) if gated else y
    return x, _gemv(h, weight, gated)


def _gemv_fits(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    return use_triton(x) and x.numel() // x.shape[-1] <= 16 and bias is None and x.dtype == weight.dtype


def _gemv(x: Tensor, weight: Tensor, gated: bool = False) -> Tensor:
    rows, k = x.numel() // x.shape[-1], x.shape[-1]
    n = weight.shape[0] // 2 if gated else weight.shape[0]
    x2 = x.reshape(rows, k).contiguous()
    weight = weight.contiguous()
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    # Tiles from benchmarks/gemv_bench.py on the H200: wide heads, mid-size, and square projections.
    rows_read = 2 * n if gated else n
    block_n, block_k, stages = (64, 256 if n >= 65536 else 128, 3) if rows_read >= 16384 else \
        (64, 256, 5) if n > 4096 else (32, 512, 3)
    if gated:
        block_n //= 2  # two tiles of W per step: the same bytes in flight per program
    if x.element_size() == 4:  # float32 tiles take twice the shared memory
        block_k, stages = block_k // 2, 3
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x2, weight, y, rows, n, k, BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k, IEEE=x.dtype == torch.float32,
        GATED=gated, num_warps=4, num_stages=stages)
    return y.view(*x.shape[:-1], n)


if triton is not None:

    @triton.jit
    def _gemv_kernel(x_ptr, w_ptr, y_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, IEEE: tl.constexpr, GATED: tl.constexpr):
        """y[:M] = x[:M] @ W^T, one program per BLOCK_N output columns streaming its rows of W once.
        GATED: W holds gate rows then up rows, and y = silu(x @ gate^T) * (x @ up^T)."""
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rm = tl.arange(0, BLOCK_M)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            wmask = (rn[:, None] < N) & (rk[None, :] < K)
            w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=wmask, other=0.0)
            x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
            if IEEE:  # float32 weights: full-precision products, not TF32
                acc += tl.dot(x, tl.trans(w), input_precision="ieee")
            else:
                acc += tl.dot(x, tl.trans(w))
            if GATED:
                wu = tl.load(w_ptr + (rn[:, None] + N) * K + rk[None, :], mask=wmask, other=0.0)
                if IEEE:
                    acc_up += tl.dot(x, tl.trans(wu), input_precision="ieee")
                else:
                    acc_up += tl.dot(x, tl.trans(wu))
        out = acc.to(y_ptr.dtype.element_ty)
        if GATED:  # as the reference: gate and up rounded, silu in float, rounded, then the product
            gf = out.to(tl.float32)
            out = (gf / (1.0 + tl.exp(-gf))).to(y_ptr.dtype.element_ty) * acc_up.to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + rm[:, None] * N + rn[None, :], out, mask=(rm[:, None] < M) & (rn[None, :] < N))

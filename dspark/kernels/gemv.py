"""Matrix products of up to 16 rows (decoding, verification, drafting), with what surrounds them in a
decoder layer folded into their epilogues: the RMSNorm of the input (its weight on x's tiles, its
1/rms on the accumulator), SwiGLU, and the residual add."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from dspark.kernels.activation import silu_mul, silu_mul_ref
from dspark.kernels.launch import overlap, tl, triton, use_triton
from dspark.kernels.norms import rms_norm, rms_norm_ref


def linear_ref(x: Tensor, weight: Tensor, bias: Tensor | None = None, residual: Tensor | None = None) -> Tensor:
    y = F.linear(x, weight, bias)
    return y if residual is None else residual + y


def norm_linear_ref(x: Tensor, norm_weight: Tensor, eps: float, weight: Tensor, bias: Tensor | None = None,
                    gated: bool = False) -> Tensor:
    """The product of x's RMSNorm, passed through SwiGLU when `gated` (W is [gate; up])."""
    y = F.linear(rms_norm_ref(x, norm_weight, eps), weight, bias)
    return silu_mul_ref(y) if gated else y


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, residual: Tensor | None = None) -> Tensor:
    """x @ W^T (+ bias), plus `residual` (the layer's stream: o_proj's and down's outputs land on it in
    the epilogue, rounded as `residual + y` is)."""
    if not _gemv_fits(x, weight, bias):
        return linear_ref(x, weight, bias, residual)
    return _gemv(x, weight, residual=residual)


def norm_linear(x: Tensor, norm_weight: Tensor, eps: float, weight: Tensor, bias: Tensor | None = None,
                gated: bool = False) -> Tensor:
    """`norm_linear_ref` on the GPU in one launch for up to 16 rows: no RMSNorm kernel between the
    residual stream and the q/k/v or gate/up product. Each program scales x's tiles by the norm weight
    as it streams W, keeps x @ x^T on the tensor cores beside the product (its diagonal: each row's
    sum of squares, with no reduction per step) and applies 1/rms to the accumulator at the end; then
    SwiGLU when `gated`. (An earlier prologue that reduced the squares every step and stored x + delta
    from one program made these products 2.9x slower: benchmarks/RESULTS.md.)"""
    if not _gemv_fits(x, weight, bias):  # many rows (a prefill), autograd, a bias
        y = F.linear(rms_norm(x, norm_weight, eps), weight, bias)
        return silu_mul(y) if gated else y
    return _gemv(x, weight, gated, norm=(norm_weight, eps))


def _gemv_fits(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    return use_triton(x) and x.numel() // x.shape[-1] <= 16 and bias is None and x.dtype == weight.dtype


def _gemv(x: Tensor, weight: Tensor, gated: bool = False, norm: tuple[Tensor, float] | None = None,
          residual: Tensor | None = None) -> Tensor:
    rows, k = x.numel() // x.shape[-1], x.shape[-1]
    n = weight.shape[0] // 2 if gated else weight.shape[0]
    x2 = x.reshape(rows, k).contiguous()
    weight = weight.contiguous()
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    r2 = x2 if residual is None else residual.reshape(rows, n).contiguous()
    nw, eps = (x2, 0.0) if norm is None else (norm[0].contiguous(), norm[1])
    # Tiles from benchmarks/gemv_bench.py on the H200: wide heads, mid-size, and square projections.
    rows_read = 2 * n if gated else n
    block_n, block_k, stages = (64, 256 if n >= 65536 else 128, 3) if rows_read >= 16384 else \
        (64, 256, 5) if n > 4096 else (32, 512, 3)
    if gated:
        block_n //= 2  # two tiles of W per step: the same bytes in flight per program
    if x.element_size() == 4:  # float32 tiles take twice the shared memory
        block_k, stages = block_k // 2, 3
    pdl = overlap(x)
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x2, nw, r2, weight, y, rows, n, k, eps, BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k,
        IEEE=x.dtype == torch.float32, NORM=norm is not None, GATED=gated, RESIDUAL=residual is not None,
        OVERLAP=pdl, num_warps=4, num_stages=stages, launch_pdl=pdl)
    return y.view(*x.shape[:-1], n)


if triton is not None:

    @triton.jit
    def _dot(a, b, IEEE: tl.constexpr):
        if IEEE:  # float32 operands: full-precision products, not TF32
            return tl.dot(a, b, input_precision="ieee")
        return tl.dot(a, b)

    @triton.jit
    def _gemv_kernel(x_ptr, nw_ptr, r_ptr, w_ptr, y_ptr, M, N, K, eps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, IEEE: tl.constexpr, NORM: tl.constexpr, GATED: tl.constexpr,
                     RESIDUAL: tl.constexpr, OVERLAP: tl.constexpr):
        """y[:M] = x[:M] @ W^T, one program per BLOCK_N output columns streaming its rows of W once.
        NORM: x is RMS-normed (weight on the tiles, 1/rms on the accumulator); GATED: W holds gate rows
        then up rows, and y = silu(x @ gate^T) * (x @ up^T); RESIDUAL: y += r. OVERLAP: launched as a
        programmatic dependent (Hopper), so that a product's programs start while the one before it ends."""
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rm = tl.arange(0, BLOCK_M)
        if OVERLAP:  # launched into the tail of the kernel before (which wrote x and r): wait for it to finish
            tl.extra.cuda.gdc_wait()
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        gram = tl.zeros([BLOCK_M, BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            wmask = (rn[:, None] < N) & (rk[None, :] < K)
            w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=wmask, other=0.0)
            x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
            if NORM:
                gram += _dot(x, tl.trans(x), IEEE)
                nw = tl.load(nw_ptr + rk, mask=rk < K, other=0.0).to(tl.float32)
                x = (x.to(tl.float32) * nw[None, :]).to(w.dtype)
            acc += _dot(x, tl.trans(w), IEEE)
            if GATED:
                wu = tl.load(w_ptr + (rn[:, None] + N) * K + rk[None, :], mask=wmask, other=0.0)
                acc_up += _dot(x, tl.trans(wu), IEEE)
        if OVERLAP:  # W streamed: the next product may launch into this one's tail (the epilogue, the last programs)
            tl.extra.cuda.gdc_launch_dependents()
        if NORM:
            sumsq = tl.sum(tl.where(rm[:, None] == tl.arange(0, BLOCK_M)[None, :], gram, 0.0), axis=1)
            inv = 1.0 / tl.sqrt(sumsq / K + eps)
            acc = acc * inv[:, None]
            acc_up = acc_up * inv[:, None]
        out = acc.to(y_ptr.dtype.element_ty)
        if GATED:  # as the reference: gate and up rounded, silu in float, rounded, then the product
            gf = out.to(tl.float32)
            out = (gf / (1.0 + tl.exp(-gf))).to(y_ptr.dtype.element_ty) * acc_up.to(y_ptr.dtype.element_ty)
        ymask = (rm[:, None] < M) & (rn[None, :] < N)
        if RESIDUAL:  # as `residual + y`: y rounded, the sum in float, rounded
            r = tl.load(r_ptr + rm[:, None] * N + rn[None, :], mask=ymask, other=0.0)
            out = (r.to(tl.float32) + out.to(tl.float32)).to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + rm[:, None] * N + rn[None, :], out, mask=ymask)

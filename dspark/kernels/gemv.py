"""Matrix products of up to 16 rows (decoding, verification, drafting), with norm prologues and SwiGLU epilogues."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from dspark.kernels.launch import launch_options, pdl, tl, triton, use_triton
from dspark.kernels.activation import silu_mul, silu_mul_ref
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
    return _gemv(x, weight)[1]


def norm_linear(x: Tensor, delta: Tensor | None, norm_weight: Tensor, eps: float, weight: Tensor,
                bias: Tensor | None = None, gated: bool = False) -> tuple[Tensor, Tensor]:
    """`norm_linear_ref` in one kernel for up to 16 rows: each program adds the residual and takes the
    rows' sum of squares while it streams its rows of W (the norm's scale, a per-row scalar, is applied
    to the accumulator), program 0 writes x + delta; `gated`: W is [gate; up] and the epilogue writes
    silu(gate) * up. The numbers differ from the reference by where the bfloat16 roundings fall."""
    if not _gemv_fits(x, weight, bias):  # many rows (a prefill), autograd, a bias: the kernels one by one
        x, h = add_rms_norm(x, delta, norm_weight, eps)
        y = F.linear(h, weight, bias)
        return x, silu_mul(y) if gated else y
    return _gemv(x, weight, delta, norm_weight, eps, gated)


def _gemv_fits(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    return use_triton(x) and x.numel() // x.shape[-1] <= 16 and bias is None and x.dtype == weight.dtype


def _gemv(x: Tensor, weight: Tensor, delta: Tensor | None = None, norm_weight: Tensor | None = None,
          eps: float = 0.0, gated: bool = False) -> tuple[Tensor, Tensor]:
    rows, k = x.numel() // x.shape[-1], x.shape[-1]
    n = weight.shape[0] // 2 if gated else weight.shape[0]
    x2 = x.reshape(rows, k).contiguous()
    d2 = x2 if delta is None else delta.reshape(rows, k).contiguous()
    out_x = torch.empty_like(x2) if delta is not None else x2
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
    norm = norm_weight is not None
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x2, d2, x2 if norm_weight is None else norm_weight, out_x, weight, y, rows, n, k, eps, BLOCK_M=16,
        BLOCK_N=block_n, BLOCK_K=block_k, IEEE=x.dtype == torch.float32, NORM=norm, DELTA=delta is not None,
        GATED=gated, PDL=pdl(x), num_warps=4, num_stages=stages, **launch_options(x))
    return out_x.view(x.shape), y.view(*x.shape[:-1], n)


if triton is not None:

    @triton.jit
    def _gemv_kernel(x_ptr, d_ptr, nw_ptr, xo_ptr, w_ptr, y_ptr, M, N, K, eps, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr, NORM: tl.constexpr,
                     DELTA: tl.constexpr, GATED: tl.constexpr, PDL: tl.constexpr):
        """y[:M] = x[:M] @ W^T, one program per BLOCK_N output columns streaming its rows of W once.
        NORM: x is (x + delta) put through RMSNorm: the norm weight multiplies x, the squares add up
        elementwise beside the products and the row scale multiplies the accumulator at the end, so the
        loop stays a plain pipelined stream of W; program 0 writes x + delta in a pass of its own.
        GATED: W holds gate rows then up rows, and y = silu(x @ gate^T) * (x @ up^T)."""
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        pid = tl.program_id(0)
        rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        rm = tl.arange(0, BLOCK_M)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        squares = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            wmask = (rn[:, None] < N) & (rk[None, :] < K)
            w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=wmask, other=0.0)
            xmask = (rm[:, None] < M) & (rk[None, :] < K)
            x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=xmask, other=0.0)
            if NORM:
                if DELTA:  # rounded to the storage dtype, as torch's add
                    x = x + tl.load(d_ptr + rm[:, None] * K + rk[None, :], mask=xmask, other=0.0)
                xf = x.to(tl.float32)
                squares += xf * xf
                nw = tl.load(nw_ptr + rk, mask=rk < K, other=0.0).to(tl.float32)
                x = (xf * nw[None, :]).to(w.dtype)
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
        if NORM:
            inv = 1.0 / tl.sqrt(tl.sum(squares, axis=1) / K + eps)
            acc = acc * inv[:, None]
            acc_up = acc_up * inv[:, None]
        out = acc.to(y_ptr.dtype.element_ty)
        if GATED:  # as the reference: gate and up rounded, silu in float, rounded, then the product
            gf = out.to(tl.float32)
            out = (gf / (1.0 + tl.exp(-gf))).to(y_ptr.dtype.element_ty) * acc_up.to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + rm[:, None] * N + rn[None, :], out, mask=(rm[:, None] < M) & (rn[None, :] < N))
        if DELTA:
            if pid == 0:
                for k0 in range(0, K, BLOCK_K):
                    rk = k0 + tl.arange(0, BLOCK_K)
                    xmask = (rm[:, None] < M) & (rk[None, :] < K)
                    s = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=xmask, other=0.0)
                    s = s + tl.load(d_ptr + rm[:, None] * K + rk[None, :], mask=xmask, other=0.0)
                    tl.store(xo_ptr + rm[:, None] * K + rk[None, :], s, mask=xmask)

"""RMSNorm (where no product takes it into its epilogue: final norms, many-row forwards), and the attention
prologue: q/k norm, RoPE and the K/V cache write."""

from __future__ import annotations

import torch
from torch import Tensor

from dspark.kernels.cpu import qk_norm_rope_cache_cpu, rms_norm_cpu, use_cpu_norm_forms
from dspark.kernels.launch import tl, triton, use_triton


def rms_norm_ref(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    dtype = x.dtype
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)


def rope_ref(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: [B, heads, T, D]; cos/sin: [B, T, D]."""
    cos, sin = cos[:, None], sin[:, None]
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def qk_norm_rope_cache_ref(qkv: Tensor, num_heads: int, num_kv_heads: int, q_norm: Tensor, k_norm: Tensor,
                           eps: float, cos: Tensor, sin: Tensor, positions: Tensor, cache_k: Tensor,
                           cache_v: Tensor) -> Tensor:
    """qkv [B, T, (Hq+2Hkv)*D] -> q [B, Hq, T, D]; normed, rotated K and V go to cache_[kv][b, :, pos]."""
    b, t, _ = qkv.shape
    d = q_norm.shape[0]
    q, k, v = qkv.view(b, t, num_heads + 2 * num_kv_heads, d).split([num_heads, num_kv_heads, num_kv_heads], dim=2)
    q = rope_ref(rms_norm_ref(q.transpose(1, 2), q_norm, eps), cos, sin)
    k = rope_ref(rms_norm_ref(k.transpose(1, 2), k_norm, eps), cos, sin)
    rows = torch.arange(b, device=qkv.device)[:, None]
    cache_k[rows, :, positions] = k.transpose(1, 2)
    cache_v[rows, :, positions] = v
    return q


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    if not use_triton(x):
        return rms_norm_cpu(x, weight, eps) if use_cpu_norm_forms(x) else rms_norm_ref(x, weight, eps)
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    out = torch.empty_like(x2)
    n = shape[-1]
    _rms_norm_kernel[(x2.shape[0],)](x2, weight, out, n, eps, BLOCK=triton.next_power_of_2(n))
    return out.view(shape)


def qk_norm_rope_cache(qkv: Tensor, num_heads: int, num_kv_heads: int, q_norm: Tensor, k_norm: Tensor, eps: float,
                       cos: Tensor, sin: Tensor, positions: Tensor, cache_k: Tensor, cache_v: Tensor) -> Tensor:
    if not use_triton(qkv) or q_norm.shape[0] & (q_norm.shape[0] - 1):  # head_dim a power of two
        form = qk_norm_rope_cache_cpu if use_cpu_norm_forms(qkv) else qk_norm_rope_cache_ref
        return form(qkv, num_heads, num_kv_heads, q_norm, k_norm, eps, cos, sin, positions, cache_k, cache_v)
    b, t, _ = qkv.shape
    d = q_norm.shape[0]
    qkv = qkv.contiguous()
    q = torch.empty(b, num_heads, t, d, dtype=qkv.dtype, device=qkv.device)
    cos, sin, positions = cos.contiguous(), sin.contiguous(), positions.contiguous()
    grid = (b * t, num_heads + 2 * num_kv_heads)
    _qk_norm_rope_cache_kernel[grid](
        qkv, q, cos, sin, positions, q_norm, k_norm, cache_k, cache_v, t, num_heads, num_kv_heads,
        cache_k.stride(0), cache_k.stride(1), cache_k.stride(2), eps, D=d,
    )
    return q


if triton is not None:

    @triton.jit
    def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, n, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n
        s = tl.load(x_ptr + row * n + cols, mask=mask, other=0.0)
        sf = s.to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(sf * sf, axis=0) / n + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        tl.store(out_ptr + row * n + cols, w * (sf * inv).to(s.dtype), mask=mask)

    @triton.jit
    def _qk_norm_rope_cache_kernel(qkv_ptr, q_ptr, cos_ptr, sin_ptr, pos_ptr, qn_ptr, kn_ptr, ck_ptr, cv_ptr,
                                   T, HQ, HKV, c_sb, c_sh, c_sp, eps, D: tl.constexpr):
        token = tl.program_id(0)  # b * T + t
        head = tl.program_id(1)  # q heads, then k heads, then v heads
        b = token // T
        t = token % T
        half: tl.constexpr = D // 2
        cols = tl.arange(0, D)
        width = (HQ + 2 * HKV) * D
        x = tl.load(qkv_ptr + token * width + head * D + cols)
        pos = tl.load(pos_ptr + token)
        if head >= HQ + HKV:  # values: straight to the cache
            h = head - HQ - HKV
            tl.store(cv_ptr + b * c_sb + h * c_sh + pos * c_sp + cols, x)
        else:
            # rotate_half: element i pairs with i + D/2 (negated) for the first half, i - D/2 after
            partner_cols = (cols + half) % D
            xp = tl.load(qkv_ptr + token * width + head * D + partner_cols).to(tl.float32)
            if head < HQ:
                w = tl.load(qn_ptr + cols)
                wp = tl.load(qn_ptr + partner_cols)
            else:
                w = tl.load(kn_ptr + cols)
                wp = tl.load(kn_ptr + partner_cols)
            xf = x.to(tl.float32)
            inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / D + eps)
            normed = w * (xf * inv).to(x.dtype)
            partner = wp * (xp * inv).to(x.dtype)
            rotated = tl.where(cols < half, -partner, partner)
            cos = tl.load(cos_ptr + token * D + cols)
            sin = tl.load(sin_ptr + token * D + cols)
            out = normed * cos + rotated * sin
            if head < HQ:
                tl.store(q_ptr + ((b * HQ + head) * T + t) * D + cols, out)
            else:
                tl.store(ck_ptr + b * c_sb + (head - HQ) * c_sh + pos * c_sp + cols, out)

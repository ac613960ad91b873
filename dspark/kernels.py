"""Fused GPU kernels (Triton) for the small operations around the matrix products, with their reference.

Each public function computes the same thing as its `*_ref` twin in plain PyTorch; on CUDA tensors
it runs one Triton kernel instead of several PyTorch ones (the reference runs on CPU, without
Triton, or when `DSPARK_KERNELS=0`). Tests check each kernel against its reference.

- `add_rms_norm`: residual add and RMSNorm in one pass (x += delta; h = norm(x) * w).
- `qk_norm_rope_cache`: per-head q/k RMSNorm, RoPE on both, K/V written to the cache at their positions.
- `silu_mul`: SwiGLU's silu(gate) * up on the fused gate/up projection output.
- `attention`: GQA attention of T query rows over the cache, each row seeing keys up to its limit.
- `linear`: x @ W^T for up to 16 rows, streaming W faster than cuBLAS does at these shapes
  (benchmarks/gemv_h200.txt).
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F
from torch import Tensor

try:  # Triton ships with CUDA builds of PyTorch; CPU builds run the references.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = None


def use_triton(t: Tensor) -> bool:
    """Triton kernels serve inference (no autograd through them): with gradients on, the references run."""
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    return (triton is not None and os.environ.get("DSPARK_KERNELS", "1") != "0" and (t.is_cuda or interpret)
            and t.dtype in (torch.float32, torch.bfloat16, torch.float16) and not torch.is_grad_enabled())


# ---- references ----------------------------------------------------------------------------------

def rms_norm_ref(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    dtype = x.dtype
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)


def add_rms_norm_ref(x: Tensor, delta: Tensor | None, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    if delta is not None:
        x = x + delta
    return x, rms_norm_ref(x, weight, eps)


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


def silu_mul_ref(gate_up: Tensor) -> Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def attention_ref(q: Tensor, cache_k: Tensor, cache_v: Tensor, limits: Tensor, kv_len: int,
                  mask: Tensor | None = None) -> Tensor:
    """q [B, Hq, T, D] over keys 0..kv_len-1; query (b, t) sees keys at slots <= limits[b, t], or where
    an explicit `mask` [B, 1, T, kv_len] is True."""
    if mask is None:
        mask = (torch.arange(kv_len, device=q.device) <= limits[..., None])[:, None]
    k, v = cache_k[:, :, :kv_len], cache_v[:, :, :kv_len]
    gqa = q.shape[1] != k.shape[1]
    if gqa and q.dtype == torch.float32:
        # float32 has no fused masked GQA kernel (SDPA falls back to its unfused math, in training too):
        # repeated K/V let the memory-efficient kernel run (benchmarks/attention_bench.py)
        k, v = k.repeat_interleave(q.shape[1] // k.shape[1], 1), v.repeat_interleave(q.shape[1] // v.shape[1], 1)
        gqa = False
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    rows = x.numel() // x.shape[-1]
    if not use_triton(x) or rows > 16 or bias is not None or x.dtype != weight.dtype:
        return F.linear(x, weight, bias)
    n, k = weight.shape
    x2 = x.reshape(rows, k).contiguous()
    weight = weight.contiguous()
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    # Tiles from benchmarks/gemv_bench.py on the H200: wide heads, mid-size, and square projections.
    block_n, block_k, stages = (64, 256 if n >= 65536 else 128, 3) if n >= 16384 else \
        (64, 256, 5) if n > 4096 else (32, 512, 3)
    if x.element_size() == 4:  # float32 tiles take twice the shared memory
        block_k, stages = block_k // 2, 3
    _gemv_kernel[(triton.cdiv(n, block_n),)](x2, weight, y, rows, n, k, BLOCK_M=16, BLOCK_N=block_n,
                                             BLOCK_K=block_k, IEEE=x.dtype == torch.float32, num_warps=4,
                                             num_stages=stages)
    return y.view(*x.shape[:-1], n)


# ---- dispatch ------------------------------------------------------------------------------------

def add_rms_norm(x: Tensor, delta: Tensor | None, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    if not use_triton(x) or delta is None:
        return add_rms_norm_ref(x, delta, weight, eps)
    shape = x.shape
    x2, d2 = x.reshape(-1, shape[-1]).contiguous(), delta.reshape(-1, shape[-1]).contiguous()
    out_x, out_h = torch.empty_like(x2), torch.empty_like(x2)
    n = shape[-1]
    _add_rms_norm_kernel[(x2.shape[0],)](x2, d2, weight, out_x, out_h, n, eps, BLOCK=triton.next_power_of_2(n))
    return out_x.view(shape), out_h.view(shape)


def qk_norm_rope_cache(qkv: Tensor, num_heads: int, num_kv_heads: int, q_norm: Tensor, k_norm: Tensor, eps: float,
                       cos: Tensor, sin: Tensor, positions: Tensor, cache_k: Tensor, cache_v: Tensor) -> Tensor:
    if not use_triton(qkv) or q_norm.shape[0] & (q_norm.shape[0] - 1):  # head_dim a power of two
        return qk_norm_rope_cache_ref(qkv, num_heads, num_kv_heads, q_norm, k_norm, eps, cos, sin, positions,
                                      cache_k, cache_v)
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


def silu_mul(gate_up: Tensor) -> Tensor:
    if not use_triton(gate_up):
        return silu_mul_ref(gate_up)
    shape = gate_up.shape
    inter = shape[-1] // 2
    g2 = gate_up.reshape(-1, shape[-1]).contiguous()
    out = torch.empty(g2.shape[0], inter, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(g2.shape[0], triton.cdiv(inter, block))](g2, out, inter, BLOCK=block)
    return out.view(*shape[:-1], inter)


# Above this many query rows per sequence (a prefill, the trainer's target pass) attention goes to
# PyTorch's fused SDPA: the split-KV kernel runs one program per query row, with the GQA group padded
# to 16 rows, and its work grows as rows x keys without tensor-core tiles over the rows
# (benchmarks/attention_bench.py measures the crossover on the H200). A half-precision prefill from
# position 0 takes SDPA's causal kernel (no mask; 3.3x the masked call's speed at 4096 rows there);
# float32 keeps the masked call, which measured faster than causal at the trainer's shape.
SPLIT_KV_MAX_QUERIES = 16


def attention(q: Tensor, cache_k: Tensor, cache_v: Tensor, limits: Tensor, kv_len: int,
              mask: Tensor | None = None, causal: bool = False) -> Tensor:
    """q [B, Hq, T, D] over cached keys 0..kv_len-1 (see `attention_ref`): the split-KV kernel for
    decoding and block verification, SDPA for many query rows, an explicit mask and autograd.
    `causal`: a prefill from slot 0 (query t sees slots <= t, T = kv_len); in half precision it runs
    as SDPA's causal (flash) attention, with no mask built."""
    hq, t, d = q.shape[1:]
    if mask is None and use_triton(q) and 16 <= d and not d & (d - 1) and t <= SPLIT_KV_MAX_QUERIES:
        return split_kv_attention(q, cache_k, cache_v, limits, kv_len)
    if causal and mask is None and q.dtype in (torch.bfloat16, torch.float16):
        return F.scaled_dot_product_attention(q, cache_k[:, :, :kv_len], cache_v[:, :, :kv_len], is_causal=True,
                                              enable_gqa=hq != cache_k.shape[1])
    return attention_ref(q, cache_k, cache_v, limits, kv_len, mask)


def split_kv_attention(q: Tensor, cache_k: Tensor, cache_v: Tensor, limits: Tensor, kv_len: int) -> Tensor:
    """Split-KV ("flash decoding") attention: each program takes one KV head's query group for one
    row over one chunk of keys; a second kernel merges the chunks' partial softmaxes.
    Returns [B, Hq, T, D] (on the GPU a view of token-major memory)."""
    b, hq, t, d = q.shape
    hkv = cache_k.shape[1]
    group = hq // hkv
    gp = max(16, triton.next_power_of_2(group))  # tensor-core tiles need 16 rows
    block_n = 64
    splits = max(1, min(triton.cdiv(kv_len, block_n), triton.cdiv(2 * _sm_count(q.device), b * hkv * t)))
    chunk = triton.cdiv(triton.cdiv(kv_len, splits), block_n) * block_n
    splits = triton.cdiv(kv_len, chunk)
    q = q.contiguous()
    part_o = torch.empty(b * hkv * t * splits * gp, d, dtype=torch.float32, device=q.device)
    part_ml = torch.empty(2, b * hkv * t * splits * gp, dtype=torch.float32, device=q.device)
    limits = limits.contiguous()
    _attention_split_kernel[(b * hkv, t, splits)](
        q, cache_k, cache_v, part_o, part_ml, limits, t, hq, hkv, kv_len, chunk, splits, part_ml.shape[1],
        cache_k.stride(0), cache_k.stride(1), cache_k.stride(2), 1.0 / math.sqrt(d),
        G=group, GP=gp, D=d, BLOCK_N=block_n, IEEE=q.dtype == torch.float32,
    )
    out = torch.empty(b, t, hq, d, dtype=q.dtype, device=q.device)  # token-major: o_proj reads it without a copy
    _attention_merge_kernel[(b * hq * t,)](part_o, part_ml, out, t, hq, hkv, splits, part_ml.shape[1], G=group,
                                            GP=gp, D=d, SP=triton.next_power_of_2(splits))
    return out.permute(0, 2, 1, 3)


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


# ---- kernels -------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _gemv_kernel(x_ptr, w_ptr, y_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
        """y[:M] = x[:M] @ W^T, one program per BLOCK_N output columns streaming its rows of W once."""
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rm = tl.arange(0, BLOCK_M)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=(rn[:, None] < N) & (rk[None, :] < K), other=0.0)
            x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
            if IEEE:  # float32 weights: full-precision products, not TF32
                acc += tl.dot(x, tl.trans(w), input_precision="ieee")
            else:
                acc += tl.dot(x, tl.trans(w))
        tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))

    @triton.jit
    def _add_rms_norm_kernel(x_ptr, d_ptr, w_ptr, out_x_ptr, out_h_ptr, n, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n
        x = tl.load(x_ptr + row * n + cols, mask=mask, other=0.0)
        s = x + tl.load(d_ptr + row * n + cols, mask=mask, other=0.0)  # rounded to the storage dtype, as torch
        tl.store(out_x_ptr + row * n + cols, s, mask=mask)
        sf = s.to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(sf * sf, axis=0) / n + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        tl.store(out_h_ptr + row * n + cols, w * (sf * inv).to(s.dtype), mask=mask)

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

    @triton.jit
    def _silu_mul_kernel(gu_ptr, out_ptr, inter, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < inter
        g = tl.load(gu_ptr + row * 2 * inter + cols, mask=mask, other=0.0)
        u = tl.load(gu_ptr + row * 2 * inter + inter + cols, mask=mask, other=0.0)
        gf = g.to(tl.float32)
        act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)  # silu in float, rounded, then the product, as torch
        tl.store(out_ptr + row * inter + cols, act * u, mask=mask)

    @triton.jit
    def _attention_split_kernel(q_ptr, k_ptr, v_ptr, po_ptr, pml_ptr, lim_ptr, T, HQ, HKV, kv_len, chunk, S, L_OFF,
                                c_sb, c_sh, c_sp, scale, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
                                BLOCK_N: tl.constexpr, IEEE: tl.constexpr):
        bk = tl.program_id(0)  # b * HKV + kv head
        t = tl.program_id(1)
        sp = tl.program_id(2)
        b = bk // HKV
        hk = bk % HKV
        g = tl.arange(0, GP)
        d = tl.arange(0, D)
        q = tl.load(q_ptr + ((b * HQ + hk * G + g[:, None]) * T + t) * D + d[None, :], mask=g[:, None] < G,
                    other=0.0)
        limit = tl.minimum(tl.load(lim_ptr + b * T + t), kv_len - 1)
        start = sp * chunk
        end = tl.minimum(start + chunk, limit + 1)
        m_i = tl.full([GP], -float("inf"), dtype=tl.float32)
        l_i = tl.zeros([GP], dtype=tl.float32)
        acc = tl.zeros([GP, D], dtype=tl.float32)
        base = b * c_sb + hk * c_sh
        for n0 in range(start, end, BLOCK_N):
            offs = n0 + tl.arange(0, BLOCK_N)
            valid = offs < end
            k = tl.load(k_ptr + base + offs[:, None] * c_sp + d[None, :], mask=valid[:, None], other=0.0)
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            else:
                s = tl.dot(q, tl.trans(k)) * scale
            s = tl.where(valid[None, :], s, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            v = tl.load(v_ptr + base + offs[:, None] * c_sp + d[None, :], mask=valid[:, None], other=0.0)
            if IEEE:
                pv = tl.dot(p, v, input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            l_i = l_i * alpha + tl.sum(p, axis=1)
            m_i = m_new
        row = ((bk * T + t) * S + sp) * GP + g
        tl.store(po_ptr + row[:, None] * D + d[None, :], acc)
        tl.store(pml_ptr + row, m_i)
        tl.store(pml_ptr + L_OFF + row, l_i)

    @triton.jit
    def _attention_merge_kernel(po_ptr, pml_ptr, o_ptr, T, HQ, HKV, S, L_OFF, G: tl.constexpr, GP: tl.constexpr,
                                D: tl.constexpr, SP: tl.constexpr):
        pid = tl.program_id(0)  # (b * HQ + h) * T + t
        t = pid % T
        bh = pid // T
        b = bh // HQ
        h = bh % HQ
        bk = b * HKV + h // G
        g = h % G
        sp = tl.arange(0, SP)
        d = tl.arange(0, D)
        row = ((bk * T + t) * S + sp) * GP + g
        ok = sp < S
        m = tl.load(pml_ptr + row, mask=ok, other=-float("inf"))
        l_s = tl.load(pml_ptr + L_OFF + row, mask=ok, other=0.0)
        w = tl.where(ok & (l_s > 0), tl.exp(m - tl.max(m, axis=0)), 0.0)
        acc = tl.sum(w[:, None] * tl.load(po_ptr + row[:, None] * D + d[None, :], mask=ok[:, None], other=0.0),
                     axis=0)
        tl.store(o_ptr + ((b * T + t) * HQ + h) * D + d, (acc / tl.sum(w * l_s, axis=0)).to(o_ptr.dtype.element_ty))

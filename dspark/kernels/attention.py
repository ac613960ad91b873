"""GQA attention of T query rows over the cache: split-KV ("flash decoding") kernels for few rows, SDPA for many."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from dspark.kernels.cpu import attention_cpu, use_cpu_forms
from dspark.kernels.launch import sm_count, tl, triton, use_triton


def attention_ref(q: Tensor, cache_k: Tensor, cache_v: Tensor, limits: Tensor, kv_len: int,
                  mask: Tensor | None = None) -> Tensor:
    """q [B, Hq, T, D] over keys 0..kv_len-1; query (b, t) sees keys at slots <= limits[b, t], or where
    an explicit `mask` [B, 1, T, kv_len] is True."""
    if mask is None:
        mask = visibility(limits, kv_len)
    k, v = cache_k[:, :, :kv_len], cache_v[:, :, :kv_len]
    gqa = q.shape[1] != k.shape[1]
    if gqa and q.dtype == torch.float32:
        # float32 has no fused masked GQA kernel (SDPA falls back to its unfused math, in training too):
        # repeated K/V let the memory-efficient kernel run (benchmarks/attention_bench.py)
        k, v = k.repeat_interleave(q.shape[1] // k.shape[1], 1), v.repeat_interleave(q.shape[1] // v.shape[1], 1)
        gqa = False
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


# Above this many query rows per sequence (a prefill, the trainer's target pass) attention goes to
# PyTorch's fused SDPA: the split-KV kernel holds every query row of a KV head's group in one tile
# (rows x group, padded to 16), which fits registers for a block to verify or draft, not for a prompt
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
    if use_cpu_forms(q):
        return attention_cpu(q, cache_k, cache_v, visibility(limits, kv_len) if mask is None else mask)
    return attention_ref(q, cache_k, cache_v, limits, kv_len, mask)


def visibility(limits: Tensor, kv_len: int) -> Tensor:
    """The boolean mask [B, 1, T, kv_len] of `limits` [B, T]: query (b, t) sees the key slots <= limits[b, t]."""
    return (torch.arange(kv_len, device=limits.device) <= limits[..., None])[:, None]


def split_kv_attention(q: Tensor, cache_k: Tensor, cache_v: Tensor, limits: Tensor, kv_len: int) -> Tensor:
    """Split-KV ("flash decoding") attention: each program takes one KV head over one chunk of keys
    for all T query rows of its GQA group at once (T x G rows in one tensor-core tile), so a block of
    8 rows to verify reads each key and value once, as a decode step does, not once per row; a second
    kernel merges the chunks' partial softmaxes.
    The number of splits is fixed by the cache size (a CUDA graph's grid cannot change); the keys up
    to the rows' furthest limit are cut into that many chunks inside the kernel, so the splits share
    the live context evenly however much of the cache it fills, and each row masks keys past its own limit.
    Returns [B, Hq, T, D] (on the GPU a view of token-major memory)."""
    b, hq, t, d = q.shape
    hkv = cache_k.shape[1]
    group = hq // hkv
    rows = max(16, triton.next_power_of_2(t * group))  # tensor-core tiles need 16 rows
    block_n = 64
    splits = max(1, min(triton.cdiv(kv_len, block_n), triton.cdiv(2 * sm_count(q.device), b * hkv)))
    q = q.contiguous()
    part_o = torch.empty(b * hkv * splits * rows, d, dtype=torch.float32, device=q.device)
    part_ml = torch.empty(2, b * hkv * splits * rows, dtype=torch.float32, device=q.device)
    limits = limits.contiguous()
    _attention_split_kernel[(b * hkv, splits)](
        q, cache_k, cache_v, part_o, part_ml, limits, t, hq, hkv, kv_len, splits, part_ml.shape[1],
        cache_k.stride(0), cache_k.stride(1), cache_k.stride(2), 1.0 / math.sqrt(d),
        G=group, ROWS=rows, D=d, BLOCK_N=block_n, IEEE=q.dtype == torch.float32, num_warps=4 if rows <= 64 else 8,
    )
    out = torch.empty(b, t, hq, d, dtype=q.dtype, device=q.device)  # token-major: o_proj reads it without a copy
    _attention_merge_kernel[(b * hq * t,)](part_o, part_ml, out, t, hq, hkv, splits, part_ml.shape[1], G=group,
                                            ROWS=rows, D=d, SP=triton.next_power_of_2(splits))
    return out.permute(0, 2, 1, 3)


if triton is not None:

    @triton.jit
    def attend_chunk(q, k_ptr, v_ptr, base, start, end, limit, c_sp, scale, ROWS: tl.constexpr, D: tl.constexpr,
                     BLOCK_N: tl.constexpr, IEEE: tl.constexpr):
        """q's rows (tile row r masked past key limit[r]) over the cached keys start..end-1 of one KV head (at
        `base`, a key every c_sp): the unnormalised output, running max and sum of the online softmax."""
        d = tl.arange(0, D)
        m_i = tl.full([ROWS], -float("inf"), dtype=tl.float32)
        l_i = tl.zeros([ROWS], dtype=tl.float32)
        acc = tl.zeros([ROWS, D], dtype=tl.float32)
        for n0 in range(start, end, BLOCK_N):
            offs = n0 + tl.arange(0, BLOCK_N)
            valid = offs < end
            k = tl.load(k_ptr + base + offs[:, None] * c_sp + d[None, :], mask=valid[:, None], other=0.0)
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            else:
                s = tl.dot(q, tl.trans(k)) * scale
            s = tl.where(valid[None, :] & (offs[None, :] <= limit[:, None]), s, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)  # a row with no key here yet: p and alpha 0
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            v = tl.load(v_ptr + base + offs[:, None] * c_sp + d[None, :], mask=valid[:, None], other=0.0)
            if IEEE:
                pv = tl.dot(p, v, input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            l_i = l_i * alpha + tl.sum(p, axis=1)
            m_i = m_new
        return acc, m_i, l_i

    @triton.jit
    def merge_chunks(po_ptr, pml_ptr, L_OFF, row, ok, D: tl.constexpr):
        """One query row's attention output from its chunks' partials at `row` (where `ok`): each chunk's output
        weighted by exp(its max - the largest), over the weighted sums."""
        m = tl.load(pml_ptr + row, mask=ok, other=-float("inf"))
        l_s = tl.load(pml_ptr + L_OFF + row, mask=ok, other=0.0)
        w = tl.where(ok & (l_s > 0), tl.exp(m - tl.max(m, axis=0)), 0.0)
        o = tl.load(po_ptr + row[:, None] * D + tl.arange(0, D)[None, :], mask=ok[:, None], other=0.0)
        return tl.sum(w[:, None] * o, axis=0) / tl.sum(w * l_s, axis=0)

    @triton.jit
    def _attention_split_kernel(q_ptr, k_ptr, v_ptr, po_ptr, pml_ptr, lim_ptr, T, HQ, HKV, kv_len, S, L_OFF,
                                c_sb, c_sh, c_sp, scale, G: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr,
                                BLOCK_N: tl.constexpr, IEEE: tl.constexpr):
        """Tile row r is query row t = r // G of the group's head g = r % G; rows past T x G are padding."""
        bk = tl.program_id(0)  # b * HKV + kv head
        sp = tl.program_id(1)
        b = bk // HKV
        hk = bk % HKV
        r = tl.arange(0, ROWS)
        t = r // G
        live = r < T * G
        d = tl.arange(0, D)
        q = tl.load(q_ptr + ((b * HQ + hk * G + r[:, None] % G) * T + t[:, None]) * D + d[None, :],
                    mask=live[:, None], other=0.0)
        limit = tl.minimum(tl.load(lim_ptr + b * T + t, mask=live, other=-1), kv_len - 1)
        furthest = tl.max(limit, axis=0)
        chunk = tl.cdiv(tl.cdiv(furthest + 1, S), BLOCK_N) * BLOCK_N  # the live keys 0..furthest over S splits
        start = sp * chunk
        end = tl.minimum(start + chunk, furthest + 1)
        acc, m_i, l_i = attend_chunk(q, k_ptr, v_ptr, b * c_sb + hk * c_sh, start, end, limit, c_sp, scale, ROWS, D,
                                     BLOCK_N, IEEE)
        row = (bk * S + sp) * ROWS + r
        tl.store(po_ptr + row[:, None] * D + d[None, :], acc)
        tl.store(pml_ptr + row, m_i)
        tl.store(pml_ptr + L_OFF + row, l_i)

    @triton.jit
    def _attention_merge_kernel(po_ptr, pml_ptr, o_ptr, T, HQ, HKV, S, L_OFF, G: tl.constexpr, ROWS: tl.constexpr,
                                D: tl.constexpr, SP: tl.constexpr):
        pid = tl.program_id(0)  # (b * HQ + h) * T + t
        t = pid % T
        bh = pid // T
        b = bh // HQ
        h = bh % HQ
        bk = b * HKV + h // G
        sp = tl.arange(0, SP)
        d = tl.arange(0, D)
        row = (bk * S + sp) * ROWS + t * G + h % G
        out = merge_chunks(po_ptr, pml_ptr, L_OFF, row, sp < S, D)
        tl.store(o_ptr + ((b * T + t) * HQ + h) * D + d, out.to(o_ptr.dtype.element_ty))

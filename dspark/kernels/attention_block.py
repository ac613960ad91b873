"""The attention half of a decoder layer as one persistent launch (issue 44): the q/k norm with RoPE and the K/V
cache write, split-KV attention, the merge of its chunks, and o_proj with the residual add, which otherwise take
four launches (`qk_norm_rope_cache`, the two of `split_kv_attention`, `linear`).

Why: between the q/k/v product and o_proj the weight stream stops for about 9 us a layer at Qwen3-8B shapes
(attention's latency, its merge and the norms), a tenth of a decode step. Here every program stays resident from
the first phase to the last; the phases hand over through counters in global memory instead of kernel
boundaries, and (`l2_prefetch`) each program first asks L2 for its rows of o_proj, so that HBM streams them while
attention runs:

1. K/V rows: each program norms and rotates some of the new keys and writes them and their values to the cache.
2. Attention: a program per (sequence, KV head, chunk of keys) norms and rotates its group's q rows, waits for
   every key to be written, attends over its chunk and leaves its partial softmax.
3. Merge: once every chunk is attended, each program merges some (token, head) rows (`split_kv_attention`'s
   merge, the same arithmetic) into o_proj's input.
4. o_proj: once every row is merged, each program multiplies its rows of W and adds the residual; the last
   program out zeroes the counters for the next launch.

A program waits only after it has done every piece of work others wait for, so the launch cannot deadlock as
long as all programs are resident at once: the grid never exceeds the SM count (one program per SM always
fits). Triton's CPU interpreter runs programs one after another, so there the grid is a single program.
One stream at a time uses a device's counters (the engine's single stream does).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from dspark.kernels.attention import attention_ref
from dspark.kernels.gemv import linear_ref
from dspark.kernels.launch import interpreting, overlap, persistent_on, sm_count, tl, triton, use_triton
from dspark.kernels.norms import qk_norm_rope_cache_ref

MAX_ROWS = 64  # query rows x GQA group of one KV head held in one tile (a draft block of 16 at a group of 4)
_COUNTERS: dict[torch.device, Tensor] = {}  # per device, zero between launches: written, merged, out, attended


def attention_block_ref(qkv: Tensor, num_heads: int, num_kv_heads: int, q_norm: Tensor, k_norm: Tensor, eps: float,
                        cos: Tensor, sin: Tensor, slots: Tensor, limits: Tensor, kv_len: int, cache_k: Tensor,
                        cache_v: Tensor, o_weight: Tensor, residual: Tensor) -> Tensor:
    """residual + o_proj(attention(q/k norm, RoPE, K/V written at `slots`)): the four operations one by one."""
    q = qk_norm_rope_cache_ref(qkv, num_heads, num_kv_heads, q_norm, k_norm, eps, cos, sin, slots, cache_k, cache_v)
    out = attention_ref(q, cache_k, cache_v, limits, kv_len)
    b, _, t, _ = out.shape
    return linear_ref(out.transpose(1, 2).reshape(b, t, -1), o_weight, None, residual)


def attention_block_fits(qkv: Tensor, num_heads: int, num_kv_heads: int, head_dim: int, o_weight: Tensor,
                         o_bias: Tensor | None, mask: Tensor | None, causal: bool) -> bool:
    """Whether `attention_block` takes this forward: a few query rows (decoding, verifying, drafting) under
    limits (no explicit mask, no prefill), no o_proj bias, a power-of-two head size, on a GPU (or Triton's
    interpreter) with the persistent launch on (`DSPARK_PERSISTENT`, `persistent_mode`)."""
    b, t = qkv.shape[0], qkv.shape[1]
    return (persistent_on() and use_triton(qkv) and mask is None and not causal and o_bias is None
            and qkv.dtype == o_weight.dtype and b * t <= 16 and num_kv_heads > 0 and num_heads % num_kv_heads == 0
            and t * (num_heads // num_kv_heads) <= MAX_ROWS and head_dim >= 16 and not head_dim & (head_dim - 1))


def attention_block(qkv: Tensor, num_heads: int, num_kv_heads: int, q_norm: Tensor, k_norm: Tensor, eps: float,
                    cos: Tensor, sin: Tensor, slots: Tensor, limits: Tensor, kv_len: int, cache_k: Tensor,
                    cache_v: Tensor, o_weight: Tensor, residual: Tensor, l2_prefetch: bool = True, split_share: int = 1,
                    trace: Tensor | None = None) -> Tensor:
    """`attention_block_ref` in one launch (see the module's docstring); qkv [B, T, (Hq + 2 Hkv) D], residual
    [B, T, hidden] -> [B, T, hidden]. For measuring it (benchmarks/launch_probe.py): `l2_prefetch` False leaves
    o_proj's rows to be read when multiplied; `split_share` key splits per program; `trace` (int64 [programs, 8])
    gets each program's global timer (ns) at its phase boundaries: start, inputs ready, keys written, keys seen,
    chunks attended, all attended, all merged, end (0 where a program had no such phase)."""
    b, t, _ = qkv.shape
    d = q_norm.shape[0]
    n, k = o_weight.shape
    group = num_heads // num_kv_heads
    rows = max(16, triton.next_power_of_2(t * group))
    block_n, block_k, block_kv = 32, 256 if qkv.element_size() == 4 else 512, 64
    programs = 1 if interpreting() else min(triton.cdiv(n, block_n), sm_count(qkv.device))
    groups = b * num_kv_heads
    splits = max(1, min(triton.cdiv(kv_len, block_kv), programs // (groups * split_share)))
    part_o = torch.empty(groups * splits * rows, d, dtype=torch.float32, device=qkv.device)
    part_ml = torch.empty(2, groups * splits * rows, dtype=torch.float32, device=qkv.device)
    attn = torch.empty(b, t, num_heads * d, dtype=qkv.dtype, device=qkv.device)  # o_proj's input, token-major
    y = torch.empty(b, t, n, dtype=qkv.dtype, device=qkv.device)
    counters = _counters(qkv.device)
    pdl = overlap(qkv)
    _attention_block_kernel[(programs,)](
        qkv.contiguous(), q_norm.contiguous(), k_norm.contiguous(), cos.contiguous(), sin.contiguous(),
        slots.contiguous(), limits.contiguous(), cache_k, cache_v, o_weight.contiguous(), residual.contiguous(), y,
        attn, part_o, part_ml, counters, counters if trace is None else trace, b, t, num_heads, num_kv_heads, kv_len,
        splits, n, k, part_ml.shape[1], eps, 1.0 / math.sqrt(d), cache_k.stride(0), cache_k.stride(1),
        cache_k.stride(2), G=group, ROWS=rows, D=d, SP=triton.next_power_of_2(splits), BLOCK_KV=block_kv, BLOCK_M=16,
        BLOCK_N=block_n, BLOCK_K=block_k, L2_PREFETCH=l2_prefetch and qkv.is_cuda, TRACE=trace is not None,
        IEEE=qkv.dtype == torch.float32, OVERLAP=pdl, num_warps=4, num_stages=2 if qkv.element_size() == 4 else 3,
        launch_pdl=pdl)
    return y


def _counters(device: torch.device) -> Tensor:
    """The device's phase counters, made (zeroed) at the first launch there: a warm-up, never inside a capture."""
    if device not in _COUNTERS:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("attention_block: run it once before capturing a CUDA graph (its counters are made then)")
        _COUNTERS[device] = torch.zeros(4, dtype=torch.int32, device=device)
    return _COUNTERS[device]


if triton is not None:
    from dspark.kernels.attention import attend_chunk, merge_chunks

    @triton.jit
    def _arrive(ptr):
        """This program's stores before the count (one thread counts, after every thread has stored)."""
        tl.debug_barrier()
        tl.atomic_add(ptr, 1, sem="release")

    @triton.jit
    def _wait(ptr, target):
        """Until the counter reaches `target`; then the other programs' stores before it are visible here."""
        while tl.load(ptr, volatile=True) < target:
            pass
        tl.atomic_add(ptr, 0, sem="acquire")
        tl.debug_barrier()

    @triton.jit
    def _stamp(tr_ptr, j, TRACE: tl.constexpr):
        if TRACE:
            tl.store(tr_ptr + tl.program_id(0) * 8 + j, tl.extra.cuda.globaltimer())

    @triton.jit
    def _prefetch_l2(w_ptr, rn, N, K, BLOCK_K: tl.constexpr):
        """Ask L2 for rows rn of W, a 128-byte line per request (a hint: nothing waits for it)."""
        lines = tl.arange(0, BLOCK_K // 64) * 64
        for k0 in range(0, K, BLOCK_K):
            ok = (rn[:, None] < N) & (k0 + lines[None, :] < K)
            ptrs = tl.where(ok, w_ptr + rn[:, None] * K + k0 + lines[None, :], w_ptr)
            tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                                      is_pure=False, pack=1)

    @triton.jit
    def _norm_rope(x, xp, w, wp, cos, sin, eps, D: tl.constexpr):
        """Rows of x (their rotate-half partners xp, in float) RMS-normed by w and rotated: `qk_norm_rope_cache`'s
        arithmetic, row by row."""
        xf = x.to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=1) / D + eps)
        normed = w * (xf * inv[:, None]).to(x.dtype)
        partner = wp * (xp * inv[:, None]).to(x.dtype)
        cols = tl.arange(0, D)
        rotated = tl.where(cols[None, :] < D // 2, -partner, partner)
        return normed * cos + rotated * sin

    @triton.jit
    def _o_tile(a_ptr, w_ptr, r_ptr, y_ptr, M, N, K, rn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
        """y[:, rn] = residual + attn @ W[rn]^T (rounded as `residual + y`), as `linear` computes it."""
        rm = tl.arange(0, BLOCK_M)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=(rn[:, None] < N) & (rk[None, :] < K), other=0.0)
            x = tl.load(a_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0,
                        cache_modifier=".cg")
            if IEEE:
                acc += tl.dot(x, tl.trans(w), input_precision="ieee")
            else:
                acc += tl.dot(x, tl.trans(w))
        ymask = (rm[:, None] < M) & (rn[None, :] < N)
        r = tl.load(r_ptr + rm[:, None] * N + rn[None, :], mask=ymask, other=0.0)
        out = (r.to(tl.float32) + acc.to(y_ptr.dtype.element_ty).to(tl.float32)).to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + rm[:, None] * N + rn[None, :], out, mask=ymask)

    @triton.jit
    def _attention_block_kernel(qkv_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, slot_ptr, lim_ptr, ck_ptr, cv_ptr, w_ptr,
                                r_ptr, y_ptr, a_ptr, po_ptr, pml_ptr, cnt_ptr, tr_ptr, B, T, HQ, HKV, kv_len, S, N, K,
                                L_OFF, eps, scale, c_sb, c_sh, c_sp, G: tl.constexpr, ROWS: tl.constexpr,
                                D: tl.constexpr, SP: tl.constexpr, BLOCK_KV: tl.constexpr, BLOCK_M: tl.constexpr,
                                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, L2_PREFETCH: tl.constexpr,
                                TRACE: tl.constexpr, IEEE: tl.constexpr, OVERLAP: tl.constexpr):
        _stamp(tr_ptr, 0, TRACE)
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        n_tiles = tl.cdiv(N, BLOCK_N)
        d = tl.arange(0, D)
        partner = (d + D // 2) % D
        width = (HQ + 2 * HKV) * D
        M = B * T
        if L2_PREFETCH:  # the weights never change: asked for before waiting on the kernel before
            for tile in range(pid, n_tiles, programs):
                _prefetch_l2(w_ptr, tile * BLOCK_N + tl.arange(0, BLOCK_N), N, K, BLOCK_K)
        if OVERLAP:  # launched into the q/k/v product's tail: wait for it (qkv, the residual) to finish
            tl.extra.cuda.gdc_wait()
        _stamp(tr_ptr, 1, TRACE)

        # Phase 1: new keys normed and rotated, and values, into the cache.
        kw = tl.load(kn_ptr + d)
        kwp = tl.load(kn_ptr + partner)
        for i in range(pid, M * HKV, programs):
            token = i // HKV
            h = i % HKV
            b = token // T
            pos = tl.load(slot_ptr + token)
            src = qkv_ptr + token * width + (HQ + h) * D
            x = tl.load(src + d)[None, :]
            xp = tl.load(src + partner).to(tl.float32)[None, :]
            cos = tl.load(cos_ptr + token * D + d)[None, :]
            sin = tl.load(sin_ptr + token * D + d)[None, :]
            key = _norm_rope(x, xp, kw[None, :], kwp[None, :], cos, sin, eps, D)
            dst = b * c_sb + h * c_sh + pos * c_sp
            tl.store(ck_ptr + dst + d[None, :], key)
            tl.store(cv_ptr + dst + d, tl.load(src + HKV * D + d))
        _arrive(cnt_ptr)
        _stamp(tr_ptr, 2, TRACE)

        # Phase 2: attention over one chunk of keys per (sequence, KV head, split), as `split_kv_attention`.
        r = tl.arange(0, ROWS)
        t = r // G
        live = r < T * G
        qw = tl.load(qn_ptr + d)
        qwp = tl.load(qn_ptr + partner)
        for item in range(pid, B * HKV * S, programs):
            bk = item // S
            sp = item % S
            b = bk // HKV
            hk = bk % HKV
            token = b * T + t
            src = qkv_ptr + token[:, None] * width + (hk * G + r[:, None] % G) * D
            x = tl.load(src + d[None, :], mask=live[:, None], other=0.0)
            xp = tl.load(src + partner[None, :], mask=live[:, None], other=0.0).to(tl.float32)
            cos = tl.load(cos_ptr + token[:, None] * D + d[None, :], mask=live[:, None], other=0.0)
            sin = tl.load(sin_ptr + token[:, None] * D + d[None, :], mask=live[:, None], other=0.0)
            q = _norm_rope(x, xp, qw[None, :], qwp[None, :], cos, sin, eps, D)
            limit = tl.minimum(tl.load(lim_ptr + token, mask=live, other=-1), kv_len - 1)
            furthest = tl.max(limit, axis=0)
            chunk = tl.cdiv(tl.cdiv(furthest + 1, S), BLOCK_KV) * BLOCK_KV
            start = sp * chunk
            end = tl.minimum(start + chunk, furthest + 1)
            _wait(cnt_ptr, programs)  # every new key and value is in the cache
            _stamp(tr_ptr, 3, TRACE)
            acc, m_i, l_i = attend_chunk(q, ck_ptr, cv_ptr, b * c_sb + hk * c_sh, start, end, limit, c_sp, scale, ROWS,
                                         D, BLOCK_KV, IEEE, ".cg")
            row = (bk * S + sp) * ROWS + r
            tl.store(po_ptr + row[:, None] * D + d[None, :], acc)
            tl.store(pml_ptr + row, m_i)
            tl.store(pml_ptr + L_OFF + row, l_i)
            _stamp(tr_ptr, 4, TRACE)
        _arrive(cnt_ptr + 3)

        # Phase 3: each (token, q head) row's chunks merged into o_proj's input, as `split_kv_attention`'s merge.
        _wait(cnt_ptr + 3, programs)
        _stamp(tr_ptr, 5, TRACE)
        sps = tl.arange(0, SP)
        ok = sps < S
        for u in range(pid, M * HQ, programs):
            token = u // HQ
            h = u % HQ
            row = ((token // T * HKV + h // G) * S + sps) * ROWS + token % T * G + h % G
            out = merge_chunks(po_ptr, pml_ptr, L_OFF, row, ok, D, ".cg")
            tl.store(a_ptr + u * D + d, out.to(a_ptr.dtype.element_ty))
        _arrive(cnt_ptr + 1)

        # Phase 4: o_proj once every row is merged.
        _wait(cnt_ptr + 1, programs)
        _stamp(tr_ptr, 6, TRACE)
        for tile in range(pid, n_tiles, programs):
            _o_tile(a_ptr, w_ptr, r_ptr, y_ptr, M, N, K, tile * BLOCK_N + tl.arange(0, BLOCK_N), BLOCK_M, BLOCK_N,
                    BLOCK_K, IEEE)
        if OVERLAP:
            tl.extra.cuda.gdc_launch_dependents()
        # The last program out zeroes the counters: every other program has passed its last wait.
        if tl.atomic_add(cnt_ptr + 2, 1, sem="acq_rel") == programs - 1:
            c = tl.arange(0, 4)
            tl.store(cnt_ptr + c, tl.zeros([4], dtype=tl.int32))
        _stamp(tr_ptr, 7, TRACE)

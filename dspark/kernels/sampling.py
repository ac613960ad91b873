"""Sampling over the whole vocabulary on many programs: the exponential race, softmax, and the Markov loop."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from dspark.kernels.launch import tl, triton, use_triton

SAMPLE_BLOCK = 512  # vocabulary columns per program: 297 programs over Qwen3's 151,936 (about 2 per SM)
# The Markov slot kernel's columns per program: 594 programs over 151,936 stream w2 (rank 256) at 3.1 TB/s in
# 64-wide rank tiles, near cuBLAS's matrix-vector product (3.2), where 297 of 512 columns reached 2.3
# (benchmarks/markov_bench.py on the H200, 8 warps); 128 columns streamed no faster but quadruple the
# partials every program reduces
MARKOV_BLOCK = 256


def vocab_draw_ref(logits: Tensor, noise: Tensor | None, temperature: float, greedy: bool,
             want_probs: bool) -> tuple[Tensor, Tensor | None]:
    """Per row of `logits` [..., V]: the arg-max of logits - T * log(noise) (with `noise` ~ Exp(1), a
    draw from softmax(logits / T); the plain arg-max without noise), and when `want_probs` the
    distribution in float32: one-hot at the arg-max when `greedy`, else softmax(logits / T)."""
    x = logits.float()
    idx = (x if noise is None else x - temperature * noise.log()).argmax(-1)
    if not want_probs:
        return idx, None
    if greedy:
        return idx, torch.zeros_like(x).scatter_(-1, x.argmax(-1, keepdim=True), 1.0)
    return idx, torch.softmax(x / temperature, dim=-1)


def vocab_draw(logits: Tensor, noise: Tensor | None, temperature: float, greedy: bool,
         want_probs: bool) -> tuple[Tensor, Tensor | None]:
    """`vocab_draw_ref` in two launches over the whole vocabulary: per block of columns, the arg-max and the
    softmax's running max and sum; then per block again, the row's totals and its slice of the
    probabilities (PyTorch's softmax and arg-max run one program per row)."""
    if not use_triton(logits):
        return vocab_draw_ref(logits, noise, temperature, greedy, want_probs)
    shape = logits.shape
    x = logits.reshape(-1, shape[-1]).contiguous()
    rows, vocab = x.shape
    nb = triton.cdiv(vocab, SAMPLE_BLOCK)
    parts = torch.empty(4, rows, nb, dtype=torch.float32, device=x.device)
    has_noise = noise is not None
    noise = noise.reshape(rows, vocab).contiguous() if has_noise else x  # x: an unread stand-in
    inv_t = 0.0 if greedy else 1.0 / temperature
    softmax = want_probs and not greedy
    _sample_partials_kernel[(rows, nb)](x, noise, parts, vocab, rows, nb, temperature, inv_t, BLOCK=SAMPLE_BLOCK,
                                        NOISE=has_noise, SOFTMAX=softmax)
    idx, out = _finish(x, parts, nb, inv_t, greedy, want_probs)
    return idx.view(shape[:-1]), None if out is None else out.view(shape)


def _finish(x: Tensor, parts: Tensor, nb: int, inv_t: float, greedy: bool, want_probs: bool,
            block: int = SAMPLE_BLOCK) -> tuple[Tensor, Tensor | None]:
    """The rows' winners (and probabilities) from their partials over `nb` blocks of `block` columns."""
    rows, vocab = x.shape
    idx = torch.empty(rows, dtype=torch.long, device=x.device)
    out = torch.empty(rows, vocab, dtype=torch.float32, device=x.device) if want_probs else None
    _sample_finish_kernel[(rows, nb if want_probs else 1)](
        x, parts, idx, idx if out is None else out, vocab, rows, nb, inv_t, BLOCK=block,
        NBP=triton.next_power_of_2(nb), PROBS=want_probs, GREEDY=greedy)
    return idx, out




def markov_sample_ref(logits: Tensor, bias_of, to_target: Tensor, anchor: Tensor, noise: Tensor | None,
                      temperature: float, greedy: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The Markov head's sequential sampling (spec section 3): slot k's logits [n, V] get `bias_of(prev, k)`
    [1, V], the bias of the token drawn at slot k-1 (target id; the anchor for slot 0), and its draft
    is the race's arg-max on the corrected row. Returns (q, the drafts (draft ids), the previous
    tokens (target ids), the corrected logits); q is formed once for all rows after the loop."""
    prev, rows, ids, prevs = anchor.view(1), [], [], []
    for k in range(logits.shape[0]):
        row = logits[k : k + 1] + bias_of(prev, k)
        d, _ = vocab_draw_ref(row, None if noise is None else noise[k : k + 1], temperature, greedy, False)
        rows.append(row)
        ids.append(d)
        prevs.append(prev)
        prev = to_target[d]
    corrected = torch.cat(rows)
    return vocab_draw_ref(corrected, None, temperature, greedy, True)[1], torch.cat(ids), torch.cat(prevs), corrected


def markov_sample(logits: Tensor, w1: Tensor, w2: Tensor, to_target: Tensor, anchor: Tensor, noise: Tensor | None,
                  temperature: float, greedy: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`markov_sample_ref` for the vanilla head (bias = w2 @ w1[prev], rounded to the weights' dtype as the
    head's product is): one launch per slot reduces the previous slot's block arg-maxes to its token,
    gathers its w1 row, forms its block of the corrected row and that block's race and softmax
    statistics; one more launch writes every slot's q and draft."""
    n, vocab = logits.shape
    if not use_triton(logits):
        def bias_of(prev: Tensor, k: int) -> Tensor:
            return F.linear(w1[prev], w2).float()
        return markov_sample_ref(logits, bias_of, to_target, anchor, noise, temperature, greedy)
    x = logits.float().contiguous()
    nb = triton.cdiv(vocab, MARKOV_BLOCK)
    parts = torch.empty(4, n, nb, dtype=torch.float32, device=x.device)
    corrected = torch.empty_like(x)
    prevs = torch.empty(n, dtype=torch.long, device=x.device)
    has_noise = noise is not None
    noise = noise.contiguous() if has_noise else x  # x: an unread stand-in
    inv_t = 0.0 if greedy else 1.0 / temperature
    w1, w2 = w1.contiguous(), w2.contiguous()
    rank = w1.shape[1]
    for k in range(n):
        _markov_sample_kernel[(nb,)](
            x, w1, w2, to_target, anchor, noise, parts, corrected, prevs, k, vocab, n, nb, temperature,
            inv_t, RANK=rank, RB=min(64, triton.next_power_of_2(rank)), BLOCK=MARKOV_BLOCK,
            NBP=triton.next_power_of_2(nb), NOISE=has_noise, SOFTMAX=not greedy, num_warps=8)
    ids, q = _finish(corrected, parts, nb, inv_t, greedy, True, MARKOV_BLOCK)
    return q, ids, prevs, corrected


def markov_sample_topk_ref(logits: Tensor, w1: Tensor, w2: Tensor, to_target: Tensor, anchor: Tensor,
                           noise: Tensor | None, temperature: float, greedy: bool,
                           topk: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The vanilla head restricted to each slot's `topk` best base logits (vLLM's `dspark_draft_topk`, #49969):
    the candidates are taken from the base logits once, the bias is formed for them alone (k rows of w2 per
    slot, not all V) and every other token gets -inf. It changes q, so it is not DeepSpec's head; it stays
    lossless, since verification holds the drafts against the target with the q they were drawn from.
    Returns what `markov_sample_ref` returns."""
    x = logits
    cand = x.topk(min(topk, x.shape[1]), dim=-1).indices  # [n, k] draft ids
    base = x.gather(1, cand)
    rows_w2 = w2[cand]  # [n, k, r]: each slot's candidate rows, gathered once
    gumbel = None if noise is None else temperature * noise.gather(1, cand).log()
    prev, vals, ids, prevs = anchor.view(1), [], [], []
    for j in range(x.shape[0]):
        row = base[j] + (rows_w2[j] @ w1[prev][0]).float()  # the bias rounded to the weights' dtype, as the head's
        win = (row if gumbel is None else row - gumbel[j]).argmax(-1, keepdim=True)
        d = cand[j].gather(0, win)
        vals.append(row)
        ids.append(d)
        prevs.append(prev)
        prev = to_target[d]
    corrected = torch.full_like(x, float("-inf")).scatter_(1, cand, torch.stack(vals))
    return vocab_draw_ref(corrected, None, temperature, greedy, True)[1], torch.cat(ids), torch.cat(prevs), corrected


def markov_sample_topk(logits: Tensor, w1: Tensor, w2: Tensor, to_target: Tensor, anchor: Tensor,
                       noise: Tensor | None, temperature: float, greedy: bool,
                       topk: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`markov_sample_topk_ref` with its left-to-right loop in one launch on the GPU: one program walks the slots,
    each gathering its k candidate rows of w2 and the previous token's row of w1 (k and the rank powers of two)."""
    n, vocab = logits.shape
    rank = w1.shape[1]
    if not use_triton(logits) or topk > vocab or topk & (topk - 1) or rank & (rank - 1) or rank < 16:
        return markov_sample_topk_ref(logits, w1, w2, to_target, anchor, noise, temperature, greedy, topk)
    x = logits.float()
    cand = x.topk(topk, dim=-1).indices.contiguous()
    base = x.gather(1, cand).contiguous()
    gumbel = (temperature * noise.gather(1, cand).log()).float().contiguous() if noise is not None else base
    vals, ids, prevs = torch.empty_like(base), torch.empty(n, dtype=torch.long, device=x.device), \
        torch.empty(n, dtype=torch.long, device=x.device)
    _markov_topk_kernel[(1,)](base, cand, gumbel, w1.contiguous(), w2.contiguous(), to_target, anchor, vals, ids,
                              prevs, n, R=rank, K=topk, RB=min(64, rank), NOISE=noise is not None, num_warps=8)
    corrected = torch.full_like(x, float("-inf")).scatter_(1, cand, vals)
    return vocab_draw_ref(corrected, None, temperature, greedy, True)[1], ids, prevs, corrected


def accept_ref(draft_tokens: Tensor, draft_probs: Tensor, target_probs: Tensor, counted: Tensor | None, u: Tensor,
               noise: Tensor) -> tuple[Tensor, Tensor]:
    """The lossless acceptance rule (`sampling.rejection_sample`) given its randomness: uniforms `u` [B, n]
    and Exp(1) arrival times `noise` [B, V] for the race that draws the residual (or bonus) token.
    Returns (accepted count [B], next token [B])."""
    b, n = draft_tokens.shape
    device = target_probs.device
    counted = torch.full((b,), n, device=device) if counted is None else counted
    valid = torch.arange(n, device=device) < counted[:, None]
    p_d = target_probs[:, :n].gather(-1, draft_tokens[..., None]).squeeze(-1)
    q_d = draft_probs.gather(-1, draft_tokens[..., None]).squeeze(-1)
    ok = (u * q_d < p_d) & valid
    accepted = ok.long().cumprod(-1).sum(-1)
    rows = torch.arange(b, device=device)
    p_next = target_probs[rows, accepted]
    q_pad = torch.cat((draft_probs, torch.zeros_like(draft_probs[:, :1])), dim=1)
    q_next = q_pad[rows, accepted] * (accepted < counted)[:, None]  # past the proposal: no q, a bonus from p
    residual = (p_next - q_next).clamp_min(0)
    # Float noise can leave no mass where p == q; rejection then had probability ~0: fall back to p.
    empty = residual.sum(-1, keepdim=True) <= EMPTY_RESIDUAL
    residual = torch.where(empty, p_next, residual)
    return accepted, (residual / noise).argmax(-1)


EMPTY_RESIDUAL = 1e-8


def accept(draft_tokens: Tensor, draft_probs: Tensor, target_probs: Tensor, counted: Tensor | None, u: Tensor,
           noise: Tensor) -> tuple[Tensor, Tensor]:
    """`accept_ref` in two launches: every program finds the accepted prefix (n gathers) and races its
    block of the residual and of p; a finishing launch sums the residual's blocks and picks the winner
    (PyTorch's version is about 25 small kernels)."""
    if not use_triton(target_probs) or target_probs.dtype != torch.float32:
        return accept_ref(draft_tokens, draft_probs, target_probs, counted, u, noise)
    b, n = draft_tokens.shape
    vocab = target_probs.shape[-1]
    nb = triton.cdiv(vocab, SAMPLE_BLOCK)
    parts = torch.empty(5, b, nb, dtype=torch.float32, device=u.device)
    accepted = torch.empty(b, dtype=torch.long, device=u.device)
    token = torch.empty(b, dtype=torch.long, device=u.device)
    tok, dp, tp = draft_tokens.contiguous(), draft_probs.contiguous(), target_probs.contiguous()
    count = tok if counted is None else counted.contiguous()
    u, noise = u.contiguous(), noise.contiguous()
    _accept_partials_kernel[(b, nb)](tok, dp, tp, count, u, noise, parts, accepted, n, vocab, b, nb,
                                     BLOCK=SAMPLE_BLOCK, COUNTED=counted is not None)
    _accept_finish_kernel[(b,)](parts, token, b, nb, EMPTY_RESIDUAL, NBP=triton.next_power_of_2(nb))
    return accepted, token


if triton is not None:

    @triton.jit
    def _block_race(x, noise_ptr, cols, mask, parts_ptr, row, blk, R, NB, t, inv_t, NOISE: tl.constexpr,
                    SOFTMAX: tl.constexpr):
        """One block of a row (x: float32, -inf where masked): its race arg-max and, for the softmax,
        its max of x / T and sum of exp(x / T - max), into parts [4, R, NB]."""
        if NOISE:
            e = tl.load(noise_ptr + cols, mask=mask, other=1.0)
            score = tl.where(mask, x - t * tl.log(e), -float("inf"))
        else:
            score = x
        best = tl.max(score, axis=0)
        idx = tl.argmax(score, axis=0)  # the first of equal maxima, as torch's argmax
        at = row * NB + blk
        tl.store(parts_ptr + at, best)
        tl.store(parts_ptr + R * NB + at, (tl.min(cols, axis=0) + idx).to(tl.float32))
        if SOFTMAX:
            z = x * inv_t
            m = tl.max(z, axis=0)
            total = tl.where(m == -float("inf"), 0.0, tl.sum(tl.exp(z - m), axis=0))
            tl.store(parts_ptr + 2 * R * NB + at, m)
            tl.store(parts_ptr + 3 * R * NB + at, total)

    @triton.jit
    def _row_winner(best_ptr, idx_ptr, NB, NBP: tl.constexpr):
        """A race's winner from its NB blocks' best scores and their indices (float): the best score,
        the lowest index on ties."""
        j = tl.arange(0, NBP)
        ok = j < NB
        best = tl.load(best_ptr + j, mask=ok, other=-float("inf"))
        idx = tl.load(idx_ptr + j, mask=ok, other=3.0e38)
        return tl.min(tl.where(best == tl.max(best, axis=0), idx, 3.0e38), axis=0).to(tl.int64)

    @triton.jit
    def _sample_partials_kernel(x_ptr, noise_ptr, parts_ptr, V, R, NB, t, inv_t, BLOCK: tl.constexpr,
                                NOISE: tl.constexpr, SOFTMAX: tl.constexpr):
        row = tl.program_id(0)
        blk = tl.program_id(1)
        cols = blk * BLOCK + tl.arange(0, BLOCK)
        mask = cols < V
        x = tl.load(x_ptr + row * V + cols, mask=mask, other=-float("inf")).to(tl.float32)
        _block_race(x, noise_ptr + row * V, cols, mask, parts_ptr, row, blk, R, NB, t, inv_t, NOISE, SOFTMAX)

    @triton.jit
    def _sample_finish_kernel(x_ptr, parts_ptr, idx_ptr, out_ptr, V, R, NB, inv_t, BLOCK: tl.constexpr,
                              NBP: tl.constexpr, PROBS: tl.constexpr, GREEDY: tl.constexpr):
        """Each program reduces its row's partials: program 0 writes the winner, and with PROBS every
        program writes its block of the one-hot (GREEDY) or softmax probabilities."""
        row = tl.program_id(0)
        blk = tl.program_id(1)
        winner = _row_winner(parts_ptr + row * NB, parts_ptr + (R + row) * NB, NB, NBP)
        if blk == 0:
            tl.store(idx_ptr + row, winner)
        if PROBS:
            cols = blk * BLOCK + tl.arange(0, BLOCK)
            mask = cols < V
            if GREEDY:
                p = tl.where(cols == winner, 1.0, 0.0)
            else:
                j = tl.arange(0, NBP)
                ok = j < NB
                m = tl.load(parts_ptr + 2 * R * NB + row * NB + j, mask=ok, other=-float("inf"))
                top = tl.max(m, axis=0)
                total = tl.sum(tl.load(parts_ptr + 3 * R * NB + row * NB + j, mask=ok, other=0.0)
                               * tl.exp(m - top), axis=0)
                x = tl.load(x_ptr + row * V + cols, mask=mask, other=-float("inf")).to(tl.float32)
                p = tl.exp(x * inv_t - top) / total
            tl.store(out_ptr + row * V + cols, p, mask=mask)

    @triton.jit
    def _markov_sample_kernel(x_ptr, w1_ptr, w2_ptr, to_target_ptr, anchor_ptr, noise_ptr, parts_ptr, corr_ptr,
                              prevs_ptr, k, V, R, NB, t, inv_t, RANK: tl.constexpr, RB: tl.constexpr,
                              BLOCK: tl.constexpr, NBP: tl.constexpr, NOISE: tl.constexpr, SOFTMAX: tl.constexpr):
        """Slot k of the Markov loop, one block of columns per program: the previous token (the anchor, or
        the winner of slot k-1's partials mapped to a target id), its bias w2 @ w1[prev] on this block,
        the corrected logits and their race and softmax partials."""
        blk = tl.program_id(0)
        if k % 2 == 1:  # odd slots walk w2 backwards: they start on the blocks the slot before left in L2
            blk = NB - 1 - blk
        cols = blk * BLOCK + tl.arange(0, BLOCK)
        mask = cols < V
        rr = tl.arange(0, RB)
        # w2's first columns load before the serial part (the previous token), which they do not depend on
        w = tl.load(w2_ptr + cols[:, None] * RANK + rr[None, :], mask=mask[:, None] & (rr[None, :] < RANK), other=0.0)
        if k == 0:
            prev = tl.load(anchor_ptr)
        else:
            prev = tl.load(to_target_ptr + _row_winner(parts_ptr + (k - 1) * NB, parts_ptr + (R + k - 1) * NB, NB, NBP))
        if blk == 0:
            tl.store(prevs_ptr + k, prev)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for r0 in range(0, RANK, RB):
            rr = r0 + tl.arange(0, RB)
            e = tl.load(w1_ptr + prev * RANK + rr, mask=rr < RANK, other=0.0).to(tl.float32)
            nxt = rr + RB  # the next columns of w2 load while these are reduced
            w_next = tl.load(w2_ptr + cols[:, None] * RANK + nxt[None, :], mask=mask[:, None] & (nxt[None, :] < RANK),
                             other=0.0)
            acc += tl.sum(w.to(tl.float32) * e[None, :], axis=1)
            w = w_next
        bias = acc.to(w2_ptr.dtype.element_ty).to(tl.float32)  # the head's product rounds to the weights' dtype
        x = tl.load(x_ptr + k * V + cols, mask=mask, other=0.0) + bias
        tl.store(corr_ptr + k * V + cols, x, mask=mask)
        x = tl.where(mask, x, -float("inf"))
        _block_race(x, noise_ptr + k * V, cols, mask, parts_ptr, k, blk, R, NB, t, inv_t, NOISE, SOFTMAX)

    @triton.jit
    def _accept_partials_kernel(tok_ptr, dp_ptr, tp_ptr, count_ptr, u_ptr, noise_ptr, parts_ptr, acc_ptr, n, V, R, NB,
                                BLOCK: tl.constexpr, COUNTED: tl.constexpr):
        """Row b, block blk: the accepted prefix (slot i kept while u_i q_i(d_i) < p_i(d_i)), then over this
        block the residual max(p - q, 0) of the next row (q = 0 past the proposal): its sum, and the race
        arg-max of the residual and of p against the same arrival times."""
        b = tl.program_id(0)
        blk = tl.program_id(1)
        if COUNTED:
            counted = tl.load(count_ptr + b)
        else:
            counted = n
        accepted = 0
        running = 1
        for i in range(0, n):
            d = tl.load(tok_ptr + b * n + i)
            p_d = tl.load(tp_ptr + (b * (n + 1) + i) * V + d)
            q_d = tl.load(dp_ptr + (b * n + i) * V + d)
            ok = (tl.load(u_ptr + b * n + i) * q_d < p_d) & (i < counted)
            running = running * ok.to(tl.int32)
            accepted += running
        if blk == 0:
            tl.store(acc_ptr + b, accepted.to(tl.int64))
        cols = blk * BLOCK + tl.arange(0, BLOCK)
        mask = cols < V
        p = tl.load(tp_ptr + (b * (n + 1) + accepted) * V + cols, mask=mask, other=0.0)
        has_q = (cols * 0 + accepted) < counted  # past the proposal no q: a bonus token from p
        q = tl.load(dp_ptr + (b * n + accepted) * V + cols, mask=mask & has_q, other=0.0)
        residual = tl.maximum(p - q, 0.0)
        e = tl.load(noise_ptr + b * V + cols, mask=mask, other=1.0)
        r_score = tl.where(mask, residual / e, -float("inf"))
        p_score = tl.where(mask, p / e, -float("inf"))
        at = b * NB + blk
        first = blk * BLOCK
        tl.store(parts_ptr + at, tl.sum(residual, axis=0))
        tl.store(parts_ptr + R * NB + at, tl.max(r_score, axis=0))
        tl.store(parts_ptr + 2 * R * NB + at, (first + tl.argmax(r_score, axis=0)).to(tl.float32))
        tl.store(parts_ptr + 3 * R * NB + at, tl.max(p_score, axis=0))
        tl.store(parts_ptr + 4 * R * NB + at, (first + tl.argmax(p_score, axis=0)).to(tl.float32))

    @triton.jit
    def _accept_finish_kernel(parts_ptr, token_ptr, R, NB, empty_below, NBP: tl.constexpr):
        """The residual's total decides which race counts (p's when float error left it empty); its
        winner is the best score, the lowest index on ties."""
        b = tl.program_id(0)
        j = tl.arange(0, NBP)
        ok = j < NB
        total = tl.sum(tl.load(parts_ptr + b * NB + j, mask=ok, other=0.0), axis=0)
        which = tl.where(total <= empty_below, 2, 0)  # offset to p's race when the residual is empty
        winner = _row_winner(parts_ptr + (1 + which) * R * NB + b * NB, parts_ptr + (2 + which) * R * NB + b * NB, NB,
                             NBP)
        tl.store(token_ptr + b, winner)

    @triton.jit
    def _markov_topk_kernel(base_ptr, cand_ptr, g_ptr, w1_ptr, w2_ptr, tt_ptr, anchor_ptr, vals_ptr, ids_ptr,
                            prevs_ptr, n, R: tl.constexpr, K: tl.constexpr, RB: tl.constexpr, NOISE: tl.constexpr):
        """Slot by slot: the bias of the previous token (w2's candidate rows . w1's row, rounded to the weights'
        dtype as the head's product is) on the candidates' base logits, the race's winner, the next token."""
        ks = tl.arange(0, K)
        prev = tl.load(anchor_ptr)
        for j in range(0, n):
            cand = tl.load(cand_ptr + j * K + ks)
            acc = tl.zeros([K], dtype=tl.float32)
            for r0 in tl.static_range(0, R, RB):
                rs = r0 + tl.arange(0, RB)
                e = tl.load(w1_ptr + prev * R + rs).to(tl.float32)
                w = tl.load(w2_ptr + cand[:, None] * R + rs[None, :]).to(tl.float32)
                acc += tl.sum(w * e[None, :], axis=1)
            row = tl.load(base_ptr + j * K + ks) + acc.to(w2_ptr.dtype.element_ty).to(tl.float32)
            score = row
            if NOISE:
                score = row - tl.load(g_ptr + j * K + ks)
            win = tl.argmax(score, axis=0)
            d = tl.sum(tl.where(ks == win, cand, 0), axis=0)
            tl.store(vals_ptr + j * K + ks, row)
            tl.store(ids_ptr + j, d)
            tl.store(prevs_ptr + j, prev)
            prev = tl.load(tt_ptr + d)

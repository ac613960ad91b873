"""DeepSpec's block objective (spec §6): the loss of a DSpark, DFlash or DFlash 2 draft on one batch.

Per sequence: the target's tapped features and final hidden states are computed on the fly; anchors
are drawn where the anchor and its next token are in the loss mask; every anchor's block
`[token, mask, ..., mask]` runs at once, each block in its own cache slots and seeing the context
before its anchor and itself (the same layers as inference, with an explicit mask; a DFlash 2 draft's
convolutions run within each block's rows, `dspark.models.dflash2.convolve`). Each drafted slot is
scored against the token it predicts (anchor-first: slot k, anchor + k + 1; fill-in, z-lab's layout: slot
k >= 1, anchor + k, the anchor slot unscored), the j-th drafted slot with weight exp(-j / gamma) under a
prefix mask: DSpark: 0.1 CE + 0.9 L1(draft, target) + BCE(confidence, 1 - L1 / 2) with a teacher-forced
Markov head; DFlash mode (Markov rank 0, no confidence head): CE only.

DFlash 2 adds its candidate selector's loss, as vllm-project/speculators trains it (`models/dflash2/metrics.py`,
`compute_selector_loss`; z-lab's `dflash` package ships inference only): per slot the head's top-k candidates,
the last of them replaced by the target's arg-max token where that is absent, are scored by the selector
teacher-forced (the true token before the slot as its predecessor), and the loss is the cross-entropy of those
k scores toward the target's token, weighted as the head's; it is added to the head's loss (times
`selector_weight`, speculators' `selector_loss_alpha`, 1). The head's loss stays ours (CE) where speculators
defaults to a KL to the target's distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from dspark.errors import DSparkError
from dspark.models.block_draft import DraftModel
from dspark.models.dflash2 import CandidateSelector
from dspark.models.layers import KVCache


@dataclass(frozen=True)
class LossConfig:
    num_anchors: int = 64
    gamma: float = 4.0
    ce_weight: float = 0.1
    l1_weight: float = 0.9
    confidence_weight: float = 1.0
    selector_weight: float = 1.0  # DFlash 2: the candidate selector's cross-entropy, added to the head's


@dataclass
class LossParts:
    """The loss and, detached, its parts: 0-dim tensors, so that computing them never waits for the
    device (read them with float() when they are shown)."""
    loss: Tensor
    ce: Tensor
    l1: Tensor
    bce: Tensor
    tau: Tensor  # 1 + sum_k prod_{i<=k} (1 - L1_i / 2): the probabilistic acceptance length estimate
    slots: Tensor
    selector: Tensor | None = None  # DFlash 2: the candidate selector's cross-entropy (None for other drafts)


def sample_anchors(loss_mask: Tensor, count: int, generator: torch.Generator) -> Tensor:
    """Up to `count` anchor positions a (sorted) with loss_mask[a] and loss_mask[a + 1]."""
    ok = (loss_mask[:-1] & loss_mask[1:]).nonzero().flatten()
    pick = torch.randperm(ok.numel(), generator=generator, device="cpu")[:count].to(ok.device)
    return ok[pick].sort().values


def pad_anchors(anchors: list[Tensor]) -> Tensor:
    """Per-sequence anchor lists as one [B, A] tensor, -1 where a sequence has fewer."""
    out = torch.full((len(anchors), max(1, max(a.numel() for a in anchors))), -1, dtype=torch.long,
                     device=anchors[0].device)
    for row, a in enumerate(anchors):
        out[row, : a.numel()] = a
    return out


def draft_loss(draft: DraftModel, feats: Tensor, target_logits: Tensor, ids: Tensor, loss_mask: Tensor,
               anchors: Tensor, cfg: LossConfig) -> LossParts:
    """The loss of one sequence (ids [S], anchors [A]) or of a right-padded batch (ids [B, S],
    anchors [B, A] with -1 for none), averaged over every scored slot of the batch."""
    dc = draft.config
    if ids.dim() == 1:
        feats, target_logits, ids, loss_mask, anchors = (t[None] for t in (feats, target_logits, ids, loss_mask,
                                                                          anchors))
    nb, s = ids.shape
    b = dc.block_size
    device = ids.device
    if draft.mask_embedding is not None:
        raise DSparkError("the trainer writes drafts that embed the mask token (no separate mask row)")
    # All blocks of a sequence run as one packed row: the context in slots 0..s-1, block j in slots
    # s + j*b .. s + j*b + b-1; each block sees the context before its anchor and itself (non-causal).
    anchor_all = anchors.clamp_min(0)  # unused blocks (-1) see only themselves and weigh nothing
    k = torch.arange(b, device=device)
    q = anchors.shape[1] * b
    packed_pos = (anchor_all[..., None] + k).reshape(nb, q)  # RoPE positions of the block rows
    slots = (s + torch.arange(q, device=device))[None].expand(nb, q)
    kv_len = s + q
    key = torch.arange(kv_len, device=device)
    before_anchor = key[None, None, :] < anchor_all.repeat_interleave(b, dim=1)[:, :, None]
    own_block = (key[None, :] >= s) & ((key[None, :] - s).div(b, rounding_mode="floor")
                                       == torch.arange(q, device=device)[:, None] // b)
    mask = (before_anchor | own_block[None])[:, None]  # [nb, 1, q, kv_len]
    bb = dc.backbone
    cache = KVCache(bb.num_layers, nb, bb.num_kv_heads, kv_len, bb.head_dim, feats.dtype, device)
    draft.add_context(feats, torch.arange(s, device=device)[None].expand(nb, s), cache)
    block = torch.full((nb, anchors.shape[1], b), dc.mask_token_id, dtype=torch.long, device=device)
    block[..., 0] = ids.gather(1, anchor_all)
    hidden = draft.block_hidden(block.view(nb, q), packed_pos, cache, kv_len, slots=slots, mask=mask)
    # One row per block from here on (no boolean indexing: the step never waits for the device), its drafted slots
    # only: anchor-first, all; fill-in (z-lab's layout), all but the anchor's.
    n = dc.num_drafts
    hidden = hidden.view(-1, b, hidden.shape[-1])[:, b - n :]  # [R, n, H]
    used = (anchors >= 0).flatten()  # [R]
    seq = torch.arange(nb, device=device).repeat_interleave(anchors.shape[1])  # [R] the sequence of each block
    r = seq.shape[0]
    positions = packed_pos.view(r, b)[:, b - n :]  # [R, n]
    logits = draft.base_logits(hidden)

    rows = seq[:, None]
    label_pos = positions + 1 - (b - n)  # the token a slot predicts: anchor + k + 1 (anchor-first), anchor + k (fill-in)
    in_seq = label_pos < s
    source = (label_pos - 1).clamp(max=s - 1)  # where the target predicts it, and the true token before it
    label_pos = label_pos.clamp(max=s - 1)
    valid = (in_seq & loss_mask[rows, label_pos] & used[:, None]).long().cumprod(-1).bool()  # a prefix mask
    labels = ids[rows, label_pos]
    prev = ids[rows, source]  # teacher forcing: each slot follows the true token before the one it predicts
    conf_logit = None
    if draft.markov_head is not None:
        state, biases, es = None, [], []
        for j in range(n):
            bias, e, state = draft.markov_head.step(hidden[:, j], prev[:, j], state)
            biases.append(bias)
            es.append(e)
        logits = logits + torch.stack(biases, 1)
        e_all = torch.stack(es, 1)
    if draft.confidence_head is not None:
        use_e = e_all if dc.confidence_head_with_markov else None
        conf_logit = draft.confidence_head(hidden, use_e)
    weight = torch.exp(-k[:n].float() / cfg.gamma)[None].expand(r, n) * valid
    norm = weight.sum().clamp_min(1e-6)
    log_q = F.log_softmax(logits.float(), -1)
    ce = -(log_q.gather(-1, labels[..., None]).squeeze(-1))
    t_logits = target_logits[rows, source].float()
    p_t = F.softmax(t_logits, -1)
    l1 = (log_q.exp() - p_t).abs().sum(-1)
    parts = {"ce": (ce * weight).sum() / norm, "l1": (l1 * weight).sum() / norm, "bce": torch.zeros((), device=device)}
    if dc.markov_rank == 0 and conf_logit is None:  # DFlash mode: cross-entropy only
        loss = parts["ce"]
    else:
        loss = cfg.ce_weight * parts["ce"] + cfg.l1_weight * parts["l1"]
        if conf_logit is not None:
            target_acc = (1 - l1.detach() / 2).clamp(0, 1)
            bce = F.binary_cross_entropy_with_logits(conf_logit, target_acc, reduction="none")
            parts["bce"] = (bce * weight).sum() / norm
            loss = loss + cfg.confidence_weight * parts["bce"]
    selector = None
    if draft.candidate_selector is not None:  # DFlash 2
        selector = selector_loss(draft.candidate_selector, hidden, logits, prev, t_logits.argmax(-1), weight) / norm
        loss = loss + cfg.selector_weight * selector
        selector = selector.detach()
    accept = ((1 - l1.detach() / 2) * valid).clamp(0, 1)
    tau = 1 + (accept.cumprod(-1).sum(-1) * used).sum() / used.sum().clamp_min(1)
    return LossParts(loss, *(parts[name].detach() for name in ("ce", "l1", "bce")), tau, valid.sum(), selector)


def selector_loss(selector: CandidateSelector, hidden: Tensor, logits: Tensor, predecessors: Tensor, target: Tensor,
                  weight: Tensor) -> Tensor:
    """The weighted sum of the selector's cross-entropy over each slot's candidates toward the target's token
    `target` [R, n] (speculators' `compute_selector_loss`): the head's top-k, the weakest replaced by the target's
    token where the top-k lacks it, scored with the true predecessors."""
    top_k = selector.top_k
    candidates = logits.detach().topk(top_k, dim=-1).indices  # sorted: the weakest last
    hit = candidates == target[..., None]
    present = hit.any(-1)
    candidates[..., -1] = torch.where(present, candidates[..., -1], target)
    index = torch.where(present, hit.long().argmax(-1), top_k - 1)
    scores = selector.score_candidates(hidden, logits, predecessors, candidates).float()
    ce = F.cross_entropy(scores.flatten(0, -2), index.flatten(), reduction="none").view_as(index)
    return (ce * weight).sum()

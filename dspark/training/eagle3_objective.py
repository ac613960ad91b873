"""The EAGLE-3 objective: training-time test (TTT) through the inference layer.

At inference every chain step after the first reads the draft's own pre-norm output instead of a
target state; a draft trained only on target states never learns the steps it takes most. So each
batch runs `ttt_length` steps over every row t of the sequences: step 0 reads `fc` of the target's
tapped states at t and the token at t + 1; step j reads step j-1's pre-norm output of the same row and
the token at t + 1 + j, at RoPE position t + j; each predicts the token at t + 2 + j. Step j's query
of row t sees the step-0 keys of rows <= t and the row's own keys of steps 1..j: what chain step j
sees in the engine, where committed rows hold target-state keys and the chain's earlier steps are
its own. Every step is one packed forward of `Eagle3Draft.forward` (the engine's layer code), its
keys in its own slots of one cache (step j: j*S .. j*S + S-1) and its visibility an explicit mask.

Step j's loss is the soft cross-entropy of the draft against the target's distribution for the token
the row predicts (its logits at t + 1 + j; forward KL up to a constant), averaged over the step's
scored rows and weighted `step_decay`^j. A row is scored where the block trainer scores a slot: its
first token (t + 1) and every label up to the step's in the loss mask. A reduced draft vocabulary is
scored against the target's distribution restricted to it and renormalised, and leaves out the rows
whose target arg-max it cannot propose (as SpecForge and EAGLE do).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from dspark.errors import DSparkError
from dspark.models.eagle3_draft import Eagle3Draft


@dataclass(frozen=True)
class TTTConfig:
    ttt_length: int = 7
    step_decay: float = 0.8


@dataclass
class TTTParts:
    """The loss and, detached, what it is made of: 0-dim or per-step tensors, never read on the device
    (float() them when shown)."""
    loss: Tensor
    step_ce: Tensor  # [n] each step's soft cross-entropy over its scored rows
    accuracy: Tensor  # [n] draft arg-max == target arg-max, over the rows in the loss mask (all vocabularies)
    tau: Tensor  # 1 + sum_j prod_{i<=j} accuracy_i: the acceptance length the step accuracies suggest
    rows: Tensor  # [n] rows scored at each step


def ttt_loss(draft: Eagle3Draft, feats: Tensor, target_logits: Tensor, ids: Tensor, loss_mask: Tensor,
             cfg: TTTConfig) -> TTTParts:
    """The TTT loss of one sequence (ids [S]) or a right-padded batch (ids [B, S]; causal attention
    keeps the padding out of every real row), with the target's tapped features [.., S, taps*H] and
    logits [.., S, V] (`dspark.training.loop.target_features`)."""
    if ids.dim() == 1:
        feats, target_logits, ids, loss_mask = (t[None] for t in (feats, target_logits, ids, loss_mask))
    nb, s = ids.shape
    n, device = cfg.ttt_length, ids.device
    if n < 1:
        raise DSparkError(f"ttt_length {n}: give at least 1 training-time-test step")
    to_target = draft.target_ids()
    logits = target_logits.float()
    t_arg = logits.argmax(-1)  # [B, S] the target's choice at each position, in target ids
    if draft.config.reduced_vocab:
        p = F.softmax(logits.index_select(-1, to_target), -1)  # restricted to the draft vocabulary, renormalised
        proposable = torch.zeros(logits.shape[-1], dtype=torch.bool, device=device).index_fill_(0, to_target, True)
        proposable = proposable[t_arg]
    else:
        p, proposable = F.softmax(logits, -1), torch.ones_like(t_arg, dtype=torch.bool)
    pad = n + 1  # every step's inputs and labels as slices of the sequence, read past its end as nothing
    p, t_arg, proposable, tokens = (F.pad(p, (0, 0, 0, pad)), F.pad(t_arg, (0, pad), value=-1),
                                    F.pad(proposable, (0, pad), value=False), F.pad(ids, (0, pad)))
    mask = F.pad(loss_mask, (0, pad + 1), value=False)
    valid = mask[:, 1 : s + 1]  # the row's first token; each step adds its label

    t = torch.arange(s, device=device)
    key = torch.arange(n * s, device=device)
    causal = key[None, :s] <= t[:, None]  # step 0's keys of rows <= t
    cache = draft.new_cache(n * s, nb)
    hidden = draft.project_features(feats)
    weights = cfg.step_decay ** torch.arange(n, dtype=torch.float32, device=device)
    loss, step_ce, accuracy, rows = [], [], [], []
    for j in range(n):
        if j:  # a new tensor for this step's writes: the earlier steps' saved keys stay as autograd saw them
            cache.k[0], cache.v[0] = cache.k[0].clone(), cache.v[0].clone()
        own = (key[None, s : (j + 1) * s] - s) % s == t[:, None]  # row t's own keys of steps 1..j
        step_mask = torch.cat((causal, own), dim=1)[None, None]
        normed, hidden = draft(draft.embed_tokens(tokens[:, 1 + j : 1 + j + s]), hidden, (t + j)[None].expand(nb, s),
                               cache, (j + 1) * s, slots=(t + j * s)[None].expand(nb, s), mask=step_mask)
        log_q = F.log_softmax(draft.logits(normed), -1)
        valid = valid & mask[:, 2 + j : 2 + j + s]
        scored = valid & proposable[:, 1 + j : 1 + j + s]
        ce = -(p[:, 1 + j : 1 + j + s] * log_q).sum(-1)
        count = scored.sum()
        loss.append((ce * scored).sum() / count.clamp_min(1))
        hit = (to_target[log_q.argmax(-1)] == t_arg[:, 1 + j : 1 + j + s]) & valid
        accuracy.append(hit.sum() / valid.sum().clamp_min(1))
        step_ce.append(loss[-1].detach())
        rows.append(count)
    accuracy = torch.stack(accuracy)
    return TTTParts((torch.stack(loss) * weights).sum(), torch.stack(step_ce), accuracy,
                    1 + accuracy.cumprod(0).sum(), torch.stack(rows))


def draft_vocabulary(examples: list[tuple[Tensor, Tensor]], size: int, vocab_size: int) -> Tensor:
    """The d2t map of a reduced draft vocabulary: the `size` target ids most frequent among the tokens
    the training data scores (its loss mask; ties to the lower id), sorted ascending, as offsets
    (target id = draft id + d2t[draft id]), as EAGLE builds it."""
    if not 0 < size < vocab_size:
        raise DSparkError(f"draft vocabulary {size}: give a size between 1 and the target's {vocab_size - 1}")
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, mask in examples:
        counts += torch.bincount(ids[mask], minlength=vocab_size)
    used = torch.argsort(-counts, stable=True)[:size].sort().values
    return used - torch.arange(size)

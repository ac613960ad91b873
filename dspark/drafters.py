"""Drafters: what proposes tokens for the target to verify. All share one interface and one verify path.

A drafter starts a request from the prompt, proposes a block from the newest committed token (the
anchor, whose target hidden state does not exist yet), and is told which verified rows were kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from dspark.draft import DraftModel
from dspark.sampling import probs, sample


@dataclass
class Proposal:
    tokens: Tensor  # [n] target token ids
    probs: Tensor | None  # [n, V] the exact distributions they were drawn from; None: deterministic
    confidence: Tensor | None = None  # [n] P(slot accepted | earlier slots accepted)


class Drafter(Protocol):
    method: str  # dspark | dflash | ngram
    taps: tuple[int, ...]  # target layers whose outputs the drafter reads
    block_size: int  # most tokens one proposal can hold

    def start(self, prompt_ids: Tensor, prompt_feats: Tensor | None, max_len: int) -> None: ...

    def propose(self, anchor: Tensor, position: int, temperature: float, generator: torch.Generator) -> Proposal: ...

    def commit(self, tokens: Tensor, feats: Tensor | None, position: int) -> None:
        """`tokens` [k] were kept at positions position..position+k-1 (anchor first), with their features."""


class BlockDrafter:
    """A DSpark (Markov-corrected) or DFlash (independent slots) draft model."""

    def __init__(self, model: DraftModel):
        self.model = model
        cfg = model.config
        self.method = cfg.method
        self.taps = cfg.target_layer_ids
        self.block_size = cfg.num_drafts
        self.cache = None
        self._pending: tuple[Tensor, int] | None = None

    def start(self, prompt_ids: Tensor, prompt_feats: Tensor | None, max_len: int) -> None:
        need = max_len + self.model.config.block_size
        if self.cache is None or self.cache.max_len < need:
            self.cache = self.model.new_cache(need)
        self._pending = (prompt_feats, 0)

    def commit(self, tokens: Tensor, feats: Tensor | None, position: int) -> None:
        self._pending = (feats, position)

    @torch.inference_mode()
    def propose(self, anchor: Tensor, position: int, temperature: float, generator: torch.Generator) -> Proposal:
        model, cfg = self.model, self.model.config
        device = anchor.device
        feats, first = self._pending
        model.add_context(feats, torch.arange(first, first + feats.shape[1], device=device)[None], self.cache)
        block = torch.full((1, cfg.block_size), cfg.mask_token_id, dtype=torch.long, device=device)
        block[0, 0] = anchor
        positions = torch.arange(position, position + cfg.block_size, device=device)[None]
        hidden = model.block_hidden(block, positions, self.cache, position + cfg.block_size)[0]
        hidden = hidden[cfg.block_size - cfg.num_drafts:]  # fill-in layout: slot 0 predicts nothing
        logits = model.base_logits(hidden)  # [n, Vd]
        to_target = model.target_ids()
        if model.markov_head is None:
            q = probs(logits, temperature)
            draft_ids = sample(q, generator)
            conf = torch.sigmoid(model.confidence_head(hidden, None)) if model.confidence_head else None
        else:
            q, draft_ids, conf = self._markov_sample(hidden, logits, anchor, temperature, generator, to_target)
        tokens = to_target[draft_ids]
        if cfg.reduced_vocab:  # verification needs q over the target vocabulary
            full = torch.zeros(q.shape[0], cfg.backbone.vocab_size, device=device)
            q = full.index_copy_(1, to_target, q)
        return Proposal(tokens, q, conf)

    def _markov_sample(self, hidden: Tensor, logits: Tensor, anchor: Tensor, temperature: float,
                       generator: torch.Generator, to_target: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """Left to right: slot k's logits get the bias of the token sampled at slot k-1 (the anchor for k=0)."""
        model = self.model
        prev, state = anchor.view(1), None
        qs, ids, confs = [], [], []
        for k in range(hidden.shape[0]):
            h = hidden[k : k + 1]
            bias, e, state = model.markov_head.step(h, prev, state)
            q = probs(logits[k : k + 1] + bias, temperature)
            d = sample(q, generator)
            if model.confidence_head is not None:
                use_e = e if model.config.confidence_head_with_markov else None
                confs.append(torch.sigmoid(model.confidence_head(h, use_e)))
            qs.append(q)
            ids.append(d)
            prev = to_target[d]
        conf = torch.cat(confs) if confs else None
        return torch.cat(qs), torch.cat(ids), conf


class NgramDrafter:
    """Prompt lookup: the tokens that followed the latest earlier occurrence of the newest n-gram.

    Tries n from `max_ngram` down to `min_ngram`; proposes up to `num_tokens` tokens (none when no
    n-gram recurs, which makes the round a plain decoding step through the same verify path).
    """

    method = "ngram"
    taps: tuple[int, ...] = ()

    def __init__(self, num_tokens: int = 7, min_ngram: int = 2, max_ngram: int = 4):
        self.block_size = num_tokens
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.history: list[int] = []

    def start(self, prompt_ids: Tensor, prompt_feats: Tensor | None, max_len: int) -> None:
        self.history = prompt_ids.tolist()

    def commit(self, tokens: Tensor, feats: Tensor | None, position: int) -> None:
        del self.history[position:]
        self.history.extend(tokens.tolist())

    def propose(self, anchor: Tensor, position: int, temperature: float, generator: torch.Generator) -> Proposal:
        seq = self.history[:position] + [int(anchor)]
        found: list[int] = []
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            tail = seq[-n:]
            for i in range(len(seq) - n - 1, -1, -1):  # latest earlier occurrence first
                if seq[i : i + n] == tail:
                    found = seq[i + n : i + n + self.block_size]
                    break
            if found:
                break
        return Proposal(torch.tensor(found, dtype=torch.long, device=anchor.device), None)

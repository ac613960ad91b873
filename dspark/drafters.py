"""Drafters: what proposes tokens for the target to verify. All share one interface and one verify path.

A drafter starts a request from the prompt's tapped features, then, once per round, writes a
proposal into the request's `DecodeState` (tokens, the distributions they were drawn from, how
many count). The block drafter works on the device only, so its step can be a CUDA graph; the
n-gram drafter looks the history up on the host.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from dspark import kernels
from dspark.draft import DraftModel
from dspark.layers import KVCache
from dspark.sampling import GREEDY_TEMPERATURE, draw, race_noise, top2_margin
from dspark.steps import DecodeState, scratch_positions, visible_len


class Drafter(Protocol):
    method: str  # dspark | dflash | ngram
    taps: tuple[int, ...]  # target layers whose outputs the drafter reads
    block_size: int  # proposal slots per round
    graphable: bool  # propose() is device work only, with no host decision
    margins: bool  # at T = 0, writes each slot's top-2 logit margin to `state.draft_margin` (for `parity`)

    def allocate(self, max_len: int) -> None: ...

    def start(self, state: DecodeState, prompt_feats: Tensor | None) -> None: ...

    def propose(self, state: DecodeState, temperature: float, threshold: float, generator: torch.Generator,
                history: list[int]) -> None:
        """Write the proposal following `state.anchor` (`history`: all committed ids, the anchor last)."""


class BlockDrafter:
    """A DSpark (Markov-corrected) or DFlash (independent slots) draft model."""

    graphable = True

    def __init__(self, model: DraftModel, margins: bool = False):
        self.model = model
        self.margins = margins
        cfg = model.config
        self.method = cfg.method
        self.taps = cfg.target_layer_ids
        self.block_size = cfg.num_drafts
        self.cache: KVCache | None = None
        device = model.fc.weight.device
        self._masks = torch.full((cfg.block_size - 1,), cfg.mask_token_id, dtype=torch.long, device=device)
        self._to_target = model.target_ids()

    def allocate(self, max_len: int) -> None:
        if self.cache is None or self.cache.max_len != max_len:
            self.cache = self.model.new_cache(max_len)

    def start(self, state: DecodeState, prompt_feats: Tensor | None) -> None:
        n = prompt_feats.shape[1]
        self.model.add_context(prompt_feats, torch.arange(n, device=prompt_feats.device)[None], self.cache)
        state.pending_count.zero_()

    def propose(self, state: DecodeState, temperature: float, threshold: float, generator: torch.Generator,
                history: list[int]) -> None:
        """The whole draft step: pending context rows in, block forward, slot sampling, proposal out."""
        model, cfg = self.model, self.model.config
        rows = state.verify_feats.shape[1]
        model.add_context(state.verify_feats, scratch_positions(state.pending_start, state.pending_count, rows,
                                                                self.cache), self.cache)
        block = torch.cat((state.anchor, self._masks))[None]
        positions = (state.position + torch.arange(cfg.block_size, device=block.device))[None]
        hidden = model.block_hidden(block, positions, self.cache, visible_len(self.cache))[0]
        hidden = hidden[cfg.block_size - cfg.num_drafts :]  # fill-in layout: slot 0 predicts nothing
        logits = model.base_logits(hidden)  # [n, Vd]
        if model.markov_head is None:
            draft_ids, q = draw(logits, temperature, generator, with_probs=True)
            conf = torch.sigmoid(model.confidence_head(hidden, None)) if model.confidence_head else None
        else:
            q, draft_ids, conf, logits = self._markov_sample(hidden, logits, state.anchor, temperature, generator)
        if self.margins and temperature <= GREEDY_TEMPERATURE:  # the logits each greedy slot took its arg-max of
            state.draft_margin.copy_(top2_margin(logits))
        state.draft_tokens[0].copy_(self._to_target[draft_ids])
        if cfg.reduced_vocab:  # verification needs q over the target vocabulary
            state.draft_probs[0].zero_().index_copy_(1, self._to_target, q)
        else:
            state.draft_probs[0].copy_(q)
        n = cfg.num_drafts
        if conf is None:
            state.confidence.fill_(1.0)
            state.num_proposed.fill_(n)
            return
        state.confidence[0].copy_(conf)
        below = conf < threshold  # cut at the first slot whose confidence is under the threshold
        first = torch.where(below.any(), below.int().argmax(), n)
        state.num_proposed.copy_(first.view(1))

    def _markov_sample(self, hidden: Tensor, logits: Tensor, anchor: Tensor, temperature: float,
                       generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
        """Left to right: slot k's logits get the bias of the token sampled at slot k-1 (the anchor for k=0).
        Returns (q, the drafts, their confidence, the corrected logits).

        Only the sampling is sequential (the race on the corrected logits, noise drawn for all slots at
        once); the distributions q are formed afterwards for all slots at once. The vanilla head runs
        as one fused launch per slot (`kernels.markov_sample`); the gated and recurrent heads, whose
        bias also depends on the slot's hidden state, step through `MarkovHead.step`.
        """
        head = self.model.markov_head
        noise = race_noise(tuple(logits.shape), temperature, generator, logits.device)
        greedy = temperature <= GREEDY_TEMPERATURE
        if head.kind == "vanilla":
            q, ids, prevs, corrected = kernels.markov_sample(logits, head.markov_w1.weight, head.markov_w2.weight,
                                                             self._to_target, anchor, noise, temperature, greedy)
        else:
            state = None

            def bias_of(prev: Tensor, k: int) -> Tensor:
                nonlocal state
                bias, _, state = head.step(hidden[k : k + 1], prev, state)
                return bias

            q, ids, prevs, corrected = kernels.markov_sample_ref(logits, bias_of, self._to_target, anchor, noise,
                                                                 temperature, greedy)
        conf = None
        if self.model.confidence_head is not None:  # slot k sees h_k and x_{k-1}, never x_k: batched after the loop
            e = head.markov_w1(prevs) if self.model.config.confidence_head_with_markov else None
            conf = torch.sigmoid(self.model.confidence_head(hidden, e))
        return q, ids, conf, corrected


class NgramDrafter:
    """Prompt lookup: the tokens that followed the latest earlier occurrence of the newest n-gram.

    Tries n from `max_ngram` down to `min_ngram`; proposes up to `num_tokens` tokens (none when no
    n-gram recurs, which makes the round a plain decoding step through the same verify path).
    Proposals are deterministic, so their distributions are one-hot.
    """

    method = "ngram"
    taps: tuple[int, ...] = ()
    graphable = False
    margins = False  # its proposals are lookups, not arg-maxes

    def __init__(self, num_tokens: int = 7, min_ngram: int = 2, max_ngram: int = 4):
        self.block_size = num_tokens
        self.min_ngram, self.max_ngram = min_ngram, max_ngram

    def allocate(self, max_len: int) -> None:
        pass

    def start(self, state: DecodeState, prompt_feats: Tensor | None) -> None:
        pass

    def lookup(self, history: list[int]) -> list[int]:
        for n in range(min(self.max_ngram, len(history) - 1), self.min_ngram - 1, -1):
            tail = history[-n:]
            for i in range(len(history) - n - 1, -1, -1):  # latest earlier occurrence first
                if history[i : i + n] == tail:
                    return history[i + n : i + n + self.block_size]
        return []

    def propose(self, state: DecodeState, temperature: float, threshold: float, generator: torch.Generator,
                history: list[int]) -> None:
        found = self.lookup(history)
        tokens = torch.zeros(1, self.block_size, dtype=torch.long)
        tokens[0, : len(found)] = torch.tensor(found, dtype=torch.long)
        state.draft_tokens.copy_(tokens)
        state.draft_probs.zero_().scatter_(-1, state.draft_tokens[..., None], 1.0)
        state.num_proposed.fill_(len(found))

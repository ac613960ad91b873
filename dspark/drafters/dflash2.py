"""The DFlash 2 drafter (method `dflash2`): z-lab's DFlash 2 draft (`dspark.models.dflash2`) proposing a block.

The block forward is the block drafter's (`BlockDrafter.slot_hidden`: context rows in, one forward over [anchor,
mask, ...], the convolutions inside each layer); the slots are then filled by the candidate selector, left to right,
instead of independently from the head. For lossless rejection sampling `state.draft_probs` holds the selector's q
of each slot scattered over the vocabulary at that slot's candidates, zero elsewhere: as z-lab's
`_rejection_sample` with `draft_indices` reads it, a draft is accepted with min(1, p / q) at its own q, and the
residual max(p - q, 0) over the vocabulary (the engine's accept step) is z-lab's `target - scatter(q)` clamped at 0.
At T > 0 the selector samples from softmax(scores / T) with temperature only, as z-lab's does (it ignores top_p and
top_k there; the target's distributions are the engine's as for every drafter). Device work only: graphable.
"""

from __future__ import annotations

import torch

from dspark.drafters.block import BlockDrafter
from dspark.engine.steps import DecodeState
from dspark.models.block_draft import DraftModel
from dspark.sampling import GREEDY_TEMPERATURE, top2_margin
from dspark.schedule import ProposalCut


class DFlash2Drafter(BlockDrafter):
    """A z-lab DFlash 2 draft: the block's hidden states, the head's top-k per slot, the selector's path."""

    def __init__(self, model: DraftModel, margins: bool = False):
        if model.candidate_selector is None:
            raise ValueError("DFlash2Drafter needs a DFlash 2 draft (one with a candidate selector)")
        super().__init__(model, margins)

    def propose(self, state: DecodeState, temperature: float, cut: ProposalCut, generator: torch.Generator,
                history: list[int]) -> None:
        model = self.model
        hidden = self.slot_hidden(state)
        logits = model.base_logits(hidden)  # [n, V] (z-lab's format: the whole target vocabulary)
        tokens, candidates, q, scores = model.candidate_selector.select(hidden, logits, state.anchor, temperature,
                                                                         generator)
        if self.margins and temperature <= GREEDY_TEMPERATURE:  # the scores each greedy slot took its arg-max of
            if scores.shape[-1] > 1:
                state.draft_margin.copy_(top2_margin(scores))
            else:  # one candidate: no runner-up to flip to
                state.draft_margin.fill_(float("inf"))
        state.draft_tokens[0].copy_(tokens)
        state.draft_probs[0].zero_().scatter_(1, candidates, q)
        state.confidence.fill_(1.0)
        state.num_proposed.fill_(self.block_size)

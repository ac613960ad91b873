"""What every drafter offers the engine: start a request, then propose once per round."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from dspark.engine.steps import DecodeState
from dspark.schedule import ProposalCut


class Drafter(Protocol):
    method: str  # dspark | dflash | eagle3 | ngram
    taps: tuple[int, ...]  # target layers whose outputs the drafter reads (-1: the embedding output)
    block_size: int  # proposal slots per round
    graphable: bool  # propose() is device work only, with no host decision
    margins: bool  # at T = 0, writes each slot's top-2 logit margin to `state.draft_margin` (for `parity`)
    has_confidence: bool  # writes each slot's confidence head output to `state.confidence` (else 1s)

    def allocate(self, max_len: int) -> None: ...

    def start(self, state: DecodeState, prompt_feats: Tensor | None, prompt_ids: Tensor) -> None:
        """A new request, after the target's prefill: its tapped features (`taps`; None without) and its ids
        [1, n] on the device (a drafter with its own model, `draft_model`, prefills its cache from them)."""

    def propose(self, state: DecodeState, temperature: float, cut: ProposalCut, generator: torch.Generator,
                history: list[int]) -> None:
        """Write the proposal following `state.anchor` (`history`: all committed ids, the anchor last; empty for a
        graphable drafter, which reads no host state) and how many of its slots to verify (`cut`: drafters with a
        confidence head cut by it, others verify all)."""

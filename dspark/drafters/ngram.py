"""The n-gram drafter: prompt lookup on the host."""

from __future__ import annotations

import torch
from torch import Tensor

from dspark.engine.steps import DecodeState
from dspark.schedule import ProposalCut


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
    has_confidence = False

    def __init__(self, num_tokens: int = 7, min_ngram: int = 2, max_ngram: int = 4):
        self.block_size = num_tokens
        self.min_ngram, self.max_ngram = min_ngram, max_ngram

    def allocate(self, max_len: int) -> None:
        pass

    def start(self, state: DecodeState, prompt_feats: Tensor | None, prompt_ids: Tensor) -> None:
        pass

    def lookup(self, history: list[int]) -> list[int]:
        for n in range(min(self.max_ngram, len(history) - 1), self.min_ngram - 1, -1):
            tail = history[-n:]
            for i in range(len(history) - n - 1, -1, -1):  # latest earlier occurrence first
                if history[i : i + n] == tail:
                    return history[i + n : i + n + self.block_size]
        return []

    def propose(self, state: DecodeState, temperature: float, cut: ProposalCut, generator: torch.Generator,
                history: list[int]) -> None:
        found = self.lookup(history)
        tokens = torch.zeros(1, self.block_size, dtype=torch.long)
        tokens[0, : len(found)] = torch.tensor(found, dtype=torch.long)
        state.draft_tokens.copy_(tokens)
        state.draft_probs.zero_().scatter_(-1, state.draft_tokens[..., None], 1.0)
        state.num_proposed.fill_(len(found))

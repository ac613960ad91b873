"""How many of a block's drafts go to verification: all of them, DeepSpec's fixed confidence threshold,
or the DSpark paper's hardware-aware prefix scheduler at batch size 1.

The confidence head's logit c_k for slot k reads the slot's hidden state and the token drawn before
it, never the slot's own draft, so cutting the proposal by it keeps the output distribution the
target's (dspark-spec 3.4). The scheduler picks the prefix length l that maximises expected tokens
per unit of time, (1 + sum_{j<l} a_j) / cost(l), where a_j = prod_{i<=j} sigmoid(c_i / T_i) is the prefix
survival after Sequential Temperature Scaling and cost(l) a measured round that verifies l drafts.
Everything here is device work on fixed shapes (it runs inside the propose step's CUDA graph).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class ProposalCut:
    """A proposal-length policy, its constants already on the device."""

    threshold: float = 0.0  # > 0: cut at the first slot whose confidence is below it
    costs: Tensor | None = None  # [N+1]: the scheduler's cost of a round that verifies l = 0..N drafts
    temperatures: Tensor | None = None  # [N]: STS temperatures of the confidence logits (the scheduler's)

    @property
    def cuts(self) -> bool:
        """Whether proposals can come out shorter than the block (then verify runs only what counts)."""
        return self.threshold > 0 or self.costs is not None

    def length(self, logits: Tensor) -> Tensor:
        """[1] how many of the N slots to verify, from the N confidence logits."""
        n = logits.shape[-1]
        if self.costs is not None:
            return scheduled_length(logits, self.temperatures, self.costs)
        below = torch.sigmoid(logits) < self.threshold  # (never, at threshold 0)
        return torch.where(below.any(), below.int().argmax(), n).view(1)


def scheduled_length(logits: Tensor, temperatures: Tensor | None, costs: Tensor) -> Tensor:
    """[1] the l in 0..N maximising (1 + sum_{j<l} a_j) / costs[l] (the shortest among equals)."""
    scaled = logits if temperatures is None else logits / temperatures
    survival = torch.cumprod(torch.sigmoid(scaled.float()), 0)
    expected = 1 + torch.cat((survival.new_zeros(1), torch.cumsum(survival, 0)))
    return torch.argmax(expected / costs).view(1)

"""Temperature, sampling and the lossless acceptance rule (spec §4.1), batched over a leading dimension.

All probabilities are float32. Sampling uses the exponential race (argmax of p / E, E ~ Exp(1)),
which draws exactly from p, needs no normalisation (so a residual max(p - q, 0) is sampled as is)
and runs the same on CPU and GPU, inside or outside a CUDA graph. From logits it is the same race
in log space, argmax(logits - T * log E), which never forms the softmax (`draw`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dspark import kernels

GREEDY_TEMPERATURE = 1e-5  # at or below this, sampling is argmax


def probs(logits: Tensor, temperature: float) -> Tensor:
    """softmax(logits / T) in float32 over the last axis; one-hot at the argmax when T is ~0."""
    greedy = temperature <= GREEDY_TEMPERATURE
    return kernels.vocab_draw(logits, None, temperature, greedy, want_probs=True)[1]


def sample(weights: Tensor, generator: torch.Generator | None) -> Tensor:
    """One index per row of non-negative `weights` [..., V], drawn with probability proportional to them."""
    noise = torch.empty_like(weights).exponential_(generator=generator)
    return (weights / noise).argmax(-1)


def race_noise(shape: tuple[int, ...], temperature: float, generator: torch.Generator | None,
               device: torch.device) -> Tensor | None:
    """Exp(1) arrival times for the exponential race: argmax(logits - T * log(noise)) samples
    softmax(logits / T) exactly, with no normalisation; None at greedy temperatures (argmax is the sample)."""
    if temperature <= GREEDY_TEMPERATURE:
        return None
    return torch.empty(shape, device=device).exponential_(generator=generator)


def draw(logits: Tensor, temperature: float, generator: torch.Generator | None,
         with_probs: bool = False) -> tuple[Tensor, Tensor | None]:
    """A token per row of `logits` [..., V] from softmax(logits / T) (the argmax when T is ~0), and
    with `with_probs` the distribution it came from (`probs`), in the same two passes over the vocabulary."""
    noise = race_noise(tuple(logits.shape), temperature, generator, logits.device)
    return kernels.vocab_draw(logits, noise, temperature, temperature <= GREEDY_TEMPERATURE, with_probs)


def top2_margin(logits: Tensor) -> Tensor:
    """Per row, how far the arg-max logit leads the runner-up (float32): a greedy choice this close is
    one that float error in another engine can flip."""
    top = logits.float().topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


@dataclass
class Streams:
    """Independent random streams: drafting, acceptance uniforms, and target-side sampling
    (prefill token, residual, bonus, plain decoding). One seed makes a run reproducible."""

    draft: torch.Generator
    accept: torch.Generator
    target: torch.Generator

    @classmethod
    def from_seed(cls, seed: int, device: torch.device | str) -> "Streams":
        streams = cls(*(torch.Generator(device=device) for _ in range(3)))
        streams.reseed(seed)
        return streams

    def reseed(self, seed: int) -> None:
        """Restart all three streams from `seed` (in place: CUDA graphs hold these generators)."""
        for offset, gen in enumerate((self.draft, self.accept, self.target), start=1):
            gen.manual_seed((seed * 1_000_003 + offset) % (2**63))

    def generators(self) -> tuple[torch.Generator, ...]:
        return self.draft, self.accept, self.target


def rejection_sample(draft_tokens: Tensor, draft_probs: Tensor, target_probs: Tensor, streams: Streams,
                     num_proposed: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Verify up to n proposed tokens per row.

    draft_tokens [B, n]; draft_probs [B, n, V]: the exact distribution each token was drawn from
    (one-hot for a deterministic proposer); target_probs [B, n+1, V]: row i is the target's
    distribution for the token after proposal prefix i; num_proposed [B]: how many of the n slots
    count (all when None). Token i is accepted with probability min(1, p_i(d_i) / q_i(d_i)) while
    all before it were; the first rejected slot is resampled from max(p - q, 0), and when every
    counted slot is accepted a bonus token is drawn from the next p. Shapes never depend on the
    outcome, so this runs inside a CUDA graph. Returns (accepted count [B], next token [B]).
    """
    b, n = draft_tokens.shape
    u = torch.rand(b, n, device=target_probs.device, generator=streams.accept)
    noise = torch.empty(b, target_probs.shape[-1], device=target_probs.device).exponential_(generator=streams.target)
    return kernels.accept(draft_tokens, draft_probs, target_probs, num_proposed, u, noise)


def synthetic_accept(target_probs: Tensor, conditional: Tensor, streams: Streams,
                     num_proposed: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Acceptance at a chosen profile instead of the lossless rule (timing at a set acceptance; see
    `dspark.synthetic.acceptance`): slot i is accepted with probability conditional[i] [n] while every slot before it
    was and it counts (num_proposed [B]), from the acceptance stream's uniforms, as the real rule draws
    them; the next token is drawn from the target's distribution at the first row not accepted (the
    rejected slot's, or the bonus row). The target has verified the whole block either way, and shapes
    never depend on the outcome, so this runs inside a CUDA graph. Returns (accepted count [B], next token [B])."""
    b, n = target_probs.shape[0], conditional.shape[0]
    device = target_probs.device
    u = torch.rand(b, n, device=device, generator=streams.accept)
    ok = u < conditional
    if num_proposed is not None:
        ok &= torch.arange(n, device=device) < num_proposed[:, None]
    accepted = ok.long().cumprod(-1).sum(-1)
    return accepted, sample(target_probs[torch.arange(b, device=device), accepted], streams.target)


"""The decode loop's steps: each named once (its NVTX range, its key in `round_ms`, its CUDA-graph key), and
their tensor code on fixed buffers, which runs the same eagerly and inside CUDA graphs.

A speculative round is the drafter's propose step (its range carries the method), VERIFY, then
ACCEPT; plain decoding is one DECODE per token. The range names (read from nsys traces) and the
kinds (the `round_ms` keys of every result record) are outputs: they are spelt here and nowhere else.

A request's state between steps lives on the device (`DecodeState`): the anchor and its position,
the proposal, the target's verify distributions, the context rows waiting to enter the draft's
cache, and the round's outcome, which the host reads back once per round. No step takes a Python
value that changes from round to round; variable lengths (rows accepted, tokens proposed) are
device tensors, and rows that do not count are written to a scratch cache slot no query can see.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from dspark.models.layers import KVCache
from dspark.models.target import Qwen3Target
from dspark.sampling import Streams, draw, probs, rejection_sample, synthetic_accept


@dataclass(frozen=True)
class Step:
    kind: str  # its times' key in GenerationResult.round_ms
    range: str  # the NVTX range around it
    settings: tuple[str, ...] = ()  # the GenerationConfig fields its work depends on: one graph per value
    rows: int | None = None  # VERIFY over fewer rows than the whole block (a policy cut the proposal)

    def graph_key(self, cfg) -> tuple:
        """The key of its CUDA graph under `cfg` (a GenerationConfig)."""
        return (self.kind, *(getattr(cfg, name) for name in self.settings), *(() if self.rows is None else (self.rows,)))

    def over(self, rows: int) -> "Step":
        """The same step over `rows` query rows: its own graph, the same range and timer key."""
        return replace(self, rows=rows)


def propose_step(method: str) -> Step:
    """The drafter's step for a `method` (dspark, dflash, ngram) drafter; its range is `<method>_propose`."""
    return Step("propose", f"{method}_propose", ("temperature", "confidence_threshold", "confidence_schedule",
                                                 "confidence_temperatures"))


VERIFY = Step("verify", "target_verify", ("temperature",))  # the target over the anchor and the proposal
# acceptance (lossless, or at a synthetic profile), the next token, the move to the next anchor
ACCEPT = Step("accept", "decode_sample", ("synthetic_rates",))
DECODE = Step("decode", "ar_decode", ("temperature",))  # plain decoding: one token

HOST = "host"  # round_ms: the round's wall time that no step covers
PREFILL = "prefill"  # the NVTX ranges that are not steps
WARMUP = "warmup"  # only around graph captures


@dataclass
class DecodeState:
    position: Tensor  # [1] position of the anchor (the newest committed token)
    anchor: Tensor  # [1] the newest committed token
    draft_tokens: Tensor  # [1, N] proposal (target ids)
    draft_probs: Tensor  # [1, N, V] the distributions the proposal was drawn from (one-hot if deterministic)
    num_proposed: Tensor  # [1] how many proposal slots are verified (<= N)
    confidence: Tensor  # [1, N] P(slot accepted | earlier accepted); 1 without a confidence head
    target_probs: Tensor  # [1, N+1, V] the target's distributions over the verified rows
    verify_feats: Tensor  # [1, N+1, F] tapped target features of the verified rows (F may be 0)
    pending_start: Tensor  # [1] position of the first context row the draft has not seen
    pending_count: Tensor  # [1] how many rows of verify_feats wait for the draft's cache
    round_out: Tensor  # [N+3]: accepted, proposed, then the emitted tokens (accepted drafts, next token)
    draft_margin: Tensor  # [N] greedy drafts: the top-2 logit margin per slot (written by drafters that record it)
    round_index: Tensor  # [1] rounds done in this request (the accept step counts them)
    confidence_log: Tensor  # [R, N] each round's `confidence`, written by the accept step (read once per request)

    @classmethod
    def allocate(cls, num_drafts: int, vocab: int, feat_dim: int, dtype: torch.dtype, device,
                 max_rounds: int = 1) -> "DecodeState":
        n = num_drafts

        def zeros(*shape, dt=torch.long):
            return torch.zeros(shape, dtype=dt, device=device)

        return cls(
            position=zeros(1), anchor=zeros(1), draft_tokens=zeros(1, n), draft_probs=zeros(1, n, vocab, dt=torch.float32),
            num_proposed=zeros(1), confidence=zeros(1, n, dt=torch.float32),
            target_probs=zeros(1, n + 1, vocab, dt=torch.float32), verify_feats=zeros(1, n + 1, feat_dim, dt=dtype),
            pending_start=zeros(1), pending_count=zeros(1), round_out=zeros(n + 3),
            draft_margin=zeros(n, dt=torch.float32), round_index=zeros(1),
            confidence_log=zeros(max_rounds + 1, n, dt=torch.float32),  # (the last row: rounds past the end)
        )


def visible_len(cache: KVCache) -> int:
    """Keys every step may read; the cache's last slot is scratch for rows that do not count."""
    return cache.max_len - 1


def scratch_positions(first: Tensor, count: Tensor, rows: int, cache: KVCache) -> Tensor:
    """[1, rows] positions first, first+1, ... for the first `count` rows, the scratch slot for the rest."""
    offsets = torch.arange(rows, device=first.device)
    return torch.where(offsets < count, first + offsets, visible_len(cache))[None]


class TargetSteps:
    """Plain decoding and verification on the target, sampling included."""

    def __init__(self, target: Qwen3Target, cache: KVCache, state: DecodeState, streams: Streams,
                 taps: tuple[int, ...]):
        self.target, self.cache, self.state, self.streams, self.taps = target, cache, state, streams, taps

    def ar_decode(self, temperature: float) -> None:
        """One plain step: the anchor's logits, a sampled next token, the state moved by one."""
        s = self.state
        hidden, _ = self.target(s.anchor.view(1, 1), s.position.view(1, 1), self.cache, visible_len(self.cache))
        token, _ = draw(self.target.logits(hidden[:, -1]), temperature, self.streams.target)
        s.anchor.copy_(token)
        s.position.add_(1)

    def verify(self, temperature: float, rows: int | None = None) -> None:
        """Target forward over [anchor, proposal]: all N+1 rows, or the first `rows` when a policy cut the
        proposal to rows - 1 slots (either way, rows past num_proposed are never read)."""
        s = self.state
        ids = torch.cat((s.anchor, s.draft_tokens[0]))[None, :rows]
        n = ids.shape[1]
        positions = (s.position + torch.arange(n, device=ids.device))[None]
        hidden, feats = self.target(ids, positions, self.cache, visible_len(self.cache), self.taps)
        s.target_probs[:, :n].copy_(probs(self.target.logits(hidden), temperature))
        if feats is not None:
            s.verify_feats[:, :n].copy_(feats)

    def accept(self, synthetic: Tensor | None = None) -> None:
        """Acceptance, residual or bonus sampling, and the move to the next anchor; with `synthetic`
        (per-slot conditional rates on the device) acceptance at that profile instead of the lossless rule."""
        s = self.state
        if synthetic is None:
            accepted, token = rejection_sample(s.draft_tokens, s.draft_probs, s.target_probs, self.streams,
                                               s.num_proposed)
        else:
            accepted, token = synthetic_accept(s.target_probs, synthetic, self.streams, s.num_proposed)
        slots = torch.arange(s.draft_tokens.shape[1] + 1, device=token.device)
        drafts = torch.cat((s.draft_tokens[0], token))
        emitted = torch.where(slots < accepted, drafts, token)
        s.round_out.copy_(torch.cat((accepted, s.num_proposed, emitted)))
        # the round's confidences logged on the device, inside this step's graph: no launch from the host
        s.confidence_log.index_copy_(0, s.round_index.clamp_max(s.confidence_log.shape[0] - 1), s.confidence)
        s.round_index.add_(1)
        s.pending_start.copy_(s.position)  # the anchor and the accepted drafts enter the draft's context
        s.pending_count.copy_(accepted + 1)
        s.position.add_(accepted + 1)
        s.anchor.copy_(token)

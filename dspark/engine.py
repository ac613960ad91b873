"""Batch-size-1 generation: plain decoding and speculative decoding over any drafter, one target path.

Accounting (one convention everywhere): the first generated token comes from the prefill and is not
a round. Each verify round records its proposal length and emits accepted + 1 tokens (only the
accepted ones up to a stop token when one was accepted; 1 when the proposal was empty). A drafted
block is proposed whole; when the last round overshoots `max_new_tokens` the extra tokens are cut
from the output but the round keeps its count. A stop token, when produced, is the last token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from dspark.drafters import Drafter
from dspark.errors import DSparkError
from dspark.sampling import Streams, probs, rejection_sample, sample
from dspark.target import Qwen3Target


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    stop_token_ids: tuple[int, ...] = ()
    confidence_threshold: float = 0.0  # > 0: cut a proposal at the first slot whose confidence is below


@dataclass
class GenerationResult:
    prompt_len: int
    tokens: list[int] = field(default_factory=list)  # all generated ids, the prefill token first
    acceptance_lengths: list[int] = field(default_factory=list)  # tokens emitted per round
    proposal_lengths: list[int] = field(default_factory=list)  # tokens verified per round
    stop_reason: str = "max_new_tokens"  # or "stop_token"
    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def num_rounds(self) -> int:
        return len(self.acceptance_lengths)

    @property
    def acceptance_length(self) -> float | None:
        """Mean tokens per round (the paper's tau); None for plain decoding."""
        return sum(self.acceptance_lengths) / self.num_rounds if self.num_rounds else None

    def to_dict(self) -> dict:
        return {
            "tokens": self.tokens,
            "num_tokens": len(self.tokens),
            "acceptance_lengths": self.acceptance_lengths,
            "proposal_lengths": self.proposal_lengths,
            "num_rounds": self.num_rounds,
            "acceptance_length": self.acceptance_length,
            "stop_reason": self.stop_reason,
            "prompt_len": self.prompt_len,
            "prefill_s": self.prefill_s,
            "decode_s": self.decode_s,
        }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Engine:
    """Runs one request at a time on `target`, speculatively when given a drafter."""

    def __init__(self, target: Qwen3Target, drafter: Drafter | None = None):
        self.target = target
        self.drafter = drafter
        self.device = target.lm_head.weight.device
        self.cache = None

    def _cache_for(self, max_len: int):
        if self.cache is None or self.cache.max_len < max_len:
            self.cache = self.target.new_cache(max_len)
        return self.cache

    def _positions(self, start: int, n: int) -> Tensor:
        return torch.arange(start, start + n, device=self.device)[None]

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], cfg: GenerationConfig) -> GenerationResult:
        if not prompt_ids:
            raise DSparkError("the prompt is empty; give at least one token")
        if cfg.max_new_tokens < 1:
            raise DSparkError(f"max_new_tokens is {cfg.max_new_tokens}; it must be at least 1")
        n = len(prompt_ids)
        block = self.drafter.block_size if self.drafter else 0
        max_len = n + cfg.max_new_tokens + block + 1
        limit = self.target.config.max_position_embeddings
        if max_len - block - 1 > limit:
            raise DSparkError(f"prompt ({n}) + max_new_tokens ({cfg.max_new_tokens}) exceeds the target's "
                              f"max_position_embeddings ({limit}); lower --max-new-tokens")
        cache = self._cache_for(max_len)
        streams = Streams.from_seed(cfg.seed, self.device)
        taps = self.drafter.taps if self.drafter else ()
        result = GenerationResult(prompt_len=n)

        t0 = time.perf_counter()
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        hidden, feats = self.target(ids, self._positions(0, n), cache, n, taps)
        x = sample(probs(self.target.logits(hidden[:, -1]), cfg.temperature), streams.target)
        if self.drafter:
            self.drafter.start(ids[0], feats, max_len)
        result.tokens.append(int(x))
        _sync(self.device)
        t1 = time.perf_counter()
        result.prefill_s = t1 - t0

        stop = set(cfg.stop_token_ids)
        position = n  # where the newest token (the anchor) sits
        while len(result.tokens) < cfg.max_new_tokens and result.tokens[-1] not in stop:
            if self.drafter is None:
                hidden, _ = self.target(x[None], self._positions(position, 1), cache, position + 1)
                x = sample(probs(self.target.logits(hidden[:, -1]), cfg.temperature), streams.target)
                result.tokens.append(int(x))
                position += 1
                continue
            x, emitted = self._round(x, position, cache, cfg, streams, result)
            position += emitted
        _sync(self.device)
        result.decode_s = time.perf_counter() - t1

        for i, tok in enumerate(result.tokens[: cfg.max_new_tokens]):
            if tok in stop:
                result.tokens = result.tokens[: i + 1]
                result.stop_reason = "stop_token"
                break
        del result.tokens[cfg.max_new_tokens :]
        return result

    def _round(self, anchor: Tensor, position: int, cache, cfg: GenerationConfig, streams: Streams,
               result: GenerationResult) -> tuple[Tensor, int]:
        """Propose, verify, accept. Returns the next anchor and how many positions were committed."""
        proposal = self.drafter.propose(anchor, position, cfg.temperature, streams.draft)
        n_prop = proposal.tokens.shape[0]
        if cfg.confidence_threshold > 0:
            if proposal.confidence is None:
                raise DSparkError(f"--confidence-threshold needs a draft with a confidence head; "
                                  f"this {self.drafter.method} drafter has none")
            low = (proposal.confidence < cfg.confidence_threshold).nonzero()
            if low.numel():
                n_prop = int(low[0, 0])
        drafts = proposal.tokens[:n_prop]
        verify_ids = torch.cat((anchor.view(1), drafts))[None]
        hidden, feats = self.target(verify_ids, self._positions(position, n_prop + 1), cache,
                                    position + n_prop + 1, self.drafter.taps)
        p = probs(self.target.logits(hidden), cfg.temperature)
        if proposal.probs is None:
            q = torch.zeros_like(p[:, :n_prop]).scatter_(-1, drafts.view(1, -1, 1), 1.0)
        else:
            q = proposal.probs[None, :n_prop]
        accepted, nxt = rejection_sample(drafts[None], q, p, streams)
        a = int(accepted)
        emitted = drafts[:a].tolist() + [int(nxt)]
        stop = set(cfg.stop_token_ids)
        for i, tok in enumerate(emitted[:-1]):
            if tok in stop:
                emitted = emitted[: i + 1]
                break
        result.proposal_lengths.append(n_prop)
        result.acceptance_lengths.append(len(emitted))
        result.tokens.extend(emitted)
        self.drafter.commit(verify_ids[0, : a + 1], None if feats is None else feats[:, : a + 1], position)
        return nxt, a + 1

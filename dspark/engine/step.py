"""The decode loop's steps, each named once: its NVTX range, its key in `round_ms`, its CUDA-graph key.

A speculative round is the drafter's propose step (its range carries the method), VERIFY, then
ACCEPT; plain decoding is one DECODE per token. The range names (read from nsys traces) and the
kinds (the `round_ms` keys of every result record) are outputs: they are spelt here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


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

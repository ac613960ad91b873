"""What a backend is to a run: the protocol every engine we measure fits (our own engine today; vLLM
offline, an OpenAI-compatible server, a batched native engine next), and the harness-owned types
that cross it, so `runs/` never reaches into an engine.

A backend says what it can report (`Capabilities`), prepares a system, warms it up outside any
timing, generates one request or several in flight, and releases a system's device memory.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harness.specs.experiments import System

# What the vLLM backends write in the run folder, some of it before the manifest (vLLM's log opens as it is
# imported): a run that failed there leaves only these, and the folder stays free for a new run
VLLM_LOG = "vllm.log"  # vLLM's output, every process
VLLM_LOGGING = "vllm-logging.json"  # the logging config vLLM's processes read
VLLM_DRAFTS = "vllm-drafts"  # draft folders as the installed vLLM reads them
SERVER_LOG = "server-{}.log"  # one `vllm serve`'s output, per system
LEFTOVERS = (VLLM_LOG, VLLM_LOGGING, VLLM_DRAFTS, SERVER_LOG.format("*"))  # (glob patterns)


@dataclass(frozen=True)
class Capabilities:
    max_concurrency: int  # requests it can have in flight at once
    step_timing: bool  # per-round propose / verify / accept times (`round_ms`)
    acceptance: str  # how finely acceptance is known: "round", "request" or "run" (server counters)
    deterministic_greedy: bool  # greedy tokens repeat exactly, so they can be held against plain decoding's
    # every system stays prepared and warm at once (they share one loaded target), so a run can alternate them
    # prompt by prompt: drift in the machine's speed then lands on both sides of each pair
    interleaves: bool = False
    # the model runs in this process or its children, so other processes' CPU use competes with it (False: a
    # server someone else runs, whose own work would read as contention)
    serves_here: bool = True


@dataclass(frozen=True)
class RequestSpec:
    """One request's generation settings, as the harness states them to any backend."""

    max_new_tokens: int
    temperature: float = 0.0
    seed: int = 0
    stop_token_ids: tuple[int, ...] = ()
    confidence_threshold: float = 0.0
    confidence_schedule: tuple[float, ...] = ()  # the prefix scheduler's cost table (empty: off, or measured)
    confidence_temperatures: tuple[float, ...] = ()
    messages: tuple[dict, ...] = ()  # the conversation the prompt ids were made of (what a chat server is sent)


@dataclass
class RequestResult:
    """What a backend returns for one request. Round lists are empty where the backend's
    `Capabilities.acceptance` is coarser than "round"."""

    tokens: list[int]
    prefill_s: float | None  # time to the first token (None where the backend cannot tell it apart)
    decode_s: float  # the rest of the request
    stop_reason: str = "max_new_tokens"  # or "stop_token"
    acceptance_lengths: list[int] = field(default_factory=list)  # tokens emitted per round
    accepted_counts: list[int] = field(default_factory=list)  # drafts accepted per round
    proposal_lengths: list[int] = field(default_factory=list)  # drafts proposed per round
    round_ms: dict[str, list[float]] = field(default_factory=dict)  # per step kind, ms per round
    # at T = 0, where the backend knows them: per round, each slot's top-2 draft logit margin up to the first
    # rejected slot (how close a greedy draft was to another choice; `parity` tells numerics by it)
    draft_margins: list[list[float]] = field(default_factory=list)
    # where the backend knows them: per round, each proposal slot's confidence (the draft's confidence head,
    # sigmoid of its logit: P(slot accepted | the slots before it accepted)), all slots of the block
    draft_confidences: list[list[float]] = field(default_factory=list)
    # where the round lists come from: "rounds" (the engine's own, every verify), "vllm per-step" (vLLM's
    # per-request lists, steps that proposed drafts), "vllm totals" (only its totals: `acceptance_totals`)
    acceptance_source: str | None = "rounds"
    acceptance_totals: dict | None = None  # drafts, draft tokens, accepted tokens (per position where known)
    extra: dict = field(default_factory=dict)  # the backend's own per-request figures, kept in the record as given
    start_utc: float | None = None  # when the request was sent (wall clock): a wave's busy time is the union
    text: str | None = None  # the output text, from a server that returns text and no token ids
    error: str | None = None  # the request failed (timed out, refused): recorded as failed, never retried silently

    @property
    def num_rounds(self) -> int:
        return len(self.acceptance_lengths)


@dataclass(frozen=True)
class Schedule:
    """How a wave of requests is sent, as `vllm bench serve` sends them: at most `concurrency` in flight;
    with a `request_rate` (requests/s; None: all at once), arrivals a gamma process of shape
    `burstiness` (1: Poisson; below 1 burstier) drawn from `seed`."""

    concurrency: int = 1
    request_rate: float | None = None
    burstiness: float = 1.0
    seed: int = 0

    def arrivals(self, n: int) -> list[float]:
        """Seconds after the wave starts at which each of `n` requests may be sent."""
        if self.request_rate is None:
            return [0.0] * n
        rng, t, out = random.Random(self.seed), 0.0, []
        for _ in range(n):
            out.append(t)
            t += rng.gammavariate(self.burstiness, 1.0 / (self.request_rate * self.burstiness))
        return out


OnResult = Callable[[int, RequestResult], None]  # (index in the wave, its result): called as each finishes


def one_at_a_time(generate: Callable[[Prepared, list[int], RequestSpec], RequestResult], prepared: Prepared,
                  prompts: list[list[int]], specs: list[RequestSpec], on_result: OnResult) -> dict:
    """A wave on a backend that serves one request at a time: each sent as the one before ends."""
    for i, (prompt, spec) in enumerate(zip(prompts, specs)):
        start = time.time()
        result = generate(prepared, prompt, spec)
        result.start_utc = result.start_utc or start
        on_result(i, result)
    return {}


@dataclass
class Prepared:
    """A system ready to serve: the backend's own handle, and the method that actually runs (from the
    draft's config, checked against the experiment's)."""

    system: System
    method: str
    handle: Any


class Backend(Protocol):
    """Every backend class is built alike, `Cls(target, device, dtype, revision=None, engine_args=None,
    run_dir=None, profiled=None, margins=False, server=None, compile=False)` (`server`: a served backend's base_url, model
    and request_timeout_s), and leaves unused what it has no use for: the run refuses an option its
    backend cannot honour before building it."""

    name: str
    capabilities: Capabilities

    @property
    def tokenizer_path(self) -> Path: ...  # the folder the target's tokenizer loads from

    @property
    def max_context(self) -> int: ...  # the target's longest sequence

    @property
    def stop_token_ids(self) -> tuple[int, ...]: ...

    def models(self) -> dict: ...  # provenance of the target's weights (system drafts are added by the run)

    def record(self) -> dict: ...  # what the manifest keeps of the backend: its engine, version and options

    def prepare(self, system: System) -> Prepared: ...

    def warmup(self, prepared: Prepared, max_len: int, spec: RequestSpec, prompt: list[int]) -> None: ...

    def capture(self, kind: str | None, run_dir: Path): ...  # context manager: a profiled run's capture window

    def generate(self, prepared: Prepared, prompt: list[int], spec: RequestSpec) -> RequestResult: ...

    def generate_many(self, prepared: Prepared, prompts: list[list[int]], specs: list[RequestSpec],
                      schedule: Schedule, on_result: OnResult) -> dict: ...  # a wave; returns its own record

    def release(self, prepared: Prepared) -> None: ...  # free its caches and graphs (others need the device)

    def reset_peak_memory(self) -> None: ...

    def peak_memory(self) -> int | None: ...  # bytes of device memory at the peak since the reset, if known

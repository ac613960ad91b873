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
from typing import Callable

import torch

from dspark.drafters import Drafter
from dspark.errors import DSparkError
from dspark.profiling import Ranges
from dspark.sampling import Streams, probs, sample
from dspark.steps import DecodeState, TargetSteps
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
    accepted_counts: list[int] = field(default_factory=list)  # drafts accepted per round (a stop token included)
    proposal_lengths: list[int] = field(default_factory=list)  # tokens verified per round
    stop_reason: str = "max_new_tokens"  # or "stop_token"
    prefill_s: float = 0.0
    decode_s: float = 0.0
    # with Engine(timing=True): per round, milliseconds of each step (propose/verify/accept, or decode
    # for plain decoding) and "host", the round's wall time the steps do not cover
    round_ms: dict[str, list[float]] = field(default_factory=dict)

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
            "accepted_counts": self.accepted_counts,
            "num_rounds": self.num_rounds,
            "acceptance_length": self.acceptance_length,
            "stop_reason": self.stop_reason,
            "prompt_len": self.prompt_len,
            "prefill_s": self.prefill_s,
            "decode_s": self.decode_s,
            "round_ms": self.round_ms,
        }


def synchronize(device: torch.device) -> None:
    """Wait for `device` (a no-op on the CPU, where the work is synchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


STEP_KINDS = {"target_verify": "verify", "decode_sample": "accept", "ar_decode": "decode"}  # else: propose


class StepTimer:
    """Per-round step times with no extra synchronisation: CUDA events, read once the request is over
    (on the CPU the steps run synchronously, so the wall clock is the step time)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.rounds: list[tuple[float, dict[str, tuple]]] = []
        self.current: dict[str, tuple] = {}
        self.t0 = 0.0

    def next_round(self) -> None:
        """Close the open round (if any) and open the next; called once more after the last round."""
        now = time.perf_counter()
        if self.t0:
            self.rounds.append(((now - self.t0) * 1e3, self.current))
        self.current, self.t0 = {}, now

    def begin(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def end(self, name: str, start) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.current[STEP_KINDS.get(name, "propose")] = (start, end)
        else:
            self.current[STEP_KINDS.get(name, "propose")] = (start, time.perf_counter())

    def results(self) -> dict[str, list[float]]:
        """{kind: [ms per round]} plus "host"; call after the device has finished the request."""
        out: dict[str, list[float]] = {}
        for wall, steps in self.rounds:
            device = 0.0
            for kind, (a, b) in steps.items():
                ms = a.elapsed_time(b) if self.cuda else (b - a) * 1e3
                out.setdefault(kind, []).append(ms)
                device += ms
            out.setdefault("host", []).append(max(0.0, wall - device))
        return out


class StepRunner:
    """Runs a step eagerly, or replays the CUDA graph captured for it (once per step and settings).

    Capture warms the step up on a side stream first (lazy initialisation, cuBLAS workspaces), so it
    runs the step twice for real: call `capture` before a request, whose prefill resets the state.
    """

    def __init__(self, use_graphs: bool, generators: tuple[torch.Generator, ...]):
        self.use_graphs = use_graphs
        self.generators = generators
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.pool = None

    def capture(self, key: tuple, fn: Callable[[], None]) -> None:
        if not self.use_graphs or key in self.graphs:
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        for gen in self.generators:  # the streams' own generators advance on every replay
            graph.register_generator_state(gen)
        with torch.cuda.graph(graph, pool=self.pool):
            fn()
        self.pool = graph.pool()
        self.graphs[key] = graph

    def reset(self) -> None:
        """Drop every graph and their memory pool (a freed pool must not be captured into again)."""
        self.graphs.clear()
        self.pool = None

    def run(self, key: tuple, fn: Callable[[], None]) -> None:
        graph = self.graphs.get(key) if self.use_graphs else None
        if graph is None:
            fn()
        else:
            graph.replay()


class Engine:
    """Runs one request at a time on `target`, speculatively when given a drafter.

    Caches and the step state are allocated once and reused while requests fit; on CUDA every
    step but the prefill replays a CUDA graph unless `use_graphs` is False (the eager reference).
    """

    def __init__(self, target: Qwen3Target, drafter: Drafter | None = None, use_graphs: bool | None = None,
                 nvtx: bool = True, timing: bool = False):
        self.target = target
        self.timing = timing
        self.timer: StepTimer | None = None
        self.drafter = drafter
        self.device = target.lm_head.weight.device
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        if self.use_graphs and self.device.type != "cuda":
            raise DSparkError("CUDA graphs need a CUDA device; drop the graphs option on CPU")
        self.ranges = Ranges(nvtx)
        self.method = drafter.method if drafter else "ar"
        self.streams = Streams.from_seed(0, self.device)
        self.runner = StepRunner(self.use_graphs, self.streams.generators())
        self.max_len = 0
        self.cache = self.state = self.steps = None

    def _allocate(self, max_len: int) -> None:
        """Caches for `max_len` positions plus a scratch slot; graphs bound to older buffers are dropped."""
        if max_len <= self.max_len:
            return
        max_len = max(max_len, 2 * self.max_len)  # grow geometrically: few reallocations and recaptures
        self.cache = self.target.new_cache(max_len + 1)
        b = self.target.config.backbone
        taps = self.drafter.taps if self.drafter else ()
        num_drafts = self.drafter.block_size if self.drafter else 1
        self.state = DecodeState.allocate(num_drafts, b.vocab_size, len(taps) * b.hidden_size,
                                          self.target.lm_head.weight.dtype, self.device)
        self.steps = TargetSteps(self.target, self.cache, self.state, self.streams, taps)
        if self.drafter:
            self.drafter.allocate(max_len + 1)
        self.runner.reset()
        self.max_len = max_len

    def release(self) -> None:
        """Free the caches, state and graphs (the next request allocates and captures again)."""
        self.runner.reset()
        self.cache = self.state = self.steps = None
        self.max_len = 0
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _step_fns(self, cfg: GenerationConfig) -> dict[str, tuple[tuple, Callable[[], None], bool]]:
        """name -> (graph key, step, graphable)."""
        t, c = cfg.temperature, cfg.confidence_threshold
        if self.drafter is None:
            return {"ar_decode": (("ar", t), lambda: self.steps.ar_decode(t), True)}
        drafter, history = self.drafter, self._history
        return {
            f"{self.method}_propose": (("propose", t, c), lambda: drafter.propose(
                self.state, t, c, self.streams.draft, history), drafter.graphable),
            "target_verify": (("verify", t), lambda: self.steps.verify(t), True),
            "decode_sample": (("accept",), self.steps.accept, True),
        }

    @torch.inference_mode()
    def warmup(self, max_len: int, cfg: GenerationConfig) -> None:
        """Allocate for `max_len` positions and capture the graphs `cfg` needs, outside any timing."""
        self._allocate(max_len)
        self._history = [0]
        todo = [(key, fn) for key, fn, graphable in self._step_fns(cfg).values()
                if graphable and self.use_graphs and key not in self.runner.graphs]
        if not todo:
            return
        with self.ranges("warmup"):  # only when something is captured: later requests show no such range
            self.state.position.zero_()
            self.state.pending_count.zero_()
            for key, fn in todo:
                self.runner.capture(key, fn)

    def _step(self, name: str, step: tuple[tuple, Callable[[], None], bool]) -> None:
        key, fn, _ = step
        with self.ranges(name):
            if self.timer is None:
                self.runner.run(key, fn)
            else:
                start = self.timer.begin()
                self.runner.run(key, fn)
                self.timer.end(name, start)

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], cfg: GenerationConfig) -> GenerationResult:
        if not prompt_ids:
            raise DSparkError("the prompt is empty; give at least one token")
        if cfg.max_new_tokens < 1:
            raise DSparkError(f"max_new_tokens is {cfg.max_new_tokens}; it must be at least 1")
        if (cfg.confidence_threshold > 0 and self.drafter is not None
                and getattr(getattr(self.drafter, "model", None), "confidence_head", None) is None):
            raise DSparkError(f"--confidence-threshold needs a draft with a confidence head; "
                              f"the {self.method} drafter has none")
        n = len(prompt_ids)
        block = self.drafter.block_size if self.drafter else 0
        limit = self.target.config.max_position_embeddings
        if n + cfg.max_new_tokens > limit:
            raise DSparkError(f"prompt ({n}) + max_new_tokens ({cfg.max_new_tokens}) exceeds the target's "
                              f"max_position_embeddings ({limit}); lower --max-new-tokens")
        self.warmup(n + cfg.max_new_tokens + block + 1, cfg)
        self.streams.reseed(cfg.seed)
        steps = self._step_fns(cfg)
        taps = self.drafter.taps if self.drafter else ()
        result = GenerationResult(prompt_len=n)
        state = self.state

        t0 = time.perf_counter()
        with self.ranges("prefill"):
            ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
            hidden, feats = self.target(ids, None, self.cache, n, taps)  # a prefill from position 0
            state.anchor.copy_(sample(probs(self.target.logits(hidden[:, -1]), cfg.temperature), self.streams.target))
            state.position.fill_(n)
            if self.drafter:
                self.drafter.start(state, feats)
            result.tokens.append(int(state.anchor))
        t1 = time.perf_counter()
        result.prefill_s = t1 - t0

        stop = set(cfg.stop_token_ids)
        self._history[:] = prompt_ids + result.tokens
        timer = self.timer = StepTimer(self.device) if self.timing else None
        while len(result.tokens) < cfg.max_new_tokens and result.tokens[-1] not in stop:
            if timer is not None:
                timer.next_round()
            if self.drafter is None:
                self._step("ar_decode", steps["ar_decode"])
                result.tokens.append(int(state.anchor))
                continue
            for name, step in steps.items():
                self._step(name, step)
            out = state.round_out.tolist()  # the round's one host-device synchronisation
            proposed, emitted = out[1], out[2 : 3 + out[0]]  # out[0] drafts accepted, then the next token
            accepted = out[0]
            for i, tok in enumerate(emitted[:-1]):
                if tok in stop:  # an accepted draft is a stop token: it is the last token, and no bonus follows
                    emitted, accepted = emitted[: i + 1], i + 1
                    break
            result.accepted_counts.append(accepted)
            result.proposal_lengths.append(proposed)
            result.acceptance_lengths.append(len(emitted))
            result.tokens.extend(emitted)
            self._history.extend(emitted)
        if timer is not None:
            timer.next_round()
        synchronize(self.device)
        result.decode_s = time.perf_counter() - t1
        if timer is not None:
            result.round_ms = timer.results()
            self.timer = None

        for i, tok in enumerate(result.tokens[: cfg.max_new_tokens]):
            if tok in stop:
                result.tokens = result.tokens[: i + 1]
                result.stop_reason = "stop_token"
                break
        del result.tokens[cfg.max_new_tokens :]
        return result

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
from typing import TYPE_CHECKING, Callable

import torch

from dspark.engine.graphs import StepRunner
from dspark.engine.nvtx import Ranges
from dspark.engine.steps import ACCEPT, DECODE, PREFILL, VERIFY, WARMUP, DecodeState, Step, TargetSteps, propose_step
from dspark.engine.timing import StepTimer, synchronize
from dspark.errors import DSparkError
from dspark.models.target import Qwen3Target
from dspark.sampling import GREEDY_TEMPERATURE, Streams, draw
from dspark.schedule import ProposalCut
from dspark.synthetic.acceptance import conditional_rates

if TYPE_CHECKING:  # (the drafters read the engine's step state: importing them here would be a cycle)
    from dspark.drafters import Drafter


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    stop_token_ids: tuple[int, ...] = ()
    confidence_threshold: float = 0.0  # > 0: cut a proposal at the first slot whose confidence is below
    record_confidences: bool = True  # keep each round's slot confidences (drafters with a confidence head)
    # the prefix scheduler (`dspark.schedule`): the cost of a round verifying l = 0..N drafts (any unit), and the
    # confidence logits' STS temperatures (N; empty: 1); a non-empty cost table turns it on
    confidence_schedule: tuple[float, ...] = ()
    confidence_temperatures: tuple[float, ...] = ()
    # synthetic acceptance (`dspark.synthetic.acceptance`): per-slot unconditional rates, one per draft slot; non-empty, the
    # accept step accepts at this profile instead of by the lossless rule (timing at a set acceptance)
    synthetic_rates: tuple[float, ...] = ()


@dataclass
class GenerationResult:
    prompt_len: int
    tokens: list[int] = field(default_factory=list)  # all generated ids, the prefill token first
    acceptance_lengths: list[int] = field(default_factory=list)  # tokens emitted per round
    accepted_counts: list[int] = field(default_factory=list)  # drafts accepted per round (a stop token included)
    proposal_lengths: list[int] = field(default_factory=list)  # tokens verified per round
    # with a drafter that records margins, at T = 0: per round, the top-2 logit margin of each slot up to
    # the first rejected one (the slots where another engine's proposal can first differ)
    draft_margins: list[list[float]] = field(default_factory=list)
    # with a drafter that has a confidence head: per round, each slot's sigmoid(c_k), the head's estimate of
    # P(slot k accepted | slots before it accepted), all slots (also those a threshold cut off)
    draft_confidences: list[list[float]] = field(default_factory=list)
    stop_reason: str = "max_new_tokens"  # or "stop_token"
    prefill_s: float = 0.0
    decode_s: float = 0.0
    # with Engine(timing=True): per round, milliseconds of each step (Step.kind: propose/verify/accept, or
    # decode for plain decoding) and "host", the round's wall time the steps do not cover
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
            "draft_margins": self.draft_margins,
            "draft_confidences": self.draft_confidences,
            "num_rounds": self.num_rounds,
            "acceptance_length": self.acceptance_length,
            "stop_reason": self.stop_reason,
            "prompt_len": self.prompt_len,
            "prefill_s": self.prefill_s,
            "decode_s": self.decode_s,
            "round_ms": self.round_ms,
        }


class Engine:
    """Runs one request at a time on `target`, speculatively when given a drafter.

    Caches and the step state are allocated once and reused while requests fit; on CUDA every
    step but the prefill replays a CUDA graph unless `use_graphs` is False (the eager reference).
    `steps` are one round's steps in order; `warmup` then `run_step` run them one at a time
    (benchmarks), the way `generate` does.
    """

    def __init__(self, target: Qwen3Target, drafter: Drafter | None = None, use_graphs: bool | None = None,
                 nvtx: bool = True, timing: bool = False, compile: bool = False):
        self.target = target
        self.drafter = drafter
        self.timing = timing
        self.device = target.lm_head.weight.device
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        if self.use_graphs and self.device.type != "cuda":
            raise DSparkError("CUDA graphs need a CUDA device; drop the graphs option on CPU")
        if compile and self.device.type != "cpu":
            raise DSparkError("compiling the steps is for the CPU (CUDA graphs accelerate them on a GPU); drop --compile")
        self.nvtx = nvtx
        self.method = drafter.method if drafter else "ar"
        self._propose = propose_step(self.method) if drafter else None
        self.steps: tuple[Step, ...] = (self._propose, VERIFY, ACCEPT) if drafter else (DECODE,)
        self.streams = Streams.from_seed(0, self.device)
        self._runner = StepRunner(self.use_graphs, self.streams.generators(), compile=compile)
        self._timer: StepTimer | None = None
        self._history: list[int] = [0]  # the request's committed ids, the anchor last (the n-gram drafter reads it)
        self._bound_cfg: GenerationConfig | None = None
        self._bound_cut = ProposalCut()
        self._cuts: dict[tuple, ProposalCut] = {}
        self._synthetic_tables: dict[tuple[float, ...], torch.Tensor] = {}
        self._bound: dict[Step, tuple[tuple, Callable[[], None], bool]] = {}
        self.max_len = 0
        self.cache = self.state = self._target_steps = None

    @property
    def nvtx(self) -> bool:
        """Whether steps run inside NVTX ranges (ranges need CUDA: always False on a CPU-only machine)."""
        return self._ranges.enabled

    @nvtx.setter
    def nvtx(self, on: bool) -> None:
        self._ranges = Ranges(on)

    @property
    def runner(self) -> StepRunner:
        """The step runner, read only: its `graphs` (or `compiled` forms) are those made so far, one per step
        and settings (none without graphs or compile, or after `release`)."""
        return self._runner

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
                                          self.target.lm_head.weight.dtype, self.device, max_rounds=max_len)
        self._target_steps = TargetSteps(self.target, self.cache, self.state, self.streams, taps)
        if self.drafter:
            self.drafter.allocate(max_len + 1)
        self._runner.reset()
        self.max_len = max_len

    def release(self) -> None:
        """Free the caches, state and graphs (the next request allocates and captures again)."""
        self._runner.reset()
        self.cache = self.state = self._target_steps = None
        self.max_len = 0
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _bind(self, cfg: GenerationConfig) -> dict[Step, tuple[tuple, Callable[[], None], bool]]:
        """Step -> (graph key, its work under `cfg`, graphable); kept until another config comes.
        The work reads the engine's buffers when it runs, so it outlives a reallocation."""
        if cfg is not self._bound_cfg:
            t, cut, synthetic = cfg.temperature, self._cut(cfg), self._synthetic(cfg.synthetic_rates)
            work = {DECODE: (lambda: self._target_steps.ar_decode(t), True),
                    VERIFY: (lambda: self._target_steps.verify(t), True),
                    ACCEPT: (lambda: self._target_steps.accept(synthetic), True)}
            if self.drafter is not None:
                d = self.drafter
                if d.graphable:  # it reads no host state (compiled, a history growing each round would recompile it)
                    work[self._propose] = (lambda: d.propose(self.state, t, cut, self.streams.draft, []), True)
                else:
                    work[self._propose] = (lambda: d.propose(self.state, t, cut, self.streams.draft, self._history),
                                           False)
            steps = list(self.steps)
            if self.drafter is not None and cut.cuts:  # verify over 1..N rows too, each its own graph
                for rows in range(1, self.drafter.block_size + 1):
                    steps.append(VERIFY.over(rows))
                    work[steps[-1]] = ((lambda r: lambda: self._target_steps.verify(t, r))(rows), True)
            self._bound = {step: (step.graph_key(cfg), *work[step]) for step in steps}
            self._bound_cfg, self._bound_cut = cfg, cut
        return self._bound

    def _cut(self, cfg: GenerationConfig) -> ProposalCut:
        """The config's proposal-length policy, its tables on the device: made once per policy and kept for
        the engine's life, since a captured graph reads them at the addresses it was captured with (an equal
        config given as a new object replays that graph)."""
        def table(values: tuple[float, ...]) -> torch.Tensor | None:
            return torch.tensor(values, dtype=torch.float32, device=self.device) if values else None

        key = (cfg.confidence_threshold, cfg.confidence_schedule, cfg.confidence_temperatures)
        if key not in self._cuts:
            self._cuts[key] = ProposalCut(key[0], table(key[1]), table(key[2]))
        return self._cuts[key]

    def _synthetic(self, rates: tuple[float, ...]) -> torch.Tensor | None:
        """The conditional rates of a synthetic profile on the device (None: the lossless rule), made once per
        profile and kept, as `_cut`'s tables are, for the graphs captured with them."""
        if not rates:
            return None
        if rates not in self._synthetic_tables:
            self._synthetic_tables[rates] = torch.tensor(conditional_rates(rates), dtype=torch.float32,
                                                         device=self.device)
        return self._synthetic_tables[rates]

    @torch.inference_mode()
    def warmup(self, max_len: int, cfg: GenerationConfig) -> None:
        """Allocate for `max_len` positions and capture the graphs (or compile the steps) `cfg` needs, outside
        any timing."""
        self._allocate(max_len)
        self._history = [0]
        runner = self._runner
        todo = [(key, fn) for key, fn, graphable in self._bind(cfg).values() if graphable and runner.accelerates
                and key not in runner.graphs and key not in runner.compiled and key not in runner.failed]
        if not todo:
            return
        with self._ranges(WARMUP):  # only when something is captured: later requests show no such range
            self.state.position.zero_()
            self.state.pending_count.zero_()
            for key, fn in todo:
                self._runner.capture(key, fn)

    def run_step(self, step: Step, cfg: GenerationConfig) -> None:
        """Run one of `steps` (or, under a policy that cuts proposals, `VERIFY.over(rows)`) under `cfg` inside
        its NVTX range: its graph's replay when one was captured,
        else the step itself (timed while `generate` times). Call `warmup` (or `generate`) first; the
        step moves `state` on, so a benchmark resets what it needs between runs."""
        try:
            key, fn, _ = self._bind(cfg)[step]
        except KeyError:
            raise DSparkError(f"{step.range} is not a step of this engine; its steps: "
                              f"{', '.join(s.range for s in self.steps)}") from None
        with self._ranges(step.range):
            if self._timer is None:
                self._runner.run(key, fn)
            else:
                start = self._timer.begin()
                self._runner.run(key, fn)
                self._timer.end(step, start)

    def _check(self, prompt_ids: list[int], cfg: GenerationConfig) -> None:
        if not prompt_ids:
            raise DSparkError("the prompt is empty; give at least one token")
        if cfg.max_new_tokens < 1:
            raise DSparkError(f"max_new_tokens is {cfg.max_new_tokens}; it must be at least 1")
        policy = cfg.confidence_threshold > 0 or cfg.confidence_schedule
        if policy and self.drafter is not None and not self.drafter.has_confidence:
            raise DSparkError(f"a confidence policy (threshold or schedule) needs a draft with a confidence head; "
                              f"the {self.method} drafter has none")
        n = self.drafter.block_size if self.drafter is not None else 0
        if cfg.synthetic_rates:
            if self.drafter is None:
                raise DSparkError("synthetic acceptance needs a drafter: plain decoding accepts nothing")
            if len(cfg.synthetic_rates) != n:
                raise DSparkError(f"{len(cfg.synthetic_rates)} synthetic acceptance rates for {n} draft slots; give {n}")
            if policy:
                raise DSparkError("synthetic acceptance sets what each slot accepts; a confidence policy cutting the "
                                  "proposal would change it: turn the policy off")
        if cfg.confidence_schedule and (len(cfg.confidence_schedule) != n + 1 or min(cfg.confidence_schedule) <= 0):
            raise DSparkError(f"the schedule's cost table has {len(cfg.confidence_schedule)} entries; give {n + 1} "
                              f"positive costs, one per number of drafts verified (0 to {n})")
        if cfg.confidence_temperatures and (len(cfg.confidence_temperatures) != n
                                            or min(cfg.confidence_temperatures) <= 0):
            raise DSparkError(f"{len(cfg.confidence_temperatures)} STS temperatures for {n} draft slots; give {n} "
                              "positive ones (dspark-bench calibrate --fit-sts writes them)")
        n, limit = len(prompt_ids), self.target.config.max_position_embeddings
        if n + cfg.max_new_tokens > limit:
            raise DSparkError(f"prompt ({n}) + max_new_tokens ({cfg.max_new_tokens}) exceeds the target's "
                              f"max_position_embeddings ({limit}); lower --max-new-tokens")

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], cfg: GenerationConfig) -> GenerationResult:
        self._check(prompt_ids, cfg)
        n = len(prompt_ids)
        block = self.drafter.block_size if self.drafter else 0
        self.warmup(n + cfg.max_new_tokens + block + 1, cfg)
        self.streams.reseed(cfg.seed)
        taps = self.drafter.taps if self.drafter else ()
        result = GenerationResult(prompt_len=n)
        state = self.state

        t0 = time.perf_counter()
        with self._ranges(PREFILL):
            ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
            hidden, feats = self.target(ids, None, self.cache, n, taps)  # a prefill from position 0
            state.anchor.copy_(draw(self.target.logits(hidden[:, -1]), cfg.temperature, self.streams.target)[0])
            state.position.fill_(n)
            state.round_index.zero_()
            if self.drafter:
                self.drafter.start(state, feats, ids)
            result.tokens.append(int(state.anchor))
        t1 = time.perf_counter()
        result.prefill_s = t1 - t0

        stop = set(cfg.stop_token_ids)
        margins = self.drafter is not None and self.drafter.margins and cfg.temperature <= GREEDY_TEMPERATURE
        # kept on the device, one row per round, and read back once after the loop (no second sync per round)
        margin_log = torch.empty(cfg.max_new_tokens, self.drafter.block_size, device=self.device) if margins else None
        confidences = self.drafter is not None and self.drafter.has_confidence and cfg.record_confidences
        self._history[:] = prompt_ids + result.tokens
        timer = self._timer = StepTimer(self.device) if self.timing else None
        while len(result.tokens) < cfg.max_new_tokens and result.tokens[-1] not in stop:
            if timer is not None:
                timer.next_round()
            if self.drafter is None:  # plain decoding: one step per token
                self.run_step(DECODE, cfg)
                result.tokens.append(int(state.anchor))
                continue
            self.run_step(self._propose, cfg)
            verify = VERIFY
            if self._bound_cut.cuts:  # verify only the slots that count: the host reads how many (a second sync)
                proposed = int(state.num_proposed)
                verify = VERIFY.over(proposed + 1) if proposed < self.drafter.block_size else VERIFY
            self.run_step(verify, cfg)
            self.run_step(ACCEPT, cfg)
            out = state.round_out.tolist()  # the round's one host-device synchronisation
            accepted, proposed, emitted = out[0], out[1], out[2 : 3 + out[0]]  # the accepted drafts, the next token
            for i, tok in enumerate(emitted[:-1]):
                if tok in stop:  # an accepted draft is a stop token: it is the last token, and no bonus follows
                    emitted, accepted = emitted[: i + 1], i + 1
                    break
            result.accepted_counts.append(accepted)
            result.proposal_lengths.append(proposed)
            if margins:
                margin_log[len(result.accepted_counts) - 1].copy_(state.draft_margin)
            result.acceptance_lengths.append(len(emitted))
            result.tokens.extend(emitted)
            self._history.extend(emitted)
        if margins:  # each round's slots up to its first rejected one: where another engine can first differ
            rows = margin_log[: result.num_rounds].tolist()
            result.draft_margins = [row[: min(a + 1, d)] for row, a, d in
                                    zip(rows, result.accepted_counts, result.proposal_lengths)]
        if confidences:  # (the accept step logged them, one row per round)
            result.draft_confidences = state.confidence_log[: result.num_rounds].tolist()
        if timer is not None:
            timer.next_round()
        synchronize(self.device)
        result.decode_s = time.perf_counter() - t1
        if timer is not None:
            result.round_ms = timer.results()
            self._timer = None

        for i, tok in enumerate(result.tokens[: cfg.max_new_tokens]):
            if tok in stop:
                result.tokens = result.tokens[: i + 1]
                result.stop_reason = "stop_token"
                break
        del result.tokens[cfg.max_new_tokens :]
        return result

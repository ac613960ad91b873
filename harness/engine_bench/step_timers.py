"""The engine's steps set up to be timed again and again (engine-bench), and their figures timed in alternated
passes: decode, verify 8, verify 16, the draft step and a whole round, one after another, pass after pass, so
that a drift of the machine (another process, the clock, the caches) lands on every figure alike, and each
figure is the median of its passes' medians with the range of those medians beside it.

Every step runs as the engine runs it: replayed from its CUDA graph on a GPU, eagerly on a CPU, or compiled
there when asked (`compile`).
"""

from __future__ import annotations

import statistics
from typing import Callable

import torch

from dspark.drafters import drafter_for
from dspark.engine import Engine, GenerationConfig, StepRunner
from dspark.engine.steps import DecodeState, TargetSteps
from dspark.sampling import Streams
from harness.backends.timing import cuda_median_ms, host_median_ms, median_ms

PASSES = 5  # alternated passes per figure (each times repeats // PASSES runs, at least MIN_PER_PASS)
MIN_PER_PASS = 5
# the tokens each timed engine generates after its prompt (the context): a context past the target's
# max_position_embeddings less these cannot be timed (engine-bench refuses it before building the models)
NEW_TOKENS = 64


def device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def decode_step(target, prompt: list[int], graphs: bool, compile: bool = False):
    """(the plain decode step after `prompt`, sampling included; the reset that rewinds it; its engine),
    the engine's cache filled and its graph captured (or its step compiled)."""
    ctx, cfg = len(prompt), GenerationConfig(max_new_tokens=NEW_TOKENS, temperature=1.0)
    engine = Engine(target, None, use_graphs=graphs, nvtx=False, compile=compile)
    engine.generate(prompt, cfg)
    (decode,) = engine.steps

    def reset():
        engine.state.position.fill_(ctx)

    return (lambda: engine.run_step(decode, cfg)), reset, engine


def graph_and_nvtx_costs(target, prompt: list[int], reps: int) -> dict:
    """On a GPU: the plain step run eagerly (graphs off), and the cost of NVTX ranges around its replay (host
    time included)."""
    step, reset, _ = decode_step(target, prompt, graphs=False)
    out = {"graphs_off_decode_ms": cuda_median_ms(step, reps, reset)}
    step, reset, engine = decode_step(target, prompt, graphs=True)
    for name, nvtx in (("nvtx_on_decode_ms", True), ("nvtx_off_decode_ms", False)):
        engine.nvtx = nvtx
        out[name] = host_median_ms(step, reps, reset)
    out["nvtx_overhead_pct"] = 100 * (out["nvtx_on_decode_ms"] / out["nvtx_off_decode_ms"] - 1)
    return out


def verify_step(target, taps: tuple[int, ...], prompt: list[int], rows: int, compile: bool = False):
    """One verify step of `rows` tokens (the anchor and rows-1 drafts) after the context, ready to replay
    (from its graph on a GPU, compiled on a CPU when asked)."""
    ctx, b, device = len(prompt), target.config.backbone, device_of(target)
    cache = target.new_cache(ctx + rows + 2)
    target(torch.tensor([prompt], device=device), torch.arange(ctx, device=device)[None], cache, ctx, taps)
    state = DecodeState.allocate(rows - 1, b.vocab_size, len(taps) * b.hidden_size, cache.k[0].dtype, device)
    state.position.fill_(ctx)
    streams = Streams.from_seed(0, device)
    steps = TargetSteps(target, cache, state, streams, taps)
    runner = StepRunner(device.type == "cuda", streams.generators(), compile=compile)

    def verify():
        steps.verify(1.0)

    runner.capture(("verify",), verify)
    return lambda: runner.run(("verify",), verify)


class SpeculativeTimer:
    """A speculative engine after `prompt` (its graphs captured, or its steps compiled), whose propose step
    and whole round can be timed again and again: each run restarts from 4 newly committed context rows."""

    def __init__(self, target, draft, prompt: list[int], compile: bool = False, markov_topk: int = 0, drafter=None):
        """`draft`: a draft model run by its drafter (`drafter_for`), or None with `drafter` given (a draft model's)."""
        self.ctx, self.cfg = len(prompt), GenerationConfig(max_new_tokens=NEW_TOKENS, temperature=1.0)
        self.engine = Engine(target, drafter or drafter_for(draft, markov_topk=markov_topk), compile=compile)
        self.engine.generate(prompt, self.cfg)
        self.device = device_of(target)

    def reset_round(self) -> None:
        state = self.engine.state
        state.position.fill_(self.ctx)
        state.pending_start.fill_(self.ctx - 4)
        state.pending_count.fill_(4)

    def whole_round(self) -> None:
        for step in self.engine.steps:
            self.engine.run_step(step, self.cfg)
        self.engine.state.round_out.tolist()

    def draft_ms(self, reps: int) -> float:
        """The draft step alone, as the plain step is timed (no NVTX range around it)."""
        engine, propose = self.engine, self.engine.steps[0]
        engine.nvtx = False
        return median_ms(lambda: engine.run_step(propose, self.cfg), reps, self.reset_round, self.device)

    def round_ms(self, reps: int) -> float:
        """A whole round: propose + verify + accept and the host's read of the outcome (in NVTX ranges on a GPU)."""
        self.engine.nvtx = self.device.type == "cuda"  # (a CPU run has no ranges)
        return host_median_ms(self.whole_round, reps, self.reset_round, self.device)

    def measure(self, reps: int) -> dict:
        return {"draft_ms": self.draft_ms(reps), "round_ms": self.round_ms(reps)}


def alternated(figures: dict[str, Callable[[int], float]], reps: int) -> dict:
    """Each figure timed over `reps` repeats in PASSES passes, the figures in turn within a pass. Returns each
    figure's median of pass medians, and under "ranges_ms" the [lowest, highest] pass median of each."""
    per_pass = max(MIN_PER_PASS, reps // PASSES)
    passes: dict[str, list[float]] = {name: [] for name in figures}
    for _ in range(PASSES):
        for name, time_it in figures.items():
            passes[name].append(time_it(per_pass))
    return {name: statistics.median(values) for name, values in passes.items()} | {
        "ranges_ms": {name: [min(values), max(values)] for name, values in passes.items()},
        "passes": {"count": PASSES, "repeats_each": per_pass, "order": list(figures)}}


def step_figures(target, draft, taps: tuple[int, ...], prompt: list[int], reps: int, compile: bool = False) -> dict:
    """decode_ms, verify8_ms, verify16_ms, draft_ms and round_ms at `prompt`'s context, alternated; with
    `compile`, each step's first call (compiling included) under "compile_s"."""
    device = device_of(target)
    decode, reset, plain = decode_step(target, prompt, graphs=device.type == "cuda", compile=compile)
    verify8, verify16 = (verify_step(target, taps, prompt, rows, compile) for rows in (8, 16))
    spec = SpeculativeTimer(target, draft, prompt, compile)
    out = alternated({"decode_ms": lambda n: median_ms(decode, n, reset, device),
                      "verify8_ms": lambda n: median_ms(verify8, n, device=device),
                      "verify16_ms": lambda n: median_ms(verify16, n, device=device),
                      "draft_ms": spec.draft_ms, "round_ms": spec.round_ms}, reps)
    if compile:
        runners = {"plain": plain.runner, "speculative": spec.engine.runner}
        out["compiled"] = plain.runner.compile_settings | {
            "compile_s": {who: {"/".join(map(str, k)): round(v, 2) for k, v in r.compile_s.items()}
                          for who, r in runners.items()},
            "failed": {who: r.failed for who, r in runners.items() if r.failed}}
    return out, spec

"""The prefix scheduler's cost table, measured on the engine that will use it: the time of a round that
verifies l = 0..N drafts (propose + verify over l + 1 rows + accept), each step replayed from its graph
on a GPU (the wall clock on a CPU), medians over repeats. Measured at start when a system asks for
`confidence = "schedule"` without `confidence_costs`. The table is made non-decreasing (a running
maximum): on the H200 verify of 6 rows timed 2 us under verify of 5, and the scheduler then cut to 5."""

from __future__ import annotations

from dataclasses import replace
from itertools import accumulate

import torch

from dspark.engine import Engine, GenerationConfig
from dspark.engine.steps import ACCEPT, VERIFY
from harness.backends.timing import median_ms


@torch.inference_mode()
def round_costs(engine: Engine, cfg: GenerationConfig, repeats: int = 10) -> list[float]:
    """Milliseconds of a round verifying 0..N drafts, after a request on `engine` (its caches and state
    set): each timed run restarts at that request's end with 4 context rows pending, as engine-bench's do."""
    n = engine.drafter.block_size
    cfg = replace(cfg, confidence_schedule=(1.0,) * (n + 1))  # a cutting policy: the verify graphs per row count
    engine.warmup(engine.max_len - 1, cfg)
    state, device = engine.state, engine.device
    ctx = max(4, min(int(state.position), engine.max_len - 2 * (n + 2)))

    def reset() -> None:
        state.position.fill_(ctx)
        state.pending_start.fill_(ctx - 4)
        state.pending_count.fill_(4)

    def timed(step) -> float:
        return median_ms(lambda: engine.run_step(step, cfg), repeats, reset, device)

    fixed = timed(engine.steps[0]) + timed(ACCEPT)
    costs = [fixed + timed(VERIFY.over(rows) if rows <= n else VERIFY) for rows in range(1, n + 2)]
    return list(accumulate(costs, max))  # a row more never costs less: noise that says so would steer the scheduler

"""The engine's steps accelerated: CUDA graphs on a GPU, torch.compile on a CPU (asked for), once per step and
settings; the step's own code otherwise, and always the same logic."""

from __future__ import annotations

import time
from typing import Callable

import torch

from dspark.engine.compile import prepare as prepare_compile


# What a compiled step does when its guards fail after capture: run eagerly (the same logic), never recompile in
# a timed step. (Tests set "fail_on_recompile", so that any state a compiled step guards on and a request changes
# is caught.)
AFTER_CAPTURE = "eager_on_recompile"


class StepRunner:
    """Runs a step eagerly, replays the CUDA graph captured for it, or runs its compiled form.

    Capture warms the step up on a side stream first (lazy initialisation, cuBLAS workspaces), so it
    runs the step twice for real; compiling runs it once: call `capture` before a request, whose
    prefill resets the state. A step whose compile fails runs eagerly, and `failed` says why.
    """

    def __init__(self, use_graphs: bool, generators: tuple[torch.Generator, ...], compile: bool = False):
        self.use_graphs = use_graphs
        self.compile = compile
        self.generators = generators
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.compiled: dict[tuple, Callable[[], None]] = {}
        self.compile_s: dict[tuple, float] = {}  # each compiled step's first call, compiling included
        self.failed: dict[tuple, str] = {}
        self.compile_settings = prepare_compile() if compile else None  # where inductor's cache is, and why
        self.pool = None

    @property
    def accelerates(self) -> bool:
        return self.use_graphs or self.compile

    def capture(self, key: tuple, fn: Callable[[], None]) -> None:
        if self.compile:
            self._compile(key, fn)
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

    def _compile(self, key: tuple, fn: Callable[[], None]) -> None:
        """Compile `fn` (static shapes: one form per step, settings and buffer sizes) and run it once, which
        compiles it; a failure (a stale cache, no C++ compiler) leaves the step eager, said in `failed`."""
        if key in self.compiled or key in self.failed:
            return
        start = time.perf_counter()
        compiled = torch.compile(fn, dynamic=False)
        try:
            compiled()
        except Exception as err:  # noqa: BLE001 - any compiler failure: the step stays eager, the run goes on
            self.failed[key] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]
            return
        self.compile_s[key] = time.perf_counter() - start
        self.compiled[key] = compiled

    def reset(self) -> None:
        """Drop every graph and their memory pool (a freed pool must not be captured into again), and the
        compiled forms (bound to the buffers they were compiled with)."""
        self.graphs.clear()
        self.compiled.clear()
        self.pool = None

    def run(self, key: tuple, fn: Callable[[], None]) -> None:
        graph = self.graphs.get(key) if self.use_graphs else None
        if graph is not None:
            graph.replay()
        elif key in self.compiled:
            with torch.compiler.set_stance(AFTER_CAPTURE):  # compiled at capture: never inside a timed step
                self.compiled[key]()
        else:
            fn()

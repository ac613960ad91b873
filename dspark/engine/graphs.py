"""CUDA graphs of the engine's steps: captured once per step and settings, replayed after."""

from __future__ import annotations

from typing import Callable

import torch


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

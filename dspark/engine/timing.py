"""Per-round step times (`Engine(timing=True)`), and waiting for the device."""

from __future__ import annotations

import time

import torch

from dspark.engine.steps import HOST, Step


def synchronize(device: torch.device) -> None:
    """Wait for `device` (a no-op on the CPU, where the work is synchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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

    def end(self, step: Step, start) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.current[step.kind] = (start, end)
        else:
            self.current[step.kind] = (start, time.perf_counter())

    def results(self) -> dict[str, list[float]]:
        """{kind: [ms per round]} plus HOST; call after the device has finished the request."""
        out: dict[str, list[float]] = {}
        for wall, steps in self.rounds:
            device = 0.0
            for kind, (a, b) in steps.items():
                ms = a.elapsed_time(b) if self.cuda else (b - a) * 1e3
                out.setdefault(kind, []).append(ms)
                device += ms
            out.setdefault(HOST, []).append(max(0.0, wall - device))
        return out

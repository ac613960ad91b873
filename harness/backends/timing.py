"""Timing for the engine's steps (engine-bench, and the native backend's round costs measured at start):
device time with CUDA events on a GPU, the wall clock (host work included) on a CPU or where the host's part
counts, medians after warm-up; and the copy bandwidth a step's bytes are held against."""

from __future__ import annotations

import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

from dspark.engine import synchronize


def cuda_median_ms(fn: Callable[[], None], repeats: int, before: Callable[[], None] | None = None) -> float:
    """Median of `repeats` device-timed runs of `fn` (CUDA events), after three warm-up runs."""
    for _ in range(3):
        if before:
            before()
        fn()
    times = []
    for _ in range(repeats):
        if before:
            before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def median_ms(fn: Callable[[], None], repeats: int, before: Callable[[], None] | None = None,
              device: torch.device = torch.device("cuda")) -> float:
    """Median time of `fn` on `device`: CUDA events on a GPU (`cuda_median_ms`), the wall clock on a CPU."""
    if device.type == "cuda":
        return cuda_median_ms(fn, repeats, before)
    return host_median_ms(fn, repeats, before, device)


def host_times_ms(fn: Callable[[], object], repeats: int, before: Callable[[], None] | None = None,
                  device: torch.device = torch.device("cuda")) -> list[float]:
    """Wall times of `repeats` runs of `fn` including its host work, synchronised before and after, after
    three warm-up runs."""
    times = []
    for i in range(repeats + 3):
        if before:
            before()
        synchronize(device)
        t = time.perf_counter()
        fn()
        synchronize(device)
        if i >= 3:
            times.append((time.perf_counter() - t) * 1e3)
    return times


def host_median_ms(fn: Callable[[], None], repeats: int, before: Callable[[], None] | None = None,
                   device: torch.device = torch.device("cuda")) -> float:
    """Median wall time of `fn` including its host work (`host_times_ms`)."""
    return statistics.median(host_times_ms(fn, repeats, before, device))


def copy_bandwidth_tbps(gib: float, repeats: int, device: torch.device = torch.device("cuda")) -> float:
    """A copy of a `gib` GiB buffer on `device` (device-to-device on a GPU, memory-to-memory on a CPU,
    on the threads torch uses); bytes read plus bytes written over time."""
    n = int(gib * 2**30)
    src = torch.empty(n, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), max(5, repeats // 5), device=device)
    return 2 * n / (ms * 1e-3) / 1e12


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux; platform's answer elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()

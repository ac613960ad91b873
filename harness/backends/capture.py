"""The capture window of a profiled child run on an in-process engine (the native backend): only the
timed requests, after every model load, cache allocation, graph capture and warm-up request (nsys'
`cudaProfilerApi` range, or a PyTorch profiler whose Chrome trace lands in the run folder)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from dspark.errors import DSparkError


@contextlib.contextmanager
def capture_window(kind: str | None, run_dir: Path, device: str):
    """Around the timed requests of a profiled child: nsys' cudaProfilerApi range, or a PyTorch
    profiler whose Chrome trace lands in `run_dir/trace.torch.json`."""
    if kind is None:
        yield
        return
    import torch

    from dspark import profiling

    if kind == "nsys":
        if not (device.startswith("cuda") and torch.cuda.is_available()):
            raise DSparkError("profile --nsys needs a CUDA device; use profile --torch on the CPU")
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        try:
            yield
        finally:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()  # also flushes the CUDA activity buffers before exit
        return
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.startswith("cuda") and torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiling.torch_ranges(True)
    prof = torch.profiler.profile(activities=activities)
    prof.start()
    try:
        yield
    finally:
        if device.startswith("cuda") and torch.cuda.is_available():
            torch.cuda.synchronize()
        prof.stop()
        profiling.torch_ranges(False)
        prof.export_chrome_trace(str(run_dir / "trace.torch.json"))

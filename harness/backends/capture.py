"""The capture window of a profiled child run on an in-process engine (the native backend): only the
timed requests, after every model load, cache allocation, graph capture and warm-up request (nsys'
`cudaProfilerApi` range, or a PyTorch profiler whose trace lands in the run folder).

A PyTorch trace is sized before it is written: as the profiler stops its events are counted and the
JSON they make is estimated from them; above the limit the profile set (`LIMIT_ENV`, megabytes) the
trace is not written and the run stops with the fix. It is written gzipped (about 12 times smaller;
Perfetto and chrome://tracing open it as it is), and `capture.json` keeps its event count, the
estimate and the sizes written, for the profile to report. A child the profile starts early waits at
its gate (`GATE_ENV`) before opening its window."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import sys
import time
import warnings
from pathlib import Path

from dspark.errors import DSparkError

TORCH_TRACE = "trace.torch.json.gz"
CAPTURE = "capture.json"
LIMIT_ENV = "DSPARK_TRACE_LIMIT_MB"
GATE_ENV = "DSPARK_CAPTURE_GATE"  # a file: the window opens once it exists (the profile is done with the last child)
GATE_WAIT_S = 900
# Bytes of Kineto's Chrome-trace JSON per event besides its name, measured on the demo pair's traces
# (PyTorch 2.13 on a CPU: 238 a host op, as ph, cat, pid, tid, ts, dur and three ids, indented; 2.11
# writes about 12 % less); a device event (a kernel, a memcpy) with its dozen more fields and its flow
# events: about 590 (PyTorch 2.11 on an H200).
HOST_EVENT_BYTES = 240
DEVICE_EVENT_BYTES = 590


@contextlib.contextmanager
def capture_window(kind: str | None, run_dir: Path, device: str):
    """Around the timed requests of a profiled child: nsys' cudaProfilerApi range, or a PyTorch
    profiler whose trace lands in `run_dir/trace.torch.json.gz` (when within the limit)."""
    if kind is None:
        yield
        return
    import torch

    from dspark.engine import nvtx

    cuda = device.startswith("cuda") and torch.cuda.is_available()
    if kind == "nsys" and not cuda:
        raise DSparkError("profile --nsys needs a CUDA device; use profile --torch on the CPU")
    wait_for_gate()
    if kind == "nsys":
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        try:
            yield
        finally:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()  # also flushes the CUDA activity buffers before exit
        return
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    nvtx.torch_ranges(True)
    prof = torch.profiler.profile(activities=activities)
    with warnings.catch_warnings():  # (some releases warn of cycles, which a one-window profile never has)
        warnings.filterwarnings("ignore", message=".*clears events at the end of each cycle")
        prof.start()
    try:
        yield
    except BaseException:  # an interrupted capture keeps what it has, if within the limit, and re-raises
        _stop(prof, cuda, nvtx)
        with contextlib.suppress(DSparkError):
            write_trace(prof, Path(run_dir), trace_limit())
        raise
    _stop(prof, cuda, nvtx)
    write_trace(prof, Path(run_dir), trace_limit())


def wait_for_gate() -> None:
    """A profile starts the next child while it still works on the last one (writing and summarising its
    trace); the child then holds its window shut until the file `GATE_ENV` names exists, so that no
    work of the profile's own overlaps a timed capture."""
    gate = os.environ.get(GATE_ENV)
    if not gate:
        return
    deadline = time.monotonic() + GATE_WAIT_S
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise DSparkError(f"the profile never opened this capture window ({gate} did not appear in "
                              f"{GATE_WAIT_S} s); run the profile again")
        time.sleep(0.02)


def _stop(prof, cuda: bool, nvtx) -> None:
    if cuda:
        import torch

        torch.cuda.synchronize()
    prof.stop()
    nvtx.torch_ranges(False)


def trace_limit() -> int | None:
    """The most bytes of trace JSON the profile allows (from `LIMIT_ENV`; unset or 0: no limit)."""
    text = os.environ.get(LIMIT_ENV, "").strip()
    try:
        mb = float(text) if text else 0.0
    except ValueError:
        raise DSparkError(f"{LIMIT_ENV}={text!r}: give megabytes as a number (0: no limit)") from None
    return int(mb * 1e6) if mb > 0 else None


def estimate_json_bytes(events: list, stride: int = 16) -> int:
    """The size of the Chrome-trace JSON these Kineto events make: per event a fixed part (larger for a
    device event) and its name, averaged over every `stride`-th event (reading them all costs a second
    per few hundred thousand)."""
    sample = events[::stride]
    if not sample:
        return 0
    total = sum(len(e.name()) + (HOST_EVENT_BYTES if str(e.device_type()).endswith("CPU") else DEVICE_EVENT_BYTES)
                for e in sample)
    return round(total * len(events) / len(sample))


def megabytes(n: int | None) -> str:
    """A size for people: 7.3 MB, 12 KB, 3.1 GB."""
    if n is None:
        return "?"
    return f"{n / 1e3:.0f} KB" if n < 1e6 else f"{n / 1e6:.1f} MB" if n < 1e9 else f"{n / 1e9:.1f} GB"


def write_trace(prof, run_dir: Path, limit: int | None) -> dict:
    """Count the stopped profiler's events, say what the trace will weigh, and write it gzipped unless
    that is above `limit` (bytes of JSON): then refuse with the fix. Returns what `capture.json` keeps."""
    results = getattr(prof.profiler, "kineto_results", None) if prof.profiler is not None else None
    events = results.events() if results is not None else None
    record = {"kind": "torch", "events": None if events is None else len(events),
              "estimated_json_bytes": None if events is None else estimate_json_bytes(events),
              "limit_json_bytes": limit, "trace": None, "json_bytes": None, "bytes": None}
    estimate = record["estimated_json_bytes"]
    limit_text = f"limit {megabytes(limit)}" if limit else "no limit"
    _say(f"trace: {record['events']:,} events captured, about {megabytes(estimate)} of JSON ({limit_text}, "
         "profile --max-trace-mb)" if events is not None else f"trace: events not countable here ({limit_text})")
    (run_dir / CAPTURE).write_text(json.dumps(record, indent=1) + "\n")
    if limit and estimate is not None and estimate > limit:
        raise DSparkError(f"the PyTorch trace of these requests would be about {megabytes(estimate)} "
                          f"({record['events']:,} events), above the limit of {megabytes(limit)}: not written; "
                          "profile fewer prompts or tokens (--num-prompts, --output-len) or raise --max-trace-mb")
    raw = run_dir / TORCH_TRACE.removesuffix(".gz")
    prof.export_chrome_trace(str(raw))
    with raw.open("rb") as src, gzip.open(run_dir / TORCH_TRACE, "wb", compresslevel=3) as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    record |= {"trace": TORCH_TRACE, "json_bytes": raw.stat().st_size, "bytes": (run_dir / TORCH_TRACE).stat().st_size}
    raw.unlink()
    (run_dir / CAPTURE).write_text(json.dumps(record, indent=1) + "\n")
    _say(f"wrote {TORCH_TRACE}: {megabytes(record['bytes'])} ({megabytes(record['json_bytes'])} of JSON)")
    return record


def _say(line: str) -> None:
    """A line for the profile, which relays this child's stderr as it comes."""
    print(line, file=sys.stderr, flush=True)

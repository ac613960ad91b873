"""`dspark-bench profile`: each system of a run in its own process under Nsight Systems (or the PyTorch
profiler), capturing only the steady state: the child loads its models, sizes its caches, captures
its graphs and runs its warm-up requests first, then opens the capture window around the timed
requests (`cudaProfilerStart`/`Stop` with nsys' `--capture-range=cudaProfilerApi`).

Traces are exported to SQLite and summarised by our parser (`harness/trace.py`); the comparison
across systems is printed at the end. Profiled timings are marked as such in every manifest: they
are not comparable with unprofiled runs.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from dspark.errors import DSparkError
from harness.results import RunFolder
from harness.trace import compare, load_inputs, summarize_any

# The published DSpark traces' options; `lean` keeps files small.
PRESETS = {
    "default": ["-t", "cuda,nvtx,osrt,cudnn,cublas", "--python-backtrace=cuda", "--cudabacktrace=all",
                "--trace-fork-before-exec=true", "--cuda-graph-trace=node"],
    "lean": ["-t", "cuda,nvtx", "--sample=none", "--cpuctxsw=none", "--trace-fork-before-exec=true",
             "--cuda-graph-trace=node"],
}
WINDOW = ["--capture-range=cudaProfilerApi", "--capture-range-end=stop"]
STANDARD_PLACES = ("/opt/nvidia/nsight-systems/*/bin/nsys", "/opt/nvidia/nsight-systems-cli/*/bin/nsys",
                   "/usr/local/cuda/bin/nsys", "/usr/local/cuda-*/bin/nsys",
                   "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys")


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


# ---- finding and probing nsys ---------------------------------------------------------------------

def find_nsys(explicit: str | None = None) -> Path:
    """`--nsys-path`, then $NSYS, the PATH and the standard install folders (Nsight Systems, and the
    copy bundled inside Nsight Compute); the first that runs `--version`."""
    tried = []
    candidates = [explicit] if explicit else []
    candidates += [os.environ.get("NSYS"), shutil.which("nsys")]
    for pattern in STANDARD_PLACES:
        candidates += sorted(glob.glob(pattern), reverse=True)
    for c in candidates:
        if not c or c in tried:
            continue
        tried.append(c)
        try:
            ok = subprocess.run([c, "--version"], capture_output=True, text=True, timeout=60).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if ok:
            return Path(c)
        if explicit and c == explicit:
            raise DSparkError(f"--nsys-path {explicit}: does not run (`{explicit} --version` failed)")
    raise DSparkError("no working nsys found (tried --nsys-path, $NSYS, the PATH and "
                      f"{', '.join(STANDARD_PLACES)}); install Nsight Systems or pass --nsys-path, "
                      "or use profile --torch")


@dataclass
class NsysPlan:
    nsys: Path
    version: str
    flags: list[str]
    dropped: list[str] = field(default_factory=list)  # notices: what this nsys or machine does not support


def plan_flags(nsys: Path, preset: str, extra: list[str], help_text: str | None = None,
               version: str | None = None, paranoid: int | None = None) -> NsysPlan:
    """The preset's flags and `extra`, less what this nsys does not list in `nsys profile --help`.
    CPU sampling is turned off when the kernel forbids it (perf_event_paranoid > 2)."""
    if preset not in PRESETS:
        raise DSparkError(f"unknown --preset '{preset}'; use one of {', '.join(PRESETS)}")
    if help_text is None:
        help_text = subprocess.run([str(nsys), "profile", "--help"], capture_output=True, text=True,
                                   timeout=60).stdout
    if version is None:
        version = subprocess.run([str(nsys), "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    if paranoid is None:
        try:
            paranoid = int(Path("/proc/sys/kernel/perf_event_paranoid").read_text())
        except (OSError, ValueError):
            paranoid = None
    flags, dropped = [], []
    args = PRESETS[preset] + [a.replace("--trace-fork=", "--trace-fork-before-exec=") for a in extra]
    i = 0
    while i < len(args):
        arg = args[i]
        value = None
        if arg in ("-t", "--trace"):
            value, i = args[i + 1], i + 1
            kept = [t for t in value.split(",") if t in help_text]
            dropped += [f"trace '{t}' is not supported by this nsys" for t in value.split(",") if t not in kept]
            flags += [arg, ",".join(kept)]
        else:
            name = arg.split("=")[0]
            if name.startswith("--") and name not in help_text:
                dropped.append(f"{name} is not supported by this nsys ({version})")
            else:
                flags.append(arg)
        i += 1
    if paranoid is not None and paranoid > 2 and not any(f.startswith(("--sample", "-s")) for f in flags):
        backtraces = [f for f in flags if f.startswith(("--cudabacktrace", "--python-backtrace"))]
        flags = [f for f in flags if f not in backtraces] + ["--sample=none", "--cpuctxsw=none"]
        dropped.append(f"CPU sampling is unavailable here (perf_event_paranoid = {paranoid}): --sample=none"
                       + (f", and without it {', '.join(backtraces)} (backtraces need sampling)" if backtraces else ""))
    return NsysPlan(nsys, version, flags, dropped)


def nsys_command(plan: NsysPlan, output: Path, child: list[str]) -> list[str]:
    """`nsys profile` of `child`, writing `output`.nsys-rep (never over an existing file)."""
    if output.parent.joinpath(output.name + ".nsys-rep").exists():
        raise DSparkError(f"{output}.nsys-rep exists; profiles never overwrite earlier traces")
    return [str(plan.nsys), "profile", *plan.flags, *WINDOW, "--force-overwrite=false", "-o", str(output), "--", *child]


def export_sqlite(nsys: Path, report: Path) -> Path:
    out = report.parent / (report.name.removesuffix(".nsys-rep") + ".sqlite")
    proc = subprocess.run([str(nsys), "export", "--type", "sqlite", "--force-overwrite", "true", "-o", str(out),
                           str(report)], capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0 or not out.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise DSparkError(f"nsys export of {report} failed ({tail[0]})")
    return out


def child_run_args(run_args: list[str], system: str, out: Path, kind: str) -> list[str]:
    """The `dspark-bench run` of one system, in a fresh interpreter (spawned, never forked)."""
    return [sys.executable, "-m", "harness.cli", "run", *run_args, "--systems", system, "--out", str(out),
            "--profiled", kind]


def profile_run(run_args: list[str], systems: list[tuple[str, str]], kind: str, out_dir: Path, console,
                preset: str = "default", nsys_path: str | None = None, nsys_args: list[str] | None = None) -> dict:
    """Profile each (system, method) in its own child `run`; returns the comparison of their summaries.

    `out_dir` gets, per system: the child's run folder `<system>/`, its trace (`<system>.nsys-rep` and
    `<system>.sqlite`, or `<system>/trace.torch.json`), `<system>.summary.json` and `<system>.log`;
    and `profile.json`: what was run, with which nsys and flags, and what was dropped."""
    if out_dir.exists():
        raise DSparkError(f"{out_dir} exists; profiles never overwrite earlier traces (give another --out)")
    out_dir.mkdir(parents=True)
    folder = RunFolder(out_dir)
    plan = None
    if kind == "nsys":
        plan = plan_flags(find_nsys(nsys_path), preset, nsys_args or [])
        for notice in plan.dropped:
            console.print(f"notice: {notice}", style="yellow")
    record = {"kind": kind, "preset": preset if plan else None, "nsys": str(plan.nsys) if plan else None,
              "nsys_version": plan.version if plan else None, "flags": plan.flags if plan else None,
              "dropped": plan.dropped if plan else [], "commands": {},
              "note": "profiled timings are not comparable with unprofiled runs"}
    for system, method in systems:
        child = child_run_args(run_args, system, out_dir / system, kind)
        cmd = nsys_command(plan, out_dir / system, child) if plan else child
        record["commands"][system] = cmd
        folder.write_json("profile.json", record)
        console.print(f"profiling {system} ({kind})", highlight=False)
        with (out_dir / f"{system}.log").open("w") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, COLUMNS="160")).returncode
        if rc != 0:
            tail = (out_dir / f"{system}.log").read_text().strip().splitlines()[-1:] or ["no output"]
            raise DSparkError(f"profiling {system} failed (exit {rc}: {tail[0]}); see {out_dir / (system + '.log')}")
        trace = export_sqlite(plan.nsys, out_dir / f"{system}.nsys-rep") if plan else out_dir / system / "trace.torch.json"
        summary = summarize_any(trace, expect_method=method if method not in ("plain", "ngram") else None)
        folder.write_json(f"{system}.summary.json", summary)
    return compare(load_inputs([out_dir]))

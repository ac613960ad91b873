"""Nsight Systems as a tool: finding a working nsys, the flags this one supports (presets, extra
flags, what the kernel forbids), the `nsys profile` command line and the SQLite export."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from dspark.errors import DSparkError

# The published DSpark traces' options; `lean` keeps files small.
PRESETS = {
    "default": ["-t", "cuda,nvtx,osrt,cudnn,cublas", "--python-backtrace=cuda", "--cudabacktrace=all",
                "--trace-fork-before-exec=true", "--cuda-graph-trace=node"],
    "lean": ["-t", "cuda,nvtx", "--sample=none", "--cpuctxsw=none", "--trace-fork-before-exec=true",
             "--cuda-graph-trace=node"],
}
# vLLM's DSpark engine hung under the default preset on the H200 (vLLM 0.26, nsys 2025.x: plain profiled, then no
# progress after DSpark's CUDA graphs were captured); under lean it ran (benchmarks/results/profile_vllm_h200/).
VLLM_PRESET = "lean"
WINDOW = ["--capture-range=cudaProfilerApi", "--capture-range-end=stop"]
STANDARD_PLACES = ("/opt/nvidia/nsight-systems/*/bin/nsys", "/opt/nvidia/nsight-systems-cli/*/bin/nsys",
                   "/usr/local/cuda/bin/nsys", "/usr/local/cuda-*/bin/nsys",
                   "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys")


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


def choose_preset(preset: str | None, vllm: bool) -> tuple[str, str | None]:
    """The preset asked for, else our engine's `default` or, for vLLM, `VLLM_PRESET`; with the notice
    that says why when the choice was made for the user."""
    if preset is not None:
        return preset, None
    if not vllm:
        return "default", None
    return VLLM_PRESET, (f"vLLM: nsys preset '{VLLM_PRESET}' ({' '.join(PRESETS[VLLM_PRESET])}): under the default "
                         "preset (OS-runtime tracing, CUDA and Python backtraces) vLLM's DSpark engine hung on the "
                         "H200; --preset default to try it anyway")


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
    extra = [a.replace("--trace-fork=", "--trace-fork-before-exec=") for a in extra]
    given = {a.split("=")[0] for a in extra if a.startswith("--") and "=" in a}
    # a flag given again replaces the preset's (nsys would see both)
    args = [a for a in PRESETS[preset] if not (a.startswith("--") and a.split("=")[0] in given)] + extra
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


def sqlite_export(report: Path) -> Path:
    """Where a .nsys-rep is exported to: the .sqlite beside it."""
    return report.parent / (report.name.removesuffix(".nsys-rep") + ".sqlite")


def export_sqlite(nsys: Path, report: Path) -> Path:
    out = sqlite_export(report)
    proc = subprocess.run([str(nsys), "export", "--type", "sqlite", "--force-overwrite", "true", "-o", str(out),
                           str(report)], capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0 or not out.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise DSparkError(f"nsys export of {report} failed ({tail[0]})")
    return out

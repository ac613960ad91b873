"""`dspark-bench profile`: each system of a run in its own process under Nsight Systems (or the PyTorch
profiler), capturing only the steady state: the child loads its models, sizes its caches, captures
its graphs and runs its warm-up requests first, then opens the capture window around the timed
requests (`cudaProfilerStart`/`Stop` with nsys' `--capture-range=cudaProfilerApi`).

Traces are exported to SQLite and summarised by our parser (`harness/profiling/traces.py`); the comparison
across systems is printed at the end. Profiled timings are marked as such in every manifest: they
are not comparable with unprofiled runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dspark.errors import DSparkError
from harness.profiling.compare import compare, load_inputs, summarize_any
from harness.profiling.nsys import export_sqlite, find_nsys, nsys_command, plan_flags
from harness.runs.folder import RunFolder


def child_run_args(run_args: list[str], system: str, out: Path, kind: str) -> list[str]:
    """The `dspark-bench run` of one system, in a fresh interpreter (spawned, never forked)."""
    return [sys.executable, "-m", "harness.cli", "run", *run_args, "--systems", system, "--out", str(out),
            "--profiled", kind]


def profile_run(run_args: list[str], systems: list[tuple[str, str]], kind: str, out_dir: Path, console,
                preset: str = "default", nsys_path: str | None = None, nsys_args: list[str] | None = None,
                run_options: dict | None = None) -> dict:
    """Profile each (system, method) in its own child `run`; returns the comparison of their summaries.
    The children get `run_options` (a run's recorded options) as `run-options.json`, and `run_args`.

    `out_dir` gets, per system: the child's run folder `<system>/`, its trace (`<system>.nsys-rep` and
    `<system>.sqlite`, or `<system>/trace.torch.json`), `<system>.summary.json` and `<system>.log`;
    and `profile.json`: what was run, with which nsys and flags, and what was dropped."""
    if out_dir.exists():
        raise DSparkError(f"{out_dir} exists; profiles never overwrite earlier traces (give another --out)")
    out_dir.mkdir(parents=True)
    folder = RunFolder(out_dir)
    if run_options is not None:
        folder.write_json("run-options.json", run_options)
        run_args = ["--options-file", str(out_dir / "run-options.json"), *run_args]
    plan = None
    if kind == "nsys":
        plan = plan_flags(find_nsys(nsys_path), preset, nsys_args or [])
        for notice in plan.dropped:
            console.print(f"notice: {notice}", style="yellow")
    record = {"kind": kind, "preset": preset if plan else None, "nsys": str(plan.nsys) if plan else None,
              "nsys_version": plan.version if plan else None, "flags": plan.flags if plan else None,
              "dropped": plan.dropped if plan else [], "commands": {},
              "note": "profiled timings are not comparable with unprofiled runs"}
    env = dict(os.environ, COLUMNS="160")
    vllm = (run_options or {}).get("backend") == "vllm"
    if vllm:  # vLLM's model runs in its worker: started by spawn, and followed by nsys across fork and exec
        env.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        record["vllm"] = {"worker_multiproc_method": env["VLLM_WORKER_MULTIPROC_METHOD"],
                          "capture": "vLLM's profiler (LLM.start_profile/stop_profile) around the timed requests: "
                                     + ("cudaProfilerStart/Stop in the worker" if plan else "its PyTorch profiler")}
        if plan:  # whatever the preset or --nsys-arg said
            plan.flags = [f for f in plan.flags if not f.startswith("--trace-fork-before-exec")]
            plan.flags.append("--trace-fork-before-exec=true")
            record["flags"] = plan.flags
    for system, method in systems:
        child = child_run_args(run_args, system, out_dir / system, kind)
        cmd = nsys_command(plan, out_dir / system, child) if plan else child
        record["commands"][system] = cmd
        folder.write_json("profile.json", record)
        console.print(f"profiling {system} ({kind})", highlight=False)
        with (out_dir / f"{system}.log").open("w") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
        if rc != 0:
            tail = (out_dir / f"{system}.log").read_text().strip().splitlines()[-1:] or ["no output"]
            raise DSparkError(f"profiling {system} failed (exit {rc}: {tail[0]}); see {out_dir / (system + '.log')}")
        trace = export_sqlite(plan.nsys, out_dir / f"{system}.nsys-rep") if plan else out_dir / system / "trace.torch.json"
        ours = not vllm and method not in ("plain", "ngram")  # vLLM's traces carry none of our step ranges
        summary = summarize_any(trace, expect_method=method if ours else None, engine="vllm" if vllm else None)
        folder.write_json(f"{system}.summary.json", summary)
    return compare(load_inputs([out_dir]))

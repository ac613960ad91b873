"""`dspark-bench profile`: each system of a run in its own process under Nsight Systems (or the PyTorch
profiler), capturing only the steady state: the child loads its models, sizes its caches, captures
its graphs and runs its warm-up requests first, then opens the capture window around the timed
requests (`cudaProfilerStart`/`Stop` with nsys' `--capture-range=cudaProfilerApi`).

To measure the profiler's own overhead, the same requests first run unprofiled, every system in one
child run (`unprofiled/`): its TPOTs are what the profiled ones are held against. While a child runs,
its progress lines and a line per finished request reach the console; before a PyTorch trace is
written its size is estimated and held against the limit (`harness.backends.capture`).

Traces are exported to SQLite and summarised by our parser (`harness/profiling/traces.py`); the comparison
across systems is printed at the end. Profiled timings are marked as such in every manifest: they
are not comparable with unprofiled runs.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from dspark.errors import DSparkError
from harness.analysis.records import MANIFEST, read_requests
from harness.backends.capture import CAPTURE, LIMIT_ENV, TORCH_TRACE, megabytes
from harness.profiling.child import STALL_S, Child
from harness.profiling.compare import REFERENCE, compare, load_inputs, summarize_any
from harness.profiling.nsys import NsysPlan, choose_preset, export_sqlite, find_nsys, nsys_command, plan_flags
from harness.runs.folder import RunFolder
from harness.runs.owner import own



def child_run_args(run_args: list[str], system: str | None, out: Path, kind: str | None) -> list[str]:
    """The `dspark-bench run` of one system (None: every system), profiled (`kind`) or not, in a fresh
    interpreter (spawned, never forked)."""
    return [sys.executable, "-m", "harness.cli", "run", *run_args, *(["--systems", system] if system else []),
            "--out", str(out), *(["--profiled", kind] if kind else [])]


def profile_run(run_args: list[str], systems: list[tuple[str, str]], kind: str, out_dir: Path, console,
                preset: str | None = None, nsys_path: str | None = None, nsys_args: list[str] | None = None,
                run_options: dict | None = None, overhead: bool = False, max_trace_mb: float = 0,
                requests_per_system: int | None = None, note: str | None = None, stall_s: float = STALL_S) -> dict:
    """Profile each (system, method) in its own child `run`; returns the comparison of their summaries
    and `traces` (per system: the file written and its size, and the JSON it holds for a PyTorch trace).
    The children get `run_options` (a run's recorded options) as `run-options.json`, and `run_args`.
    `overhead`: time the same requests unprofiled first; `max_trace_mb`: the most megabytes of JSON a
    PyTorch trace may hold (0: no limit); `requests_per_system`: for the progress lines; `note`: what
    is profiled, said once the folder is made; `stall_s`: a child silent this long is ended (0: never).
    However it ends (a failure, a stall, Ctrl-C, SIGTERM), every child is stopped and what finished stays,
    said in one line with the `profile --resume` that finishes the rest (`resume_profile`).

    `out_dir` gets, per system: the child's run folder `<system>/`, its trace (`<system>.nsys-rep` and
    `<system>.sqlite`, or `<system>/trace.torch.json.gz`), `<system>.summary.json` and `<system>.log`;
    `unprofiled/` with `unprofiled.log` (with `overhead`); and `profile.json`: what was run, with which
    nsys and flags, and what was dropped."""
    if out_dir.exists():
        raise DSparkError(f"{out_dir} exists; profiles never overwrite earlier traces (give another --out, or "
                          f"--resume {out_dir} to finish it)")
    out_dir.mkdir(parents=True)
    owner = own(out_dir, f"continue with dspark-bench profile --resume {out_dir}")  # (one process at a time)
    with owner:  # (let go however what follows ends)
        if note:
            console.print(note, highlight=False, soft_wrap=True)
        folder = RunFolder(out_dir)
        if run_options is not None:
            folder.write_json("run-options.json", run_options)
            run_args = ["--options-file", str(out_dir / "run-options.json"), *run_args]
        plan = None
        vllm = (run_options or {}).get("backend") == "vllm"
        if kind == "nsys":
            preset, why = choose_preset(preset, vllm)
            plan = plan_flags(find_nsys(nsys_path), preset, nsys_args or [])
            for notice in ([why] if why else []) + plan.dropped:
                console.print(f"notice: {notice}", style="yellow", highlight=False, soft_wrap=True)
        record = {"kind": kind, "preset": preset if plan else None, "nsys": str(plan.nsys) if plan else None,
                  "nsys_version": plan.version if plan else None, "flags": plan.flags if plan else None,
                  "dropped": plan.dropped if plan else [], "commands": {}, "methods": dict(systems),
                  "requests_per_system": requests_per_system, "max_trace_mb": max_trace_mb or None,
                  "note": "profiled timings are not comparable with unprofiled runs"}
        if vllm and plan:  # vLLM's model runs in its worker, followed by nsys across fork and exec whatever was said
            plan.flags = [f for f in plan.flags if not f.startswith("--trace-fork-before-exec")]
            plan.flags.append("--trace-fork-before-exec=true")
            record["flags"] = plan.flags
        env = _child_env(record, vllm)
        jobs = []  # (label, command, requests expected, method or None for the unprofiled run)
        if overhead:
            cmd = child_run_args(run_args, None, out_dir / REFERENCE, None)
            record["reference"] = {"folder": REFERENCE, "command": cmd,
                                   "how": "the same requests of every system in one unprofiled child run, before the "
                                          "profiles; overhead: profiled TPOT less this run's"}
            jobs.append((REFERENCE, cmd, requests_per_system * len(systems) if requests_per_system else None, None))
            console.print(f"timing the same requests unprofiled first, every system in one run ({REFERENCE}/), to "
                          "measure the profiler's overhead (--no-overhead to skip)", highlight=False, soft_wrap=True)
        for system, method in systems:
            child = child_run_args(run_args, system, out_dir / system, kind)
            record["commands"][system] = nsys_command(plan, out_dir / system, child) if plan else child
            jobs.append((system, record["commands"][system], requests_per_system, method))
        folder.write_json("profile.json", record)
        return _profile_jobs(jobs, [], out_dir, console, record, plan, vllm, env, stall_s)


def resume_profile(out_dir: Path, console, stall_s: float = STALL_S) -> dict:
    """Finish the profile in `out_dir` as it was started (its `profile.json`): a system with its summary is
    kept; one whose child finished its trace is only summarised; the rest, and an unfinished unprofiled
    run, run again (their partial files removed first: a profile never mixes two children's output)."""
    path = out_dir / "profile.json"
    if not path.is_file():
        raise DSparkError(f"--resume {out_dir}: no profile.json there; give a folder written by dspark-bench profile")
    record = json.loads(path.read_text())
    if "methods" not in record:
        raise DSparkError(f"--resume {out_dir}: this profile was made before profiles could be resumed; profile "
                          "again with another --out")
    owner = own(out_dir, f"continue with dspark-bench profile --resume {out_dir}")  # (before a file is removed)
    with owner:  # (let go however what follows ends)
        vllm = "vllm" in record  # (what the children of a vLLM profile were started with)
        plan = NsysPlan(Path(record["nsys"]), record["nsys_version"], record["flags"], record["dropped"]) \
            if record["kind"] == "nsys" else None
        per = record["requests_per_system"]
        jobs, finished = [], []
        reference = record.get("reference")
        if reference and not _complete(out_dir / REFERENCE):
            cmd = reference["command"]
            if (out_dir / REFERENCE / MANIFEST).is_file():  # the run itself takes up where it stopped
                cmd = [*cmd[:cmd.index("run") + 1], "--resume", str(out_dir / REFERENCE)]
            else:  # (stopped before its manifest: what it left is no run to resume)
                _remove(out_dir / REFERENCE, out_dir / f"{REFERENCE}.log")
            jobs.append((REFERENCE, cmd, per * len(record["methods"]) if per else None, None))
        for system, method in record["methods"].items():
            if (out_dir / f"{system}.summary.json").is_file():
                continue
            if _complete(out_dir / system) and _trace(out_dir, system, plan) is not None:
                finished.append((system, method))
                continue
            _remove(out_dir / system, out_dir / f"{system}.nsys-rep", out_dir / f"{system}.sqlite",
                    out_dir / f"{system}.log", out_dir / f".{system}.open")
            jobs.append((system, record["commands"][system], per, method))
        left = [j[0] for j in jobs] + [f"{s} (summarised only)" for s, _ in finished]
        console.print(f"resuming {out_dir}: " + (", ".join(left) if left else "nothing left to do"), highlight=False,
                      soft_wrap=True)
        return _profile_jobs(jobs, finished, out_dir, console, record, plan, vllm, _child_env(record, vllm), stall_s)


def _remove(*paths: Path) -> None:
    """A stopped child's partial output, before it runs again."""
    for path in paths:
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)


def _child_env(record: dict, vllm: bool) -> dict:
    """The children's environment: the trace limit, and vLLM's workers started by spawn (recorded)."""
    env = dict(os.environ, COLUMNS="160")
    env[LIMIT_ENV] = str(record["max_trace_mb"] or 0)
    if vllm:  # vLLM's model runs in its worker: started by spawn, and followed by nsys across fork and exec
        env.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        record["vllm"] = {"worker_multiproc_method": env["VLLM_WORKER_MULTIPROC_METHOD"],
                          "capture": "vLLM's profiler (LLM.start_profile/stop_profile) around the timed requests: "
                                     + ("cudaProfilerStart/Stop in the worker" if record["kind"] == "nsys"
                                        else "its PyTorch profiler")}
    return env


def _complete(run_dir: Path) -> bool:
    """Whether a child's run finished every request it was given (its summary says so)."""
    summary = run_dir / "summary.json"
    return summary.is_file() and json.loads(summary.read_text()).get("complete") is not False


def _trace(out_dir: Path, system: str, plan) -> Path | None:
    """The trace a system's child wrote, if it wrote one."""
    found = [out_dir / f"{system}.nsys-rep"] if plan else [out_dir / system / TORCH_TRACE,  # (vLLM's profiler
                                                           out_dir / system / "trace.torch.json"]  # writes it plain)
    return next((p for p in found if p.is_file()), None)


def _profile_jobs(jobs: list[tuple], finished: list[tuple[str, str]], out_dir: Path, console, record: dict,
                  plan, vllm: bool, env: dict, stall_s: float) -> dict:
    """Summarise the `finished` systems' traces, then run the `jobs` in turn (the next one loading while
    this one's trace is written and summarised), each system's trace summarised as its child ends."""
    kind, max_trace_mb, folder = record["kind"], record["max_trace_mb"] or 0, RunFolder(out_dir)
    # The next child starts (loads, warms up) while this one writes its trace and this process summarises
    # it; its capture window opens once both are done (its gate). vLLM's window has no gate: one at a time.
    ahead = not vllm and record["requests_per_system"] is not None
    per_token: dict[str, float] = {}  # bytes of trace JSON per output token, of the systems profiled so far
    children: dict[str, Child] = {}
    traces: dict[str, dict] = {}  # per system: its trace's file and sizes

    def announce(label: str) -> None:  # as its capture window opens (or the child starts, ungated)
        console.print(f"profiling {label} ({kind}){_outlook(out_dir, label, per_token, max_trace_mb)}",
                      highlight=False, soft_wrap=True)

    def start(job: tuple, gated: bool) -> None:
        label, cmd, expected, method = job
        if method is not None and not gated:
            announce(label)
        children[label] = Child(label, cmd, out_dir, env, console, expected, gated, stall_s, held=gated)

    try:
        for system, method in finished:
            traces[system] = _summarise(system, method, out_dir, plan, vllm, folder, per_token, console)
        if jobs:
            start(jobs[0], gated=False)
        for i, (label, _, _, method) in enumerate(jobs):
            upcoming = jobs[i + 1] if i + 1 < len(jobs) else None
            if upcoming and ahead:
                children[label].wait(until_requests=True)  # its capture window has closed
                start(upcoming, gated=True)
            children[label].wait()
            if method is not None:
                traces[label] = _summarise(label, method, out_dir, plan, vllm, folder, per_token, console)
            if upcoming and upcoming[0] in children:
                children[upcoming[0]].release()  # what it said while it loaded, before its window opens
                announce(upcoming[0])
                children[upcoming[0]].open()
            elif upcoming:
                start(upcoming, gated=False)
    except BaseException:
        for child in children.values():
            child.stop()
        done = sorted(p.name.removesuffix(".summary.json") for p in out_dir.glob("*.summary.json"))
        console.print(f"kept in {out_dir}: " + (f"the profiles of {', '.join(done)}" if done else "no finished profile")
                      + f"; finish it with: dspark-bench profile --resume {out_dir}", highlight=False, soft_wrap=True)
        raise
    return compare(load_inputs([out_dir])) | {"kind": kind, "traces": traces}


def _summarise(system: str, method: str, out_dir: Path, plan, vllm: bool, folder: RunFolder,
               per_token: dict[str, float], console) -> dict:
    """Export (nsys) and summarise one system's trace into `<system>.summary.json`; say the size of what
    was written where the child did not, and keep its JSON per token for the next outlook. Returns the
    trace's file and sizes."""
    if plan:
        report = out_dir / f"{system}.nsys-rep"
        trace = export_sqlite(plan.nsys, report)
        console.print(f"{system}: wrote {report.name}: {megabytes(_size(report))} (exported: {trace.name}, "
                      f"{megabytes(_size(trace))})", highlight=False)
        written = {"file": str(report), "bytes": _size(report), "json_bytes": None}
    else:
        trace = _trace(out_dir, system, plan) or out_dir / system / TORCH_TRACE
        tokens = sum(r["output_tokens"] for r in read_requests(out_dir / system))
        json_bytes = _capture(out_dir / system).get("json_bytes")
        if json_bytes is None:  # (a trace the child did not size: vLLM's)
            json_bytes = _size(trace)
            console.print(f"{system}: wrote {trace.name}: {megabytes(json_bytes)}", highlight=False)
        if tokens and json_bytes:
            per_token[system] = json_bytes / tokens
        written = {"file": str(trace), "bytes": _size(trace), "json_bytes": json_bytes}
    ours = not vllm and method not in ("plain", "ngram")  # vLLM's traces carry none of our step ranges
    summary = summarize_any(trace, expect_method=method if ours else None, engine="vllm" if vllm else None)
    folder.write_json(f"{system}.summary.json", summary)
    return written


def _outlook(out_dir: Path, system: str, per_token: dict[str, float], max_trace_mb: float) -> str:
    """What the next capture holds, from the unprofiled run (its tokens) and the traces written so far
    (their JSON per token, the largest): ': 2 requests, 151 tokens to come, a trace of about 89 MB at
    plain's 591 KB per token'."""
    mine = [r for r in read_requests(out_dir / REFERENCE) if r["system"] == system and not r.get("failed")]
    if not mine:
        return ""
    tokens = sum(r["output_tokens"] for r in mine)
    text = f": {len(mine)} request{'s' if len(mine) > 1 else ''}, {tokens} tokens to come"
    if per_token:
        worst = max(per_token, key=per_token.get)
        expected = per_token[worst] * tokens
        text += f", a trace of about {megabytes(int(expected))} at {worst}'s {per_token[worst] / 1e3:.0f} KB per token"
        if max_trace_mb and expected > max_trace_mb * 1e6:
            text += f", which may pass the limit of {max_trace_mb:g} MB"
    return text


def _capture(run_dir: Path) -> dict:
    """What the child's capture window recorded of its PyTorch trace (`harness.backends.capture`)."""
    path = run_dir / CAPTURE
    return json.loads(path.read_text()) if path.is_file() else {}


def _size(path: Path) -> int | None:
    return path.stat().st_size if path.is_file() else None

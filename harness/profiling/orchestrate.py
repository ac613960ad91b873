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
import subprocess
import sys
import threading
import time
from pathlib import Path

from dspark.errors import DSparkError
from harness.analysis.records import read_requests
from harness.backends.capture import CAPTURE, GATE_ENV, LIMIT_ENV, TORCH_TRACE, megabytes
from harness.backends.process_group import stop_group
from harness.profiling.compare import REFERENCE, compare, load_inputs, summarize_any
from harness.profiling.nsys import choose_preset, export_sqlite, find_nsys, nsys_command, plan_flags
from harness.runs.folder import RunFolder

QUIET = ("USDT:", "STAGE:")  # the profiler library's own log lines: kept in the log, not shown
STALL_S = 300.0  # a child silent this long (no line, request or file growth) has stalled: vLLM under nsys can hang
STOP_GRACE_S = 10.0  # after SIGTERM, the seconds a child has to write what it finished before SIGKILL


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
    However it ends (a failure, a stall, Ctrl-C, SIGTERM), every child is stopped and the systems already
    profiled stay, said in one line.

    `out_dir` gets, per system: the child's run folder `<system>/`, its trace (`<system>.nsys-rep` and
    `<system>.sqlite`, or `<system>/trace.torch.json.gz`), `<system>.summary.json` and `<system>.log`;
    `unprofiled/` with `unprofiled.log` (with `overhead`); and `profile.json`: what was run, with which
    nsys and flags, and what was dropped."""
    if out_dir.exists():
        raise DSparkError(f"{out_dir} exists; profiles never overwrite earlier traces (give another --out)")
    out_dir.mkdir(parents=True)
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
              "dropped": plan.dropped if plan else [], "commands": {}, "max_trace_mb": max_trace_mb or None,
              "note": "profiled timings are not comparable with unprofiled runs"}
    env = dict(os.environ, COLUMNS="160")
    env[LIMIT_ENV] = str(max_trace_mb or 0)
    if vllm:  # vLLM's model runs in its worker: started by spawn, and followed by nsys across fork and exec
        env.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        record["vllm"] = {"worker_multiproc_method": env["VLLM_WORKER_MULTIPROC_METHOD"],
                          "capture": "vLLM's profiler (LLM.start_profile/stop_profile) around the timed requests: "
                                     + ("cudaProfilerStart/Stop in the worker" if plan else "its PyTorch profiler")}
        if plan:  # whatever the preset or --nsys-arg said
            plan.flags = [f for f in plan.flags if not f.startswith("--trace-fork-before-exec")]
            plan.flags.append("--trace-fork-before-exec=true")
            record["flags"] = plan.flags
    jobs = []  # (label, command, run folder, requests expected, method or None for the unprofiled run)
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
    # The next child starts (loads, warms up) while this one writes its trace and this process summarises
    # it; its capture window opens once both are done (its gate). vLLM's window has no gate: one at a time.
    ahead = not vllm and requests_per_system is not None
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
        if traces:
            console.print(f"kept: the profiles of {', '.join(traces)} in {out_dir} (dspark-bench trace compare "
                          f"{out_dir} compares them)", highlight=False, soft_wrap=True)
        raise
    return compare(load_inputs([out_dir])) | {"traces": traces}


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
        trace = next((p for p in (out_dir / system / TORCH_TRACE, out_dir / system / "trace.torch.json")
                      if p.is_file()), out_dir / system / TORCH_TRACE)  # (vLLM's profiler writes it plain)
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


class Child:
    """One child run in the background, in a process group of its own (nsys, our run, vLLM's engine
    processes), so that stopping it stops all of them. Its stdout (the run's tables) goes to
    `<label>.log`; its stderr to the log and, line by line, to the console, unless it is `held` (a child
    started ahead of its turn keeps its lines until `release`, so the console reads one child at a
    time); a line per request as the child records it. A gated child holds its capture window shut
    until `open` (`harness.backends.capture.GATE_ENV`). A child that shows no sign of progress (a line,
    a request, a file growing) for `stall_s` seconds is ended (0: never)."""

    def __init__(self, label: str, cmd: list[str], out_dir: Path, env: dict, console, expected: int | None,
                 gated: bool, stall_s: float = 0, held: bool = False):
        self.label, self.run_dir, self.console, self.expected = label, out_dir / label, console, expected
        self.log_path = out_dir / f"{label}.log"
        self.gate, self.gated, self.stall_s = out_dir / f".{label}.open", gated, stall_s
        self.watched = [self.run_dir, out_dir / f"{label}.nsys-rep", self.log_path]  # what grows while it works
        env = dict(env, **({GATE_ENV: str(self.gate)} if gated else {}))
        self.log = self.log_path.open("a")
        self.lock = threading.RLock()
        self.held, self.pending, self.last_line = held, [], ""
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.PIPE, env=env, text=True,
                                     errors="replace", start_new_session=True)
        self.relay = threading.Thread(target=self._relay, daemon=True)
        self.relay.start()
        self.seen = 0
        self.active, self.footprint = time.monotonic(), _footprint(self.watched)

    def _relay(self) -> None:
        for line in self.proc.stderr:
            self.log.write(line)
            self.log.flush()
            with self.lock:
                self.active = time.monotonic()
                if line.strip():
                    self.last_line = line.strip()
                if line.strip() and not line.startswith(QUIET):
                    if self.held:
                        self.pending.append(line)
                    else:
                        self._requests()  # the requests recorded before this line, first
                        self._show(line)

    def _requests(self) -> None:
        """A line for each request recorded since the last look."""
        with self.lock:
            seen = _new_requests(self.run_dir, self.seen, self.expected, self.console)
            if seen != self.seen:
                self.seen, self.active = seen, time.monotonic()

    def _show(self, line: str) -> None:
        self.console.print(f"  {self.label}: {line.rstrip()}", highlight=False, markup=False, soft_wrap=True)

    def release(self) -> None:
        """Its turn: the lines it held, then its lines as they come."""
        with self.lock:
            for line in self.pending:
                self._show(line)
            self.pending, self.held = [], False

    def open(self) -> None:
        self.active = time.monotonic()  # (waiting at its gate, it had nothing to say)
        self.gate.touch()

    def wait(self, until_requests: bool = False) -> None:
        """Until the child ends (or, `until_requests`, has recorded every expected request), reporting
        each request; a child that failed raises with its last line, one that stalled is ended and
        raises with what to try."""
        self.release()
        while True:
            ended = self.proc.poll() is not None
            self._requests()
            footprint = _footprint(self.watched)
            if footprint != self.footprint:
                self.footprint, self.active = footprint, time.monotonic()
            if ended or (until_requests and self.expected and self.seen >= self.expected):
                break
            if self.stall_s and time.monotonic() - self.active > self.stall_s:
                self._stalled()
            time.sleep(0.2)
        if not ended:
            return
        self.relay.join(timeout=30)  # (a process it left behind may hold its stderr open)
        self.log.close()
        self.gate.unlink(missing_ok=True)
        if self.proc.returncode != 0:
            lines = [line for line in self.log_path.read_text().splitlines() if line.strip()]
            tail = lines[-1].strip().removeprefix("error: ") if lines else "no output"
            raise DSparkError(f"{self._what()} failed (exit {self.proc.returncode}: {tail}); see {self.log_path}")

    def _what(self) -> str:
        return "timing unprofiled" if self.label == REFERENCE else f"profiling {self.label}"

    def _stalled(self) -> None:
        last = f" (its last line: '{self.last_line[:120]}')" if self.last_line else ""
        self.stop(grace_s=STOP_GRACE_S)
        raise DSparkError(f"{self._what()} stalled: no output, request or file growth for {self.stall_s:g} s"
                          f"{last}; it was ended. Try --preset lean (nsys), fewer requests (--num-prompts, "
                          f"--output-len), or a longer --stall-timeout (0: wait for ever); see {self.log_path}")

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """On the way out (an interrupt, a stall, another child's failure): SIGTERM to its process group,
        which a child run takes as Ctrl-C (it writes the summaries of its finished requests and stops the
        servers it started); SIGKILL to the group if it has not ended after `grace_s` (a stalled or hung
        child). A child still waiting at its gate has nothing to keep and is ended at once."""
        waiting = self.gated and not self.gate.exists()
        stop_group(self.proc, min(grace_s, 2.0) if waiting else grace_s)
        self.proc.wait()
        self.relay.join(timeout=5)
        self.release()
        self.log.close()
        self.gate.unlink(missing_ok=True)


def _new_requests(run_dir: Path, seen: int, expected: int | None, console) -> int:
    """Print a line for each request recorded since the `seen` first; returns how many there are now."""
    records = read_requests(run_dir)
    for i, r in enumerate(records[seen:], seen + 1):
        if r.get("failed"):
            what = f"failed: {r.get('error')}"
        else:
            tpot = f", TPOT {r['tpot_ms']:.1f} ms" if r.get("tpot_ms") is not None else ""
            what = f"{r['output_tokens']} tokens{tpot}"
        console.print(f"  [{i}{f'/{expected}' if expected else ''}] {r['system']} T={float(r['temperature']):g} "
                      f"{r['question_id'][:12]}: {what}", highlight=False, markup=False, soft_wrap=True)
    return max(seen, len(records))


def _footprint(paths: list[Path]) -> tuple[int, int]:
    """How many files the child has written under `paths`, and their bytes: any change is progress."""
    files = size = 0
    for path in paths:
        for f in ([path] if path.is_file() else path.rglob("*") if path.is_dir() else []):
            try:
                size += f.stat().st_size
                files += 1
            except OSError:  # (gone between the listing and the look)
                pass
    return files, size


def _capture(run_dir: Path) -> dict:
    """What the child's capture window recorded of its PyTorch trace (`harness.backends.capture`)."""
    path = run_dir / CAPTURE
    return json.loads(path.read_text()) if path.is_file() else {}


def _size(path: Path) -> int | None:
    return path.stat().st_size if path.is_file() else None

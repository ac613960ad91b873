"""One child run of a profile in the background: its own process group, its output relayed to the console
one child at a time, a line per request it records, its capture window behind a gate, and a watch for a
child that stops making progress (`harness.profiling.orchestrate` runs them in turn)."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

from dspark.errors import DSparkError
from harness.analysis.records import REQUESTS, read_requests
from harness.backends.capture import GATE_ENV
from harness.backends.process_group import stop_group
from harness.profiling.compare import REFERENCE

QUIET = ("USDT:", "STAGE:")  # the profiler library's own log lines: kept in the log, not shown
STALL_S = 300.0  # a child silent this long (no line, request or file growth) has stalled: vLLM under nsys can hang
STOP_GRACE_S = 10.0  # after SIGTERM, the seconds a child has to write what it finished before SIGKILL


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
        self.seen, self.requests_bytes = 0, -1
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
        """A line for each request recorded since the last look (the records read again only once their
        file has grown: this runs at each line the child prints and 5 times a second). A record the
        child is still writing, or a bad one, waits for the next look: the relay must keep reading."""
        with self.lock:
            try:
                size = (self.run_dir / REQUESTS).stat().st_size
            except OSError:
                return
            if size == self.requests_bytes:
                return
            try:
                seen = _new_requests(self.run_dir, self.seen, self.expected, self.console)
            except DSparkError:
                return
            self.requests_bytes = size
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

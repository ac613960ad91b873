"""Stopping a child and everything it started: a vLLM server with its EngineCore and workers, a profiled
run under nsys. Signalling the child's process group is not enough: nsys runs the program it profiles
in a group of its own, and a run started under it starts vLLM's engine processes and servers, so a
SIGKILL to nsys's group left our run and vLLM's EngineCore running on the H200. The whole tree of
descendants is found (through /proc, where there is one) before each signal and signalled too."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

PROC = Path("/proc")
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc's CPU times are in these


def _processes() -> dict[int, tuple[int, int]]:
    """{pid: (parent pid, user plus system CPU ticks)} of every process still running (zombies, already
    ended, left out), in one pass over /proc: the contention check calls it per request on the served
    backends' event loop, so the tree and its CPU time come from one read of each process's stat."""
    found = {}
    try:
        entries = list(PROC.iterdir())
    except OSError:  # (no /proc: nothing found)
        return found
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            state, parent, ticks = fields[0], int(fields[1]), int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            continue  # (it ended while we read)
        if state not in ("Z", "X"):
            found[int(entry.name)] = (parent, ticks)
    return found


def _tree(pid: int, processes: dict[int, tuple[int, int]]) -> list[int]:
    """The processes of `processes` that `pid` started, and theirs."""
    children: dict[int, list[int]] = {}
    for child, (parent, _) in processes.items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def descendants(pid: int) -> list[int]:
    """The processes `pid` started, and theirs, that are still running (none where there is no /proc)."""
    return _tree(pid, _processes())


def descendants_cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds that the live descendants of `pid` have used so far, read in the same
    pass that finds them: the run's share of the cores, its servers' and engines' included."""
    processes = _processes()
    return sum(processes[child][1] for child in _tree(pid, processes)) / TICK


def running(pid: int) -> bool:
    """Whether `pid` is a live process (not ended, not a zombie waiting for its parent)."""
    try:
        state = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _signal(pids: list[int], group: int, sig: int) -> None:
    for send, target in [(os.killpg, group)] + [(os.kill, p) for p in pids]:
        try:
            send(target, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop_group(proc: subprocess.Popen, grace_s: float, kill_wait_s: float = 10.0) -> None:
    """SIGTERM to `proc`'s process group and to every process it started (a run of ours takes it as
    Ctrl-C: it keeps what it finished and stops its servers), then SIGKILL to whatever of them still runs
    after `grace_s` (hung, or stopped: a stopped process holds SIGTERM until it runs again, SIGKILL ends
    it all the same). The tree is taken before the signals, as orphans are no longer found under `proc`."""
    if proc.poll() is not None:
        return
    tree: list[int] = []
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_wait_s)):
        tree += [p for p in descendants(proc.pid) if p not in tree]
        _signal(tree, proc.pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if proc.poll() is not None and not any(running(p) for p in tree):
                return
            time.sleep(0.05)

"""Stopping a child started in a process group of its own (`start_new_session=True`): a vLLM server with
its EngineCore and workers, a profiled run under nsys. Signalling the group reaches every process of
it, which signalling the child alone would not."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_group(proc: subprocess.Popen, grace_s: float, kill_wait_s: float = 10.0) -> None:
    """SIGTERM to `proc`'s process group (a child of ours takes it as Ctrl-C: it keeps what it finished),
    SIGKILL to the group if `proc` has not ended after `grace_s` (hung, or stopped: a stopped process
    holds SIGTERM until it runs again, SIGKILL ends it all the same)."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_wait_s)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue

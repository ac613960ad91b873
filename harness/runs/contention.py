"""How much the machine was shared while a request was timed, measured from what the run itself sees.

A load average lags by a minute and counts this run's own threads, so it cannot tell a quiet machine
from a busy one request by request. Instead, around every request the runner samples:

- this process's CPU time and that of its live descendants (a vLLM engine core or server is ours);
- the busy time of every core this process may run on (`/proc/stat`: user, nice, system, irq,
  softirq and steal), so other processes' CPU use is the cores' busy time less our own;
- the CPU pressure stall time (`/proc/pressure/cpu`, "some": time in which a runnable task waited).

From two samples, `between` gives the request's figures: `cpu_share` (our CPU seconds per wall
second; on a CPU run at one thread about 1 on a quiet machine), `other_cores` (cores' worth of other
processes' use), `idle_cores` and `stall_share` (the share of its wall time in which some runnable
task waited for a core). A request is `contended` when other processes used a measurable share of
the cores and tasks waited for a core a tenth of the time or more (without PSI: the cores were all
taken). Another process busy on a core this run does not use is not contention: nothing waits. Off
Linux only the process's own CPU time is known and nothing is flagged.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from harness.backends.process_group import TICK, descendants_cpu_seconds

IDLE_LEFT = 0.25  # cores left idle (on average over the request) below which the cores were all taken
OTHER_MIN = 0.25  # other processes' use, in cores, below which they did not compete
STALL_MIN = 0.1  # share of the time some runnable task waited for a core, from which the cores were contended


@dataclass(frozen=True)
class Sample:
    wall: float  # time.monotonic()
    own_cpu: float  # CPU seconds of this process and its live descendants
    busy: float | None  # busy CPU seconds of the cores this process may use (None: no /proc/stat)
    stall_us: int | None  # CPU pressure "some" total, microseconds (None: no PSI)


def _cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return list(range(os.cpu_count() or 1))


CORES = _cores()


def _busy_seconds() -> float | None:
    """Busy time of our cores since boot: every /proc/stat column but idle and iowait (guest time is
    already inside user)."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    wanted, busy = {f"cpu{i}" for i in CORES}, 0
    for line in lines:
        name, *cols = line.split()
        if name in wanted:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(c) for c in cols[:8])
            busy += user + nice + system + irq + softirq + steal
    return busy / TICK


def _stall_us() -> int | None:
    try:
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    return int(some.rsplit("total=", 1)[1]) if "total=" in some else None


def sample() -> Sample:
    own = time.process_time() + descendants_cpu_seconds(os.getpid())  # (its servers and engine cores are ours)
    return Sample(time.monotonic(), own, _busy_seconds(), _stall_us())


def between(a: Sample, b: Sample, serves_here: bool = True) -> dict:
    """What a request between two samples saw (the record's `contention`). Where the model is served by
    someone else's server (`serves_here` False) its work is among the other processes', so nothing is
    flagged (`contended` None)."""
    wall = max(b.wall - a.wall, 1e-9)
    own = max(b.own_cpu - a.own_cpu, 0.0)
    cores = len(CORES)
    out = {"wall_s": round(wall, 4), "cpu_s": round(own, 4), "cpu_share": round(own / wall, 3), "cores": cores,
           "other_cores": None, "idle_cores": None, "stall_share": None, "contended": False}
    stall = None
    if a.stall_us is not None and b.stall_us is not None:
        stall = out["stall_share"] = round(min((b.stall_us - a.stall_us) / 1e6 / wall, 1.0), 3)
    if a.busy is not None and b.busy is not None:
        other = max((b.busy - a.busy) - own, 0.0) / wall
        idle = max(cores - own / wall - other, 0.0)
        waited = stall >= STALL_MIN if stall is not None else idle < IDLE_LEFT
        out |= {"other_cores": round(other, 3), "idle_cores": round(idle, 3),
                "contended": other >= OTHER_MIN and waited}
    if not serves_here:
        out["contended"] = None
    return out

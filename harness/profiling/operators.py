"""Where host time goes in a PyTorch profiler trace: each operator's self time (its own time, less the
operators it called), and how much of the engine thread's time was inside operators at all, split at
the prefill ranges. What the operators leave of the requests' wall time is the host's own work
(Python, the engine's loop, the profiler's bookkeeping): `harness.profiling.compare` divides both by
the decoded tokens."""

from __future__ import annotations

import bisect
from collections import defaultdict

PREFILL = "prefill"  # the step range around each request's prefill (dspark.engine)


def operator_times(ops: list[tuple], ranges: list[tuple]) -> dict:
    """`ops`: the trace's `cpu_op` events as (pid, tid, start_ns, dur_ns, name); `ranges`: its
    `user_annotation` ranges, the same way. Returns `operators` (per name: calls, self_ns, the part of
    it inside prefill ranges `prefill_ns`, and share of all operators' self time, largest first),
    `self_ns` (their sum), and for the thread with the most
    time inside operators (the engine's) `thread_ns` (its time inside operators: the sum of its
    outermost ones) and `prefill_ns` (the part inside prefill ranges)."""
    per_thread: dict[tuple, list[tuple]] = defaultdict(list)
    for pid, tid, start, dur, name in ops:
        per_thread[(pid, tid)].append((start, -dur, name))
    prefills: dict[tuple, list[tuple]] = defaultdict(list)
    for pid, tid, start, dur, name in ranges:
        if name == PREFILL:
            prefills[(pid, tid)].append((start, start + dur))
    calls: dict[str, int] = defaultdict(int)
    self_ns: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # [self time, of it inside prefill]
    busiest = (-1, 0, 0)  # (time inside operators, of it inside prefill, thread)
    for thread, events in per_thread.items():
        events.sort()
        spans = sorted(prefills.get(thread, []))
        starts = [s for s, _ in spans]
        stack: list[list] = []  # [end, name, dur, time of direct children, inside prefill]
        outer = inside_prefill = 0
        for start, neg, name in events:
            dur = -neg
            while stack and stack[-1][0] <= start:
                _close(stack.pop(), calls, self_ns)
            if stack:
                stack[-1][3] += dur
                prefill = stack[-1][4]
            else:  # an outermost operator: its whole time is time inside operators
                outer += dur
                i = bisect.bisect_right(starts, start) - 1
                prefill = i >= 0 and start < spans[i][1]
                inside_prefill += dur if prefill else 0
            stack.append([start + dur, name, dur, 0, prefill])
        while stack:
            _close(stack.pop(), calls, self_ns)
        if outer > busiest[0]:
            busiest = (outer, inside_prefill, thread)
    total = sum(t for t, _ in self_ns.values())
    rows = sorted(({"name": n, "calls": calls[n], "self_ns": t, "prefill_ns": p, "share": t / total if total else None}
                   for n, (t, p) in self_ns.items()), key=lambda r: -r["self_ns"])
    return {"operators": rows, "self_ns": total, "thread_ns": max(busiest[0], 0), "prefill_ns": busiest[1]}


def _close(frame: list, calls: dict, self_ns: dict) -> None:
    _, name, dur, children, prefill = frame
    calls[name] += 1
    own = max(dur - children, 0)
    self_ns[name][0] += own
    self_ns[name][1] += own if prefill else 0

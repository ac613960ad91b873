"""Progress of a run, on a terminal and in a log file alike.

On a terminal: a live Rich progress bar. Off a terminal (piped, redirected, under CI) Rich would
print nothing until the end, so there progress is a plain line at each change of step and every
`interval_s` seconds. Both name what runs now (system, temperature, category) and, once a few requests
are done, an estimate of the time left.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class Interrupted(BaseException):
    """A Ctrl-C the run has already answered (what it kept and how to resume): the command line exits 130
    and adds nothing. Not a KeyboardInterrupt, which typer turns into a bare exit code on its way out."""


ETA_AFTER = 3  # requests done before the time left is estimated (from the second on: the first waits for warm-up)


class RunProgress:
    """`with RunProgress(console, total) as p: p.step("plain T=0", "coding"); ...; p.advance()`.

    Off a terminal a plain line is printed when the label changes, every `interval_s` seconds while
    it runs, and once at the end: `[12/64 requests, 31 s, about 2 min left] dspark T=0 coding`. The time
    left is the mean time between the requests done so far (after the first) times those still to come:
    rough where systems differ in speed or a later system still has to load."""

    def __init__(self, console: Console, total: int, interval_s: float = 15.0):
        self.console, self.total, self.interval_s = console, total, interval_s
        self.done, self.label, self.text = 0, "", ""
        self.start = self.last_line = time.monotonic()
        self.first_done = self.last_done = None
        self.bar = None
        if console.is_terminal:
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TextColumn("{task.fields[left]}"), console=console,
                                transient=True)
            self.task = self.bar.add_task("run", total=total, left="")

    def __enter__(self) -> RunProgress:
        if self.bar is not None:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)
        elif self.total:
            self._line("stopped" if exc[0] is not None else "finished")

    def step(self, label: str, detail: str = "") -> None:
        """Now running `label` (a system at a temperature); `detail` (a category, the warm-up) shows
        on the bar and in the line a new label prints."""
        changed = label != self.label
        self.label, self.text = label, f"{label} {detail}".strip()
        if self.bar is not None:
            self.bar.update(self.task, description=self.text)
        elif changed:
            self._line()

    def advance(self) -> None:
        self.done += 1
        self.last_done = time.monotonic()
        if self.first_done is None:
            self.first_done = self.last_done
        if self.bar is not None:
            left = self.seconds_left()
            self.bar.update(self.task, advance=1, left="" if left is None else f"about {duration(left)} left")
        elif time.monotonic() - self.last_line >= self.interval_s:
            self._line()

    def seconds_left(self) -> float | None:
        """The requests to come times the mean time between those done after the first; None before
        ETA_AFTER are done, and once all are."""
        if self.done < ETA_AFTER or self.done >= self.total:
            return None
        return (self.last_done - self.first_done) / (self.done - 1) * (self.total - self.done)

    def _line(self, what: str | None = None) -> None:
        self.last_line = time.monotonic()
        left = self.seconds_left() if what is None else None
        when = f"{self.last_line - self.start:.0f} s" + ("" if left is None else f", about {duration(left)} left")
        self.console.print(f"[{self.done}/{self.total} requests, {when}] {what or self.text}",
                           highlight=False, markup=False, soft_wrap=True)


def duration(seconds: float) -> str:
    """A time to wait, as a person reads it: 40 s, 12 min, 2.5 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"

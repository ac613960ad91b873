"""Progress of a run, on a terminal and in a log file alike.

On a terminal: a live Rich progress bar. Off a terminal (piped, redirected, under CI) Rich would
print nothing until the end, so there progress is a plain line at each change of step and every
`interval_s` seconds.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class Interrupted(BaseException):
    """A Ctrl-C the run has already answered (what it kept and how to resume): the command line exits 130
    and adds nothing. Not a KeyboardInterrupt, which typer turns into a bare exit code on its way out."""


class RunProgress:
    """`with RunProgress(console, total) as p: p.step("plain T=0", "coding"); ...; p.advance()`.

    Off a terminal a plain line is printed when the label changes, every `interval_s` seconds while
    it runs, and once at the end: `[12/64 requests, 31 s] dspark T=0`."""

    def __init__(self, console: Console, total: int, interval_s: float = 15.0):
        self.console, self.total, self.interval_s = console, total, interval_s
        self.done, self.label = 0, ""
        self.start = self.last_line = time.monotonic()
        self.bar = None
        if console.is_terminal:
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=console, transient=True)
            self.task = self.bar.add_task("run", total=total)

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
        self.label = label
        text = f"{label} {detail}".strip()
        if self.bar is not None:
            self.bar.update(self.task, description=text)
        elif changed:
            self._line(text)

    def advance(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.advance(self.task)
        elif time.monotonic() - self.last_line >= self.interval_s:
            self._line()

    def _line(self, what: str | None = None) -> None:
        self.last_line = time.monotonic()
        what = what or self.label
        self.console.print(f"[{self.done}/{self.total} requests, {self.last_line - self.start:.0f} s] {what}",
                           highlight=False, markup=False, soft_wrap=True)

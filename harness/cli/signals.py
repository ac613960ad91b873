"""SIGINT and SIGTERM for the command line: the first one interrupts, every later one is only counted.

The first signal raises KeyboardInterrupt (Ctrl-C's path: the finished results kept, the vLLM servers
and profilers this process started stopped, one line saying what was kept and how to continue). A
second signal raised from the handler while that cleanup ran (a user pressing Ctrl-C twice, `timeout`
or a scheduler sending SIGTERM again, a process-group SIGINT after a SIGTERM) broke it off anywhere,
inside rich's print of "interrupted" or while summary.png was drawn, and printed a traceback instead
of the resume hint; so after the first, signals are counted and ignored until the process ends. The
exit code follows the first signal, as a shell reports a process that signal ended: 130 for SIGINT,
143 for SIGTERM. A signal the process was started ignoring (nohup, a background job) stays ignored."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass
class FirstSignal:
    """The handler: the first signal's number, and how many came after it."""

    first: int | None = None
    later: int = 0

    def __call__(self, signum: int, frame) -> None:
        if self.first is not None:
            self.later += 1
            return
        self.first = signum
        raise KeyboardInterrupt

    def exit_code(self) -> int:
        """128 + the first signal's number; 130 for an interrupt that came without a signal (a
        KeyboardInterrupt raised in the code itself)."""
        return 128 + (self.first if self.first is not None else signal.SIGINT)


@contextmanager
def first_signal_interrupts() -> Iterator[FirstSignal]:
    """The handler in place of Python's for SIGINT and SIGTERM inside the block. Where a signal came, both
    are ignored after the block (the exit that follows, interpreter shutdown included, must not be broken
    off by another: Python's shutdown restores the default, fatal, action of a signal it handled, not of an
    ignored one); else the previous handlers come back (a command run inside a test leaves it as it was)."""
    handler = FirstSignal()
    previous = {}
    if threading.current_thread() is threading.main_thread():  # only there can signals be caught
        for sig in SIGNALS:
            if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler):
                previous[sig] = signal.signal(sig, handler)
    try:
        yield handler
    finally:
        for sig, old in previous.items():  # after a signal, ignored to the end: Python's own shutdown would
            signal.signal(sig, old if handler.first is None else signal.SIG_IGN)  # put back the default, fatal one

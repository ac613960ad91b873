"""One process at a time in a run (or profile) folder. Two `run --resume DIR` started a second apart
both ran every pending request and appended it, so `requests.jsonl` held requests twice and the report
counted them twice. The folder's owner holds an OS lock (`flock`) on a file in it from before anything
loads until it ends: the kernel drops the lock when the process dies, however it dies (a kill -9, a
crash), so a folder is never left locked by a process that is gone. The lock file also says the
owner's pid, for the refusal's one line."""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from dspark.errors import DSparkError

LOCK = ".owner.lock"  # (a hidden file: a folder holding only it is still a new, empty folder to `run --out`)


@dataclass
class Owner:
    """The lock on `folder`, held while `fd` is open; `made`: this process made the folder."""

    folder: Path
    fd: int
    made: bool

    def release(self) -> None:
        """Let the folder go. A folder this process made that holds nothing but the lock (the work failed
        before writing anything) is removed, as if it had never been made."""
        if self.fd < 0:
            return
        if self.made and self.folder.is_dir() and [p.name for p in self.folder.iterdir()] == [LOCK]:
            (self.folder / LOCK).unlink()
            self.folder.rmdir()
        os.close(self.fd)
        self.fd = -1

    def __del__(self) -> None:  # (dropped unreleased: an error before the work began)
        self.release()

    def __enter__(self) -> Owner:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def own(folder: Path, again: str) -> Owner:
    """Take `folder` (made if missing) for this process, or refuse in one line naming the process that has
    it and what to do; `again`: how to continue the work once that process has ended ("continue with ...")."""
    folder = Path(folder)
    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = os.read(fd, 32).decode(errors="replace").strip()
        os.close(fd)
        who = f"process {pid}" if pid.isdigit() else "another process"
        raise DSparkError(f"{folder}: {who} is running it now (one process at a time writes a run folder); wait for "
                          f"it to end (or stop it{f': kill {pid}' if pid.isdigit() else ''}), then {again}; or start afresh "
                          "with another --out") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return Owner(folder, fd, made)

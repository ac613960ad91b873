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
        try:  # (another process may open the lock file again between the two: the folder then stays)
            if self.made and self.folder.is_dir() and [p.name for p in self.folder.iterdir()] == [LOCK]:
                (self.folder / LOCK).unlink()
                self.folder.rmdir()
        except OSError:
            pass
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
    it and what to do; `again`: how to continue the work once that process has ended ("continue with ...").
    A lock taken on a lock file that its owner removed meanwhile (letting go of a folder it made) is no
    hold on the folder, whose lock file is another by then: the lock is taken again, on the file now there."""
    folder = Path(folder)
    for _ in range(ATTEMPTS):
        made = not folder.exists()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise DSparkError(f"{folder}: cannot write there ({exc.strerror or type(exc).__name__}); a run or profile "
                              "writes its folder as it goes: give a folder you may write (copy this one there to "
                              "finish it)") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            who = f"process {pid}" if pid.isdigit() else "another process"
            raise DSparkError(f"{folder}: {who} is running it now (one process at a time writes a run folder); wait "
                              f"for it to end (or stop it{f': kill {pid}' if pid.isdigit() else ''}), then {again}; or "
                              "start afresh with another --out") from None
        if _same_file(fd, folder / LOCK):
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
            return Owner(folder, fd, made)
        os.close(fd)  # (the file was removed after it was opened: locked, it holds nothing)
    raise DSparkError(f"{folder}: its lock file ({LOCK}) kept being removed while this process took it; another "
                      f"process is making and removing it: let that end, then {again}")


ATTEMPTS = 5  # takes of a lock file removed meanwhile, before giving up (each loses only to a release)


def _same_file(fd: int, path: Path) -> bool:
    """Whether `fd` is the file at `path` now (not one removed, or replaced, since it was opened)."""
    try:
        now = os.stat(path)
    except OSError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)

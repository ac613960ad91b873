"""vLLM's output: where it goes while this process imports vLLM and starts its engines, and what it said
when an engine failed.

vLLM's engine processes (EngineCore, workers) print tracebacks, warnings and progress bars to the
standard output and error they inherit, besides what its loggers say; a run's terminal (and its
`--json` output) must not carry 150 lines of them. So its loggers write to `vllm.log` in the run folder,
and while an engine starts its processes inherit that log as their output too (`output_to`). A failure
is then reported in one line: vLLM's own cause (the last exception line of its output,
`failure_cause`) and the log's path.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from pathlib import Path

from harness.backends.base import VLLM_LOG as LOG
from harness.backends.base import VLLM_LOGGING as LOGGING

ABOVE = r",? please check the stack trace above.*$"  # vLLM's pointer to a trace the terminal no longer shows
POINTER = r"(?i)see (?:the )?(?:stack trace|root cause)"  # an exception that only points to the one that caused it
PREFIX = r"^(?:\(\w+ pid=\d+\)\s+)?(?:[A-Z]+ [\d-]+ [\d:,.]+ [^\]]*\]\s+)?"  # "(Worker pid=1) ERROR 12-05 09:05:36 [f.py:1] "
EXCEPTION_LINE = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Exit|Interrupt)\b(?::.*)?$")

# what the user's environment said before any engine of this process changed it
USER_ENV = {k: os.environ.get(k) for k in ("VLLM_USE_V2_MODEL_RUNNER", "VLLM_LOGGING_CONFIG_PATH")}


@contextlib.contextmanager
def environment(**values: str | None):
    """os.environ with `values` set (None: unset) while vLLM starts an engine, then as it was."""
    before = {k: os.environ.get(k) for k in values}
    try:
        _set_environment(values)
        yield
    finally:
        _set_environment(before)


def _set_environment(values: dict) -> None:
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value



def logging_environment(run_dir: Path | None) -> dict[str, str | None]:
    """The variables that route vLLM's log while this process imports it and starts its engines: the
    user's own logging config, else `run_dir/vllm.log` (vLLM logs to stdout at INFO by default, and the
    results go there). Set only inside `environment(...)`: a value left in os.environ would pass to every
    later child, and its run's log would land in an earlier run's folder."""
    config = USER_ENV["VLLM_LOGGING_CONFIG_PATH"]
    if config is None and run_dir is not None:
        config = str(logging_config(Path(run_dir)))
    return {"VLLM_LOGGING_CONFIG_PATH": config,
            "VLLM_LOGGING_STREAM": os.environ.get("VLLM_LOGGING_STREAM", "ext://sys.stderr"),
            "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")}


def logging_config(run_dir: Path) -> Path:
    """A logging config for vLLM's processes: INFO and up, errors included, to `run_dir/vllm.log` (the
    harness reports a failure itself, in one line naming vLLM's cause and this log)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fmt = {"format": "%(levelname)s %(asctime)s %(process)d %(filename)s:%(lineno)d] %(message)s"}
    config = {"version": 1, "disable_existing_loggers": False, "formatters": {"plain": fmt},
              "handlers": {"file": {"class": "logging.FileHandler", "filename": str((run_dir / LOG).resolve()),
                                    "formatter": "plain", "level": "INFO"}},
              "loggers": {"vllm": {"handlers": ["file"], "level": "INFO", "propagate": False}}}
    path = run_dir / LOGGING
    path.write_text(json.dumps(config, indent=1))
    return path


@contextlib.contextmanager
def output_to(log: Path | None):
    """This process's standard output and error (the file descriptors, which the engine processes it
    starts inherit and keep) appended to `log` inside the block, then as they were; nothing where
    `log` is None."""
    if log is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    sink = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(sink, 1)
        os.dup2(sink, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (sink, *saved):
            os.close(fd)


def log_size(log: Path) -> int:
    """Where what an engine starting now writes to `log` begins."""
    return log.stat().st_size if log.is_file() else 0


def log_text(log: Path, start: int = 0) -> str:
    """What `log` holds past byte `start`: what one engine or server wrote there (a resumed run appends to the
    same log, and an earlier session's lines are not this one's); empty where there is no log."""
    if not log.is_file():
        return ""
    with log.open("rb") as f:
        f.seek(start)
        return f.read().decode(errors="replace")


def failure_cause(log: Path, start: int = 0) -> str | None:
    """vLLM's own cause of a failure: the last exception line of its output in `log` past byte `start` (a
    config's validation error with its first detail line, which says what was wrong)."""
    if not log.is_file():
        return None
    lines = [line.strip() for line in log_text(log, start).splitlines()]
    lines = [re.sub(PREFIX, "", line) for line in lines]
    found = [i for i, line in enumerate(lines) if EXCEPTION_LINE.match(line)]
    causes = [i for i in found if not re.search(POINTER, re.sub(ABOVE, "", lines[i]))]  # (not "see above")
    if not found:
        return None
    i = (causes or found)[-1]
    cause = re.sub(ABOVE, "", lines[i])  # (the trace is in the log, not above)
    if "validation error" in cause and i + 1 < len(lines):  # pydantic's: the detail is on the next line
        cause += ": " + lines[i + 1].split(" [type=")[0]
    return cause[:400]

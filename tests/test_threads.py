"""The intra-op thread count a run uses: chosen by rule, the user's choice respected, and recorded."""

from __future__ import annotations

import json

import pytest
import torch

from dspark.checkpoint import DEMO_DIR
from dspark.errors import DSparkError
from harness.runs.threads import SMALL_MODEL_BYTES, choose, usable_cores


@pytest.fixture
def no_thread_env(monkeypatch):
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)


def test_the_rule(tmp_path, monkeypatch, no_thread_env):
    small, large = tmp_path / "small", tmp_path / "large"
    small.mkdir()
    large.mkdir()
    (small / "model.safetensors").write_bytes(b"\0" * 1000)
    with (large / "model.safetensors").open("wb") as f:  # a sparse file: the rule reads sizes, never weights
        f.truncate(SMALL_MODEL_BYTES + 1)
    assert choose(usable_cores(), "cpu", small) == (usable_cores(), "--threads")  # (more: refused, see test_option_mistakes)
    n, why = choose(None, "cpu", small)
    assert n == 1 and why.startswith("auto: target weights 0.001 MB")
    assert choose(None, "cpu", large) == (usable_cores(), "auto: every usable core (a large target)")
    assert choose(None, "cuda", small) == (torch.get_num_threads(), "torch default (GPU run)")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # torch read it at start-up: its count stands
    assert choose(None, "cpu", small) == (torch.get_num_threads(), f"OMP_NUM_THREADS=2 (torch uses {torch.get_num_threads()})")
    assert choose(2, "cpu", small) == (2, "--threads")  # the flag wins over the environment
    with pytest.raises(DSparkError, match="--threads is 0; give at least 1"):
        choose(0, "cpu", small)


@pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(), reason="the demo models are not built")
def test_the_demo_target_runs_on_one_thread(no_thread_env):
    n, why = choose(None, "cpu", DEMO_DIR / "target")
    assert n == 1 and "14 MB" in why


def test_a_resume_keeps_the_recorded_count_and_refuses_another(tmp_path, monkeypatch, no_thread_env):
    from harness.runs.plan import RunOptions, recorded_options, resume_options

    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"options": recorded_options(RunOptions()), "settings": {},
                                                   "threads": {"count": 1, "chosen_by": "auto: ..."}}))
    opts = resume_options(RunOptions(resume=str(run)), set())
    assert opts.threads == 1 and choose(opts.threads, "cpu", None) == (1, "as the run recorded")
    assert choose(resume_options(RunOptions(resume=str(run), threads=1), {"threads"}).threads, "cpu", None) == \
        (1, "as the run recorded")
    with pytest.raises(DSparkError) as refused:
        resume_options(RunOptions(resume=str(run), threads=2), {"threads"})
    assert str(refused.value) == f"--resume {run}: --threads was 1 in this run, now 2; drop --threads to continue " \
        "the run as it was started"
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    with pytest.raises(DSparkError) as refused:
        resume_options(RunOptions(resume=str(run)), set())
    assert str(refused.value) == f"--resume {run}: the run was timed on 1 thread(s), OMP_NUM_THREADS=2 asks for 2; " \
        "unset OMP_NUM_THREADS (or set it to 1) to continue the run as it was started"
    assert resume_options(RunOptions(resume=str(run), threads=1), {"threads"}).threads == 1  # the flag wins
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the same count from the environment: the run goes on
    assert resume_options(RunOptions(resume=str(run)), set()).threads == 1

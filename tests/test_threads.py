"""The intra-op thread count a run uses: chosen by rule, the user's choice respected, and recorded."""

from __future__ import annotations

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
    assert choose(3, "cpu", small) == (3, "--threads")
    n, why = choose(None, "cpu", small)
    assert n == 1 and why.startswith("auto: target weights 0 MB")
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

"""Calibration of the draft's confidence head (`harness.analysis.calibration`, `dspark-bench calibrate`):
ECE and Brier score by hand; Sequential Temperature Scaling recovering the temperatures that generated
synthetic outcomes, fitted on one half of the prompts and better on the other; the prefix survival and
the verified slots read from real rounds; the command on a run of the demo pair."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from dspark.checkpoint import DEMO_DIR
from harness.analysis import calibration
from harness.analysis.calibration import Rounds

needs_demo = pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(),
                                reason="the demo models are not built")


def test_ece_and_brier_by_hand():
    predicted = np.array([0.1, 0.1, 0.9, 0.9])
    realised = np.array([0.0, 1.0, 1.0, 1.0])
    # bin 1: mean 0.1 against 0.5 (2 pairs); bin 9: 0.9 against 1.0 (2 pairs)
    assert calibration.ece(predicted, realised) == pytest.approx((2 * 0.4 + 2 * 0.1) / 4)
    assert calibration.brier(predicted, realised) == pytest.approx((0.01 + 0.81 + 0.01 + 0.01) / 4)
    assert calibration.ece(np.array([1.0, 0.0]), np.array([1.0, 0.0])) == 0.0  # the edges fall in the end bins


def test_survival_and_verified_slots_from_recorded_rounds():
    rounds = pd.DataFrame([
        {"run": "r", "system": "dspark", "temperature": 1.0, "question_id": "a", "failed": False, "proposed": 3,
         "accepted": 1, "confidences": [0.5, 0.8, 0.25]},
        {"run": "r", "system": "dspark", "temperature": 1.0, "question_id": "a", "failed": False, "proposed": 2,
         "accepted": 2, "confidences": [0.9, 0.5, 0.1]},  # a threshold cut slot 3: not verified
        {"run": "r", "system": "dspark", "temperature": 1.0, "question_id": "b", "failed": False, "proposed": 0,
         "accepted": 0, "confidences": [0.1, 0.1, 0.1]},  # nothing verified: no pair
        {"run": "r", "system": "dflash", "temperature": 1.0, "question_id": "a", "failed": False, "proposed": 3,
         "accepted": 0, "confidences": None},
    ])
    (key, r), = calibration.groups(rounds).items()
    assert key == ("r", "dspark", 1.0) and len(r.proposed) == 2
    np.testing.assert_allclose(r.survival(), [[0.5, 0.4, 0.1], [0.9, 0.45, 0.045]], rtol=1e-6)
    verified, accepted = r.outcomes()
    assert verified.tolist() == [[True, True, True], [True, True, False]]
    assert accepted.tolist() == [[True, False, False], [True, True, False]]
    t = calibration.table(r)
    assert t["pairs"].tolist() == [2, 2, 1, 5]
    assert t.iloc[1]["predicted"] == pytest.approx((0.4 + 0.45) / 2) and t.iloc[1]["realised"] == 0.5
    # a temperature rescales the logit: sigmoid(logit(0.5) / T) stays 0.5, sigmoid(logit(0.8) / 2) = 2/3
    assert r.survival([1.0, 2.0, 1.0])[0, 1] == pytest.approx(0.5 * 2 / 3, rel=1e-5)


def _synthetic(temperatures: list[float], rounds: int, seed: int) -> Rounds:
    """Rounds whose slot k is accepted (given the earlier ones) with probability sigmoid(c_k / T_k): a head
    whose logits are off by exactly those temperatures."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.5, 2.0, size=(rounds, len(temperatures)))
    ok = rng.random(logits.shape) < 1 / (1 + np.exp(-logits / np.array(temperatures)))
    accepted = np.where(ok.all(axis=1), len(temperatures), np.argmin(ok, axis=1))
    return Rounds(logits, np.full(rounds, len(temperatures)), accepted, [f"p{i % 400}" for i in range(rounds)])


def test_sts_recovers_the_temperatures_and_calibrates_held_out_prompts():
    truth = [2.0, 0.5, 1.0]
    fit = calibration.sts(_synthetic(truth, 40_000, seed=0))
    assert fit.fit_prompts + fit.held_out_prompts == 400 and fit.fit_rounds > 10_000 and fit.held_out_rounds > 10_000
    for got, want in zip(fit.temperatures, truth):
        assert got == pytest.approx(want, rel=0.15)
    before, after = fit.before.iloc[-1]["ece"], fit.after.iloc[-1]["ece"]
    assert after < 0.02 < before  # overall, on prompts the fit never saw
    assert all(a < b for a, b in zip(fit.after["ece"][:2], fit.before["ece"][:2]))  # the miscalibrated positions
    # a calibrated head keeps temperatures near 1 (up to the sampling noise of the fit)
    calibrated = calibration.sts(_synthetic([1.0, 1.0, 1.0], 40_000, seed=1))
    assert all(t == pytest.approx(1.0, rel=0.15) for t in calibrated.temperatures)


def _cli(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=600)


@needs_demo
def test_calibrate_on_a_demo_run_fits_and_saves_sts(tmp_path):
    run = tmp_path / "run"
    proc = _cli("run", "--category", "coding", "--num-prompts", "3", "--output-len", "48", "--systems", "dspark",
                "--temperature", "1", "--out", run, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = tmp_path / "sts.json"
    proc = _cli("calibrate", run, "--fit-sts", out, "--plot", tmp_path / "rel.png", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (group,) = json.loads(proc.stdout)["groups"]
    records = [json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines()]
    dspark = [r for r in records if r["system"] == "dspark"]
    verified = sum(1 for r in dspark for d in r["proposal_lengths"] if d > 0)
    assert group["system"] == "dspark" and group["table"][0]["pairs"] == verified
    assert group["table"][-1]["pairs"] == sum(r["proposal_lengths"][i] for r in dspark for i in range(r["num_rounds"]))
    saved = json.loads(out.read_text())
    assert len(saved["temperatures"]) == 7 and all(0.1 <= t <= 10 for t in saved["temperatures"])
    assert saved["system"] == "dspark" and saved["temperature"] == 1.0 and saved["git"]
    assert (tmp_path / "rel.png").read_bytes()[:4] == b"\x89PNG"
    # a system the run lacks is refused in one line, naming those it has
    proc = _cli("calibrate", run, "--system", "ngram", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr == "error: --system ngram: not in this run; it has dspark\n"
    # a temperature without confidences, naming those that have them
    proc = _cli("calibrate", run, "--system", "dspark", "--temperature", "0", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "dspark T=1" in proc.stderr


def test_policy_replay_chooses_as_the_engine_does_and_counts_by_hand():
    import torch

    from dspark.schedule import ProposalCut, scheduled_length
    from harness.analysis import policies

    rng = np.random.default_rng(3)
    logits = rng.normal(0.5, 2.0, size=(200, 7))
    costs = np.array([1.0, 1.1, 1.15, 1.2, 1.3, 1.5, 1.8, 2.0])
    temps = np.array([1.5, 1.0, 0.8, 1.2, 1.0, 2.0, 1.0])
    ours = policies.scheduled_lengths(logits, costs, temps)
    engine = [scheduled_length(torch.tensor(row), torch.tensor(temps), torch.tensor(costs)).item() for row in logits]
    assert ours.tolist() == engine and len(set(engine)) > 2
    cut = policies.threshold_lengths(logits, 0.4)
    assert cut.tolist() == [ProposalCut(threshold=0.4).length(torch.tensor(row)).item() for row in logits]
    # three full rounds that accepted 0, 2 and 7 drafts, replayed at l = 1, 3, 3: tokens 1, 3, 4 at costs 1.1, 1.2, 1.2
    r = Rounds(np.zeros((3, 7)), np.array([7, 7, 7]), np.array([0, 2, 7]), ["a", "b", "c"])
    got = policies.replay(r, np.array([1, 3, 3]), costs)
    assert (got["tokens"], got["verified_per_round"]) == (8, 7 / 3) and got["cost"] == pytest.approx(3.5)
    table = policies.compare(r, list(costs), thresholds=(0.6,))
    assert table[0]["policy"] == "all drafts" and table[0]["tokens"] == 1 + 3 + 8 and table[0]["vs_full"] == 1.0
    assert table[1]["verified_per_round"] == 0  # sigmoid(0) = 0.5 < 0.6: every proposal cut to nothing

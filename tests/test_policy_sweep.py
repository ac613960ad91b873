"""`harness.analysis.policy_sweep`: a policy against all drafts per temperature and concurrency, from two
served runs in opposite orders; figures checked by hand on small folders."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from harness.analysis.policy_sweep import compare, policy_pairs

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = [{"name": "plain", "method": "plain"},
           {"name": "dspark", "method": "dspark", "draft": "demo-dspark", "confidence": "off"},
           {"name": "dspark-schedule", "method": "dspark", "draft": "demo-dspark", "confidence": "schedule"}]


def _row(system: str, c: int, tok_s: float, al: float, drafts: int, rounds: int) -> dict:
    return {"system": system, "temperature": 0.0, "max_concurrency": c, "category": "overall",
            "output_throughput": tok_s, "spec_decode_acceptance_length": al, "spec_decode_num_draft_tokens": drafts,
            "num_rounds": rounds, "mean_tpot_ms": 1000.0 / tok_s}


def _run(path: Path, order: list[str], rows: list[dict], ids: dict[tuple, list[int]]) -> Path:
    path.mkdir()
    (path / "manifest.json").write_text(json.dumps({"settings": {"systems": order},
                                                    "experiment": {"systems": SYSTEMS}}))
    (path / "summary.json").write_text(json.dumps({"rows": rows}))
    with (path / "requests.jsonl").open("w") as f:
        for (system, c, q), out in ids.items():
            f.write(json.dumps({"system": system, "question_id": q, "turn": 0, "temperature": 0.0,
                                "max_concurrency": c, "output_ids": out}) + "\n")
    return path


def test_two_orders_give_per_run_ratios_their_geometric_mean_and_token_equality_beside_its_control(tmp_path):
    ab = _run(tmp_path / "ab", ["dspark", "dspark-schedule"],
              [_row("dspark", 1, 100.0, 2.4, 70, 10), _row("dspark-schedule", 1, 80.0, 2.3, 70, 10),
               _row("dspark", 32, 1000.0, 2.4, 700, 100), _row("dspark-schedule", 32, 1200.0, 2.2, 700, 100)],
              {("dspark", 1, "q1"): [1, 2], ("dspark-schedule", 1, "q1"): [1, 2],
               ("dspark", 1, "q2"): [3, 4], ("dspark-schedule", 1, "q2"): [3, 5]})
    ba = _run(tmp_path / "ba", ["dspark-schedule", "dspark"],
              [_row("dspark", 1, 200.0, 2.6, 70, 10), _row("dspark-schedule", 1, 180.0, 2.5, 63, 10),
               _row("dspark", 32, 1000.0, 2.4, 700, 100), _row("dspark-schedule", 32, 1500.0, 2.4, 700, 100)],
              {("dspark", 1, "q1"): [1, 2], ("dspark-schedule", 1, "q1"): [1, 2],
               ("dspark", 1, "q2"): [3, 9], ("dspark-schedule", 1, "q2"): [3, 9]})
    assert policy_pairs([ab, ba]) == [("dspark", "dspark-schedule")]
    low, high = compare([ab, ba], "dspark", "dspark-schedule")
    assert (low["concurrency"], high["concurrency"]) == (1, 32)
    assert low["ratio_per_run"] == [0.8, 0.9] and low["ratio_geomean"] == round(math.sqrt(0.8 * 0.9), 3)
    assert high["ratio_per_run"] == [1.2, 1.5] and high["ratio_geomean"] == round(math.sqrt(1.8), 3)
    assert low["dspark_tok_s"] == [100.0, 200.0] and low["dspark-schedule_tok_s"] == [80.0, 180.0]
    assert low["dspark_al"] == 2.5 and low["dspark-schedule_al"] == 2.4
    assert low["dspark_verified_per_round"] == 7.0 and low["dspark-schedule_verified_per_round"] == 6.65
    # q1 equal in both runs, q2 differs in the first: 3 of 4; the control (dspark, run to run) 1 of 2
    assert low["greedy_equal"] == (3, 4) and low["greedy_equal_dspark_run_to_run"] == (1, 2)
    assert high["greedy_equal"] is None
    # the script prints the same table
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "vllm_adaptive.py"), str(ab), str(ba)],
                         capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert "0.800/0.900" in out and "1.200/1.500" in out and "3/4; 1/2" in out


def test_a_run_without_a_policy_pairs_nothing_and_native_rows_have_no_counters(tmp_path):
    row = {"system": "dspark", "temperature": 0.0, "max_concurrency": 1, "category": "overall",
           "output_throughput": 10.0, "mean_tpot_ms": 100.0}
    run = _run(tmp_path / "one", ["plain", "dspark"], [row, row | {"system": "dspark-schedule"}], {})
    assert policy_pairs([run]) == []
    bare = tmp_path / "bare"  # a folder whose manifest lacks the experiment (older runs): nothing to pair
    bare.mkdir()
    (bare / "manifest.json").write_text(json.dumps({"settings": {"systems": ["dspark"]}}))
    assert policy_pairs([bare, tmp_path / "no-manifest"]) == []
    (only,) = compare([run], "dspark", "dspark-schedule")
    assert only["dspark_verified_per_round"] is None and only["dspark_al"] is None and only["ratio_per_run"] == [1.0]

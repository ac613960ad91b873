"""Where DSpark stops paying (issue 57 item 2): `harness.analysis.crossover` on hand-made level rows (the
crossover rule: reached, bracketed, not reached, an interval touching 1 exactly), on built AB / BA run
folders (pooling over orders, their hull where they disagree, the throughput ratio's interval over runs,
measured against derived per level), and on real served CPU runs kept as a fixture
(tests/fixtures/crossover/: plain and n-gram, since vLLM's CPU build runs DSpark only under Triton's
interpreter; its README gives the commands), a speedup and a throughput ratio recomputed by hand from the
records, and `benchmarks/study_report.py` drawing its table and figure from them."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.analysis.crossover import caption, crossover, crossovers, levels, markdown, read_sweeps
from tests.run_folders import MANY, served, write

FIXTURE = Path(__file__).parent / "fixtures" / "crossover"


def test_reached_with_its_bracket():
    found = crossover([(16, 1.8, [1.6, 2.0]), (32, 1.4, [1.2, 1.6]), (64, 0.97, [0.9, 1.05]), (128, 0.8, [0.7, 0.9])])
    assert found["level"] == 64 and found["bracket"] == [32, 64] and found["above_again"] == []
    assert found["text"] == "between 32 and 64"
    assert "32 (1.40x, 95 % CI 1.20-1.60) to 64 (0.97x, 95 % CI 0.90-1.05)" == found["evidence"]


def test_above_one_again_past_the_crossover_is_named():
    found = crossover([(1, 2.0, [1.1, 3.0]), (2, 1.5, [0.5, 4.0]), (4, 2.5, [1.5, 4.0])])
    assert found["text"] == "between 1 and 2" and found["above_again"] == [4]
    text = "\n".join(markdown("x", [], {"tpot": found, "throughput": found}, "c"))
    assert "wholly above 1 again at 4" in text


def test_reached_at_the_lowest_level():
    found = crossover([(4, 0.99, [0.95, 1.03]), (1, 1.02, [0.98, 1.06])])  # (any order in)
    assert found["level"] == 1 and found["text"] == "at or below 1" and found["bracket"] == [None, 1]


def test_not_reached():
    found = crossover([(1, 2.0, [1.8, 2.2]), (256, 1.2, [1.1, 1.3])])
    assert found["level"] is None and found["text"] == "not reached up to 256"
    assert found["evidence"] == "256 (1.20x, 95 % CI 1.10-1.30)"


def test_touching_one_exactly_counts_as_reached():
    found = crossover([(16, 1.5, [1.2, 1.8]), (32, 1.1, [1.0, 1.2])])
    assert found["level"] == 32 and found["text"] == "between 16 and 32"
    just_above = crossover([(16, 1.5, [1.2, 1.8]), (32, 1.1, [1.0000001, 1.2])])
    assert just_above["level"] is None and "1.0000001-1.20" in just_above["evidence"]


def test_levels_without_an_interval_are_skipped_and_named():
    found = crossover([(1, 2.0, [1.8, 2.2]), (4, 1.5, None), (16, 0.9, [0.8, 1.0])])
    assert found["text"] == "between 1 and 16" and found["untested_between"] == [4]
    assert crossover([(1, 2.0, None)])["text"] == "no level has an interval"


def _sweep(root: Path, name: str, order: list[str], tpots: dict[tuple[str, int], float]) -> Path:
    """A served sweep of 8 prompts at 16 and 64: plain and dspark, each prompt's TPOT given per (system,
    level), nudged per prompt so the pairs have a spread; one wave a level, all at once."""
    records = []
    for (system, level), tpot in tpots.items():
        for i, q in enumerate(MANY):
            rec = served(system, q, level, tpot * (1 + 0.01 * (i % 3)), 100.0 * level + (system == "dspark"))
            records.append(rec | {"method": "plain" if system == "plain" else "dspark"})
    return write(root / name, records, systems=order, backend="vllm-server", concurrency=(16, 64), device="cuda")


def test_pooled_over_orders_and_throughput_over_runs(tmp_path):
    tpots = {("plain", 16): 10.0, ("dspark", 16): 5.0, ("plain", 64): 12.0, ("dspark", 64): 12.5}
    runs = [_sweep(tmp_path, "ab", ["plain", "dspark"], tpots), _sweep(tmp_path, "ba", ["dspark", "plain"], tpots)]
    bench = {"against_vllm": {"levels": [{"concurrency": 16, "plain_ms": {"median": 6.0},
                                          "dspark_round_ms": {"median": 9.0}}]},
             "device_name": None, "shapes": {"target": {"name": "demo"}}}  # (the built runs: target demo, no GPU)
    rows = levels(read_sweeps(runs), "dspark", bench)
    assert [r["concurrency"] for r in rows] == [16, 64]
    low, high = rows
    assert low["tpot"]["speedup"] == pytest.approx(2.0) and low["tpot"]["pairs"] == 16
    assert low["tpot"]["pooling"].startswith("pooled over both orders")
    # (every request of a level in one wave: throughput is tokens over the wave's span, the same in both runs)
    assert low["throughput"]["per_run"] == pytest.approx([10.0 * 1.02 / (5.0 * 1.02)] * 2, rel=0.05)
    assert "1 degree of freedom" in low["throughput"]["note"]
    assert low["derived"] is None  # (no acceptance recorded by these requests: no AL to derive from)
    assert high["derived_note"] == "engine-bench timed no batch of 64"
    found = crossovers(rows)
    assert found["tpot"]["text"] == "between 16 and 64"
    text = "\n".join(markdown("dspark", rows, found, "random weights, synthetic acceptance"))
    assert "Crossover by TPOT speedup: between 16 and 64" in text and "random weights, synthetic acceptance" in text


def test_orders_that_disagree_give_the_hull(tmp_path):
    ab = _sweep(tmp_path, "ab", ["plain", "dspark"], {("plain", 16): 10.0, ("dspark", 16): 5.0})
    ba = _sweep(tmp_path, "ba", ["dspark", "plain"], {("plain", 16): 10.0, ("dspark", 16): 8.0})
    row = levels(read_sweeps([ab, ba]), "dspark")[0]
    assert row["tpot"]["pooling"].startswith("orders disagree")
    per = row["tpot"]["per_order"]
    assert row["tpot"]["ci"] == [min(per["plain first"][1][0], per["dspark first"][1][0]),
                                 max(per["plain first"][1][1], per["dspark first"][1][1])]
    assert row["tpot"]["speedup"] == pytest.approx(math.sqrt(2.0 * 1.25))


def test_measured_over_derived_is_flagged_past_ten_percent(tmp_path):
    tpots = {("plain", 16): 10.0, ("dspark", 16): 5.0}
    runs = [_sweep(tmp_path, "ab", ["plain", "dspark"], tpots), _sweep(tmp_path, "ba", ["dspark", "plain"], tpots)]
    sweeps = read_sweeps(runs)
    for sw in sweeps:  # (an AL of 3 on every row of the system)
        for r in sw.summary["rows"]:
            if r["system"] == "dspark":
                r["spec_decode_acceptance_length"] = 3.0
    bench = {"against_vllm": {"levels": [{"concurrency": 16, "plain_ms": {"median": 6.0},
                                          "dspark_round_ms": {"median": 9.0}}]},
             "device_name": None, "shapes": {"target": {"name": "demo"}}}
    row = levels(sweeps, "dspark", bench)[0]
    assert row["derived"] == pytest.approx(2.0) and row["tpot_over_derived"] == pytest.approx(1.0)
    assert "tpot_over_derived" not in row["off"]
    bench["against_vllm"]["levels"][0]["dspark_round_ms"]["median"] = 7.0  # derived 2.57: measured 22 % under
    assert "tpot_over_derived" in levels(sweeps, "dspark", bench)[0]["off"]
    other = bench | {"device_name": "NVIDIA H200", "shapes": {"target": {"name": "qwen3-8b"}}}
    row = levels(sweeps, "dspark", other)[0]  # (step costs of another machine and model derive nothing here)
    assert row["derived"] is None and row["derived_note"].startswith("no derivation: the step costs are qwen3-8b")


def _union_s(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by any of the spans (the time some request was in flight)."""
    total, end = 0.0, -math.inf
    for lo, hi in sorted(spans):
        total += max(0.0, hi - max(lo, end))
        end = max(end, hi)
    return total


def _by_hand(records: list[dict], level: int) -> tuple[list[float], float]:
    """One run at one level, recomputed from its records: n-gram's per-prompt log TPOT ratios against
    plain's (paired by prompt) and its output throughput over plain's."""
    mine = [r for r in records if r["max_concurrency"] == level and not r.get("failed")]
    plain = {r["question_id"]: r["tpot_ms"] for r in mine if r["system"] == "plain"}
    logs = [math.log(plain[r["question_id"]] / r["tpot_ms"]) for r in mine if r["system"] == "ngram"]
    rate = {s: sum(r["output_tokens"] for r in mine if r["system"] == s) /
            _union_s([(r["start_utc"], r["start_utc"] + r["e2el_ms"] / 1e3) for r in mine if r["system"] == s])
            for s in ("plain", "ngram")}
    return logs, rate["ngram"] / rate["plain"]


def test_real_served_runs_recomputed_by_hand():
    """The CPU runs of the fixture (vLLM's CPU server, the demo target, plain and n-gram in both orders):
    the pooled speedup is the mean of the two runs' mean log ratios (one category: a stratum per run), the
    throughput ratio the geometric mean of each run's, from the records alone."""
    runs = [FIXTURE / "crossover-ab", FIXTURE / "crossover-ba"]
    sweeps = read_sweeps(runs)
    assert [sw.first for sw in sweeps] == ["plain", "ngram"]
    rows = levels(sweeps, "ngram")
    assert [r["concurrency"] for r in rows] == [1, 2, 4]
    for row in rows:
        by_hand = [_by_hand([json.loads(x) for x in (run / "requests.jsonl").read_text().splitlines()],
                            row["concurrency"]) for run in runs]
        centre = math.exp(sum(sum(logs) / len(logs) for logs, _ in by_hand) / 2)
        assert row["tpot"]["speedup"] == pytest.approx(centre, rel=1e-9)
        assert row["tpot"]["pairs"] == sum(len(logs) for logs, _ in by_hand)
        lo, hi = row["tpot"]["ci"]
        assert lo < row["tpot"]["speedup"] < hi
        ratios = [ratio for _, ratio in by_hand]
        assert row["throughput"]["per_run"] == pytest.approx(ratios, rel=1e-9)
        assert row["throughput"]["ratio"] == pytest.approx(math.sqrt(ratios[0] * ratios[1]), rel=1e-9)
        assert row["throughput"]["note"] == "2 runs: a t interval at 1 degree of freedom (t = 12.7), wide"
        assert row["al"] and row["al"] > 1  # (n-gram's acceptance, from the server's counters)
        assert row["derived"] is None and row["derived_note"] == "no engine-bench step costs given"
    found = crossovers(rows)
    assert found["tpot"]["text"] and found["throughput"]["text"]
    assert caption(sweeps) == "vLLM 0.32.0 served, x86_64, real weights, real acceptance, 2 runs (plain first, ngram first)"


def test_study_report_draws_the_crossover_from_unpacked_stages(tmp_path):
    """`benchmarks/study_report.py FOLDER` on a folder holding only the crossover stages' run folders (no
    raw.tar.xz, no other stage): the crossover table and its two crossovers in study.md, the figure, and
    study.json's rows; the study's other tables left out."""
    folder = tmp_path / "study"
    shutil.copytree(FIXTURE, folder)
    done = subprocess.run([sys.executable, "benchmarks/study_report.py", str(folder)], capture_output=True, text=True,
                          cwd=Path(__file__).parents[1], timeout=300)
    assert done.returncode == 0, done.stderr
    text = (folder / "study.md").read_text()
    assert "## Where ngram stops paying: vLLM 0.32.0 served, x86_64" in text and "| engine | system |" not in text
    assert "Crossover by TPOT speedup: " in text and "Crossover by output throughput ratio: " in text
    assert text.startswith("# Where the speculative systems stop paying\n")
    assert "no engine-bench step costs given" not in text  # (the 0.26 H200 file was given: refused by name)
    assert "no derivation: the step costs are qwen3-8b on NVIDIA H200" in text
    assert (folder / "crossover-ngram.png").stat().st_size > 10_000
    study = json.loads((folder / "study.json").read_text())
    assert [r["concurrency"] for r in study["crossovers"]["crossover: ngram"]["rows"]] == [1, 2, 4]

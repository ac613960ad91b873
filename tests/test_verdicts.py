"""A speedup's verdict from a real run: two prompts give no interval and no verdict (the table, the JSON and
the HTML report say "too few prompts (2) for an interval", where a bootstrap over the two pairs once printed
1.49, 95 % CI 1.05-2.12 and "1.49x faster than plain decoding"), and the table follows the `--systems`
order the user typed, plain decoding the baseline wherever it stands."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest
from cli_runner import run_cli

from dspark.checkpoint import DEMO_DIR
from harness.analysis.metrics import MIN_PAIRS
from harness.analysis.summary import summarize

needs_demo = pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(),
                                reason="the demo models are not built")
has_report_tools = all(importlib.util.find_spec(m) is not None for m in ("nbclient", "nbconvert", "ipykernel"))
TOO_FEW = "too few prompts (2) for an interval"
INTERVAL = re.compile(r"\d+\.\d\d-\d+\.\d\d")


def _table_rows(out: str) -> dict[tuple[str, str], str]:
    """The summary table's rows by (system, T), as printed (cells joined by their borders)."""
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) > 8 and cells[1] in ("plain", "dspark"):
            rows[(cells[1], cells[2])] = line
    return rows


@needs_demo
def test_two_prompts_give_no_interval_and_no_verdict(tmp_path, monkeypatch, capfd):
    """The issue's command on two prompts: each DSpark speedup is shown with `*` and, instead of an interval,
    "too few prompts (2) for an interval", with a warning that says how many pairs a verdict needs; the
    HTML report's verdict says the same and never "faster than plain decoding"."""
    run = tmp_path / "two"
    code, out, err = run_cli(monkeypatch, capfd, "run", "--category", "coding", "--num-prompts", "2", "--output-len",
                             "32", "--systems", "plain,dspark", "--device", "cpu", "--out", run)
    assert code == 0, err
    rows = _table_rows(out)
    assert set(rows) == {("plain", "0"), ("plain", "1"), ("dspark", "0"), ("dspark", "1")}, out
    column = _column(out, "speedup")
    for temp in ("0", "1"):
        dspark = rows[("dspark", temp)]
        assert TOO_FEW in dspark and not INTERVAL.search(dspark), dspark
        speedup = [c.strip() for c in dspark.split("│")][column]
        assert re.fullmatch(r"\d+\.\d\d\*", speedup), dspark  # no verdict: the `*` of no clear speedup
    warning = " ".join(out.split())
    assert ("too few prompts for an interval, so no verdict: dspark T=0 (2 pairs), dspark T=1 (2 pairs); a speedup "
            f"gets an interval and a verdict from {MIN_PAIRS} prompt pairs on") in warning

    code, out, err = run_cli(monkeypatch, capfd, "report", run, "--json")
    assert code == 0, err
    summary = json.loads(out)[str(run)]
    assert summary["speedup_min_pairs"] == MIN_PAIRS
    for row in summary["rows"]:
        if row["system"] == "dspark":
            assert row["speedup"] > 0 and row["speedup_pairs"] == 2 and row["speedup_ci95"] is None
            assert row["speedup_ci95_reason"] == TOO_FEW and row["speedup_ci95_spans_1"] is None
    assert "too few prompts (2) for an interval" in (run / "summary.md").read_text()

    if not has_report_tools:
        pytest.skip("the report extra is not installed: the HTML half is left out")
    page = tmp_path / "report.html"
    code, _, err = run_cli(monkeypatch, capfd, "report", run, "--html", page)
    assert code == 0, err
    text = " ".join(re.sub(r"<[^>]+>", " ", page.read_text()).split())
    for temp in ("0", "1"):  # (the verdict's system name is in bold: a tag before its colon)
        assert re.search(rf"dspark ?: too few prompts \(2\) for an interval at T={temp} \(\d+\.\d\dx measured, no "
                         r"verdict\)", text), text
    assert "faster than plain decoding" not in text and "slower than plain decoding" not in text


def _column(out: str, header: str) -> int:
    """The index of a header's column in the printed table (cells split on its borders)."""
    for line in out.splitlines():
        cells = [c.strip() for c in re.split(r"[┃│]", line)]
        if header in cells and "system" in cells:
            return cells.index(header)
    raise AssertionError(f"no {header} column in:\n{out}")


@needs_demo
def test_the_table_and_the_json_follow_the_systems_order_given(tmp_path, monkeypatch, capfd):
    """`--systems dspark,plain`: DSpark's rows first in the table and in the JSON, each held against plain
    decoding (the baseline, wherever it stands in the list)."""
    run = tmp_path / "order"
    code, out, err = run_cli(monkeypatch, capfd, "run", "--category", "coding", "--num-prompts", "1", "--output-len",
                             "8", "--temperature", "0", "--systems", "dspark,plain", "--device", "cpu", "--json",
                             "--out", run)
    assert code == 0, err
    summary = json.loads(out)
    overall = [r for r in summary["rows"] if r["category"] == "overall"]
    assert [r["system"] for r in overall] == ["dspark", "plain"] and summary["baseline"] == "plain"
    assert overall[0]["speedup"] > 0 and overall[0]["speedup_pairs"] == 1 and overall[1]["speedup"] == 1.0
    code, out, err = run_cli(monkeypatch, capfd, "report", run)
    assert code == 0, err
    printed = [line.split("│")[1].strip() for line in out.splitlines() if line.count("│") > 8]
    assert printed == ["dspark", "plain"], out


def _record(system: str, qid: str, tpot: float) -> dict:
    method = "plain" if system == "plain" else "dspark"
    return {"system": system, "method": method, "question_id": qid, "category": "coding", "turn": 0,
            "temperature": 0.0, "prompt_sha256": qid, "output_tokens": 11, "acceptance_lengths":
            [] if method == "plain" else [3, 2], "proposal_lengths": [] if method == "plain" else [6, 6],
            "ttft_ms": 5.0, "tpot_ms": tpot, "e2el_ms": 5.0 + 10 * tpot, "round_ms": {}}


def test_plain_in_the_middle_of_the_systems_order_is_still_the_baseline():
    """Rows follow `systems` (a system it omits after those it names, in the records' order); the speedups
    are against plain decoding's, wherever plain stands."""
    records = [_record(s, f"q{i}", tpot) for i in range(MIN_PAIRS)
               for s, tpot in (("plain", 10.0), ("slow", 20.0), ("fast", 5.0), ("other", 10.0))]
    summary = summarize(records, systems=["fast", "plain", "slow"])
    rows = {r["system"]: r for r in summary["rows"] if r["category"] == "overall"}
    assert [r["system"] for r in summary["rows"] if r["category"] == "overall"] == ["fast", "plain", "slow", "other"]
    assert summary["baseline"] == "plain"
    assert (rows["fast"]["speedup"], rows["slow"]["speedup"], rows["plain"]["speedup"]) == \
        (pytest.approx(2.0), pytest.approx(0.5), pytest.approx(1.0))
    assert rows["fast"]["speedup_ci95"] == pytest.approx([2.0, 2.0]) and rows["plain"]["speedup_ci95_spans_1"] is None
    assert [r["system"] for r in summarize(records)["rows"] if r["category"] == "overall"] == \
        ["plain", "slow", "fast", "other"]  # no order given: the records'

"""`benchmarks/filled_split.py`: a split of N rows from the demo suite's prompts for served sweeps above the
58 it holds: every row a distinct request (its id and its first turn), the first pass the suite itself, each
copy keeping its category and saying it is a copy; the harness's loader reads the file as SPEED-Bench data."""

from __future__ import annotations

import json
from pathlib import Path

from harness.specs.datasets import demo_suite_dir, load, read_records
from tests.scripts import load_script


def test_a_filled_split_is_distinct_requests_keeping_their_categories(tmp_path):
    suite = list(read_records(Path(str(demo_suite_dir().joinpath("qualitative.jsonl")))))
    rows = load_script(Path("benchmarks/filled_split.py")).filled(suite, 130)
    assert len(rows) == 130 and rows[:len(suite)] == suite
    assert len({r["question_id"] for r in rows}) == len({r["turns"][0] for r in rows}) == 130
    second = rows[len(suite) + 3]
    assert second["turns"][0] == f"(1) {suite[3]['turns'][0]}" and second["category"] == suite[3]["category"]
    assert second["source"] == f"copy 1 of {suite[3]['source']}" and rows[2 * len(suite)]["turns"][0].startswith("(2) ")
    out = tmp_path / "qualitative.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = load("qualitative", out)
    assert len(data.rows) == 130 and data.origin["kind"] == "files"

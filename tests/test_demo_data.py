"""The held-out demo prompts: SPEED-Bench's row schema, shipped as package data."""

from __future__ import annotations

import json
import re
from importlib import resources


def _rows() -> list[dict]:
    text = resources.files("harness").joinpath("data/demo_coding.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_demo_coding_prompts_follow_the_speed_bench_schema():
    rows = _rows()
    assert len(rows) >= 16
    columns = {"question_id", "category", "sub_category", "turns", "source", "src_id", "difficulty", "multiturn"}
    ids = set()
    for row in rows:
        assert set(row) == columns
        assert re.fullmatch(r"[0-9a-f]{32}", row["question_id"])  # AIPerf requires exactly 32 characters
        assert row["category"] == "coding" and row["multiturn"] is False
        assert len(row["turns"]) == 1 and len(row["turns"][0]) > 40
        ids.add(row["question_id"])
    assert len(ids) == len(rows)
    assert len({r["turns"][0] for r in rows}) == len(rows)

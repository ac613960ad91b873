"""The demo suite: SPEED-Bench's row schema for every qualitative category and throughput tier,
shipped as package data."""

from __future__ import annotations

import json
import re

from harness.specs.datasets import QUALITATIVE, THROUGHPUT, demo_suite_dir, load

COLUMNS = {"question_id", "category", "sub_category", "turns", "source", "src_id", "difficulty", "multiturn"}


def _raw(split: str) -> list[dict]:
    text = demo_suite_dir().joinpath(f"{split}.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_demo_suite_rows_follow_the_speed_bench_schema():
    for split, categories in (("qualitative", QUALITATIVE), ("throughput_1k", THROUGHPUT)):
        rows = _raw(split)
        assert {r["category"] for r in rows} == set(categories)
        for row in rows:
            assert set(row) == COLUMNS
            assert re.fullmatch(r"[0-9a-f]{32}", row["question_id"])  # AIPerf requires exactly 32 characters
            assert row["multiturn"] == (len(row["turns"]) > 1)
            assert all(isinstance(t, str) and len(t) > 20 for t in row["turns"])
        assert len({r["question_id"] for r in rows}) == len(rows)
        assert len(load(split, source="demo").rows) == len(rows)


def test_the_held_out_coding_prompts():
    coding = [r for r in _raw("qualitative") if r["category"] == "coding"]
    assert len(coding) >= 16 and all(not r["multiturn"] for r in coding)
    assert len({r["turns"][0] for r in coding}) == len(coding)

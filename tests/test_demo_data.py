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
    for split, categories in (("qualitative", QUALITATIVE), ("throughput_1k", THROUGHPUT), ("throughput_2k", THROUGHPUT),
                              ("throughput_8k", THROUGHPUT)):
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


def test_the_throughput_splits_grow_in_length_within_the_demo_context():
    """Each longer split's prompts are longer, tier by tier, and every one leaves room for a reply in the
    demo target's 2048 positions (with the chat template, 256 output tokens fit)."""
    from transformers import AutoTokenizer

    from dspark.checkpoint import DEMO_DIR

    tokenizer = AutoTokenizer.from_pretrained(DEMO_DIR / "target")
    lengths = {split: [len(tokenizer(r["turns"][0]).input_ids) for r in _raw(split)]
               for split in ("throughput_1k", "throughput_2k", "throughput_8k")}
    for short, long in (("throughput_1k", "throughput_2k"), ("throughput_2k", "throughput_8k")):
        assert all(a < b for a, b in zip(lengths[short], lengths[long])), (short, long)
        assert sum(lengths[long]) > 1.2 * sum(lengths[short])
    assert max(lengths["throughput_2k"]) <= 1200 and max(lengths["throughput_8k"]) <= 1750
    assert {r["question_id"] for r in _raw("throughput_2k")}.isdisjoint(r["question_id"] for r in _raw("throughput_8k"))

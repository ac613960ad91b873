"""SPEED-Bench data in the shapes people have, normalised to the hub's schema and validated."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from dspark.errors import DSparkError
from harness.specs.datasets import SENTINEL, load, select

ROWS = [
    {"question_id": "a" * 32, "category": "coding", "sub_category": "python", "turns": ["Write fizzbuzz."],
     "source": "s", "src_id": "1", "difficulty": "easy", "multiturn": False},
    {"question_id": "b" * 32, "category": "math", "sub_category": "algebra", "turns": ["Solve x + 1 = 2.", "And x + 2 = 5?"],
     "source": "s", "src_id": "2", "difficulty": "easy", "multiturn": True},
    {"question_id": "c" * 32, "category": "coding", "sub_category": "c", "turns": ["Write strlen in C."],
     "source": "s", "src_id": "3", "difficulty": "easy", "multiturn": False},
]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_hub_parquet_and_specdec_bench_folder(tmp_path):
    pd.DataFrame(ROWS).to_parquet(tmp_path / "qualitative.parquet")
    data = load("qualitative", tmp_path)
    assert [r.question_id for r in data.rows] == ["a" * 32, "b" * 32, "c" * 32]
    assert data.rows[1].turns == ("Solve x + 1 = 2.", "And x + 2 = 5?") and data.rows[1].multiturn
    (tmp_path / "spec" / "qualitative").mkdir(parents=True)  # specdec_bench: data/speed/<config>/test.parquet
    pd.DataFrame(ROWS).to_parquet(tmp_path / "spec" / "qualitative" / "test.parquet")
    spec = load("qualitative", tmp_path / "spec")
    assert [r.to_dict() for r in spec.rows] == [r.to_dict() for r in data.rows]
    assert list(spec.origin["files"].values())[0]  # the file's sha256 is recorded


def test_nemo_skills_messages_jsonl(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "turns"} | {"messages": [{"role": "user", "content": t} for t in r["turns"]]}
            for r in ROWS]
    _jsonl(tmp_path / "qualitative.jsonl", rows)
    data = load("qualitative", tmp_path)
    assert [r.turns for r in data.rows] == [tuple(r["turns"]) for r in ROWS]


def test_turns_jsonl_without_category_takes_the_file_stem(tmp_path):
    f = _jsonl(tmp_path / "humaneval.jsonl", [{"question_id": 1, "turns": ["def add(a, b):"]},
                                               {"question_id": 2, "turns": ["def sub(a, b):"]}])
    data = load("qualitative", f)
    assert {r.category for r in data.rows} == {"humaneval"} and data.rows[0].question_id == "1"
    with pytest.raises(DSparkError, match="valid: humaneval"):
        select(data.rows, "qualitative", ["coding"], None, 0, True)


def test_bad_rows_and_placeholders_stop_the_run(tmp_path):
    with pytest.raises(DSparkError, match="no 'turns'"):
        load("qualitative", _jsonl(tmp_path / "x.jsonl", [{"question_id": "q", "prompt": "hi"}]))
    with pytest.raises(DSparkError, match=r"x2.jsonl:2: not JSON"):
        (tmp_path / "x2.jsonl").write_text(json.dumps(ROWS[0]) + "\n{oops\n")
        load("qualitative", tmp_path / "x2.jsonl")
    with pytest.raises(DSparkError, match="appears twice"):
        load("qualitative", _jsonl(tmp_path / "dup.jsonl", [ROWS[0], ROWS[0]]))
    with pytest.raises(DSparkError, match="found neither qualitative.jsonl"):
        load("qualitative", _mkdir(tmp_path / "empty"))
    held = dict(ROWS[2], turns=[SENTINEL + "\n\n{question}"])
    data = load("qualitative", _jsonl(tmp_path / "held.jsonl", [ROWS[0], held]))
    with pytest.raises(DSparkError, match="placeholder text; rebuild them .*prepare_data.py"):
        select(data.rows, "qualitative", None, None, 0, False)
    assert len(select(data.rows, "qualitative", None, 1, 0, False)) == 1  # the unselected placeholder row is fine


def _mkdir(path):
    path.mkdir()
    return path


def test_categories_and_subsets(tmp_path):
    data = load("qualitative", _jsonl(tmp_path / "q.jsonl", ROWS))
    assert [r.question_id[0] for r in select(data.rows, "qualitative", ["coding"], None, 0, False)] == ["a", "c"]
    with pytest.raises(DSparkError, match="unknown category 'cooking' for qualitative; valid: coding, math"):
        select(data.rows, "qualitative", ["cooking"], None, 0, False)
    picks = {tuple(r.question_id for r in select(data.rows, "qualitative", None, 2, seed, True)) for seed in range(20)}
    assert len(picks) > 1  # the seeded shuffle picks different subsets for different seeds
    assert select(data.rows, "qualitative", None, 2, 5, True) == select(data.rows, "qualitative", None, 2, 5, True)
    with pytest.raises(DSparkError, match="unknown split"):
        load("throughput_4k", tmp_path)


def test_the_demo_suite_and_the_hub_message(monkeypatch):
    demo = load("qualitative", source="demo")
    assert {r.category for r in demo.rows} >= {"coding", "writing"}
    with pytest.raises(DSparkError, match="demo suite has no 'throughput_32k'"):
        load("throughput_32k", source="demo")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DSparkError, match="could not load nvidia/SPEED-Bench config 'qualitative'.*--dataset-path"):
        load("qualitative", source="hub")


def test_a_torn_last_line_is_skipped_and_cut_only_on_resume(tmp_path):
    from harness.analysis.records import read_requests

    path = tmp_path / "requests.jsonl"
    path.write_text('{"a": 1}\n{"b": 2}')  # killed before the newline: the record is not trusted
    assert read_requests(tmp_path) == [{"a": 1}] and path.read_text().endswith('{"b": 2}')  # reading writes nothing
    assert read_requests(tmp_path, repair=True) == [{"a": 1}] and path.read_text() == '{"a": 1}\n'
    path.write_text('{"a": 1}\n{oops\n{"c": 3}\n')
    with pytest.raises(DSparkError, match="a line is not JSON"):
        read_requests(tmp_path)

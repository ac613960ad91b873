"""Our trace parser against `nsys stats` on exports of our own engine and of a forked child, recorded
on an H200 with Nsight Systems 2025.3 (`tests/fixtures/record_nsys.py`; MANIFEST.json says how)."""

from __future__ import annotations

import csv
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from harness.profiling.traces import summarize

NSYS = Path(__file__).parent / "fixtures" / "nsys"
CASES = ("engine_plain", "engine_dspark", "fork_unfollowed", "fork_unflushed", "fork_stopped", "spawn")
# (our section, report, the report's name column, our count key, the report's count column)
SECTIONS = (("nvtx", "nvtx_sum", "Range", "instances", "Instances"),
            ("kernels", "cuda_gpu_kern_sum", "Name", "instances", "Instances"),
            ("api", "cuda_api_sum", "Name", "calls", "Num Calls"),
            ("memory_ops", "cuda_gpu_mem_time_sum", "Operation", "count", "Count"))


def _golden(case: str, report: str) -> list[dict]:
    with open(NSYS / case / f"{report}.csv") as f:
        return list(csv.DictReader(f))


def _label(row: dict) -> str:
    """nsys prints a range as `domain:range` (an empty domain for the default one)."""
    return f"{row['domain'] or ''}:{row['range']}"


@pytest.fixture(scope="module")
def summaries() -> dict:
    return {case: summarize(NSYS / f"{case}.sqlite") for case in CASES}


def test_fixtures_are_small_and_recorded_by_a_supported_nsys(summaries):
    manifest = json.loads((NSYS / "MANIFEST.json").read_text())
    assert "2025.3" in manifest["nsys"] and manifest["device"] == "NVIDIA H200"
    for case in CASES:
        assert (NSYS / f"{case}.sqlite").stat().st_size < 2_000_000
        assert summaries[case]["nsys_version"].startswith("2025.3")


@pytest.mark.parametrize("case", CASES)
def test_sums_equal_nsys_stats(summaries, case):
    s = summaries[case]
    for key, report, name_col, count_key, count_col in SECTIONS:
        golden = _golden(case, report)
        labels = [_label(r) if key == "nvtx" else r["name"] for r in s[key]]
        assert sorted(labels) == sorted(row[name_col] for row in golden), (case, key)  # no duplicates either
        ours = dict(zip(labels, s[key]))
        for row in golden:
            o = ours[row[name_col]]
            assert (o[count_key], o["total_ns"], o["min_ns"], o["max_ns"]) == (
                int(row[count_col]), int(row["Total Time (ns)"]), int(row["Min (ns)"]), int(row["Max (ns)"]))
            assert o["med_ns"] == float(row["Med (ns)"])  # exact: nsys prints medians to the 0.5 ns
            assert o["avg_ns"] == pytest.approx(float(row["Avg (ns)"]), abs=0.05 + 1e-9)  # printed to 0.1 ns
            assert o["stddev_ns"] == pytest.approx(float(row["StdDev (ns)"]), abs=0.05 + 1e-6)


@pytest.mark.parametrize("case", CASES)
def test_projection_equals_nsys_stats(summaries, case):
    golden = _golden(case, "nvtx_gpu_proj_sum")
    labels = [_label(p) for p in summaries[case]["projection"]]
    assert sorted(labels) == sorted(row["Range"] for row in golden)
    ours = dict(zip(labels, summaries[case]["projection"]))
    for row in golden:
        p = ours[row["Range"]]
        assert (p["proj_total_ns"], p["range_total_ns"], p["range_instances"], p["gpu_ops"]) == (
            int(row["Total Proj Time (ns)"]), int(row["Total Range Time (ns)"]), int(row["Range Instances"]),
            int(row["Total GPU Ops"]))


def test_engine_traces_graphs_in_node_mode(summaries):
    plain, spec = summaries["engine_plain"], summaries["engine_dspark"]
    for s in (plain, spec):
        assert s["capture"]["TRACE_AFTER_FORK_BEFORE_EXEC"] == "true"
        assert any(k.endswith("CUDA_GRAPH_TRACE_OPTIONS:MODE") and v == "Node" for k, v in s["capture"].items())
        assert s["launches"]["graph_launches"] > 0 and s["launches"]["kernels_from_graphs_share"] > 0.9
        assert s["diagnosis"] == []
        (worker,) = [p for p in s["processes"] if p["did_gpu_work"]]
        assert worker["kernel_rows"] == s["launches"]["kernels"]
        assert {c["category"] for c in s["categories"]} >= {"GEMM", "norm", "attention"}
        assert sum(c["share"] for c in s["categories"]) == pytest.approx(1.0)
    assert {r["range"] for r in plain["nvtx"]} == {"prefill", "ar_decode"}
    assert {r["range"] for r in spec["nvtx"]} == {"prefill", "dspark_propose", "target_verify", "decode_sample"}
    # every round's propose and verify is one graph launch: one GPU op per range instance
    for p in spec["projection"]:
        if p["range"] in ("dspark_propose", "target_verify"):
            assert p["gpu_ops"] == p["range_instances"] and p["gpu_busy_ns"] > 0
    assert summarize(NSYS / "engine_dspark.sqlite", expect_method="dspark")["diagnosis"] == []
    (note,) = summarize(NSYS / "engine_dspark.sqlite", expect_method="dflash")["diagnosis"]
    assert "dflash_propose range never appears" in note and "dspark_propose" in note


def test_child_process_cases_are_diagnosed(summaries):
    # a forked child that nsys did not follow: no trace of the work at all
    s = summaries["fork_unfollowed"]
    assert s["launches"]["kernels"] == 0 and s["nvtx"] == []
    (note,) = s["diagnosis"]
    assert "--trace-fork-before-exec=true" in note and "spawn" in note and "fork tracing off" in note
    # followed but never flushed: 2 of the 5 ranges and no kernel
    s = summaries["fork_unflushed"]
    assert len(s["nvtx"]) == 2 and s["launches"]["kernels"] == 0
    assert any("left 2 NVTX rows and no kernel rows" in d and "spawn" in d for d in s["diagnosis"])
    # followed and stopped before exit, or spawned: all five ranges and their kernels
    for case in ("fork_stopped", "spawn"):
        s = summaries[case]
        assert {r["range"] for r in s["nvtx"]} == {"load", "prefill", "decode", "verify", "finish"}
        assert s["launches"]["kernels"] > 0 and s["diagnosis"] == []
        assert [p["did_gpu_work"] for p in s["processes"]].count(True) == 1


def test_bad_files_give_one_line_errors(tmp_path, monkeypatch, capfd):
    from cli_runner import run_cli

    truncated = tmp_path / "truncated.sqlite"
    truncated.write_bytes((NSYS / "engine_plain.sqlite").read_bytes()[:300_000])
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    old = tmp_path / "old.sqlite"
    shutil.copy(NSYS / "spawn.sqlite", old)
    with sqlite3.connect(old) as conn:
        conn.execute("UPDATE META_DATA_EXPORT SET value = '2022.4.2.50' WHERE name = 'EXPORT_PRODUCT_VERSION'")
    for path, words in ((truncated, "corrupt or truncated"), (other, "not an Nsight Systems export"),
                        (old, "Nsight Systems 2022.4.2.50, which is not supported")):
        code, out, err = run_cli(monkeypatch, capfd, "trace", "summarize", path)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, (path, err)


def test_expect_method_fails_in_one_line_when_its_range_is_missing(monkeypatch, capfd):
    """`--expect-method` is a check: exit 1 and one line when the range is missing (the summary still
    printed), 0 when it is there; a method that is not a speculative one is a bad argument (exit 2)."""
    from cli_runner import run_cli

    dspark = NSYS / "engine_dspark.sqlite"
    for extra in ([], ["--json"]):
        code, out, err = run_cli(monkeypatch, capfd, "trace", "summarize", dspark, "--expect-method", "dflash", *extra)
        assert code == 1 and len(err.strip().splitlines()) == 1, err
        assert err.startswith("error: engine_dspark.sqlite: the dflash_propose range never appears") and \
            "(seen: dspark_propose)" in err
        assert json.loads(out)["nvtx"] if extra else "nvtx (engine_dspark.sqlite)" in out
    code, _, err = run_cli(monkeypatch, capfd, "trace", "summarize", NSYS / "engine_plain.sqlite", "--expect-method",
                           "eagle3")
    assert code == 1 and "eagle3_propose range never appears" in err and "no propose range" in err
    code, out, err = run_cli(monkeypatch, capfd, "trace", "summarize", dspark, "--expect-method", "dspark")
    assert code == 0 and err == "" and "never appears" not in out
    code, _, err = run_cli(monkeypatch, capfd, "trace", "summarize", dspark, "--expect-method", "eagle")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--expect-method eagle is not a speculative method; give one of dspark, dflash, dflash2, eagle3, ngram, draft_model" in err
    code, out, _ = run_cli(monkeypatch, capfd, "trace", "summarize", "--help")
    assert code == 0 and "(dspark, dflash, dflash2, eagle3, ngram, draft_model)" in " ".join(out.split())

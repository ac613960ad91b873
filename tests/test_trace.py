"""Our SQLite trace parser against `nsys stats` on a real export, and the diagnoses on exports built
from the same schema."""

from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path

import pytest

from harness.profiling.traces import api_name, kernel_category, summarize

FIXTURE = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "nsys-fuser"
needs_fixture = pytest.mark.skipif(not (FIXTURE / "nsys_fuser_report1.sqlite").is_file(),
                                   reason="the shared nsys fixture is not beside the project")


def _golden(name: str) -> list[dict]:
    with open(FIXTURE / "stats_nsys2023.4" / name) as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def fuser():
    return summarize(FIXTURE / "nsys_fuser_report1.sqlite")


def _check_stats(ours: dict, row: dict, count_key: str, count_col: str):
    assert ours[count_key] == int(row[count_col])
    assert ours["total_ns"] == int(row["Total Time (ns)"])
    assert ours["min_ns"] == int(row["Min (ns)"]) and ours["max_ns"] == int(row["Max (ns)"])
    assert ours["avg_ns"] == pytest.approx(float(row["Avg (ns)"]), abs=0.06)
    assert ours["med_ns"] == pytest.approx(float(row["Med (ns)"]), abs=0.06)
    assert ours["stddev_ns"] == pytest.approx(float(row["StdDev (ns)"]), abs=0.06, rel=1e-9)


@needs_fixture
def test_nvtx_kernel_api_and_memory_sums_equal_nsys_stats(fuser):
    for key, csv_name, name_col, count_key, count_col in (
            ("nvtx", "nvtx_sum.csv", "Range", "instances", "Instances"),
            ("kernels", "cuda_gpu_kern_sum.csv", "Name", "instances", "Instances"),
            ("api", "cuda_api_sum.csv", "Name", "calls", "Num Calls"),
            ("memory_ops", "cuda_gpu_mem_time_sum.csv", "Operation", "count", "Count")):
        golden = _golden(csv_name)
        ours = {r["range" if key == "nvtx" else "name"]: r for r in fuser[key]}
        assert len(ours) == len(golden), key
        for row in golden:
            _check_stats(ours[row[name_col]], row, count_key, count_col)
    assert all(r["domain"] is None and r["style"] == "PushPop" for r in fuser["nvtx"])


@needs_fixture
def test_gpu_projection_equals_nsys_stats(fuser):
    golden = _golden("nvtx_gpu_proj_sum.csv")
    ours = {r["range"]: r for r in fuser["projection"]}
    assert len(ours) == len(golden) == 9
    for row in golden:
        p = ours[row["Range"]]
        assert (p["proj_total_ns"], p["range_total_ns"], p["range_instances"], p["gpu_ops"]) == (
            int(row["Total Proj Time (ns)"]), int(row["Total Range Time (ns)"]), int(row["Range Instances"]),
            int(row["Total GPU Ops"]))
        assert 0 < p["gpu_busy_ns"] <= p["proj_total_ns"] * p["gpu_ops"]


@needs_fixture
def test_categories_launches_processes_schema(fuser):
    cats = {c["category"]: c for c in fuser["categories"]}
    assert sum(c["share"] for c in cats.values()) == pytest.approx(1.0)
    assert cats["memcpy/memset"]["instances"] == 6 and cats["GEMM"]["instances"] == 3  # 3 nvjet (cuBLASLt) GEMMs
    assert sum(c["instances"] for c in cats.values()) == 18 + 6
    assert fuser["launches"] == {"kernels": 18, "graph_launches": 0, "kernels_from_graphs_share": 0.0,
                                 "graph_trace_rows": 0}
    (worker,) = [p for p in fuser["processes"] if p["did_gpu_work"]]
    assert (worker["name"], worker["kernel_rows"], worker["nvtx_rows"]) == ("pytest", 18, 13513)
    assert fuser["schema"]["EXPORT_SCHEMA_VERSION"] == "3.17.1" and fuser["diagnosis"] == []


def test_kernel_categories_and_api_names():
    assert kernel_category("_attention_split_kernel") == "attention"
    assert kernel_category("cutlass::device_kernel<flash::FlashAttnFwdSm90<...>>") == "attention"  # before GEMM
    assert kernel_category("_gemv_kernel") == "GEMM" and kernel_category("nvjet_tst_192x192") == "GEMM"
    assert kernel_category("_add_rms_norm_kernel") == "norm"
    assert kernel_category("void vllm::rotary_embedding_kernel<float>") == "rotary"
    assert kernel_category("_silu_mul_kernel") == "activation"
    for ours in ("_sample_partials_kernel", "_sample_finish_kernel", "_markov_sample_kernel", "_accept_partials_kernel",
                 "_accept_finish_kernel"):
        assert kernel_category(ours) == "softmax/sampling", ours
    assert kernel_category("_gemv_kernel") == "GEMM"
    assert kernel_category("void at::native::vectorized_elementwise_kernel<4>") == "elementwise"
    assert kernel_category("ncclDevKernel_AllReduce_Sum") == "communication"
    assert kernel_category("void at::native::reduce_kernel<512, 1>") == "reduce"
    assert kernel_category("cunn_SoftMaxForward") == "softmax/sampling"
    assert kernel_category("mystery") == "other"
    assert api_name("cudaLaunchKernel_v7000") == "cudaLaunchKernel"
    assert api_name("cudaGetDeviceProperties_v2_v12000") == "cudaGetDeviceProperties_v2_v12000"  # as nsys prints it
    assert api_name("cuLaunchKernel") == "cuLaunchKernel"


# ---- exports built from the real schema -----------------------------------------------------------

PID = (1 << 48) | (4242 << 24)  # globalPid of the traced process
TID = PID | 4243


def _export(tmp_path: Path, name: str, capture: dict | None = None, version: str = "2025.1.1.110") -> sqlite3.Connection:
    conn = sqlite3.connect(tmp_path / name)
    ddl = (FIXTURE / "nsys_fuser_report1.schema.sql").read_text()
    conn.executescript(ddl)
    conn.execute("CREATE TABLE IF NOT EXISTS CUPTI_ACTIVITY_KIND_GRAPH_TRACE (start INTEGER NOT NULL, end INTEGER "
                 "NOT NULL, deviceId INTEGER, contextId INTEGER, streamId INTEGER, correlationId INTEGER, "
                 "globalPid INTEGER, graphId INTEGER NOT NULL, graphExecId INTEGER NOT NULL)")
    for k, v in (capture or {}).items():
        conn.execute("INSERT INTO META_DATA_CAPTURE VALUES (?, ?)", (k, v))
    conn.execute("INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_PRODUCT_VERSION', ?)", (version,))
    conn.execute("INSERT INTO PROCESSES VALUES (?, ?, ?)", (PID, 4242, "python3"))
    return conn


def _string(conn, sid: int, value: str) -> int:
    conn.execute("INSERT INTO StringIds VALUES (?, ?)", (sid, value))
    return sid


def _range(conn, start, end, text=None, text_id=None, domain=None, tid=TID, etype=59):
    conn.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, textId, domainId) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?)", (start, end, etype, text, tid, text_id, domain))


def _kernel(conn, start, end, corr, name_id, graph_node=None):
    conn.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, correlationId, "
                 "globalPid, demangledName, shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY, "
                 "blockZ, staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId, "
                 "graphNodeId) VALUES (?, ?, 0, 1, 7, ?, ?, ?, ?, 32, 1, 1, 1, 128, 1, 1, 0, 0, 0, 0, 1, ?)",
                 (start, end, corr, PID, name_id, name_id, graph_node))


def _api(conn, start, end, corr, name_id, tid=TID):
    conn.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, nameId, "
                 "returnValue) VALUES (?, ?, 0, ?, ?, ?, 0)", (start, end, tid, corr, name_id))


@needs_fixture
def test_domains_registered_strings_and_a_graph_replay_in_node_mode(tmp_path):
    conn = _export(tmp_path, "spec.sqlite", {"TRACE_AFTER_FORK_BEFORE_EXEC": "true"})
    _range(conn, 0, None, text="dspark", domain=5, etype=75)  # the domain's create row names it
    verify = _string(conn, 1, "target_verify")
    _range(conn, 100, 200, text_id=_string(conn, 2, "dspark_propose"), domain=5)
    _range(conn, 200, 400, text_id=verify, domain=5)
    _range(conn, 400, 600, text_id=verify, domain=5)
    graph_launch, gemv = _string(conn, 3, "cudaGraphLaunch_v10000"), _string(conn, 4, "_gemv_kernel")
    for i, (a, k) in enumerate(((210, 250), (410, 450))):  # each verify replays a graph of two kernels
        _api(conn, a, a + 5, 10 + i, graph_launch)
        _kernel(conn, k, k + 20, 10 + i, gemv, graph_node=1)
        _kernel(conn, k + 20, k + 50, 10 + i, gemv, graph_node=2)
    conn.commit()
    s = summarize(tmp_path / "spec.sqlite", expect_method="dspark")
    nvtx = {r["range"]: r for r in s["nvtx"]}
    assert nvtx["target_verify"]["domain"] == "dspark" and nvtx["target_verify"]["instances"] == 2
    assert nvtx["target_verify"]["med_ns"] == 200 and nvtx["dspark_propose"]["total_ns"] == 100
    proj = {r["range"]: r for r in s["projection"]}["target_verify"]
    # a graph launch is one GPU op (nsys counts distinct launching calls), its kernels' time is all busy time
    assert (proj["range_instances"], proj["gpu_ops"], proj["proj_total_ns"], proj["gpu_busy_ns"]) == (2, 2, 100, 100)
    assert {b["range"]: b["gpu_busy_fraction"] for b in s["busy"]}["target_verify"] == pytest.approx(100 / 400)
    assert s["launches"] == {"kernels": 4, "graph_launches": 2, "kernels_from_graphs_share": 1.0,
                             "graph_trace_rows": 0}
    assert {r["name"] for r in s["api"]} == {"cudaGraphLaunch_v10000"}  # as cuda_api_sum prints it
    assert s["diagnosis"] == []


@needs_fixture
def test_diagnoses(tmp_path):
    # 1. a forked worker nsys did not follow: nothing of it in the trace
    conn = _export(tmp_path, "fork.sqlite", {"TRACE_AFTER_FORK_BEFORE_EXEC": "false"})
    _range(conn, 0, 10, text="run")
    conn.commit()
    (note,) = [d for d in summarize(tmp_path / "fork.sqlite")["diagnosis"] if "not traced" in d]
    assert "--trace-fork-before-exec=true" in note and "spawn" in note and "fork tracing off" in note
    # 2. a followed child that exited without flushing: NVTX and API rows, no kernels
    conn = _export(tmp_path, "flush.sqlite", {"TRACE_AFTER_FORK_BEFORE_EXEC": "true"})
    _range(conn, 0, 10, text="prefill")
    _range(conn, 10, 20, text="ar_decode")
    _api(conn, 2, 3, 1, _string(conn, 1, "cudaLaunchKernel_v7000"))
    conn.commit()
    notes = summarize(tmp_path / "flush.sqlite")["diagnosis"]
    assert any("left 2 NVTX rows and no kernel rows" in d and "cudaProfilerStop" in d for d in notes)
    # 3. a speculative run whose propose range never appears; 4. graphs traced whole
    conn = _export(tmp_path, "graph.sqlite", {"TRACE_AFTER_FORK_BEFORE_EXEC": "true"})
    _range(conn, 0, 100, text="target_verify")
    _range(conn, 100, 200, text="ngram_propose")
    _api(conn, 10, 12, 5, _string(conn, 1, "cudaGraphLaunch_v10000"))
    conn.execute("INSERT INTO CUPTI_ACTIVITY_KIND_GRAPH_TRACE VALUES (20, 90, 0, 1, 7, 5, ?, 1, 1)", (PID,))
    conn.commit()
    notes = summarize(tmp_path / "graph.sqlite", expect_method="dspark")["diagnosis"]
    assert any("dspark_propose range never appears" in d and "ngram_propose" in d for d in notes)
    assert any("traced whole" in d and "--cuda-graph-trace=node" in d for d in notes)


@needs_fixture
def test_trace_summarize_command(monkeypatch, capfd, tmp_path):
    from cli_runner import run_cli

    code, out, err = run_cli(monkeypatch, capfd, "trace", "summarize", FIXTURE / "nsys_fuser_report1.sqlite", "--json")
    assert code == 0, err
    s = json.loads(out)
    assert set(s) >= {"nvtx", "kernels", "categories", "api", "projection", "launches", "busy", "processes", "schema",
                      "diagnosis"}
    code, out, _ = run_cli(monkeypatch, capfd, "trace", "summarize", FIXTURE / "nsys_fuser_report1.sqlite")
    assert code == 0 and "nvtx (nsys_fuser_report1.sqlite)" in out and "launches:" in out
    (tmp_path / "x.sqlite").write_text("not a database")
    code, _, err = run_cli(monkeypatch, capfd, "trace", "summarize", tmp_path / "x.sqlite")
    assert code == 2 and "not an SQLite export" in err and len(err.strip().splitlines()) == 1


@needs_fixture
def test_long_close_durations_keep_their_stddev_and_a_repeated_domain_is_one_domain(tmp_path):
    conn = _export(tmp_path, "precise.sqlite")
    _range(conn, 0, None, text="engine", domain=3, etype=75)
    _range(conn, 5, None, text="engine", domain=3, etype=75, tid=TID + 1)  # another thread creates it again
    base = 10**12
    _range(conn, 10, 10 + base, text="step", domain=3)
    _range(conn, 20, 20 + base + 1, text="step", domain=3)
    _range(conn, 30, None, text="open")  # never ended: ends at the last range timestamp
    conn.commit()
    s = summarize(tmp_path / "precise.sqlite")
    step = {r["range"]: r for r in s["nvtx"]}["step"]
    assert step["domain"] == "engine" and step["instances"] == 2
    assert step["med_ns"] == base + 0.5 and step["stddev_ns"] == pytest.approx(0.5 ** 0.5, abs=1e-6)
    assert {r["range"]: r for r in s["nvtx"]}["open"]["total_ns"] == 20 + base + 1 - 30


@needs_fixture
def test_an_export_without_a_product_version_is_refused_in_one_line(tmp_path, monkeypatch, capfd):
    from cli_runner import run_cli

    conn = _export(tmp_path, "noversion.sqlite")
    conn.execute("UPDATE META_DATA_EXPORT SET value = NULL WHERE name = 'EXPORT_PRODUCT_VERSION'")
    conn.commit()
    code, _, err = run_cli(monkeypatch, capfd, "trace", "summarize", tmp_path / "noversion.sqlite")
    assert code == 2 and "not an Nsight Systems export" in err and len(err.strip().splitlines()) == 1


def test_an_empty_file_is_said_to_be_empty(tmp_path, monkeypatch, capfd):
    """SQLite opens an empty file as an empty database: an empty export (an interrupted `nsys export`) is
    called empty, not 'an SQLite file but not an Nsight Systems export'."""
    from cli_runner import run_cli

    for name in ("empty.sqlite", "empty"):
        (tmp_path / name).write_bytes(b"")
        for command in ("summarize", "compare"):
            code, _, err = run_cli(monkeypatch, capfd, "trace", command, tmp_path / name)
            assert code == 2 and err == (f"error: {tmp_path / name}: the file is empty, not a trace; export the "
                                         ".nsys-rep again with `nsys export --type sqlite -o FILE.sqlite "
                                         "FILE.nsys-rep`\n"), err


def _kineto(path: Path, ops: list[tuple[str, float, float]]) -> Path:
    """A minimal PyTorch profiler Chrome trace: one prefill range around host operators (name, ts, dur)."""
    import gzip

    events = [{"ph": "X", "cat": "user_annotation", "name": "prefill", "pid": 7, "tid": 7, "ts": 0.0, "dur": 100.0}]
    events += [{"ph": "X", "cat": "cpu_op", "name": n, "pid": 7, "tid": 7, "ts": ts, "dur": dur} for n, ts, dur in ops]
    text = json.dumps({"schemaVersion": 1, "traceEvents": events})
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


def test_trace_compare_tells_same_named_traces_apart_by_their_folders(tmp_path, monkeypatch, capfd):
    from cli_runner import run_cli

    a = _kineto(tmp_path / "runs" / "a" / "trace.torch.json", [("aten::mm", 1.0, 50.0), ("aten::view", 2.0, 5.0)])
    b = _kineto(tmp_path / "other" / "a" / "trace.torch.json.gz", [("aten::add", 1.0, 20.0)])
    c = _kineto(tmp_path / "runs" / "c" / "trace.torch.json", [("aten::mm", 1.0, 10.0)])
    code, out, err = run_cli(monkeypatch, capfd, "trace", "compare", a, b, c, "--json")
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert [r["name"] for r in rows] == ["runs/a/trace.torch", "other/a/trace.torch", "c/trace.torch"]
    assert [o["name"] for o in rows[0]["operators"]] == ["aten::mm", "aten::view"]
    assert rows[0]["operators"][0]["self_ns"] == 45_000 and rows[1]["operators"][0]["calls"] == 1
    code, out, _ = run_cli(monkeypatch, capfd, "trace", "compare", c, c, "--json")
    assert [r["name"] for r in json.loads(out)["rows"]] == ["trace.torch (1)", "trace.torch (2)"]  # one file twice
    code, out, _ = run_cli(monkeypatch, capfd, "trace", "compare", a, b)
    assert code == 0 and "runs/a/trace.torch" in out and "top host operators: other/a/trace.torch" in out


def test_operators_have_a_per_token_column_only_where_the_tokens_are_known(tmp_path, monkeypatch, capfd):
    """A bare trace file counts no tokens: no all-`-` "us per token" column; a profile folder with its
    requests has one."""
    import run_folders
    from cli_runner import run_cli

    raw = _kineto(tmp_path / "raw" / "trace.torch.json", [("aten::mm", 1.0, 50.0), ("aten::view", 2.0, 5.0)])
    code, out, err = run_cli(monkeypatch, capfd, "trace", "summarize", raw)
    assert code == 0, err
    assert "top host operators: trace.torch" in out and "aten::mm" in out and "us per token" not in out
    assert "per decoded token" not in out  # (nor the caption's word for it)
    profile = run_folders.cpu_profile(tmp_path)
    for system in ("plain", "dspark"):
        run_folders.write(profile / system, [run_folders.native(system, "q1", 5.0)], systems=[system])
    code, out, err = run_cli(monkeypatch, capfd, "trace", "compare", profile)
    assert code == 0, err
    assert "top host operators: plain" in out and " ".join(out.split()).count("us per token") == 2


def test_vllm_step_ranges_sit_beside_ours_as_prefill_and_decode():
    """vLLM names each model-runner step by its batch; `compare` sums them into `vllm_prefill` (steps with
    prompt tokens) and `vllm_decode` (none), as in the H200 trace of vLLM 0.26 (`benchmarks/results/vllm026_h200/
    profile/`), and nothing for ranges of any other name."""
    from harness.profiling.compare import vllm_steps

    ranges = {"execute_context_0(0)_generation_1(1)": {"total_ns": 1000, "instances": 250},
              "execute_context_0(0)_generation_2(2)": {"total_ns": 30, "instances": 8},
              "execute_context_1(16)_generation_0(0)": {"total_ns": 700, "instances": 1},
              "execute_context_1(60)_generation_1(1)": {"total_ns": 5, "instances": 1},
              "ar_decode": {"total_ns": 9, "instances": 9}, "execute_context_x": {"total_ns": 1, "instances": 1}}
    assert vllm_steps(ranges) == {"vllm_decode": {"total_ns": 1030, "instances": 258},
                                  "vllm_prefill": {"total_ns": 705, "instances": 2}}
    assert vllm_steps({"ar_decode": {"total_ns": 9, "instances": 9}}) == {}

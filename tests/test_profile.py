"""`profile`: the PyTorch-profiler path end to end on the CPU (the one CI can run), the steady-state
window, the prompts it picks, the trace's size before it is written, the host operators and the
profiler's overhead, and how the nsys path finds nsys and builds its command."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runner import run_cli

from dspark.checkpoint import DEMO_DIR
from dspark.errors import DSparkError
from harness.analysis.records import read_requests
from harness.backends.process_group import descendants, running, stop_group
from harness.profiling.nsys import PRESETS, find_nsys, nsys_command, plan_flags
from harness.profiling.orchestrate import child_run_args

needs_demo = pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(),
                                reason="the demo models are not built")


@needs_demo
def test_profile_torch_captures_only_the_timed_requests(tmp_path, monkeypatch, capfd):
    out = tmp_path / "prof"
    code, stdout, err = run_cli(monkeypatch, capfd, "profile", "--torch", "--category", "coding", "--systems",
                                "plain,dspark", "--num-prompts", "2", "--output-len", "24", "--temperature", "0",
                                "--device", "cpu", "--out", out, "--json")
    assert code == 0, err
    result = json.loads(stdout)
    assert [r["name"] for r in result["rows"]] == ["plain", "dspark"]
    _profile_output(out, result, err)
    for system, step in (("plain", "ar_decode"), ("dspark", "dspark_propose")):
        records = read_requests(out / system)
        assert json.loads((out / system / "manifest.json").read_text())["profiled"] == "torch"
        summary = json.loads((out / f"{system}.summary.json").read_text())
        ranges = {r["range"]: r for r in summary["nvtx"]}
        # one prefill per timed request: the warm-up request and graph captures stayed outside the window
        assert ranges["prefill"]["instances"] == len(records) == 2 and "warmup" not in ranges
        rounds = sum(r["num_rounds"] or r["output_tokens"] - 1 for r in records)
        assert ranges[step]["instances"] == rounds
        assert "kernels" in summary["unavailable"] and summary["kernels"] is None and summary["diagnosis"] == []
    dspark = result["rows"][1]
    assert dspark["ranges_ns"]["target_verify"] > 0 and dspark["kernels_per_token"] is None  # no GPU on a CPU
    assert [r["output_tokens"] for r in result["rows"]] == [sum(r["output_tokens"] for r in read_requests(out / s))
                                                          for s in ("plain", "dspark")]
    code, stdout, _ = run_cli(monkeypatch, capfd, "trace", "compare", out, "--json")
    assert code == 0 and [r["name"] for r in json.loads(stdout)["rows"]] == ["plain", "dspark"]
    # the tables a person reads: ms with the unit in the label, calls, per call and per token, tokens filled
    code, stdout, _ = run_cli(monkeypatch, capfd, "trace", "compare", out)
    lines = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]] for line in stdout.splitlines()
             if line.count("│") == 4}
    verify = dspark["ranges_ns"]["target_verify"]
    calls = dspark["ranges_calls"]["target_verify"]
    assert lines["target_verify: total ms"] == ["absent", f"{verify / 1e6:.3f}"]
    assert lines["target_verify: calls"] == ["absent", str(calls)]
    assert lines["target_verify: ms per call"][1] == f"{verify / calls / 1e6:.3f}"
    assert lines["target_verify: ms per token"][1] == f"{verify / dspark['output_tokens'] / 1e6:.3f}"
    assert lines["output tokens"] == [str(r["output_tokens"]) for r in result["rows"]]
    assert "kernels per token" not in lines  # a CPU trace has no kernels: no row of dashes
    host = dspark["host"]
    assert lines["TPOT profiled, ms (the two above)"][1] == f"{host['tpot_ms']:.3f}"
    assert lines["profiler overhead, ms per token"][1] == f"{host['overhead_ms']:.3f} " \
                                                          f"({100 * host['overhead_share']:+.0f}%)"
    assert "top host operators: dspark" in stdout
    code, stdout, _ = run_cli(monkeypatch, capfd, "trace", "summarize", out / "dspark" / "trace.torch.json.gz")
    assert code == 0 and "total ms" in stdout and "per call ms" in stdout and "{" not in stdout
    assert "launches: no GPU kernels in this trace (a CPU run)" in stdout
    code, _, err = run_cli(monkeypatch, capfd, "profile", "--torch", "--device", "cpu", "--out", out)
    assert code == 2 and "never overwrite" in err


def _profile_output(out: Path, result: dict, err: str) -> None:
    """What `test_profile_torch_captures_only_the_timed_requests` also checks: the prompts named, a line
    per request, the trace sized before it was written, the host split and the overhead."""
    ids = result["question_ids"]
    assert f"profiling 2 of 18 qualitative coding prompts at T = 0 (question ids {ids[0]}, {ids[1]})" in err
    unprofiled = read_requests(out / "unprofiled")  # the same requests, every system, timed unprofiled
    assert sorted((r["system"], r["question_id"]) for r in unprofiled) == sorted(
        (s, q) for s in ("plain", "dspark") for q in ids)
    assert not json.loads((out / "unprofiled" / "manifest.json").read_text())["profiled"]
    for system, row in zip(("plain", "dspark"), result["rows"]):
        for i, r in enumerate(read_requests(out / system), 1):
            assert f"[{i}/2] {system} T=0 {r['question_id'][:12]}: {r['output_tokens']} tokens, TPOT" in err
        capture = json.loads((out / system / "capture.json").read_text())
        assert f"{system}: trace: {capture['events']:,} events captured, about" in err
        assert abs(capture["estimated_json_bytes"] / capture["json_bytes"] - 1) < 0.25
        assert 0 < capture["bytes"] < capture["json_bytes"] and (out / system / "trace.torch.json.gz").is_file()
        host = row["host"]
        assert host["tpot_ms"] == pytest.approx(host["operators_ms"] + host["host_ms"])
        assert host["operators_ms"] > 0 and host["host_ms"] > 0 and host["unprofiled_requests"] == 2
        assert host["overhead_ms"] == pytest.approx(host["tpot_ms"] - host["unprofiled_tpot_ms"])
        ops = row["operators"]
        assert ops and all(a["self_ns"] >= b["self_ns"] for a, b in zip(ops, ops[1:])) and ops[0]["calls"] > 0


def test_profile_refuses_bad_choices(monkeypatch, capfd):
    assert "one of --nsys or --torch" in run_cli(monkeypatch, capfd, "profile")[2]
    code, _, err = run_cli(monkeypatch, capfd, "profile", "--nsys", "--device", "cpu")
    assert code == 2 and "needs a CUDA device" in err


@needs_demo
def test_profile_refuses_a_request_past_the_context_before_making_its_folder(tmp_path, monkeypatch, capfd):
    """`profile --output-len 100000` made its folder, its child run refused, and the user was told to resume a
    profile that could never finish; now the run's own preflight refuses it first: one line, exit 2, no folder."""
    out = tmp_path / "prof"
    code, _, err = run_cli(monkeypatch, capfd, "profile", "--torch", "--device", "cpu", "--output-len", "100000",
                           "--out", out)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "the run cannot fit" in err and "past the target's context of 2,048" in err and "--output-len" in err
    assert "--resume" not in err and not out.exists()


@needs_demo
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_profile_refuses_a_vllm_engine_argument_before_making_its_folder(tmp_path, monkeypatch, capfd):
    """`profile --backend vllm --vllm-arg nosuch=1` refused in the child, after the folder was made; now as
    `run` refuses it, before: one line naming the argument, exit 2, no folder."""
    out = tmp_path / "prof"
    code, _, err = run_cli(monkeypatch, capfd, "profile", "--torch", "--backend", "vllm", "--device", "cpu",
                           "--systems", "plain", "--vllm-arg", "nosuch=1", "--out", out)
    assert code == 2 and err.strip().splitlines()[-1].startswith("error: --vllm-arg nosuch: not an engine argument")
    assert "--resume" not in err and not out.exists()


HELP = """usage: nsys profile [<args>] [application] [<application args>]
 -t, --trace=  Possible values are 'cuda', 'nvtx', 'osrt', 'cublas', 'cudnn' or 'none'.
 --python-backtrace=  --cudabacktrace=  --trace-fork-before-exec=  --cuda-graph-trace=
 --capture-range=  --capture-range-end=  --sample=  --cpuctxsw=  --force-overwrite=  -o, --output="""


def test_nsys_flags_follow_what_this_nsys_supports(tmp_path):
    plan = plan_flags(Path("/x/nsys"), "default", [], help_text=HELP, version="2025.3.1", paranoid=1)
    assert plan.flags == PRESETS["default"] and plan.dropped == []
    old = HELP.replace("'cublas', 'cudnn'", "").replace("--python-backtrace=", "")
    plan = plan_flags(Path("/x/nsys"), "default", ["--trace-fork=true", "--stats=false"], help_text=old,
                      version="2023.4", paranoid=4)
    assert plan.flags[:2] == ["-t", "cuda,nvtx,osrt"]
    assert "--python-backtrace=cuda" not in plan.flags and "--trace-fork-before-exec=true" in plan.flags
    assert plan.flags[-2:] == ["--sample=none", "--cpuctxsw=none"]  # CPU sampling is forbidden there,
    assert "--cudabacktrace=all" not in plan.flags  # and backtraces need it
    assert any("--cudabacktrace=all" in d for d in plan.dropped)
    assert any("cublas" in d for d in plan.dropped) and any("--python-backtrace" in d for d in plan.dropped)
    assert any("--stats" in d for d in plan.dropped) and any("perf_event_paranoid = 4" in d for d in plan.dropped)
    lean = plan_flags(Path("/x/nsys"), "lean", [], help_text=HELP, version="v", paranoid=4)
    assert lean.flags == PRESETS["lean"]  # lean already samples nothing
    whole = plan_flags(Path("/x/nsys"), "lean", ["--cuda-graph-trace=graph"], help_text=HELP, version="v", paranoid=1)
    assert [f for f in whole.flags if f.startswith("--cuda-graph-trace")] == ["--cuda-graph-trace=graph"]  # replaced
    with pytest.raises(DSparkError, match="unknown --preset"):
        plan_flags(Path("/x/nsys"), "fat", [], help_text=HELP, version="v", paranoid=1)

    child = child_run_args(["--split", "qualitative"], "dspark", tmp_path / "dspark", "nsys")
    assert child[1:4] == ["-m", "harness.cli", "run"] and child[-2:] == ["--profiled", "nsys"]
    cmd = nsys_command(plan, tmp_path / "dspark", child)
    assert cmd[:2] == ["/x/nsys", "profile"] and "--capture-range=cudaProfilerApi" in cmd
    assert "--capture-range-end=stop" in cmd and cmd[cmd.index("--") + 1:] == child
    (tmp_path / "dspark.nsys-rep").write_bytes(b"")
    with pytest.raises(DSparkError, match="never overwrite"):
        nsys_command(plan, tmp_path / "dspark", child)


def test_finding_nsys(tmp_path, monkeypatch):
    monkeypatch.delenv("NSYS", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("harness.profiling.nsys.STANDARD_PLACES", (str(tmp_path / "none" / "*" / "nsys"),))
    with pytest.raises(DSparkError, match=r"no working nsys found .*--nsys-path.*profile --torch"):
        find_nsys()
    with pytest.raises(DSparkError, match="--nsys-path /no/nsys: does not run"):
        find_nsys("/no/nsys")
    fake = tmp_path / "nsys"  # a real executable that answers --version, found on the PATH
    fake.write_text("#!/bin/sh\necho 'NVIDIA Nsight Systems version 2025.3.1'\n")
    fake.chmod(0o755)
    assert find_nsys() == fake


FAKE_NSYS = """#!{python}
# A stand-in nsys: answers --version and `profile --help`, records each `profile` command line and
# writes its report, and `export`s one of our recorded H200 exports in place of the report.
import json, os, shutil, sys
args = sys.argv[1:]
if args == ["--version"]:
    print("NVIDIA Nsight Systems version 2025.3.1")
elif args[:2] == ["profile", "--help"]:
    print({help!r})
elif args[0] == "profile":
    out = args[args.index("-o") + 1]
    with open(os.environ["FAKE_NSYS_LOG"], "a") as log:
        log.write(json.dumps(args) + "\\n")
    open(out + ".nsys-rep", "wb").close()
elif args[0] == "export":
    out = args[args.index("-o") + 1]
    system = "dspark" if os.path.basename(args[-1]).startswith("dspark") else "plain"
    shutil.copy(os.path.join({fixtures!r}, "engine_" + system + ".sqlite"), out)
"""


def test_profile_nsys_runs_argument_lists_and_summarises_each_system(tmp_path, monkeypatch):
    """The nsys path end to end through a stand-in nsys executable: each system's command is an
    argument list (shell characters in the folder and a prompt file name stay literal), each report is
    exported, summarised with its method's expectation, and compared."""
    import sys

    from rich.console import Console

    from harness.profiling.orchestrate import profile_run

    fake = tmp_path / "nsys"
    fake.write_text(FAKE_NSYS.format(python=sys.executable, help=HELP,
                                     fixtures=str(Path(__file__).parent / "fixtures" / "nsys")))
    fake.chmod(0o755)
    monkeypatch.setenv("FAKE_NSYS_LOG", str(tmp_path / "calls.jsonl"))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "prof; touch pwned $(touch pwned2)"
    run_args = ["--dataset-path", "rows `touch pwned3`.jsonl", "--output-len", "8"]
    result = profile_run(run_args, [("plain", "plain"), ("dspark", "dspark")], "nsys", out, Console(quiet=True),
                         preset="lean", nsys_path=str(fake))
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    record = json.loads((out / "profile.json").read_text())
    assert len(calls) == 2
    for call, system in zip(calls, ("plain", "dspark")):
        assert [str(fake), *call] == record["commands"][system]
        assert call[call.index("-o") + 1] == str(out / system)  # the folder is one argument, as given
        child = call[call.index("--") + 1:]
        assert child[child.index("--dataset-path") + 1] == "rows `touch pwned3`.jsonl"
    assert not list(tmp_path.glob("pwned*"))
    assert record["nsys_version"].endswith("2025.3.1") and record["dropped"] == []
    assert [r["name"] for r in result["rows"]] == ["plain", "dspark"]
    spec = json.loads((out / "dspark.summary.json").read_text())
    assert spec["diagnosis"] == [] and {"dspark_propose", "target_verify"} <= {r["range"] for r in spec["nvtx"]}


def test_profile_nsys_of_vllm_follows_its_processes_and_names_them_when_missing(tmp_path, monkeypatch):
    """`profile --backend vllm --nsys`: fork tracing is forced on (even against an --nsys-arg), vLLM's
    workers start by spawn (recorded), vLLM's CUDA profiler start/stop is the capture range, and a trace
    without vLLM's EngineCore and worker processes says so by name."""
    import sys

    from rich.console import Console

    from harness.profiling.orchestrate import profile_run
    from harness.runs.plan import RunOptions, recorded_options

    fake = tmp_path / "nsys"
    fake.write_text(FAKE_NSYS.format(python=sys.executable, help=HELP,
                                     fixtures=str(Path(__file__).parent / "fixtures" / "nsys")))
    fake.chmod(0o755)
    monkeypatch.setenv("FAKE_NSYS_LOG", str(tmp_path / "calls.jsonl"))
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    out = tmp_path / "prof"
    options = recorded_options(RunOptions(backend="vllm", device="cuda", output_len=8))
    profile_run([], [("plain", "plain")], "nsys", out, Console(quiet=True), preset="lean", nsys_path=str(fake),
                nsys_args=["--trace-fork-before-exec=false"], run_options=options)
    (call,) = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    record = json.loads((out / "profile.json").read_text())
    assert "--trace-fork-before-exec=true" in call and "--trace-fork-before-exec=false" not in call
    assert "--capture-range=cudaProfilerApi" in call
    assert record["vllm"]["worker_multiproc_method"] == "spawn" and "cudaProfilerStart" in record["vllm"]["capture"]
    assert json.loads((out / "run-options.json").read_text())["backend"] == "vllm"
    diagnosis = json.loads((out / "plain.summary.json").read_text())["diagnosis"]
    assert any(d.startswith("vLLM's engine processes (EngineCore and Worker) are not in this trace") for d in diagnosis)


def test_a_vllm_trace_whose_engine_core_ran_the_model_is_not_diagnosed_as_missing_it():
    """On one GPU vLLM 0.26 runs the model inside its EngineCore process, whose name a trace keeps to 15
    characters (`VLLM::EngineCor`, as in the H200 trace of `benchmarks/results/vllm026_h200/profile/`): that trace
    has the engine's kernels, and says nothing is missing; a trace of only the harness's process does."""
    from harness.profiling.traces import diagnose

    def summary(*processes):
        return {"launches": {"kernels": 29466, "graph_launches": 272, "kernels_from_graphs_share": 0.84,
                             "graph_trace_rows": 0}, "memory_ops": [], "nvtx": [],
                "processes": [{"pid": pid, "name": name, "nvtx_rows": 261, "api_rows": api, "kernel_rows": kernels,
                               "did_gpu_work": kernels > 0} for pid, name, api, kernels in processes]}

    engine_core = (1422, "VLLM::EngineCor", 16723, 29466)
    assert diagnose(summary(engine_core), {}, None, engine="vllm") == []
    assert diagnose(summary((1400, "python3", 0, 0), (1423, "VLLM::Worker_TP", 900, 29466)), {}, None, "vllm") == []
    (note,) = diagnose(summary((1400, "python3", 16723, 29466)), {}, None, engine="vllm")
    assert note.startswith("vLLM's engine processes (EngineCore and Worker) are not in this trace (processes seen: "
                           "python3)")


def test_profile_defaults_to_two_prompts_at_the_first_temperature_and_says_how_to_get_more():
    from harness.runs.selection import choose
    from harness.runs.plan import RunOptions
    from harness.specs.experiments import load_experiment

    exp = load_experiment("demo")
    picked = choose(RunOptions(categories=["coding"]), exp)
    assert picked.opts.num_prompts == 2 and picked.opts.temperatures == [exp.temperatures[0]]
    assert picked.available == 18 and len(picked.question_ids) == 2 and picked.requests_per_system == 2
    assert picked.note.startswith(f"profiling 2 of 18 qualitative coding prompts at T = 0 (question ids "
                                  f"{picked.question_ids[0]}, {picked.question_ids[1]})")
    assert "--num-prompts N for more (up to 18)" in picked.note and "--temperature 0,1" in picked.note
    again = choose(RunOptions(categories=["coding"], num_prompts=3, temperatures=[0.0, 1.0]), exp)
    assert again.question_ids[:2] == picked.question_ids  # the run's own seeded pick, a prefix of it
    assert again.requests_per_system == 6 and "--num-prompts" not in again.note and "--temperature" not in again.note


def test_operator_self_times_split_at_prefill_on_the_busiest_thread():
    from harness.profiling.operators import operator_times

    ops = [(1, 1, 0, 100, "aten::linear"), (1, 1, 10, 60, "aten::mm"), (1, 1, 20, 10, "aten::view"),
           (1, 1, 200, 50, "aten::mm"), (1, 1, 300, 30, "aten::add"),  # thread 1: 180 ns inside operators
           (1, 2, 0, 40, "aten::mm")]  # another thread, less busy
    host = operator_times(ops, [(1, 1, 0, 150, "prefill"), (1, 1, 190, 200, "ar_decode")])
    by = {o["name"]: o for o in host["operators"]}
    assert [o["name"] for o in host["operators"]] == ["aten::mm", "aten::linear", "aten::add", "aten::view"]
    assert by["aten::mm"]["calls"] == 3 and by["aten::mm"]["self_ns"] == 50 + 50 + 40  # less aten::view's 10
    assert by["aten::mm"]["prefill_ns"] == 50 and by["aten::linear"]["self_ns"] == 40
    assert host["self_ns"] == 220 and by["aten::view"]["share"] == pytest.approx(10 / 220)
    assert host["thread_ns"] == 180 and host["prefill_ns"] == 100


def test_host_time_per_token_against_the_profiled_and_unprofiled_tpot():
    from harness.profiling.compare import host_figures

    def request(q, e2el, ttft, n, system="plain", **extra):
        return {"system": system, "question_id": q, "turn": 0, "temperature": 0.0, "e2el_ms": e2el, "ttft_ms": ttft,
                "output_tokens": n, **extra}

    profiled = [request("a", 110.0, 10.0, 11), request("b", 60.0, 10.0, 6)]  # 150 ms over 15 decoded tokens
    unprofiled = [request("a", 70.0, 10.0, 11), request("b", 40.0, 10.0, 6), request("c", 5.0, 1.0, 3),
                  request("d", 1.0, 1.0, 1, failed=True)]
    summary = {"host": {"thread_ns": 100_000_000, "prefill_ns": 10_000_000, "operators": []}}
    h = host_figures(summary, profiled, unprofiled)
    assert h["tpot_ms"] == 10.0 and h["operators_ms"] == 6.0 and h["host_ms"] == 4.0
    assert h["unprofiled_tpot_ms"] == 6.0 and h["overhead_ms"] == 4.0 and h["overhead_share"] == pytest.approx(2 / 3)
    assert h["unprofiled_requests"] == 2 and h["contended_requests"] == 0  # "c" was not profiled
    assert host_figures(summary, profiled, [])["overhead_ms"] is None
    assert host_figures({"host": None}, profiled, unprofiled) is None  # an nsys trace: no host operators
    assert host_figures(summary, [r | {"max_concurrency": 4} for r in profiled], unprofiled) is None


def test_a_torch_trace_is_sized_before_it_is_written_and_refused_above_the_limit(tmp_path, monkeypatch):
    import torch

    from harness.backends import capture
    from harness.profiling.torch_trace import summarize_torch

    def profiled():
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        prof.start()
        x = torch.ones(8, 8)
        for _ in range(50):
            x = (x @ x).relu() / 8
        prof.stop()
        return prof

    with pytest.raises(DSparkError, match=r"would be about .* KB \(\d+ events\), above the limit of 1 KB: not "
                                          r"written; .*--num-prompts, --output-len\) or raise --max-trace-mb"):
        capture.write_trace(profiled(), tmp_path, limit=1000)
    refused = json.loads((tmp_path / capture.CAPTURE).read_text())
    assert refused["events"] > 100 and refused["estimated_json_bytes"] > 1000 and refused["bytes"] is None
    assert not list(tmp_path.glob("trace*"))
    record = capture.write_trace(profiled(), tmp_path, limit=None)
    assert abs(record["estimated_json_bytes"] / record["json_bytes"] - 1) < 0.25
    assert (tmp_path / capture.TORCH_TRACE).stat().st_size == record["bytes"] < record["json_bytes"]
    assert not (tmp_path / "trace.torch.json").exists()  # only the gzipped trace stays
    host = summarize_torch(tmp_path / capture.TORCH_TRACE)["host"]
    assert {"aten::mm", "aten::relu", "aten::div"} <= {o["name"] for o in host["operators"]}
    assert {o["name"]: o["calls"] for o in host["operators"]}["aten::mm"] == 50
    monkeypatch.setenv(capture.LIMIT_ENV, "2.5")
    assert capture.trace_limit() == 2_500_000
    monkeypatch.setenv(capture.LIMIT_ENV, "lots")
    with pytest.raises(DSparkError, match="give megabytes as a number"):
        capture.trace_limit()


def test_a_child_started_early_waits_at_its_gate(tmp_path, monkeypatch):
    from harness.backends import capture

    capture.wait_for_gate()  # no gate: the window opens at once
    monkeypatch.setenv(capture.GATE_ENV, str(tmp_path / "open"))
    monkeypatch.setattr(capture, "GATE_WAIT_S", 0.05)
    with pytest.raises(DSparkError, match="never opened this capture window"):
        capture.wait_for_gate()
    (tmp_path / "open").touch()
    capture.wait_for_gate()


def test_on_the_way_out_a_running_child_keeps_what_it_finished_and_a_hung_one_is_killed(tmp_path):
    """Ctrl-C or SIGTERM during a profile: each child gets SIGTERM (a child run takes it as Ctrl-C and
    writes what it finished), so `stop` waits for it; one that does not end in the grace time (hung,
    stalled) is killed with its process group; one still shut at its gate is ended at once."""
    import io
    import os
    import sys

    from rich.console import Console

    from harness.profiling.child import Child

    keeps = ("import pathlib, signal, sys, time\n"
             "signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path(sys.argv[1]).write_text('kept'), sys.exit(130)))\n"
             "print('ready', file=sys.stderr, flush=True)\ntime.sleep(60)\n")
    console = Console(file=io.StringIO())
    running = Child("first", [sys.executable, "-c", keeps, str(tmp_path / "first.out")], tmp_path,
                    dict(os.environ), console, None, gated=False)
    while not (tmp_path / "first.log").read_text():  # its handler is in place once it has spoken
        time.sleep(0.05)
    running.stop()
    assert running.proc.returncode == 130 and (tmp_path / "first.out").read_text() == "kept"
    deaf = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)\n"
    hung = Child("hung", [sys.executable, "-c", deaf], tmp_path, dict(os.environ), console, None, gated=False)
    time.sleep(0.5)
    hung.stop(grace_s=0.5)
    assert hung.proc.returncode == -signal.SIGKILL
    waiting = Child("next", [sys.executable, "-c", deaf], tmp_path, dict(os.environ), console, None, gated=True)
    time.sleep(0.5)
    began = time.monotonic()
    waiting.stop(grace_s=60)  # shut at its gate, it has nothing to keep: no grace's worth of waiting
    assert waiting.proc.returncode == -signal.SIGKILL and time.monotonic() - began < 30


def test_stopping_a_child_stops_what_it_started_in_other_sessions_too(tmp_path):
    """nsys runs the program it profiles in a group of its own, and a run starts vLLM servers in theirs:
    on the H200 a SIGKILL to nsys's group alone left our run and vLLM's EngineCore running. Here a child
    that ignores SIGTERM starts a grandchild in a session of its own that ignores it too: both end."""
    script = ("import signal, subprocess, sys, time\n"
              "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
              "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'], start_new_session=True)\n"
              "print('started', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline() == "started\n"
    (grandchild,) = descendants(proc.pid)
    assert os.getpgid(grandchild) != os.getpgid(proc.pid)  # out of reach of a signal to the child's group
    stop_group(proc, grace_s=0.5)
    assert proc.returncode == -signal.SIGKILL and not running(grandchild)


def test_a_child_started_ahead_holds_its_lines_until_its_turn(tmp_path):
    """The next system loads while the current one is profiled: its lines wait until its turn, so the
    console reads one child at a time (they reach its log at once)."""
    import io
    import os
    import sys

    from rich.console import Console

    from harness.profiling.child import Child

    text = io.StringIO()
    console = Console(file=text, width=200)
    script = "import sys\nprint('loaded', file=sys.stderr)\n"
    ahead = Child("next", [sys.executable, "-c", script], tmp_path, dict(os.environ), console, None, gated=False,
                  held=True)
    ahead.proc.wait()
    ahead.relay.join()
    assert "loaded" in (tmp_path / "next.log").read_text() and text.getvalue() == ""
    console.print("profiling next")
    ahead.wait()
    assert text.getvalue().splitlines() == ["profiling next", "  next: loaded"]


def test_vllm_profiles_take_the_lean_preset_unless_asked_and_say_so():
    from harness.profiling.nsys import VLLM_PRESET, choose_preset

    assert choose_preset(None, vllm=False) == ("default", None)
    preset, why = choose_preset(None, vllm=True)
    assert preset == VLLM_PRESET == "lean" and "hung" in why and "--preset default" in why
    assert choose_preset("default", vllm=True) == ("default", None)  # asked for: given, no notice


def _profile(out: Path, systems: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness.cli", "profile", "--torch", "--category", "coding",
                             "--systems", systems, "--num-prompts", "1", "--output-len", "8", "--temperature", "0",
                             "--device", "cpu", "--no-overhead", "--out", str(out), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _stop_child(parent: subprocess.Popen, system: str, deadline_s: float = 120) -> int:
    """SIGSTOP the child run of `system` (a real stall: it neither speaks nor writes) once it exists."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline and parent.poll() is None:
        for pid in descendants(parent.pid):
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if f"--systems {system} " in cmd:
                os.kill(pid, signal.SIGSTOP)
                return pid
        time.sleep(0.05)
    raise AssertionError(f"no child run of {system} appeared")


@needs_demo
def test_a_stalled_child_is_ended_and_the_profile_says_which_keeping_what_finished_and_resumes(tmp_path):
    """A child that stops making progress is ended with one line naming it; the profile that finished
    stays; `profile --resume` profiles only the rest, and summarises a finished child's trace without
    profiling it again."""
    out = tmp_path / "prof"
    parent = _profile(out, "plain,dspark", "--stall-timeout", "15")  # (a child loads in silence for seconds)
    child = _stop_child(parent, "dspark")
    _, err = parent.communicate(timeout=180)
    assert parent.returncode == 2 and "Traceback" not in err, err
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert "profiling dspark stalled: no output, request or file growth for 15 s" in line
    assert "--preset lean" in line and "--stall-timeout" in line and str(out / "dspark.log") in line
    assert f"kept in {out}: the profiles of plain; finish it with: dspark-bench profile --resume {out}" in err
    assert (out / "plain.summary.json").is_file() and not running(child)
    plain_trace = (out / "plain" / "trace.torch.json.gz").stat()
    resumed = subprocess.run([sys.executable, "-m", "harness.cli", "profile", "--resume", str(out), "--json"],
                             capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {out}: dspark" in resumed.stderr and "profiling plain" not in resumed.stderr
    assert [r["name"] for r in json.loads(resumed.stdout)["rows"]] == ["plain", "dspark"]
    assert (out / "plain" / "trace.torch.json.gz").stat().st_mtime_ns == plain_trace.st_mtime_ns  # kept as it was
    (out / "dspark.summary.json").unlink()  # as if the profile had stopped while it summarised dspark's trace
    again = subprocess.run([sys.executable, "-m", "harness.cli", "profile", "--resume", str(out)], capture_output=True,
                           text=True, timeout=180)
    assert again.returncode == 0 and f"resuming {out}: dspark (summarised only)" in again.stderr, again.stderr
    assert "profiling dspark" not in again.stderr and (out / "dspark.summary.json").is_file()
    refused = subprocess.run([sys.executable, "-m", "harness.cli", "profile", "--resume", str(out), "--num-prompts",
                              "3"], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "leave out num_prompts" in refused.stderr


@needs_demo
def test_sigterm_ends_a_profile_whose_child_is_stalled_and_the_child_with_it(tmp_path):
    parent = _profile(tmp_path / "prof", "plain")
    child = _stop_child(parent, "plain")
    time.sleep(0.5)
    parent.send_signal(signal.SIGTERM)
    _, err = parent.communicate(timeout=600)  # the child's grace, then SIGKILL to its group (a hang guard only)
    assert parent.returncode == 143 and "Traceback" not in err and err.strip().endswith("interrupted"), err
    assert not running(child)

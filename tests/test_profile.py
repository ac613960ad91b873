"""`profile`: the PyTorch-profiler path end to end on the CPU (the one CI can run), the steady-state
window, and how the nsys path finds nsys and builds its command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import run_cli

from dspark.checkpoint import DEMO_DIR
from dspark.errors import DSparkError
from harness.analysis.records import read_requests
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
    code, stdout, _ = run_cli(monkeypatch, capfd, "trace", "summarize", out / "dspark" / "trace.torch.json")
    assert code == 0 and "total ms" in stdout and "per call ms" in stdout and "{" not in stdout
    assert "launches: no GPU kernels in this trace (a CPU run)" in stdout
    code, _, err = run_cli(monkeypatch, capfd, "profile", "--torch", "--device", "cpu", "--out", out)
    assert code == 2 and "never overwrite" in err


def test_profile_refuses_bad_choices(monkeypatch, capfd):
    assert "one of --nsys or --torch" in run_cli(monkeypatch, capfd, "profile")[2]
    code, _, err = run_cli(monkeypatch, capfd, "profile", "--nsys", "--device", "cpu")
    assert code == 2 and "needs a CUDA device" in err


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
    assert any(d.startswith("vLLM's EngineCore and Worker processes are not in this trace") for d in diagnosis)

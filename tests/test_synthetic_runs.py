"""Random weights and synthetic acceptance as ordinary run inputs, end to end on the CPU: `random:` targets
and drafts, prompts shaped when no tokenizer is there, `--acceptance` in both engines (vLLM's CPU build
through the tests' Triton shim), what every table and record says, and the refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_runner import run_cli
from test_vllm import _cli, needs_demo, needs_vllm

from dspark.checkpoint import DEMO_DIR, random_folder, random_weights, resolve_path
from dspark.errors import DSparkError
from dspark.synthetic.acceptance import goodness_of_fit, resolve
from harness.analysis.records import read_requests
from harness.specs.datasets import demo_suite_dir
from harness.specs.shaped import GENERATION_PROMPT, MESSAGE_WRAP, ShapedTokenizer

RANDOM_DEMO = """
name = "random-demo"
target = "{target}"
backend = "native"
dataset = "demo"
[sampling]
temperatures = [0.0]
output_len = 48
[[systems]]
name = "plain"
method = "plain"
[[systems]]
name = "dspark"
method = "dspark"
draft = "{draft}"
acceptance = "official-coding"
[[systems]]
name = "ngram"
method = "ngram"
"""


def _experiment(tmp_path: Path, target: str = "random:demo", draft: str = "random:demo-dspark") -> Path:
    path = tmp_path / "random-demo.toml"
    path.write_text(RANDOM_DEMO.format(target=target, draft=draft))
    return path


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path / "cache"))


def test_a_random_folder_holds_the_config_and_a_marker_and_no_weights(tmp_path):
    target = resolve_path("random:qwen3-8b")
    config = json.loads((target / "config.json").read_text())
    assert config["hidden_size"] == 4096 and config["num_hidden_layers"] == 36
    assert random_weights(target)["source"] == "random:qwen3-8b"
    assert not list(target.glob("*.safetensors"))
    draft = json.loads((resolve_path("random:dspark-qwen3-8b-block7") / "config.json").read_text())
    assert draft["block_size"] == 7 and draft["markov_rank"] == 256 and draft["target_layer_ids"] == [1, 9, 17, 25, 33]
    assert random_folder("qwen3-8b") == target  # the same config: the same folder
    from dspark.checkpoint import load_draft_config
    from dspark.synthetic.presets import DRAFTS

    for name, make in DRAFTS.items():  # every draft preset, each in its own format (z-lab's fill-in DFlash too)
        path, cfg = load_draft_config(f"random:{name}")
        assert (cfg.format, cfg.num_drafts) == (make().format, make().num_drafts) and random_weights(path)
    with pytest.raises(DSparkError, match="name a preset"):
        resolve_path("random:")


@needs_demo
def test_a_native_run_at_random_weights_and_a_profile_says_so_everywhere(tmp_path, monkeypatch, capfd):
    code, out, err = run_cli(monkeypatch, capfd, "run", "--experiment", _experiment(tmp_path), "--category", "coding",
                             "--num-prompts", "6", "--systems", "plain,dspark", "--ignore-eos", "--out",
                             tmp_path / "run")
    assert code == 0, err
    assert "[random weights, synthetic acceptance: official-coding (AL 3.41)]" in " ".join(out.split())  # (wrapped)
    assert "profile AL" in out and "realised rates" in out and "= plain" not in out.split("T: temperature")[0]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["settings"]["weights"] == "random"
    assert manifest["label"] == "random weights, synthetic acceptance: official-coding (AL 3.41)"
    profile = manifest["settings"]["acceptance"]["dspark"]
    assert profile["name"] == "official-coding" and len(profile["rates"]) == 7
    assert manifest["models"]["target"]["random_weights"]["init"] == "normal(0, 0.02)"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    check = summary["synthetic"]["dspark"]
    assert check["verdict"] == "matches" and check["rounds"] > 50
    counts = [a for r in read_requests(tmp_path / "run") if r["system"] == "dspark"
              for a, p in zip(r["accepted_counts"], r["proposal_lengths"]) if p == 7]
    assert goodness_of_fit(counts, tuple(profile["rates"]))["p_value"] == pytest.approx(check["p_value"])
    assert goodness_of_fit(counts, resolve("collapse", 7).rates)["p_value"] < 1e-6  # (the check can fail)
    md = (tmp_path / "run" / "summary.md").read_text()
    assert md.startswith("# run run [random weights, synthetic acceptance: official-coding (AL 3.41)]")
    assert "say nothing of any draft's quality" in md


def test_prompts_are_shaped_when_a_random_target_has_no_tokenizer(tmp_path):
    tok = ShapedTokenizer("throughput_8k", 151936)
    ids = tok.apply_chat_template([{"role": "user", "content": "short text"}])
    assert len(ids) == 8000 + MESSAGE_WRAP + GENERATION_PROMPT and max(ids) < 151643
    assert ids == tok.apply_chat_template([{"role": "user", "content": "short text"}])  # the same ids every time
    shaped = ShapedTokenizer("qualitative", 272)
    coding = shaped.apply_chat_template([{"role": "user", "content": "x" * 401}])
    assert len(coding) == 101 + MESSAGE_WRAP + GENERATION_PROMPT and max(coding) < 272
    reply = shaped.decode(list(range(37)))  # a later turn counts an earlier reply at its own length
    assert shaped.turn_tokens(reply, "assistant") == 37


@needs_demo
def test_a_random_target_without_a_tokenizer_runs_on_shaped_prompts(tmp_path, monkeypatch, capfd):
    bare = tmp_path / "bare-config"
    bare.mkdir()
    shutil.copy(DEMO_DIR / "target" / "config.json", bare / "config.json")
    drafts = tmp_path / "bare-draft"
    drafts.mkdir()
    shutil.copy(DEMO_DIR / "dspark" / "config.json", drafts / "config.json")
    exp = _experiment(tmp_path, f"random:{bare}", f"random:{drafts}")
    code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", exp, "--category", "coding", "--num-prompts",
                           "2", "--systems", "plain,dspark", "--output-len", "8", "--ignore-eos", "--out", tmp_path / "r")
    assert code == 0, err
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert manifest["tokenizer"]["shaped"]["split"] == "qualitative"
    rows = [json.loads(line) for line in demo_suite_dir().joinpath("qualitative.jsonl").read_text().splitlines()]
    turns = {r["question_id"]: r["turns"][0] for r in rows}
    for r in read_requests(tmp_path / "r"):
        expected = -(-len(turns[r["question_id"]].encode()) // 4) + MESSAGE_WRAP + GENERATION_PROMPT
        assert r["prompt_tokens"] == expected and r["output_text"] == " ".join(["tok"] * r["output_tokens"])


@pytest.mark.parametrize("args,fragment", [
    (["--acceptance", "fast"], "not a profile"),
    (["--acceptance", "official-coding"], "n-gram lookup"),
    (["--acceptance", "0.9,0.8", "--systems", "plain,dspark"], "(system 'dspark') 0.9,0.8: 2 rates for a proposal of 7"),
    (["--acceptance", "official-coding", "--systems", "plain"], "have no draft to accept at it"),
])
def test_bad_synthetic_options_are_refused_in_one_line(tmp_path, monkeypatch, capfd, args, fragment):
    code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", _experiment(tmp_path), "--category", "coding",
                           *args, "--out", tmp_path / "r")
    assert code == 2 and fragment in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_a_bad_profile_in_an_experiment_names_the_file_and_the_system(tmp_path, monkeypatch, capfd):
    exp = _experiment(tmp_path)
    exp.write_text(exp.read_text().replace('acceptance = "official-coding"', 'acceptance = "bogus"'))
    code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", exp, "--category", "coding", "--out", tmp_path / "r")
    assert code == 2 and f"{exp}: system 'dspark': acceptance 'bogus': not a profile" in err, err


def test_tables_keep_real_acceptance_beside_synthetic():
    """A run whose drafts are partly real keeps the accept and = plain columns beside the profile's."""
    from harness.analysis.table_text import columns

    rows = [{"system": "plain", "method": "plain"}, {"system": "a", "method": "dspark", "profile_acceptance_length": 3.4},
            {"system": "b", "method": "dflash", "profile_acceptance_length": None}]
    keys = [key for _, key in columns({"rows": rows, "synthetic": {"a": {}}})]
    assert {"spec_decode_acceptance_rate", "matches_baseline", "profile_acceptance_length", "realised_rates"} <= set(keys)
    keys = [key for _, key in columns({"rows": rows[:2], "synthetic": {"a": {}}})]
    assert "spec_decode_acceptance_rate" not in keys and "profile_acceptance_length" in keys


@needs_demo
def test_a_random_target_with_a_real_draft_is_refused(tmp_path, monkeypatch, capfd):
    code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", _experiment(tmp_path, draft="demo-dspark"),
                           "--category", "coding", "--out", tmp_path / "r")
    assert code == 2 and "give both as random:<preset> or neither" in err, err


@needs_demo
def test_vllm_without_synthetic_acceptance_and_dummy_drafts_on_its_cpu_build_are_refused():
    from harness.backends.vllm.offline import VllmTarget
    from harness.runs.synthetic import with_synthetic
    from harness.specs.experiments import System

    backend = object.__new__(VllmTarget)
    backend.version, backend.on_cpu, backend.random, backend.run_dir, backend.spec_args = "0.26.0", False, False, None, {}
    system = with_synthetic(System("dspark", "dspark", "demo-dspark", 7),
                            {"acceptance": {"dspark": resolve("community", 7).to_dict()}})
    with pytest.raises(DSparkError, match="vLLM 0.26.0 has no synthetic acceptance"):
        backend.prepare(system)
    backend.version = "0.32.0"
    sc = backend.prepare(system).handle["speculative_config"]
    assert sc["rejection_sample_method"] == "synthetic" and sc["synthetic_acceptance_rates"][:2] == [0.605, 0.341]
    backend.random, backend.on_cpu = True, True
    with pytest.raises(DSparkError, match="CPU build cannot run a dspark draft on dummy weights"):
        backend.prepare(System("dspark", "dspark", "random:demo-dspark", 7))


@needs_vllm
@needs_demo
def test_vllm_accepts_at_the_profile_on_its_cpu_build(tmp_path):
    """vLLM's synthetic rejection sampler given the profile's rates, its per-request rounds held against it."""
    # (about 22 rounds: each cell of the test still expects 5; DSpark's rounds run interpreted here, about 1 s each)
    run = _cli(["run", "--systems", "dspark", "--backend", "vllm", "--category", "coding", "--num-prompts", "2",
                "--output-len", "80", "--temperature", "0", "--disable-shuffle", "--ignore-eos", "--acceptance",
                "dspark-ascend-gsm8k", "--vllm-arg", "distributed_executor_backend=uni", "--out", tmp_path / "v",
                "--json"], tmp_path, extra_env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)
    check = summary["synthetic"]["dspark"]
    assert check["verdict"] == "matches" and check["rounds"] >= 18, check
    manifest = json.loads((tmp_path / "v" / "manifest.json").read_text())
    sc = manifest["backend"]["engines"]["dspark"]
    assert "synthetic" in json.dumps(sc)
    counts = [a for r in read_requests(tmp_path / "v") for a, p in zip(r["accepted_counts"], r["proposal_lengths"])
              if p == 7]
    assert goodness_of_fit(counts, resolve("community", 7).rates)["p_value"] < 1e-6

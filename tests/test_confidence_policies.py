"""Proposal-length policies as systems (`confidence = "off" | "threshold:0.x" | "schedule"`): parsed with
one-line refusals, run end to end on the demo pair (the scheduler's round costs measured at start and
recorded, greedy output equal to plain decoding), and `parity` refusing runs of different policies."""

from __future__ import annotations

import json

import pytest
from cli_runner import run_cli

from dspark.checkpoint import DEMO_DIR
from dspark.errors import DSparkError
from harness.specs.experiments import parse

needs_demo = pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(),
                                reason="the demo models are not built")


def _experiment(**system) -> dict:
    return {"name": "x", "target": "demo", "systems": [{"name": "d", "method": "dspark", "draft": "demo-dspark",
                                                        **system}]}


def test_policies_parse_and_bad_ones_are_refused(tmp_path):
    assert parse(_experiment(), "x.toml").systems[0].confidence == "off"
    s = parse(_experiment(confidence="threshold:0.3"), "x.toml").systems[0]
    assert (s.confidence, s.confidence_threshold) == ("threshold:0.3", 0.3)
    assert parse(_experiment(confidence_threshold=0.4), "x.toml").systems[0].confidence == "threshold:0.4"
    sts = tmp_path / "sts.json"
    sts.write_text(json.dumps({"temperatures": [1.5, 1, 1, 1, 1, 1, 2]}))
    s = parse(_experiment(confidence="schedule", confidence_costs=[1, 2], confidence_sts=str(sts)), "x.toml").systems[0]
    assert s.confidence_costs == (1.0, 2.0) and s.confidence_temperatures == (1.5, 1, 1, 1, 1, 1, 2)
    with pytest.raises(DSparkError, match="needs a draft with a confidence head"):
        parse({"name": "x", "target": "demo", "systems": [{"name": "n", "method": "ngram", "confidence": "schedule"}]},
              "x.toml")
    for bad, match in [({"confidence": "threshold:x"}, "threshold must be a number in"),
                       ({"confidence": "threshold:1.5"}, "threshold must be a number in"),
                       ({"confidence": "adaptive"}, "must be off, threshold:0.x or schedule"),
                       ({"confidence": "schedule", "confidence_costs": [1, -2]}, "positive numbers"),
                       ({"confidence": "schedule", "confidence_sts": str(tmp_path / "none.json")}, "no file .*none.json"),
                       ({"confidence": "schedule", "confidence_costs": [1, 2], "num_speculative_tokens": 7},
                        "give 8, the cost of a round"),
                       ({"confidence_costs": [1, 2]}, "belong to confidence"),
                       ({"confidence": "off", "confidence_threshold": 0.3}, "not both")]:
        with pytest.raises(DSparkError, match=match):
            parse(_experiment(**bad), "x.toml")


@needs_demo
def test_policies_run_losslessly_and_parity_needs_the_same_policy(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    common = ["--temperature", "0", "--num-prompts", "2", "--output-len", "32"]
    code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", "confidence", *common, "--out", "a")
    assert code == 0, err[-2000:]
    records = [json.loads(line) for line in (tmp_path / "a" / "requests.jsonl").read_text().splitlines()]
    assert {r["system"] for r in records} == {"plain", "dspark", "dspark-threshold", "dspark-schedule"}
    assert all(r["matches_baseline"] is True for r in records if r["system"] != "plain")
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    costs = manifest["backend"]["schedule_costs_ms"]["dspark-schedule"]
    assert len(costs) == 8 and min(costs) > 0
    policy = {s["name"]: s["confidence"] for s in manifest["experiment"]["systems"]}
    assert policy == {"plain": "off", "dspark": "off", "dspark-threshold": "threshold:0.3", "dspark-schedule": "schedule"}
    cut = [r for r in records if r["system"] == "dspark-threshold"]
    assert any(min(r["proposal_lengths"]) < 7 for r in cut)  # the threshold cut some proposals
    # the same system name under another policy: parity refuses in one line
    other = tmp_path / "other.toml"
    other.write_text('name = "other"\ntarget = "demo"\ndataset = "demo"\n[sampling]\nnum_prompts = 2\n'
                     '[[systems]]\nname = "dspark"\nmethod = "dspark"\ndraft = "demo-dspark"\n'
                     'confidence = "threshold:0.5"\n')
    code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", other, *common, "--out", "b")
    assert code == 0, err[-2000:]
    code, _, err = run_cli(monkeypatch, capfd, "parity", "a", "b")
    assert code == 2 and err.count("\n") == 1 and "confidence off in a and threshold:0.5 in b" in err
    # a policy on a backend that verifies every draft is refused before anything runs
    code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", "confidence", "--backend", "vllm", *common,
                           "--out", "c")
    assert code == 2 and "dspark-threshold" in err and "--backend native" in err


def test_the_prefix_scheduler_maps_onto_vllms_adaptive_verification(tmp_path):
    """On the vLLM backends `confidence = "schedule"` is vLLM's adaptive verification (its speculative config
    says so); every other policy, a non-DSpark method, a CPU run and our own cost tables or temperatures are
    refused in one line each."""
    from harness.backends.vllm.offline import speculative_config
    from harness.runs.plan import vllm_policy_problem
    from harness.specs.experiments import System

    schedule = System("s", "dspark", "demo-dspark", 7, confidence="schedule")

    class Draft:  # what speculative_config reads of a draft's config
        vllm_method, markov_rank, num_drafts, format = "dspark", 16, 7, "deepspec"

    sc = speculative_config(schedule, Draft(), tmp_path, on_cpu=False)
    assert sc["enable_adaptive_verification"] is True and sc["method"] == "dspark"
    plain_block = speculative_config(System("d", "dspark", "demo-dspark", 7), Draft(), tmp_path, on_cpu=False)
    assert "enable_adaptive_verification" not in plain_block
    assert vllm_policy_problem(schedule, "vllm-server", "cuda") is None
    assert vllm_policy_problem(System("d", "dspark"), "vllm", "cpu") is None
    problems = [vllm_policy_problem(schedule, "vllm", "cpu"),
                vllm_policy_problem(System("t", "dspark", confidence="threshold:0.3", confidence_threshold=0.3),
                                    "vllm", "cuda"),
                vllm_policy_problem(schedule, "openai", "cuda"),
                vllm_policy_problem(System("e", "eagle3", confidence="schedule"), "vllm", "cuda"),
                vllm_policy_problem(System("c", "dspark", confidence="schedule", confidence_costs=(1.0,) * 8),
                                    "vllm", "cuda")]
    hints = ["--device cuda", "threshold:0.3", "--backend native", "method dspark", "drop confidence_costs"]
    for problem, hint in zip(problems, hints):
        assert problem is not None and "\n" not in problem and hint in problem, (problem, hint)


@needs_demo
def test_the_scheduler_on_vllm_without_a_gpu_is_refused_in_one_line(monkeypatch, capfd, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", "confidence", "--backend", "vllm",
                           "--systems", "dspark,dspark-schedule", "--num-prompts", "1", "--out", "c")
    assert code == 2 and err.count("\n") == 1 and "dspark-schedule" in err and "--device cuda" in err

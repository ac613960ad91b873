"""EAGLE-3 checkpoint formats: the published layouts detected and read (taps in both conventions, with
numbers), every format saved and loaded back to the same tensors, config and proposals, broken
checkpoints refused in one line, and EAGLE-3 weights under a DSpark/DFlash config refused by name.

Greedy outputs are equal whatever the draft proposes (verification keeps them exact), so the round
trips compare the proposals of every round, and a control shows those change when the taps do.
"""

from __future__ import annotations

import copy
import json
import shutil
from dataclasses import replace

import pytest
import torch
from cli_runner import run_cli
from safetensors.torch import load_file, save_file
from test_checkpoint import ALL_8B, QWEN3_8B, _Payload, assert_one_error_line, qwen3_target

from dspark import formats
from dspark.checkpoint import check_draft, load_draft, load_draft_config, load_target, save_draft, save_target
from dspark.drafters import Eagle3Drafter
from dspark.engine import Engine, GenerationConfig
from dspark.errors import DSparkError
from dspark.formats import deepspec as block_deepspec
from dspark.formats.eagle3.deepspec import vllm_config
from dspark.models.config import DraftConfig, draft_config_from_hf
from dspark.synthetic.tiny import random_eagle3, random_target, tiny_draft_config, tiny_eagle3_config, tiny_target_config

# ---- 1. the published layouts (Qwen3-8B drafts; notes §4) --------------------------------------

LAYER_8B = {k: QWEN3_8B[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                                     "head_dim", "rms_norm_eps", "max_position_embeddings", "vocab_size", "hidden_act")}


def authors_8b() -> dict:
    """AngelSlim/Qwen3-8B_eagle3, Tengyunw/qwen3_8b_eagle3 (SpecForge's template): a Llama layer, a
    32000-token draft vocabulary, no taps named (vLLM's default for the target)."""
    return LAYER_8B | {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
                       "rope_theta": 1000000.0, "draft_vocab_size": 32000, "tie_word_embeddings": False,
                       "torch_dtype": "bfloat16", "bos_token_id": 151643, "eos_token_id": 151645}


def speculators_8b() -> dict:
    """RedHatAI/Qwen3-8B-speculator.eagle3: the layer nested, taps in vLLM's convention."""
    layer = LAYER_8B | {"num_hidden_layers": 1, "rope_theta": 1000000.0, "model_type": "llama",
                        "architectures": ["LlamaForCausalLM"]}
    return {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.2.0",
        "speculators_config": {
            "algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "verifier": {"name_or_path": "Qwen/Qwen3-8B", "architectures": ["Qwen3ForCausalLM"]},
        },
        "transformer_layer_config": layer, "draft_vocab_size": 32000, "norm_before_residual": True,
        "target_hidden_size": 4096, "eagle_aux_hidden_state_layer_ids": [2, 18, 33], "torch_dtype": "bfloat16",
    }


def deepspec_8b() -> dict:
    """deepseek-ai/eagle3_qwen3_8b_ttt7: Qwen3-8B's config with the EAGLE-3 fields, taps ours."""
    cfg = copy.deepcopy(QWEN3_8B)
    cfg.update(architectures=["Qwen3Eagle3Model"], num_hidden_layers=1, num_target_layers=36,
               target_layer_ids=[1, 9, 17, 25, 33], ttt_length=7, step_loss_decay=0.8, draft_num_hidden_layers=1,
               layer_types=["full_attention"], tie_word_embeddings=False, target_model_name_or_path="Qwen/Qwen3-8B")
    return cfg


def test_the_authors_layout_taps_vllms_default_for_the_targets_depth():
    with pytest.raises(DSparkError, match=r"does not say which target layers the draft taps; add "
                                          r"eagle_config\.eagle_aux_hidden_state_layer_ids") as exc:
        draft_config_from_hf(authors_8b())
    assert "\n" not in str(exc.value)
    cfg = draft_config_from_hf(authors_8b() | {"num_target_layers": 36})
    assert formats.detect_format(authors_8b()) == "eagle" and cfg.format == "eagle"
    assert cfg.vllm_aux_layer_ids == (2, 18, 33) and cfg.target_layer_ids == (1, 17, 32)  # (2, 36//2, 36-3) - 1
    b = cfg.backbone
    assert (b.hidden_size, b.num_layers, b.num_heads, b.num_kv_heads, b.head_dim, b.intermediate_size) == (
        4096, 1, 32, 8, 128, 12288)
    assert (cfg.vocab_size, cfg.draft_vocab_size, b.vocab_size, cfg.reduced_vocab) == (32000, 32000, 151936, True)
    assert (cfg.qk_norm, cfg.norm_before_residual, cfg.num_speculative_tokens, cfg.feature_size) == (False, False, 7, 4096)
    assert (cfg.method, cfg.vllm_method, cfg.architecture) == ("eagle3", "eagle3", "LlamaForCausalLMEagle3")
    cfg.check_target(qwen3_target())
    nested = draft_config_from_hf(authors_8b() | {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 9, 17]}})
    assert nested.target_layer_ids == (0, 8, 16) and nested.vllm_aux_layer_ids == (1, 9, 17)
    qwen3_style = draft_config_from_hf(authors_8b() | {"architectures": ["Eagle3Qwen3ForCausalLM"],
                                                       "eagle_aux_hidden_state_layer_ids": [2, 18, 33]})
    assert qwen3_style.qk_norm is True and qwen3_style.target_layer_ids == (1, 17, 32)


def test_the_speculators_layout():
    cfg = draft_config_from_hf(speculators_8b())
    assert formats.detect_format(speculators_8b()) == "speculators-eagle3" and cfg.architecture == "Eagle3Speculator"
    assert cfg.target_layer_ids == (1, 17, 32) and cfg.vllm_aux_layer_ids == (2, 18, 33)
    assert (cfg.num_speculative_tokens, cfg.vocab_size, cfg.qk_norm, cfg.norm_before_residual) == (3, 32000, False, True)
    assert cfg.target_hidden_size is None and cfg.backbone.rope_theta == 1e6  # 4096: the draft's own width
    raw = speculators_8b()
    del raw["norm_before_residual"], raw["transformer_layer_config"]["model_type"]
    defaults = draft_config_from_hf(raw)
    assert defaults.norm_before_residual is True and defaults.qk_norm is False  # vLLM's readings of absent fields
    qwen3 = copy.deepcopy(speculators_8b())
    qwen3["transformer_layer_config"]["model_type"] = "qwen3"
    assert draft_config_from_hf(qwen3).qk_norm is True


def test_the_deepspec_layout():
    cfg = draft_config_from_hf(deepspec_8b())
    assert formats.detect_format(deepspec_8b()) == "deepspec-eagle3" and cfg.architecture == "Qwen3Eagle3Model"
    assert cfg.target_layer_ids == (1, 9, 17, 25, 33) and cfg.vllm_aux_layer_ids == (2, 10, 18, 26, 34)
    assert (cfg.num_speculative_tokens, cfg.num_target_layers, cfg.qk_norm, cfg.norm_before_residual) == (7, 36, True, False)
    assert cfg.draft_vocab_size is None and cfg.vocab_size == 151936 and cfg.feature_size == 4096
    cfg.check_target(qwen3_target())
    # What vLLM 0.32 is given for it: its class of the same layer, and the taps counted one higher.
    seen = vllm_config(deepspec_8b())
    assert seen["architectures"] == ["Eagle3Qwen3ForCausalLM"] and seen["eagle_aux_hidden_state_layer_ids"] == [
        2, 10, 18, 26, 34]
    assert draft_config_from_hf(seen).target_layer_ids == cfg.target_layer_ids  # read as the authors' layout


def test_the_block_formats_detect_as_before_and_refuse_an_eagle3_config():
    expected = {"deepspec-dspark": "deepspec", "deepspec-dflash": "deepspec", "zlab": "zlab",
                "speculators-dspark": "speculators", "speculators-dflash": "speculators"}
    assert {name: formats.detect_format(make()) for name, make in ALL_8B.items()} == expected
    assert formats.speculators.detect(speculators_8b(), "draft") is False  # no longer raises for eagle3
    for raw in (authors_8b(), speculators_8b(), deepspec_8b()):
        with pytest.raises(DSparkError, match=r"an EAGLE-3 draft \(.*\), not a DSpark/DFlash one; it runs as method eagle3"):
            DraftConfig.from_hf(raw)


@pytest.mark.parametrize("raw,message", [
    (speculators_8b() | {"norm_before_fc": True}, r"norm_before_fc=true is not supported"),
    (speculators_8b() | {"fc_norm": True}, r"fc_norm=true is not supported"),
    (speculators_8b() | {"norm_output": True}, r"norm_output=true is not supported"),
    (speculators_8b() | {"transformer_layer_config": LAYER_8B | {"model_type": "mistral", "num_hidden_layers": 1,
                                                                  "rope_theta": 1e6}},
     r"transformer_layer_config\.model_type 'mistral' is not supported"),
    (authors_8b() | {"architectures": ["Eagle3DeepseekV2ForCausalLM"], "num_target_layers": 36},
     r"Eagle3DeepseekV2ForCausalLM is not supported"),
    (authors_8b() | {"eagle_aux_hidden_state_layer_ids": [2, 18, 33],
                     "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 17, 32]}},
     r"\[2, 18, 33\] \(top level\) and \[1, 17, 32\] \(eagle_config\) differ"),
    (deepspec_8b() | {"eagle_aux_hidden_state_layer_ids": [1, 9, 17, 25, 33]},
     r"eagle_aux_hidden_state_layer_ids \[1, 9, 17, 25, 33\] are not target_layer_ids \[1, 9, 17, 25, 33\] \+ 1"),
    (deepspec_8b() | {"model_type": "llama"}, r"Qwen3Eagle3Model with model_type 'llama' is not supported"),
    (deepspec_8b() | {"num_hidden_layers": 2}, r"an EAGLE-3 draft of 2 layers"),
    (deepspec_8b() | {"ttt_length": "seven"}, r"malformed config\.json"),
])
def test_unsupported_eagle3_configs_are_one_line(raw, message):
    with pytest.raises(DSparkError, match=message) as exc:
        draft_config_from_hf(raw)
    assert "\n" not in str(exc.value)


def test_a_draft_for_another_target_is_refused():
    cfg = draft_config_from_hf(deepspec_8b())
    with pytest.raises(DSparkError, match=r"draft hidden_size 4096 != target hidden_size 2560"):
        cfg.check_target(qwen3_target(hidden_size=2560))
    with pytest.raises(DSparkError, match=r"tapped target layer 33 does not exist in a 28-layer target"):
        cfg.check_target(qwen3_target(num_hidden_layers=28))


# ---- 2. round trips of tiny drafts ---------------------------------------------------------------

TCFG = tiny_target_config(vocab_size=64, hidden=32, layers=4, heads=4, kv_heads=2, head_dim=8, intermediate=64, eos=())
PROMPT = [(11 * i + 5) % 64 for i in range(12)]
DRAFT_VOCAB = 30
VARIANTS = {  # name: (format, config changes, saved with the embedding copy)
    "eagle": ("eagle", dict(num_tokens=7, draft_vocab_size=DRAFT_VOCAB), True),
    "eagle-qwen3": ("eagle", dict(num_tokens=7, qk_norm=True), False),
    "speculators": ("speculators-eagle3", dict(qk_norm=True, norm_before_residual=True), True),
    "speculators-llama": ("speculators-eagle3", dict(draft_vocab_size=DRAFT_VOCAB), False),
    "deepspec": ("deepspec-eagle3", dict(qk_norm=True, num_tokens=4), True),
}
LAYER_KEY = {"eagle": "midlayer.", "speculators-eagle3": "layers.0.", "deepspec-eagle3": "layers.0."}


def _draft(target, name: str, seed: int):
    fmt, changes, _ = VARIANTS[name]
    model = random_eagle3(tiny_eagle3_config(TCFG, taps=(1, 2, 3), fmt=fmt, **changes), target, seed, std=0.3)
    if model.config.reduced_vocab:  # draft id i is target id 2i: a map that is not the identity
        model.d2t = torch.arange(DRAFT_VOCAB)
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A wide-init tiny target (saved, reloaded) and each variant's draft, in memory and saved."""
    root = tmp_path_factory.mktemp("eagle3")
    save_target(random_target(TCFG, seed=0, std=0.3), root / "target")
    target = load_target(root / "target", dtype="float32").model
    drafts = {}
    for i, (name, (fmt, _, with_embeddings)) in enumerate(VARIANTS.items()):
        drafts[name] = _draft(target, name, seed=10 + i)
        save_draft(drafts[name], root / name, fmt, TCFG, verifier="tiny", with_embeddings=with_embeddings)
    return root, target, drafts


def _proposals(target, draft) -> tuple[list[int], list[list[int]]]:
    rounds = []

    class Recording(Eagle3Drafter):
        def propose(self, state, *args):
            super().propose(state, *args)
            rounds.append(state.draft_tokens[0].tolist())

    r = Engine(target, Recording(draft)).generate(PROMPT, GenerationConfig(max_new_tokens=24, temperature=0.0))
    return r.tokens, rounds


@pytest.mark.parametrize("name", VARIANTS)
def test_save_then_load_gives_the_same_draft(saved, name):
    root, target, drafts = saved
    fmt, _, with_embeddings = VARIANTS[name]
    mine = drafts[name]
    loaded = load_draft(root / name, target)
    assert loaded.config.format == fmt and loaded.shares_embeddings
    assert replace(loaded.config, format=mine.config.format, architecture="") == mine.config
    a, b = mine.state_dict(), loaded.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert loaded.model.embed_tokens is target.model.embed_tokens  # the target's table, shipped or not
    if mine.config.reduced_vocab:
        assert loaded.model.d2t.dtype == torch.int64 and loaded.model.target_ids()[-1] == 2 * (DRAFT_VOCAB - 1)
    # Stored in the format's own names, t2d beside d2t, the embedding copy only where asked for.
    stored = load_file(root / name / "model.safetensors")
    assert f"{LAYER_KEY[fmt]}self_attn.q_proj.weight" in stored and not any(
        k.startswith("midlayer." if LAYER_KEY[fmt] == "layers.0." else "layers.") for k in stored)
    assert ("t2d" in stored) == ("d2t" in stored) == mine.config.reduced_vocab
    assert ("embed_tokens.weight" in stored) == with_embeddings and "lm_head.weight" in stored
    if "t2d" in stored:
        assert stored["t2d"].sum() == DRAFT_VOCAB and bool(stored["t2d"][2 * torch.arange(DRAFT_VOCAB)].all())
    # Every round proposes the same tokens as the draft in memory.
    tokens, rounds = _proposals(target, mine)
    assert _proposals(target, loaded.model) == (tokens, rounds)
    assert tokens == Engine(target).generate(PROMPT, GenerationConfig(max_new_tokens=24, temperature=0.0)).tokens
    assert len(rounds) >= 8 and all(len(r) == mine.config.num_speculative_tokens for r in rounds)


@pytest.mark.parametrize("name", ["eagle", "speculators", "deepspec"])
def test_saving_a_loaded_draft_writes_the_same_checkpoint(saved, name, tmp_path):
    root, target, _ = saved
    fmt = VARIANTS[name][0]
    save_draft(load_draft(root / name, target).model, tmp_path, fmt, TCFG, verifier="tiny")
    assert json.loads((tmp_path / "config.json").read_text()) == json.loads((root / name / "config.json").read_text())
    a, b = load_file(root / name / "model.safetensors"), load_file(tmp_path / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_saved_taps_are_vllms_and_reading_ours_there_changes_the_drafts(saved, tmp_path):
    root, target, drafts = saved
    for name in ("eagle", "speculators", "deepspec"):
        raw = json.loads((root / name / "config.json").read_text())
        assert raw["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]  # ours (1, 2, 3) + 1
    assert json.loads((root / "eagle" / "config.json").read_text())["eagle_config"] == {
        "eagle_aux_hidden_state_layer_ids": [2, 3, 4]}  # (what vLLM sizes a Llama-style draft's fc by)
    assert json.loads((root / "deepspec" / "config.json").read_text())["target_layer_ids"] == [1, 2, 3]
    shutil.copytree(root / "speculators", tmp_path / "shifted")
    raw = json.loads((tmp_path / "shifted" / "config.json").read_text())
    raw["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3]  # our ids where vLLM's belong: off by one
    (tmp_path / "shifted" / "config.json").write_text(json.dumps(raw))
    shifted = load_draft(tmp_path / "shifted", target)
    assert shifted.config.target_layer_ids == (0, 1, 2)
    _, right = _proposals(target, drafts["speculators"])
    _, wrong = _proposals(target, shifted.model)
    assert sum(a == b for a, b in zip(right, wrong)) < len(right) // 2


def test_a_draft_of_the_wrong_kind_for_a_format_is_refused(saved, tmp_path):
    root, target, drafts = saved
    with pytest.raises(DSparkError, match=r"the deepspec format holds block drafts, not eagle3 ones; use one of "
                                          r"eagle, speculators-eagle3, deepspec-eagle3"):
        save_draft(drafts["eagle"], tmp_path / "a", "deepspec")
    with pytest.raises(DSparkError, match=r"DeepSpec EAGLE-3 format holds Qwen3-style \(q/k norm\) drafts over the "
                                          r"full vocabulary"):
        save_draft(drafts["eagle"], tmp_path / "b", "deepspec-eagle3")


# ---- 3. broken checkpoints: one line each ----------------------------------------------------------

def _copy(saved, name, tmp_path):
    root, target, _ = saved
    folder = tmp_path / name
    shutil.copytree(root / name, folder)
    return folder, target


def _edit_state(folder, edit) -> None:
    state = load_file(folder / "model.safetensors")
    edit(state)
    save_file(state, folder / "model.safetensors")


def _one_line(folder, target, message: str) -> None:
    with pytest.raises(DSparkError, match=message) as exc:
        load_draft(folder, target)
    assert "\n" not in str(exc.value) and str(folder) in str(exc.value)


def test_a_missing_tensor_is_named_as_stored(saved, tmp_path):
    folder, target = _copy(saved, "speculators", tmp_path)
    _edit_state(folder, lambda s: s.pop("layers.0.mlp.down_proj.weight"))
    _one_line(folder, target, r"tensor 'layers\.0\.mlp\.down_proj\.weight' is missing from the checkpoint")
    folder, target = _copy(saved, "eagle", tmp_path)
    _edit_state(folder, lambda s: s.pop("lm_head.weight"))  # the draft's own head: never the target's
    _one_line(folder, target, r"tensor 'lm_head\.weight' is missing")


def test_a_wrong_shape_is_one_line(saved, tmp_path):
    folder, target = _copy(saved, "deepspec", tmp_path)
    _edit_state(folder, lambda s: s.update({"fc.weight": torch.zeros(32, 64)}))
    _one_line(folder, target, r"tensor 'fc\.weight' has shape \[32, 64\], expected \[32, 96\] from its config")
    folder, target = _copy(saved, "eagle", tmp_path / "2")
    _edit_state(folder, lambda s: s.update({"d2t": torch.zeros(3, dtype=torch.long)}))
    _one_line(folder, target, r"tensor 'd2t' has shape \[3\], expected \[30\]")


def test_an_embedding_that_is_not_the_targets_is_refused_naming_vllm(saved, tmp_path):
    folder, target = _copy(saved, "eagle", tmp_path)

    def nudge(state):
        state["embed_tokens.weight"][5, 0] += 1e-3

    _edit_state(folder, nudge)
    _one_line(folder, target, r"its embed_tokens differ from the target's; .* \(vLLM can: --backend vllm\)")


def test_a_d2t_outside_the_target_vocabulary_is_refused(saved, tmp_path):
    folder, target = _copy(saved, "speculators-llama", tmp_path)
    _edit_state(folder, lambda s: s.update({"d2t": torch.full((DRAFT_VOCAB,), 40)}))
    _one_line(folder, target, r"d2t maps draft ids outside the target vocabulary")


def test_pytorch_model_bin_is_read_with_weights_only(saved, tmp_path):
    folder, target = _copy(saved, "eagle", tmp_path)
    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")
    loaded = load_draft(folder, target)
    a, b = saved[2]["eagle"].state_dict(), loaded.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    marker = tmp_path / "executed"
    torch.save({"fc.weight": _Payload(marker)}, folder / "pytorch_model.bin")
    _one_line(folder, target, r"pytorch_model\.bin: not a plain tensor file \(torch\.load with weights_only refused")
    assert not marker.exists()
    torch.save([torch.zeros(2)], folder / "pytorch_model.bin")
    _one_line(folder, target, r"pytorch_model\.bin: expected a dict of named tensors")
    (folder / "pytorch_model.bin").unlink()
    _one_line(folder, target, r"no \.safetensors weights \(nor pytorch_model\.bin\)")
    other, target = _copy(saved, "speculators", tmp_path)  # the other formats read safetensors only
    (other / "model.safetensors").rename(other / "pytorch_model.bin")
    _one_line(other, target, r"no \.safetensors weights; only safetensors checkpoints are loaded")


# ---- 4. EAGLE-3 weights under a DSpark/DFlash config ----------------------------------------------

def _mislabelled(saved, tmp_path, name: str, block_format: str):
    """The community-draft case: EAGLE-3 tensors with a block draft's config of the same shapes."""
    folder, target = _copy(saved, name, tmp_path)
    block = tiny_draft_config(TCFG, layers=1, taps=(1, 2, 3), mask_token_id=63, markov_rank=4,
                              sample_from_anchor=block_format == "deepspec", confidence=False)
    if block_format == "deepspec":
        hf = block_deepspec.hf_config(block, 4)
    else:
        hf = block.backbone.hf_fields() | {
            "architectures": ["DFlashDraftModel"], "block_size": 8,
            "dflash_config": {"mask_token_id": 63, "target_layer_ids": [1, 2, 3]}}
    (folder / "config.json").write_text(json.dumps(hf))
    return folder, target


@pytest.mark.parametrize("name,block_format,says", [
    ("deepspec", "deepspec", "Qwen3DSparkModel (dspark)"),
    ("eagle", "zlab", "DFlashDraftModel (dflash)"),
])
def test_eagle3_weights_under_a_block_config_are_refused_naming_the_method(saved, tmp_path, name, block_format, says):
    folder, target = _mislabelled(saved, tmp_path, name, block_format)
    layer = LAYER_KEY[VARIANTS[name][0]]
    message = (f"draft {folder}: its weights are an EAGLE-3 draft ({layer}self_attn.q_proj reads 2 x 32 inputs: "
               f"token embedding and hidden state), but its config says {says}; run it as method eagle3")
    path, cfg = load_draft_config(folder)
    for check in (lambda: check_draft(path, cfg, f"draft {folder}"), lambda: load_draft(folder, target)):
        with pytest.raises(DSparkError) as exc:
            check()
        assert str(exc.value) == message


def test_inspect_refuses_a_mislabelled_draft_in_one_line(saved, tmp_path, monkeypatch, capfd):
    folder, _ = _mislabelled(saved, tmp_path, "speculators", "deepspec")
    code, out, err = run_cli(monkeypatch, capfd, "inspect", folder)
    assert_one_error_line(code, out, err, "its weights are an EAGLE-3 draft (layers.0.self_attn.q_proj reads 2 x 32 "
                                          "inputs: token embedding and hidden state), but its config says "
                                          "Qwen3DSparkModel (dspark); run it as method eagle3")


def test_inspect_describes_an_eagle3_draft(saved, monkeypatch, capfd):
    root = saved[0]
    code, out, err = run_cli(monkeypatch, capfd, "inspect", root / "speculators-llama", "--json",
                             "--target", root / "target")
    assert code == 0, err
    info = json.loads(out)
    assert (info["method"], info["vllm_method"], info["format"], info["fits_target"]) == (
        "eagle3", "eagle3", "speculators-eagle3", True)
    assert info["taps (ours: outputs of target layers)"] == [1, 2, 3]
    assert info["taps (vLLM eagle_aux_hidden_state_layer_ids)"] == [2, 3, 4] == info["vllm_aux_layer_ids"]
    assert (info["draft_vocabulary"], info["layer_style"], info["norm_before_residual"]) == (30, "llama", False)
    h, heads, kv, d, inter = 32, 4, 2, 8, 64
    layer = 3 * h + 2 * h * (heads + 2 * kv) * d + heads * d * h + 3 * h * inter  # norms, q/k/v (2H in), o, MLP
    assert info["parameters"] == {"embed_tokens": 0, "lm_head": DRAFT_VOCAB * h, "layers": layer,
                                  "fc+norms": 3 * h * h + h, "total": DRAFT_VOCAB * h + layer + 3 * h * h + h,
                                  "total_without_embeddings": layer + 3 * h * h + h}
    code, out, _ = run_cli(monkeypatch, capfd, "inspect", root / "deepspec", "--json")
    info = json.loads(out)
    assert code == 0 and info["layer_style"] == "qwen3 (q/k norm)" and info["parameters"]["embed_tokens"] == 64 * 32


def test_make_tiny_saves_an_eagle3_draft_in_each_format(tiny_dir):
    target = load_target(tiny_dir / "target", dtype="float32").model
    found = {}
    for name in ("eagle3", "eagle3-speculators", "eagle3-deepspec"):
        cfg = load_draft(tiny_dir / name, target).config
        found[name] = (cfg.format, cfg.qk_norm, cfg.norm_before_residual, cfg.vocab_size)
    assert found == {"eagle3": ("eagle", False, False, 200), "eagle3-speculators": ("speculators-eagle3", True, True, 272),
                     "eagle3-deepspec": ("deepspec-eagle3", True, False, 272)}

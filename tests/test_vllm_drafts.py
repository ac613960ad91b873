"""A draft folder as each vLLM version reads it: 0.26 gets a copy whose config nests the taps in
`dflash_config` (the values the config has at its top level), everything else linked; 0.32 and a
config that has one already get the folder as it is."""

from __future__ import annotations

import json

import pytest

from dspark.checkpoint import DEMO_DIR
from dspark.errors import DSparkError
from harness.backends.vllm.drafts import as_vllm_reads, draft_folder, version_tuple


def test_versions_read_as_major_and_minor():
    assert [version_tuple(v) for v in ("0.26.0", "0.32.0+cpu", "0.27.0rc1", "1.0")] == [(0, 26), (0, 32), (0, 27),
                                                                                         (1, 0)]
    with pytest.raises(DSparkError, match="'dev' is not MAJOR.MINOR"):
        version_tuple("dev")


def test_vllm_026_gets_the_taps_nested_and_032_the_config_as_it_is():
    cfg = json.loads((DEMO_DIR / "dspark" / "config.json").read_text())
    old, note = as_vllm_reads(cfg, "0.26.0")
    assert old["dflash_config"] == {"target_layer_ids": cfg["target_layer_ids"], "mask_token_id": cfg["mask_token_id"]}
    assert {k: v for k, v in old.items() if k != "dflash_config"} == cfg and "vLLM 0.26.0" in note
    assert as_vllm_reads(cfg, "0.32.0+cpu") == (cfg, None)
    nested = cfg | {"dflash_config": {"target_layer_ids": [1], "mask_token_id": 3}}
    assert as_vllm_reads(nested, "0.26.0") == (nested, None)  # its own is kept, never overwritten


def test_the_copy_links_the_weights_and_rewrites_only_the_config(tmp_path):
    source = DEMO_DIR / "dspark"
    folder, note = draft_folder(source, "0.26.0", tmp_path / "copy")
    assert folder == tmp_path / "copy" and note
    weights = folder / "model.safetensors"
    assert weights.is_symlink() and weights.resolve() == (source / "model.safetensors").resolve()
    assert json.loads((folder / "config.json").read_text())["dflash_config"]["target_layer_ids"] == [1, 2, 3, 4, 5]
    assert json.loads((source / "config.json").read_text()).get("dflash_config") is None  # the original untouched
    again, _ = draft_folder(source, "0.26.0", tmp_path / "copy")  # a resumed run writes it again over itself
    assert again == folder and weights.is_symlink()
    assert draft_folder(source, "0.32.0", tmp_path / "other") == (source, None)
    assert not (tmp_path / "other").exists()


def test_a_deepspec_eagle3_draft_is_given_to_vllm_as_its_eagle3_qwen3_class_with_vllm_taps(tmp_path):
    """DeepSpec writes `Qwen3Eagle3Model` and its taps as `target_layer_ids` (the output of layer i); vLLM
    registers neither: the copy names `Eagle3Qwen3ForCausalLM` and the taps + 1, and nothing else changes."""
    from dspark.checkpoint import save_draft
    from dspark.synthetic.tiny import random_eagle3, random_target, tiny_eagle3_config, tiny_target_config

    tcfg = tiny_target_config()
    target = random_target(tcfg)
    save_draft(random_eagle3(tiny_eagle3_config(tcfg, taps=(0, 2), qk_norm=True, fmt="deepspec-eagle3"), target),
               tmp_path / "d", "deepspec-eagle3", tcfg)
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    folder, note = draft_folder(tmp_path / "d", "0.32.0", tmp_path / "copy")
    given = json.loads((folder / "config.json").read_text())
    assert folder == tmp_path / "copy" and "Eagle3Qwen3ForCausalLM" in note
    assert given["architectures"] == ["Eagle3Qwen3ForCausalLM"] and given["eagle_aux_hidden_state_layer_ids"] == [1, 3]
    assert {k: v for k, v in given.items() if k not in ("architectures", "eagle_aux_hidden_state_layer_ids")} == {
        k: v for k, v in cfg.items() if k not in ("architectures", "eagle_aux_hidden_state_layer_ids")}
    assert (folder / "model.safetensors").is_symlink()

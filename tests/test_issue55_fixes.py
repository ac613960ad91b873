"""Issue 55's review findings, each held where a user meets it: a draft whose format does not match its method (a
DFlash 2 draft or a DFlash draft given as a draft model, a Qwen3 draft model given as a block draft) named in one
line before any model loads; a draft model whose tensors do not match its config, or whose context is shorter than
the run's requests, refused there too; z-lab fields z-lab never reads refused; our saver's DFlash 2 layout as
z-lab's current releases keep it; vLLM's V2-runner methods on a CPU without Triton's CPU backend refused in the dry
run; each refusal naming its fix.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

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


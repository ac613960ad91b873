"""z-lab's DFlash format (`DFlashDraftModel`; spec §1.2).

A flat Qwen3 config with the DFlash fields nested in `dflash_config` (SpecForge-style DSpark knobs
also nest there, with `projector_type: "dspark"`); fill-in unless that says otherwise. No embedding
or head tensors (the target's are used); an optional `mask_embedding.pt` holds a separate mask row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
from torch import nn

from dspark.errors import DSparkError
from dspark.formats.common import (
    MASK_FILE,
    KeyTable,
    architecture,
    draft_state,
    full_attention,
    load_mask_file,
    markov_fields,
    require,
    write,
)

NAME = "zlab"
KIND = "block"
READS_BIN = False
KEYS = KeyTable()


def detect(cfg: dict, where: str) -> bool:
    if "dflash_config" not in cfg and architecture(cfg) != "DFlashDraftModel":
        return False
    if "dflash_config" not in cfg:
        raise DSparkError(f"{where}: DFlashDraftModel config lacks 'dflash_config'")
    return True


def parse(cfg: dict, where: str, backbone: Callable) -> dict:
    """DraftConfig fields; `backbone(hf_dict, where)` reads the Qwen3 backbone fields."""
    dcfg = dict(cfg.get("dflash_config") or {})
    for key in ("use_swa", "causal"):
        if dcfg.get(key):
            raise DSparkError(f"{where}: dflash_config.{key}=true is not supported (non-causal full attention only)")
    dspark = dcfg.get("projector_type") == "dspark"
    heads = markov_fields(dcfg, enabled=dspark)
    return {
        "format": NAME,
        "backbone": backbone(cfg, where),
        "block_size": int(require(cfg, "block_size", where)),
        "target_layer_ids": tuple(int(i) for i in require(dcfg, "target_layer_ids", where + " dflash_config")),
        "sample_from_anchor": bool(dcfg.get("sample_from_anchor", dspark)),
        "mask_token_id": int(require(dcfg, "mask_token_id", where + " dflash_config")),
        **heads,
        "num_target_layers": cfg.get("num_target_layers"),
        "architecture": architecture(cfg),
    }


def load_extras(path: Path, model: nn.Module) -> None:
    load_mask_file(path, model)


def save(model: nn.Module, out: Path, num_target_layers: int | None, verifier: str, with_embeddings: bool) -> None:
    """Always without the embedding and head copies, as z-lab's checkpoints are."""
    state = draft_state(model, with_embeddings=False)
    hf = hf_config(model.config, num_target_layers)
    if model.mask_embedding is not None:
        torch.save(model.mask_embedding.detach().cpu().clone(), out / MASK_FILE)
    write(out, hf, state)


def hf_config(cfg, num_target_layers: int | None) -> dict:
    """The `config.json` of a fill-in DFlash draft of `cfg` in z-lab's layout (also a random draft's)."""
    if cfg.sample_from_anchor or cfg.markov_rank or cfg.reduced_vocab:
        raise DSparkError("the z-lab format holds fill-in DFlash drafts over the full vocabulary only")
    b = cfg.backbone
    return b.hf_fields() | {
        "architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": cfg.block_size, "num_target_layers": num_target_layers, "tie_word_embeddings": True,
        "dflash_config": {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids)},
        "layer_types": full_attention(b.num_layers),
    }

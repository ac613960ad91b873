"""DeepSpec's flat format (deepseek-ai/dspark_* and DeepSpec's own dflash_*; spec §1.1).

A Qwen3 config of the draft's backbone with the DSpark fields added at the top level,
`architectures: ["Qwen3DSparkModel"]`; anchor-first always (no `sample_from_anchor` field: true).
Tensors carry the model's own names, with frozen copies of the target's embedding and head.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from torch import nn

from dspark.errors import DSparkError
from dspark.formats.common import (
    KeyTable,
    architecture,
    draft_state,
    full_attention,
    load_mask_file,
    markov_fields,
    require,
    write,
)

NAME = "deepspec"
KIND = "block"
READS_BIN = False
KEYS = KeyTable()


def detect(cfg: dict, where: str) -> bool:
    arch = architecture(cfg)
    if not (arch.endswith("DSparkModel") and "block_size" in cfg):
        return False
    if cfg.get("model_type") not in (None, "qwen3"):
        raise DSparkError(f"{where}: {arch} with model_type '{cfg.get('model_type')}' is not supported (Qwen3 only)")
    return True


def parse(cfg: dict, where: str, backbone: Callable) -> dict:
    """DraftConfig fields; `backbone(hf_dict, where)` reads the Qwen3 backbone fields."""
    heads = markov_fields(cfg)
    return {
        "format": NAME,
        "backbone": backbone(cfg, where),
        "block_size": int(require(cfg, "block_size", where)),
        "target_layer_ids": tuple(int(i) for i in require(cfg, "target_layer_ids", where)),
        "sample_from_anchor": bool(cfg.get("sample_from_anchor", True)),
        "mask_token_id": int(require(cfg, "mask_token_id", where)),
        **heads,
        "num_target_layers": cfg.get("num_target_layers"),
        "architecture": architecture(cfg),
    }


def load_extras(path: Path, model: nn.Module) -> None:
    load_mask_file(path, model)  # none is shipped in this format, but one beside it is read, as for every format


def save(model: nn.Module, out: Path, num_target_layers: int | None, verifier: str, with_embeddings: bool) -> None:
    write(out, hf_config(model.config, num_target_layers), draft_state(model, with_embeddings))


def hf_config(cfg, num_target_layers: int | None) -> dict:
    """The `config.json` of a draft of `cfg` (a DraftConfig, not imported here: it imports the formats) in
    this format; also what vLLM is given for a dummy-weight draft."""
    if not cfg.sample_from_anchor:
        raise DSparkError("the DeepSpec format is anchor-first; a fill-in draft saves as zlab or speculators")
    b = cfg.backbone
    hf = b.hf_fields() | {
        "architectures": ["Qwen3DSparkModel"], "num_target_layers": num_target_layers,
        "block_size": cfg.block_size, "target_layer_ids": list(cfg.target_layer_ids),
        "mask_token_id": cfg.mask_token_id, "markov_rank": cfg.markov_rank,
        "enable_confidence_head": cfg.confidence_head, "tie_word_embeddings": False,
        "layer_types": full_attention(b.num_layers),
    }
    if cfg.markov_rank > 0:
        hf["markov_head_type"] = cfg.markov_head_type
    if cfg.confidence_head:
        hf["confidence_head_with_markov"] = cfg.confidence_head_with_markov
    return hf

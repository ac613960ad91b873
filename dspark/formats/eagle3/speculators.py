"""vLLM speculators' EAGLE-3 format (`speculators_model_type: eagle3`).

The layer's config is nested in `transformer_layer_config` (model_type llama: no q/k norms; qwen3:
Qwen3's per-head q/k norms; absent: llama, as vLLM reads it); at the top level `draft_vocab_size`,
`norm_before_residual` (absent: true, as vLLM's translator reads it, though the speculators model
class defaults to false), `target_hidden_size` and `eagle_aux_hidden_state_layer_ids` (vLLM's
convention). The chain length is `speculators_config.proposal_methods[0].speculative_tokens`.
Tensors: the layer as `layers.0.*`, `fc`, `norm`, `lm_head`, `d2t`/`t2d`, an optional embedding
copy; the verifier's copies (`verifier_*`) are skipped. vLLM 0.32 loads a saved one as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from torch import nn

from dspark.errors import DSparkError
from dspark.formats.common import KeyTable, architecture, speculators_config, write
from dspark.formats.eagle3.common import fields, layer_config, load_extras, refuse_unsupported, state, tapped_layers

NAME = "speculators-eagle3"
KIND = "eagle3"
READS_BIN = False
KEYS = KeyTable(renames=(("layers.0.", "midlayer."),))
QK_NORM = {"llama": False, "qwen3": True}  # transformer_layer_config.model_type -> the layer's q/k norms

__all__ = ["NAME", "KIND", "READS_BIN", "KEYS", "detect", "parse", "load_extras", "save"]


def detect(cfg: dict, where: str) -> bool:
    return cfg.get("speculators_model_type") == "eagle3"


def parse(cfg: dict, where: str, backbone: Callable) -> dict:
    """Eagle3Config fields; `backbone(hf_dict, where)` reads the layer's shapes."""
    refuse_unsupported(cfg, where)
    layer = dict(cfg.get("transformer_layer_config") or {})
    if not layer:
        raise DSparkError(f"{where}: speculators config lacks 'transformer_layer_config'")
    style = layer.get("model_type", "llama")
    if style not in QK_NORM:
        raise DSparkError(f"{where}: transformer_layer_config.model_type '{style}' is not supported; EAGLE-3 "
                          "layers are llama or qwen3 style")
    methods = (cfg.get("speculators_config") or {}).get("proposal_methods") or [{}]
    return fields(NAME, backbone(layer, where), tapped_layers(cfg, where),
                  tokens=methods[0].get("speculative_tokens"), qk_norm=QK_NORM[style],
                  norm_before_residual=cfg.get("norm_before_residual", True),
                  draft_vocab=cfg.get("draft_vocab_size"), target_hidden=cfg.get("target_hidden_size"),
                  num_target_layers=cfg.get("num_target_layers"), architecture=architecture(cfg))


def save(model: nn.Module, out: Path, num_target_layers: int | None, verifier: str, with_embeddings: bool) -> None:
    cfg = model.config
    hf = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_config": speculators_config("eagle3", cfg.num_speculative_tokens, verifier),
        "transformer_layer_config": layer_config(cfg, "qwen3" if cfg.qk_norm else "llama"),
        "draft_vocab_size": cfg.vocab_size, "norm_before_residual": cfg.norm_before_residual,
        "target_hidden_size": cfg.feature_size, "eagle_aux_hidden_state_layer_ids": list(cfg.vllm_aux_layer_ids),
        "norm_before_fc": False, "fc_norm": False, "norm_output": False,
        "num_target_layers": num_target_layers,
    }
    write(out, hf, state(model, KEYS, with_embeddings))

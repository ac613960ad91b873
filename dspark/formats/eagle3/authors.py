"""The EAGLE authors' layout, also SpecForge's and AngelSlim's (`LlamaForCausalLMEagle3`).

A flat Hugging Face config of the draft layer (model_type llama; a Qwen3-style layer with q/k norms
is `Eagle3Qwen3ForCausalLM`, model_type qwen3, as vLLM names it) with `draft_vocab_size`; tensors
under the model's own names (`midlayer.*`, `fc`, `norm`, `lm_head`, `d2t`, the training-only `t2d`,
and a copy of the target's `embed_tokens` or none). The taps are optional: vLLM's
`eagle_aux_hidden_state_layer_ids` (top level or in `eagle_config`), else vLLM's default for the
target's depth. No chain length is stored (7 is assumed). AngelSlim ships `pytorch_model.bin`: read,
where no safetensors exist, with `torch.load(weights_only=True)`.

Saved as vLLM 0.32 loads it as it is (`method: eagle3`): the taps both at the top level (what vLLM's
runners read) and in `eagle_config` (what its Llama-style draft sizes `fc` by).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from torch import nn

from dspark.errors import DSparkError
from dspark.formats.common import KeyTable, architecture, write
from dspark.formats.eagle3.common import fields, layer_config, load_extras, refuse_unsupported, state, tapped_layers

NAME = "eagle"
KIND = "eagle3"
READS_BIN = True
KEYS = KeyTable()  # the model's names are this layout's; t2d is skipped
# The architectures vLLM runs, and whether their layer has Qwen3's per-head q/k norms.
QK_NORM = {"LlamaForCausalLMEagle3": False, "Eagle3LlamaForCausalLM": False, "Eagle3Qwen3ForCausalLM": True}

__all__ = ["NAME", "KIND", "READS_BIN", "KEYS", "detect", "parse", "load_extras", "save", "hf_config"]


def detect(cfg: dict, where: str) -> bool:
    """An architecture named ...Eagle3 or Eagle3... (vLLM's rule for a plain EAGLE-3 config)."""
    arch = architecture(cfg)
    return "speculators_model_type" not in cfg and (arch.startswith("Eagle3") or arch.endswith("Eagle3"))


def parse(cfg: dict, where: str, backbone: Callable) -> dict:
    """Eagle3Config fields; `backbone(hf_dict, where)` reads the layer's shapes."""
    arch = architecture(cfg)
    if arch not in QK_NORM:
        raise DSparkError(f"{where}: {arch} is not supported; EAGLE-3 drafts of a Llama-style layer "
                          "(LlamaForCausalLMEagle3) or a Qwen3-style one (Eagle3Qwen3ForCausalLM) are")
    refuse_unsupported(cfg, where)
    b = backbone(cfg, where)
    return fields(NAME, b, tapped_layers(cfg, where), tokens=None, qk_norm=QK_NORM[arch],
                  norm_before_residual=cfg.get("norm_before_residual", False),
                  draft_vocab=cfg.get("draft_vocab_size"), target_hidden=cfg.get("target_hidden_size"),
                  num_target_layers=cfg.get("num_target_layers"), architecture=arch)


def save(model: nn.Module, out: Path, num_target_layers: int | None, verifier: str, with_embeddings: bool) -> None:
    write(out, hf_config(model.config, num_target_layers), state(model, KEYS, with_embeddings))


def hf_config(cfg, num_target_layers: int | None) -> dict:
    """The `config.json` of a draft of `cfg` (an Eagle3Config) in this layout."""
    arch, model_type = ("Eagle3Qwen3ForCausalLM", "qwen3") if cfg.qk_norm else ("LlamaForCausalLMEagle3", "llama")
    taps = list(cfg.vllm_aux_layer_ids)
    return layer_config(cfg, model_type) | {
        "architectures": [arch], "draft_vocab_size": cfg.vocab_size,
        "target_hidden_size": cfg.feature_size, "norm_before_residual": cfg.norm_before_residual,
        "eagle_aux_hidden_state_layer_ids": taps, "eagle_config": {"eagle_aux_hidden_state_layer_ids": taps},
        "num_target_layers": num_target_layers, "tie_word_embeddings": False,
    }

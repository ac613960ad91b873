"""DeepSpec's EAGLE-3 format (`Qwen3Eagle3Model`, e.g. deepseek-ai/eagle3_qwen3_8b_ttt7).

A copy of the target's flat Qwen3 config with `num_hidden_layers: 1`, `target_layer_ids` (our
convention: outputs of those 0-based layers), `num_target_layers` and `ttt_length` (the training
chain length, taken as the chain length to propose). The layer is always Qwen3-style (per-head q/k
norms) with the raw hidden as residual, over the full vocabulary; tensors `layers.0.*`, `fc`,
`norm`, and copies of the target's embedding and head.

vLLM 0.32 refuses the architecture name `Qwen3Eagle3Model` and finds taps only in
`eagle_aux_hidden_state_layer_ids`. `save` writes DeepSpec's own layout (what DeepSpec's tools read)
with those ids added (ours + 1; this module checks they agree on load); `vllm_config` gives the
config vLLM loads the same folder with (architecture `Eagle3Qwen3ForCausalLM`, the same layer): a
harness running it through vLLM gives vLLM a copy of the folder with that config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from torch import nn

from dspark.errors import DSparkError
from dspark.formats.common import KeyTable, architecture, full_attention, our_ids, require, vllm_ids, write
from dspark.formats.eagle3.common import fields, layer_config, load_extras, state

NAME = "deepspec-eagle3"
KIND = "eagle3"
READS_BIN = False
KEYS = KeyTable(renames=(("layers.0.", "midlayer."),))
ARCHITECTURE = "Qwen3Eagle3Model"
VLLM_ARCHITECTURE = "Eagle3Qwen3ForCausalLM"  # vLLM's class of the same layer

__all__ = ["NAME", "KIND", "READS_BIN", "KEYS", "detect", "parse", "load_extras", "save", "vllm_config"]


def detect(cfg: dict, where: str) -> bool:
    if architecture(cfg) != ARCHITECTURE:
        return False
    if cfg.get("model_type") not in (None, "qwen3"):
        raise DSparkError(f"{where}: {ARCHITECTURE} with model_type '{cfg.get('model_type')}' is not supported "
                          "(Qwen3 only)")
    return True


def parse(cfg: dict, where: str, backbone: Callable) -> dict:
    """Eagle3Config fields; `backbone(hf_dict, where)` reads the layer's shapes."""
    taps = tuple(int(i) for i in require(cfg, "target_layer_ids", where))
    aux = cfg.get("eagle_aux_hidden_state_layer_ids")
    if aux is not None and our_ids(aux) != taps:
        raise DSparkError(f"{where}: eagle_aux_hidden_state_layer_ids {list(aux)} are not target_layer_ids "
                          f"{list(taps)} + 1 (vLLM counts one higher); fix the one that is wrong")
    b = backbone(cfg, where)
    if cfg.get("draft_vocab_size") not in (None, b.vocab_size):
        raise DSparkError(f"{where}: a {ARCHITECTURE} draft has the full vocabulary; draft_vocab_size "
                          f"{cfg['draft_vocab_size']} does not belong in it")
    return fields(NAME, b, taps, tokens=cfg.get("ttt_length"), qk_norm=True, norm_before_residual=False,
                  draft_vocab=None, target_hidden=cfg.get("target_hidden_size"),
                  num_target_layers=cfg.get("num_target_layers"), architecture=ARCHITECTURE)


def save(model: nn.Module, out: Path, num_target_layers: int | None, verifier: str, with_embeddings: bool) -> None:
    cfg = model.config
    if not cfg.qk_norm or cfg.norm_before_residual or cfg.reduced_vocab:
        raise DSparkError("the DeepSpec EAGLE-3 format holds Qwen3-style (q/k norm) drafts over the full "
                          "vocabulary with the raw hidden as residual; save this one as eagle or speculators-eagle3")
    b = cfg.backbone
    hf = layer_config(cfg, "qwen3") | {
        "architectures": [ARCHITECTURE], "num_target_layers": num_target_layers,
        "target_layer_ids": list(cfg.target_layer_ids), "ttt_length": cfg.num_speculative_tokens,
        "draft_num_hidden_layers": b.num_layers, "layer_types": full_attention(b.num_layers),
        "tie_word_embeddings": False, "eagle_aux_hidden_state_layer_ids": list(cfg.vllm_aux_layer_ids),
    }
    if cfg.target_hidden_size:
        hf["target_hidden_size"] = cfg.target_hidden_size
    write(out, hf, state(model, KEYS, with_embeddings))


def vllm_config(hf: dict) -> dict:
    """This format's `config.json` as vLLM 0.32 loads it: the architecture renamed to vLLM's class of the
    same layer, and the taps in vLLM's convention (it reads no `target_layer_ids` for EAGLE-3)."""
    return hf | {"architectures": [VLLM_ARCHITECTURE],
                 "eagle_aux_hidden_state_layer_ids": vllm_ids(hf["target_layer_ids"])}

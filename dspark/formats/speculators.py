"""vLLM speculators' format (`speculators_model_type: dspark | dflash`; spec §1.3).

The backbone is nested in `transformer_layer_config`; tapped layers are `aux_hidden_state_layer_ids`,
counted one higher than DeepSpec's (hidden_states indices: aux id i is the output of layer i - 1).
A reduced vocabulary is `draft_vocab_size` with `d2t` offsets (target id = draft id + d2t[draft id])
and the training-only `t2d` mask. dspark: anchor-first with the Markov/confidence fields at the top
level; dflash: fill-in, no heads.
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
    narrowed,
    our_ids,
    require,
    speculators_config,
    t2d_mask,
    vllm_ids,
    write,
)

NAME = "speculators"
KIND = "block"
READS_BIN = False
KINDS = ("dspark", "dflash")
# t2d is training-only; the verifier's head and norm are the target's (excluded on save, skipped if present).
KEYS = KeyTable()


def detect(cfg: dict, where: str) -> bool:
    kind = cfg.get("speculators_model_type")
    if kind is None or kind == "eagle3":  # (an EAGLE-3 draft is `dspark.formats.eagle3.speculators`')
        return False
    if kind not in KINDS:
        raise DSparkError(f"{where}: speculators_model_type '{kind}' is not a DSpark, DFlash or EAGLE-3 draft")
    return True


def parse(cfg: dict, where: str, backbone: Callable) -> dict:
    """DraftConfig fields; `backbone(hf_dict, where)` reads the Qwen3 backbone fields."""
    kind = cfg["speculators_model_type"]
    layer_cfg = dict(cfg.get("transformer_layer_config") or {})
    if not layer_cfg:
        raise DSparkError(f"{where}: speculators config lacks 'transformer_layer_config'")
    layer_cfg.setdefault("model_type", "qwen3")
    aux = require(cfg, "aux_hidden_state_layer_ids", where)
    heads = markov_fields(cfg, enabled=kind == "dspark")
    b = backbone(layer_cfg, where)
    return {
        "format": NAME,
        "backbone": b,
        "block_size": int(cfg.get("block_size", 8)),
        "target_layer_ids": our_ids(aux),
        "sample_from_anchor": bool(cfg.get("sample_from_anchor", kind == "dspark")),
        "mask_token_id": int(require(cfg, "mask_token_id", where)),
        **heads,
        "draft_vocab_size": narrowed(cfg.get("draft_vocab_size"), b.vocab_size),
        "architecture": architecture(cfg),
    }


def load_extras(path: Path, model: nn.Module) -> None:
    load_mask_file(path, model)  # none is shipped in this format, but one beside it is read, as for every format


def save(model: nn.Module, out: Path, num_target_layers: int | None, verifier: str, with_embeddings: bool) -> None:
    cfg = model.config
    b = cfg.backbone
    kind = "dspark" if cfg.markov_rank > 0 or cfg.sample_from_anchor else "dflash"
    hf = {
        "architectures": ["DSparkSpeculator" if kind == "dspark" else "DFlashSpeculator"],
        "speculators_model_type": kind,
        "speculators_config": speculators_config(kind, cfg.num_drafts, verifier),
        "transformer_layer_config": b.hf_fields() | {"layer_types": full_attention(b.num_layers)},
        "draft_vocab_size": cfg.vocab_size, "block_size": cfg.block_size,
        "aux_hidden_state_layer_ids": vllm_ids(cfg.target_layer_ids),
        "mask_token_id": cfg.mask_token_id, "target_hidden_size": b.hidden_size,
        "sample_from_anchor": cfg.sample_from_anchor,
    }
    if kind == "dspark":
        hf |= {"markov_rank": cfg.markov_rank, "markov_head_type": cfg.markov_head_type or "vanilla",
               "enable_confidence_head": cfg.confidence_head,
               "confidence_head_with_markov": cfg.confidence_head_with_markov}
    state = draft_state(model, with_embeddings)
    if cfg.reduced_vocab:  # d2t is a buffer of the model, already in the state
        state["t2d"] = t2d_mask(model)
    write(out, hf, state)

"""What the EAGLE-3 formats share: the tapped layers (vLLM's ids and its default), the normalised
fields, the flags no format here supports, the tensors written under a format's names, and how
EAGLE-3 weights are told from a block draft's by their shapes alone."""

from __future__ import annotations

from pathlib import Path

from torch import Tensor, nn

from dspark.errors import DSparkError
from dspark.formats.common import KeyTable, draft_state, narrowed, our_ids, t2d_mask

# The chain length a checkpoint suggests when it names none: the EAGLE authors' and DeepSpec's
# training-time-test length (a run may set another).
DEFAULT_TOKENS = 7
# What saved configs give as max_position_embeddings: vLLM needs one (its Qwen3-style draft reads it) and
# raises a smaller one to the target's max_model_len; the draft's RoPE has no length limit here.
MAX_POSITIONS = 32768
# vLLM and speculators flags of variants the draft model here does not implement (all default false).
UNSUPPORTED_FLAGS = ("norm_before_fc", "fc_norm", "norm_output")


def vllm_default_taps(num_target_layers: int) -> list[int]:
    """The taps vLLM (and speculators, SGLang) use when a draft names none, in vLLM's convention."""
    n = num_target_layers
    return [2, n // 2, n - 3]


def tapped_layers(cfg: dict, where: str) -> tuple[int, ...]:
    """Our tap ids from a config in vLLM's convention: `eagle_aux_hidden_state_layer_ids` at the top level
    (what vLLM reads first) or in `eagle_config`, else vLLM's default for `num_target_layers` (the
    checkpoint alone does not know its target's depth otherwise)."""
    top = cfg.get("eagle_aux_hidden_state_layer_ids")
    nested = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if top and nested and list(top) != list(nested):
        raise DSparkError(f"{where}: eagle_aux_hidden_state_layer_ids {list(top)} (top level) and {list(nested)} "
                          "(eagle_config) differ; vLLM would tap one and size fc by the other; keep one list")
    ids = top or nested
    if not ids:
        layers = cfg.get("num_target_layers")
        if not layers:
            raise DSparkError(f"{where}: config.json does not say which target layers the draft taps; add "
                              "eagle_config.eagle_aux_hidden_state_layer_ids (vLLM's default for an L-layer target: "
                              "[2, L//2, L-3])")
        ids = vllm_default_taps(int(layers))
    return our_ids(ids)


def layer_config(cfg, model_type: str) -> dict:
    """The Hugging Face fields of the draft layer of `cfg` (an Eagle3Config), for a saved config."""
    return cfg.backbone.hf_fields() | {"model_type": model_type, "max_position_embeddings": MAX_POSITIONS}


def refuse_unsupported(cfg: dict, where: str) -> None:
    """One line for an EAGLE-3 variant flag this engine does not implement."""
    for flag in UNSUPPORTED_FLAGS:
        if cfg.get(flag):
            raise DSparkError(f"{where}: {flag}=true is not supported (EAGLE-3 drafts without it are); "
                              "run this draft with vLLM (--backend vllm)")


def fields(name: str, backbone, taps: tuple[int, ...], *, tokens, qk_norm: bool, norm_before_residual: bool,
           draft_vocab, target_hidden, num_target_layers, architecture: str) -> dict:
    """The `Eagle3Config` fields (normalised: a draft vocabulary or a target width equal to the full one
    is None)."""
    return {
        "format": name,
        "backbone": backbone,
        "target_layer_ids": taps,
        "num_speculative_tokens": int(tokens or DEFAULT_TOKENS),
        "qk_norm": qk_norm,
        "norm_before_residual": bool(norm_before_residual),
        "draft_vocab_size": narrowed(draft_vocab, backbone.vocab_size),
        "target_hidden_size": narrowed(target_hidden, backbone.hidden_size),
        "num_target_layers": int(num_target_layers) if num_target_layers else None,
        "architecture": architecture,
    }


def state(model: nn.Module, keys: KeyTable, with_embeddings: bool) -> dict[str, Tensor]:
    """An EAGLE-3 draft's tensors under the format's names: its head always (its own, over the draft
    vocabulary), its copy of the target's embedding only `with_embeddings`, and `t2d` beside `d2t` for a
    reduced vocabulary, as the trainers write it."""
    out = draft_state(model, with_embeddings=True)
    if not with_embeddings:
        out.pop("embed_tokens.weight", None)
    out = {keys.stored(k): v for k, v in out.items()}
    if model.config.reduced_vocab:
        out["t2d"] = t2d_mask(model)
    return out


def load_extras(path: Path, model: nn.Module) -> None:
    """EAGLE-3 checkpoints hold nothing besides their config and tensors."""


def weights_signature(found: dict[str, tuple[int, ...]]) -> str | None:
    """What marks tensors (stored names -> shapes) as an EAGLE-3 draft's, in words, or None: a first layer
    whose q_proj reads twice the width its o_proj writes (the token embedding beside the hidden state); a
    block draft's reads the hidden state alone."""
    for prefix in ("midlayer.", "layers.0."):
        q, o = found.get(prefix + "self_attn.q_proj.weight"), found.get(prefix + "self_attn.o_proj.weight")
        if q is not None and o is not None and len(q) == 2 and len(o) == 2 and q[1] == 2 * o[0]:
            return (f"{prefix}self_attn.q_proj reads 2 x {o[0]} inputs: token embedding and hidden state")
    return None

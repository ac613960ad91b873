"""z-lab's DFlash format (`DFlashDraftModel`; spec §1.2).

A flat Qwen3 config with the DFlash fields nested in `dflash_config` (SpecForge-style DSpark knobs
also nest there, with `projector_type: "dspark"`); fill-in unless that says otherwise. No embedding
or head tensors (the target's are used); an optional `mask_embedding.pt` holds a separate mask row.

Read as z-lab's own code (`dflash/model.py`, package 0.1.0) reads it, so that both layouts it ships run
as it runs them: each DFlash field from `dflash_config` first, then the top level (early checkpoints keep
`block_size` at the top, releases since June 2026 inside `dflash_config`), with z-lab's defaults; the layer
kinds from the top-level Qwen3 fields (`layer_types`, `is_causal`, `use_sliding_window`, `sliding_window`,
`max_window_layers`). A DFlash 2 draft (`DFlash2DraftModel`, `dspark.models.dflash2`) adds its convolution and
selector fields, read the same way, and its two codebooks, which z-lab's releases store without `.weight` (its
`from_pretrained` maps them; both names load here, and ours are saved as the releases store them).
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
CODEBOOKS = ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook")  # stored bare
KEYS = KeyTable(bare=CODEBOOKS)


# z-lab's DFlash 2 (DFlash2DraftModel): its architecture and the fields only it reads
DFLASH2 = "DFlash2DraftModel"
DFLASH2_FIELDS = ("selector_rank", "selector_top_k", "conv_kernel_size", "conv_group_size")
LAYER_TYPES = ("full_attention", "sliding_attention")
BLOCK_SIZE_DEFAULT = 16  # z-lab's when neither dflash_config nor the top level sets block_size


def detect(cfg: dict, where: str) -> bool:
    dcfg = cfg.get("dflash_config")
    marker = next((k for k in DFLASH2_FIELDS if k in cfg or k in (dcfg or {})), None)
    arch = architecture(cfg)
    if marker and arch != DFLASH2 and (dcfg is not None or "DFlash" in arch):
        raise DSparkError(f"{where}: config.json sets DFlash 2's '{marker}' under architecture {arch or '(none)'}; "
                          f"z-lab runs DFlash 2 as {DFLASH2} only: set architectures to [\"{DFLASH2}\"], or drop "
                          "the DFlash 2 fields for a DFlash draft")
    if dcfg is None and arch not in ("DFlashDraftModel", DFLASH2):
        return False
    if dcfg is None and "mask_token_id" not in cfg:
        raise DSparkError(f"{where}: DFlashDraftModel config lacks 'dflash_config' (and a top-level mask_token_id)")
    return True


def _value(cfg: dict, key: str, default=None):
    """A DFlash field as z-lab reads it: `dflash_config` first, then the top level, then its default."""
    return (cfg.get("dflash_config") or {}).get(key, cfg.get(key, default))


def _required(cfg: dict, key: str, where: str):
    value = _value(cfg, key)
    if value is None:
        raise DSparkError(f"{where}: config.json sets '{key}' neither in dflash_config nor at the top level")
    return value


def _target_layer_ids(cfg: dict, where: str) -> tuple[int, ...]:
    """z-lab's taps, or where none are given its default spread over `num_target_layers`."""
    ids = _value(cfg, "target_layer_ids")
    if ids is not None:
        return tuple(int(i) for i in ids)
    n, layers = cfg.get("num_target_layers"), int(require(cfg, "num_hidden_layers", where))
    if n is None:
        raise DSparkError(f"{where}: config.json sets neither 'target_layer_ids' nor 'num_target_layers' (z-lab "
                          "spreads the taps over the target's layers); add one of them")
    n = int(n)
    if layers == 1:
        return (n // 2,)
    return tuple(round(1 + i * (n - 4) / (layers - 1)) for i in range(layers))


def _layers(cfg: dict, where: str) -> dict:
    """Per draft layer, whether it is causal and its sliding window, as z-lab's attention sets them: the
    layer kinds of `layer_types` (else Qwen3's default: sliding from `max_window_layers` on when
    `use_sliding_window`), sliding layers causal and full ones not unless a top-level `is_causal` says for
    all; a window only where `use_sliding_window` is on (Qwen3's config drops `sliding_window` otherwise)."""
    n = int(require(cfg, "num_hidden_layers", where))
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
    types = cfg.get("layer_types")
    if types is None:
        first = int(cfg.get("max_window_layers", 28))
        types = ["sliding_attention" if window is not None and i >= first else "full_attention" for i in range(n)]
    bad = [t for t in types if t not in LAYER_TYPES]
    if len(types) != n or bad:
        raise DSparkError(f"{where}: layer_types {list(types)} must name each of the {n} draft layers as one of "
                          f"{', '.join(LAYER_TYPES)}")
    if window is None and "sliding_attention" in types:
        raise DSparkError(f"{where}: layer_types has sliding_attention layers but no sliding window (z-lab's code "
                          "cannot run them without one); set use_sliding_window true and sliding_window")
    is_causal = cfg.get("is_causal")
    causal = tuple(t == "sliding_attention" if is_causal is None else bool(is_causal) for t in types)
    windows = tuple(int(window) if t == "sliding_attention" and window is not None else None for t in types)
    return {"layer_causal": causal if any(causal) else (), "layer_window": windows if any(windows) else ()}


def _dflash2(cfg: dict, where: str) -> dict:
    """DFlash 2's convolution and selector fields (none for a DFlash draft), each required as z-lab's code
    requires it, and refused where z-lab's modules could not be built of them."""
    if architecture(cfg) != DFLASH2:
        return {}
    if (cfg.get("dflash_config") or {}).get("projector_type") == "dspark":
        raise DSparkError(f"{where}: a {DFLASH2} with projector_type dspark (a Markov head); z-lab's DFlash 2 has "
                          "none: drop projector_type")
    out = {key: int(_required(cfg, key, where)) for key in DFLASH2_FIELDS}
    small = next((key for key, value in out.items() if value < 1), None)
    if small:
        raise DSparkError(f"{where}: {small} {out[small]} must be at least 1")
    hidden, vocab = int(require(cfg, "hidden_size", where)), int(require(cfg, "vocab_size", where))
    if hidden % out["conv_group_size"]:
        raise DSparkError(f"{where}: conv_group_size {out['conv_group_size']} does not divide hidden_size {hidden} "
                          "(the convolution's channel groups); the config does not fit its draft: use a divisor of hidden_size "
                          f"{hidden}")
    if out["selector_top_k"] > vocab:
        raise DSparkError(f"{where}: selector_top_k {out['selector_top_k']} is more than the vocabulary ({vocab}); "
                          f"set it to at most {vocab}")
    return out


def _scalars(cfg: dict) -> dict:
    """The logit and embedding scalars z-lab applies (1.0 / none where unset)."""
    cap = _value(cfg, "final_logit_softcapping")
    return {"input_embedding_scale": float(_value(cfg, "input_embedding_scale", 1.0)),
            "output_multiplier": float(_value(cfg, "output_multiplier", 1.0)),
            "final_logit_softcapping": float(cap) if cap is not None and float(cap) > 0 else None}


def _sample_from_anchor(dcfg: dict, dspark: bool, where: str) -> bool:
    """Anchor-first or fill-in: SpecForge's `sample_from_anchor`, which only its DSpark drafts (`projector_type
    dspark`) set; z-lab's code never reads it (its DFlash and DFlash 2 drafts are fill-in), so a z-lab draft that
    sets it true would decode another layout than `dflash_generate`: refused."""
    if dcfg.get("sample_from_anchor") and not dspark:
        raise DSparkError(f"{where}: dflash_config.sample_from_anchor true without projector_type dspark; z-lab's code "
                          "never reads it (its drafts are fill-in): drop sample_from_anchor, or set projector_type "
                          "dspark for a SpecForge DSpark draft")
    return bool(dcfg.get("sample_from_anchor", dspark))


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
        "backbone": backbone(cfg | {"use_sliding_window": False}, where),  # its windows: `_layers`
        "block_size": int(_value(cfg, "block_size", BLOCK_SIZE_DEFAULT)),
        "target_layer_ids": _target_layer_ids(cfg, where),
        "sample_from_anchor": _sample_from_anchor(dcfg, dspark, where),
        "mask_token_id": int(_required(cfg, "mask_token_id", where)),
        **heads,
        **_layers(cfg, where),
        **_scalars(cfg),
        **_dflash2(cfg, where),
        "num_target_layers": cfg.get("num_target_layers"),
        "architecture": architecture(cfg),
    }


def load_extras(path: Path, model: nn.Module) -> None:
    load_mask_file(path, model)


def save(model: nn.Module, out: Path, num_target_layers: int | None, verifier: str, with_embeddings: bool) -> None:
    """Always without the embedding and head copies, as z-lab's checkpoints are (DFlash 2's codebooks bare)."""
    state = {KEYS.stored(k): v for k, v in draft_state(model, with_embeddings=False).items()}
    hf = hf_config(model.config, num_target_layers)
    if model.mask_embedding is not None:
        torch.save(model.mask_embedding.detach().cpu().clone(), out / MASK_FILE)
    write(out, hf, state)


def hf_config(cfg, num_target_layers: int | None) -> dict:
    """The `config.json` of a fill-in DFlash draft of `cfg` in z-lab's layout (also a random draft's): a DFlash 2
    draft's `block_size` inside `dflash_config`, as z-lab's current releases keep it; a DFlash draft's at the top
    level, as its early checkpoints (and the vLLM versions that read only those) keep it."""
    if cfg.sample_from_anchor or cfg.markov_rank or cfg.reduced_vocab:
        raise DSparkError("the z-lab format holds fill-in DFlash drafts over the full vocabulary only")
    b = cfg.backbone
    scalars = {k: v for k, v in _scalars(vars(cfg)).items() if v != _scalars({})[k]}
    arch = DFLASH2 if cfg.selector_rank else "DFlashDraftModel"
    dflash2 = {key: getattr(cfg, key) for key in ("block_size", *DFLASH2_FIELDS)} if cfg.selector_rank else {}
    top = {} if cfg.selector_rank else {"block_size": cfg.block_size}
    return b.hf_fields() | {
        "architectures": [arch], "auto_map": {"AutoModel": f"dflash.{arch}"},
        **top, "num_target_layers": num_target_layers, "tie_word_embeddings": True,
        "dflash_config": {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids),
                          **scalars, **dflash2},
    } | _layer_fields(cfg)


def _layer_fields(cfg) -> dict:
    """`layer_types` (and `is_causal`, the window) that `_layers` reads back as `cfg`'s layers."""
    n = cfg.backbone.num_layers
    if not cfg.layer_causal and not cfg.layer_window:
        return {"layer_types": full_attention(n)}
    causal = cfg.layer_causal or (False,) * n
    windows = cfg.layer_window or (None,) * n
    sliding = [c if len(set(causal)) > 1 else w is not None for c, w in zip(causal, windows)]
    out = {"layer_types": ["sliding_attention" if s else "full_attention" for s in sliding]}
    if any(c != s for c, s in zip(causal, sliding)):
        out["is_causal"] = causal[0]
    sizes = {w for w in windows if w is not None}
    if sizes:
        out |= {"use_sliding_window": True, "sliding_window": sizes.pop(), "max_window_layers": 0}
    return out

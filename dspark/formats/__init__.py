"""The draft checkpoint formats, one module each, and which one a config.json is.

Every format module has the same parts: `NAME`; `KIND` ("block": a DSpark/DFlash draft, read into
`dspark.models.config.DraftConfig`; "eagle3": an EAGLE-3 draft, read into `Eagle3Config`); `detect(cfg,
where)` (is this config mine? raises for a config that claims the format but cannot be one);
`parse(cfg, where, backbone)` (the fields of its normalised config); `KEYS` (its tensor key table:
the ignored tensors, and the names it stores otherwise than the model); `READS_BIN` (whether a
`pytorch_model.bin` is read, with `weights_only`, where no safetensors exist); `load_extras(path,
model)` (files besides config and tensors); and `save(model, out, num_target_layers, verifier,
with_embeddings)`. Loading, resolving and checking are `dspark.checkpoint`'s, for all formats alike.
The EAGLE-3 formats are the subpackage `dspark.formats.eagle3`.
"""

from __future__ import annotations

from types import ModuleType
from typing import Callable

from dspark.errors import DSparkError
from dspark.formats import deepspec, speculators, zlab
from dspark.formats.eagle3 import authors as eagle3_authors
from dspark.formats.eagle3 import deepspec as eagle3_deepspec
from dspark.formats.eagle3 import speculators as eagle3_speculators

FORMATS: dict[str, ModuleType] = {m.NAME: m for m in (deepspec, speculators, zlab, eagle3_authors,
                                                      eagle3_speculators, eagle3_deepspec)}
# Asked in this order: the EAGLE-3 formats first (each asks for what only it has: speculators_model_type
# eagle3, Qwen3Eagle3Model, an ...Eagle3 architecture), then the block ones: speculators exports may also say
# Qwen3DSparkModel, and z-lab configs are flat Qwen3 ones.
DETECTION_ORDER = (eagle3_speculators, eagle3_deepspec, eagle3_authors, speculators, zlab, deepspec)


def names(kind: str) -> list[str]:
    """The formats that hold drafts of `kind` ("block" or "eagle3")."""
    return [name for name, m in FORMATS.items() if m.KIND == kind]


def detect_format(cfg: dict, where: str = "draft") -> str:
    """The format of a draft's config.json; none claiming it is one line: a Qwen3 causal LM (a target's layout, as
    the classic draft model is saved) named as the draft model it can be, anything else with the formats we read."""
    for fmt in DETECTION_ORDER:
        if fmt.detect(cfg, where):
            return fmt.NAME
    architectures = cfg.get("architectures")
    if cfg.get("model_type") == "qwen3" and any(str(a).endswith("ForCausalLM") for a in architectures or []):
        raise DSparkError(f"{where}: a Qwen3 causal LM (architectures={architectures}), not a draft of a block or "
                          "EAGLE-3 format; such a model drafts as a draft model: set method draft_model (with "
                          "num_speculative_tokens)")
    raise DSparkError(
        f"{where}: unknown draft format (architectures={architectures}); expected a DeepSpec "
        "Qwen3DSparkModel, a speculators dspark/dflash, a z-lab DFlashDraftModel or DFlash2DraftModel, or an EAGLE-3 "
        "(LlamaForCausalLMEagle3, speculators eagle3, Qwen3Eagle3Model) config"
    )


def get(name: str) -> ModuleType:
    if name not in FORMATS:
        raise DSparkError(f"unknown draft format '{name}'; use one of {', '.join(FORMATS)}")
    return FORMATS[name]


def parse_any(cfg: dict, where: str, backbone: Callable) -> tuple[str, dict]:
    """(kind, fields) of a draft config.json in any format: "block" with DraftConfig fields, "eagle3"
    with Eagle3Config fields."""
    fmt = FORMATS[detect_format(cfg, where)]
    return fmt.KIND, fmt.parse(cfg, where, backbone)


def parse(cfg: dict, where: str, backbone: Callable) -> dict:
    """The DraftConfig fields of a DSpark/DFlash draft config.json in any block format."""
    fmt = FORMATS[detect_format(cfg, where)]
    if fmt.KIND != "block":
        raise DSparkError(f"{where}: an EAGLE-3 draft ({fmt.NAME} format), not a DSpark/DFlash one; it runs as "
                          "method eagle3")
    return fmt.parse(cfg, where, backbone)


__all__ = ["FORMATS", "DETECTION_ORDER", "detect_format", "get", "names", "parse", "parse_any", "deepspec",
           "speculators", "zlab", "eagle3_authors", "eagle3_deepspec", "eagle3_speculators"]

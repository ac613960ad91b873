"""The draft checkpoint formats, one module each, and which one a config.json is.

Every format module has the same parts: `NAME`; `detect(cfg, where)` (is this config mine? raises
for a config that claims the format but cannot be one); `parse(cfg, where, backbone)` (the fields
of the normalised `dspark.config.DraftConfig`); `KEYS` (its tensor key table: the ignored
tensors); `load_extras(path, model)` (files besides config and safetensors); and
`save(model, out, num_target_layers, verifier, with_embeddings)`. Loading, resolving and checking
are `dspark.checkpoint`'s, for all formats alike.
"""

from __future__ import annotations

from types import ModuleType
from typing import Callable

from dspark.errors import DSparkError
from dspark.formats import deepspec, speculators, zlab

FORMATS: dict[str, ModuleType] = {m.NAME: m for m in (deepspec, speculators, zlab)}
# Asked in this order: speculators exports may also say Qwen3DSparkModel, and z-lab configs are flat Qwen3 ones.
DETECTION_ORDER = (speculators, zlab, deepspec)


def detect_format(cfg: dict, where: str = "draft") -> str:
    for fmt in DETECTION_ORDER:
        if fmt.detect(cfg, where):
            return fmt.NAME
    raise DSparkError(
        f"{where}: unknown draft format (architectures={cfg.get('architectures')}); expected a DeepSpec "
        "Qwen3DSparkModel, a speculators dspark/dflash, or a z-lab DFlashDraftModel config"
    )


def get(name: str) -> ModuleType:
    if name not in FORMATS:
        raise DSparkError(f"unknown draft format '{name}'; use deepspec, speculators or zlab")
    return FORMATS[name]


def parse(cfg: dict, where: str, backbone: Callable) -> dict:
    """The DraftConfig fields of a draft config.json in any format."""
    return FORMATS[detect_format(cfg, where)].parse(cfg, where, backbone)


__all__ = ["FORMATS", "DETECTION_ORDER", "detect_format", "get", "parse", "deepspec", "speculators", "zlab"]

"""What the draft formats share: reading config.json fields, the Markov and confidence fields (one
parse for every format), tensor key tables, and writing a draft's config and tensors."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from safetensors.torch import save_file
from torch import Tensor, nn

from dspark.errors import DSparkError

# Non-persistent buffers that older transformers versions wrote into checkpoints; never weights.
HF_BUFFERS = ("rotary_emb.inv_freq",)


def require(cfg: dict, key: str, where: str) -> Any:
    if key not in cfg:
        raise DSparkError(f"{where}: config.json lacks '{key}'; is this a Qwen3 checkpoint?")
    return cfg[key]


def architecture(cfg: dict) -> str:
    return (cfg.get("architectures") or [""])[0]


def markov_fields(src: dict, enabled: bool = True) -> dict:
    """The DraftConfig fields of the Markov and confidence heads, read from `src` (the flat config,
    or the dict a format nests them in); `enabled=False`: a format variant without these heads."""
    rank = int(src.get("markov_rank", 0) or 0) if enabled else 0
    conf = enabled and bool(src.get("enable_confidence_head", False))
    return {
        "markov_rank": rank,
        "markov_head_type": (src.get("markov_head_type") or "vanilla") if rank > 0 else None,
        "confidence_head": conf,
        "confidence_head_with_markov": conf and rank > 0 and bool(src.get("confidence_head_with_markov", True)),
    }


@dataclass(frozen=True)
class KeyTable:
    """How a format's stored tensor names relate to the model's parameter names."""

    ignored: tuple[str, ...] = HF_BUFFERS  # stored tensors no weight corresponds to (suffixes), skipped on load
    renames: dict[str, str] = field(default_factory=dict)  # stored name -> the model's name

    def is_ignored(self, key: str) -> bool:
        return any(key.endswith(s) for s in self.ignored)

    def to_model(self, stored: dict) -> dict:
        """Stored names (of tensors or of shapes) as the model's."""
        return {self.renames.get(k, k): v for k, v in stored.items()} if self.renames else stored

    def to_stored(self, state: dict) -> dict:
        back = {v: k for k, v in self.renames.items()}
        return {back.get(k, k): v for k, v in state.items()} if back else state


def draft_state(model: nn.Module, with_embeddings: bool) -> dict[str, Tensor]:
    """A draft's tensors to save; `with_embeddings=False` leaves out its copies of the target's
    embedding and head."""
    state, seen = {}, set()
    for k, v in model.state_dict().items():
        if k != "mask_embedding":  # a tied head (a draft loaded with the target's) is written as its own copy
            state[k] = v.clone() if v.data_ptr() in seen else v.contiguous()
            seen.add(v.data_ptr())
    if not with_embeddings:
        state = {k: v for k, v in state.items() if not k.startswith(("embed_tokens.", "lm_head."))}
    return state


def write(out: Path, hf: dict, state: dict[str, Tensor], keys: KeyTable) -> None:
    (out / "config.json").write_text(json.dumps(hf, indent=2))
    save_file(keys.to_stored(state), out / "model.safetensors")


def full_attention(num_layers: int) -> list[str]:
    return ["full_attention"] * num_layers

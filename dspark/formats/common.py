"""What the draft formats share: reading config.json fields, the Markov and confidence fields (one
parse for every format), tensor key tables, and writing a draft's config and tensors."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
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


# Stored tensors no weight corresponds to: skipped on load in every format and in targets, as before the
# formats had modules of their own (speculators' vocabulary maps and verifier copies; HF's rotary buffer)
SKIPPED = HF_BUFFERS + ("t2d", "verifier_lm_head", "verifier_norm")


@dataclass(frozen=True)
class KeyTable:
    """Which stored tensors a format skips on load (by name suffix), the name prefixes it stores
    otherwise than the model calls them ((stored, ours) pairs, e.g. speculators' `layers.0.` for the
    EAGLE-3 draft's `midlayer.`), and the weights it stores without their `.weight` suffix (`bare`: z-lab's
    DFlash 2 codebooks; read with it too); every other name is the model's own."""

    ignored: tuple[str, ...] = SKIPPED
    renames: tuple[tuple[str, str], ...] = ()
    bare: tuple[str, ...] = ()

    def is_ignored(self, key: str) -> bool:
        return any(key.endswith(s) for s in self.ignored)

    def ours(self, key: str) -> str:
        """The model's name of stored tensor `key`."""
        return key + ".weight" if key in self.bare else _swap_prefix(key, self.renames)

    def stored(self, key: str) -> str:
        """The format's name of the model's tensor `key`."""
        if key.removesuffix(".weight") in self.bare:
            return key.removesuffix(".weight")
        return _swap_prefix(key, tuple((own, stored) for stored, own in self.renames))

    def canonical(self, key: str) -> str:
        """A stored name as the format writes it (a bare weight stored with its `.weight` is read as without)."""
        return key.removesuffix(".weight") if key.removesuffix(".weight") in self.bare else key


def _swap_prefix(key: str, pairs: tuple[tuple[str, str], ...]) -> str:
    for old, new in pairs:
        if key.startswith(old):
            return new + key[len(old):]
    return key


def vllm_ids(ours) -> list[int]:
    """Tapped layers in vLLM's convention (`aux_hidden_state_layer_ids`, `eagle_aux_hidden_state_layer_ids`:
    id k is the state before layer k, HF's hidden_states[k]) from ours (the output of 0-based layer i): + 1."""
    return [int(i) + 1 for i in ours]


def our_ids(vllm) -> tuple[int, ...]:
    """The inverse of `vllm_ids`."""
    return tuple(int(i) - 1 for i in vllm)


def narrowed(value, full: int) -> int | None:
    """A draft vocabulary (or width) field as the normalised configs keep it: None when absent or `full`."""
    return int(value) if value and int(value) != full else None


def t2d_mask(model: nn.Module) -> Tensor:
    """The training-only target-to-draft mask that reduced-vocabulary checkpoints carry beside d2t: True at
    the target ids the draft vocabulary holds."""
    t2d = torch.zeros(model.config.backbone.vocab_size, dtype=torch.bool)
    t2d[model.target_ids().cpu()] = True
    return t2d


def speculators_config(algorithm: str, tokens: int, verifier: str) -> dict:
    """The `speculators_config` block of a speculators export: one greedy proposal method of `tokens`."""
    return {
        "algorithm": algorithm,
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": tokens}],
        "default_proposal_method": "greedy",
        "verifier": {"name_or_path": verifier, "architectures": ["Qwen3ForCausalLM"]},
    }


MASK_FILE = "mask_embedding.pt"


def load_mask_file(path: Path, model: nn.Module) -> None:
    """A separate mask row (`mask_embedding.pt`, z-lab's), in any format's folder that has one, read
    without running pickled code."""
    mask_file = path / MASK_FILE
    if not mask_file.is_file():
        return
    hidden = model.config.backbone.hidden_size
    try:
        mask = torch.load(mask_file, weights_only=True, map_location="cpu")
    except Exception as exc:
        raise DSparkError(f"{mask_file}: unreadable ({type(exc).__name__}); re-download the checkpoint") from None
    if not isinstance(mask, Tensor) or mask.numel() != hidden:
        raise DSparkError(f"{mask_file}: expected a tensor of {hidden} values")
    model.mask_embedding = nn.Parameter(mask.reshape(-1), requires_grad=False)


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


def write(out: Path, hf: dict, state: dict[str, Tensor]) -> None:
    (out / "config.json").write_text(json.dumps(hf, indent=2))
    save_safetensors(state, out / "model.safetensors")


def save_safetensors(state: dict[str, Tensor], path: Path) -> None:
    """`save_file`, the file given the mode any new file gets (0644 under the usual umask): safetensors
    writes a private temporary file (0600) and renames it, which left the weights unreadable to the
    group and others beside a readable config."""
    save_file({k: v.contiguous() for k, v in state.items()}, path)  # (a CPU model's products are column-major)
    umask = os.umask(0o022)  # (reading the umask means setting it; it is put back at once)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def full_attention(num_layers: int) -> list[str]:
    return ["full_attention"] * num_layers

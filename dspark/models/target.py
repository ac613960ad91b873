"""Our Qwen3 target: the forward that verifies blocks and decodes plainly, tapping hidden states.

Parameter names are those of Hugging Face's `Qwen3ForCausalLM`, so its safetensors load as they are.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dspark import kernels
from dspark.models.config import TargetConfig
from dspark.models.layers import AttentionStep, DecoderLayer, KVCache, RMSNorm, init_weights, lay_out_products


class Qwen3Body(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        b = cfg.backbone
        self.embed_tokens = nn.Embedding(b.vocab_size, b.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(b) for _ in range(b.num_layers))
        self.norm = RMSNorm(b.hidden_size, b.rms_norm_eps)


class Qwen3Target(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.config = cfg
        b = cfg.backbone
        self.model = Qwen3Body(cfg)
        self.lm_head = nn.Linear(b.hidden_size, b.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def init_random(self, std: float = 0.02) -> None:
        init_weights(self, std)

    def fuse(self) -> "Qwen3Target":
        """Fuse every layer's q/k/v and gate/up projections (see `layers.FusedProjections`); called
        once the weights are final, by `load_target` and the random builders."""
        for layer in self.model.layers:
            layer.fuse()
        lay_out_products(self)
        return self

    def new_cache(self, max_len: int, batch: int = 1) -> KVCache:
        b = self.config.backbone
        w = self.lm_head.weight
        return KVCache(b.num_layers, batch, b.num_kv_heads, max_len, b.head_dim, w.dtype, w.device, b.rope_theta)

    def forward(self, input_ids: Tensor, positions: Tensor | None, cache: KVCache, kv_len: int,
                taps: tuple[int, ...] = ()) -> tuple[Tensor, Tensor | None]:
        """Causal forward of `input_ids` [B, T] at `positions` [B, T], keys 0..kv_len-1 visible.
        `positions=None` is a prefill from position 0 (kv_len = T), which attention can run as plainly
        causal, with no mask.

        Returns the final-normed hidden states [B, T, H] and, when `taps` is given, the outputs of
        those decoder layers concatenated in order [B, T, len(taps)*H] (-1: the embedding output).
        """
        x = self.model.embed_tokens(input_ids)
        prefill = positions is None
        if prefill:
            if kv_len != input_ids.shape[1]:
                raise ValueError(f"a prefill (positions=None) sees its own {input_ids.shape[1]} keys, not {kv_len}")
            positions = torch.arange(kv_len, device=input_ids.device)[None].expand(input_ids.shape[0], kv_len)
        step = AttentionStep.build(positions, positions, kv_len, self.config.backbone, x.dtype, causal=prefill,
                                   tables=cache.rope)
        tapped = [x] if -1 in taps else []
        for i, layer in enumerate(self.model.layers):
            x = layer(x, step, cache, i)
            if i in taps:
                tapped.append(x)
        feats = torch.cat(tapped, dim=-1) if taps else None
        return self.model.norm(x), feats

    def logits(self, hidden: Tensor) -> Tensor:
        return kernels.linear(hidden, self.lm_head.weight).float()


def weights_bytes(cfg: TargetConfig, dtype: torch.dtype) -> int:
    """What the target's weights weigh in `dtype` (its parameter count times the dtype's size), counted on
    the meta device: nothing is allocated. A `random:` target has no weight files to measure, and "0 MB"
    both misled the reader and chose one thread for an 8B model."""
    with torch.device("meta"):
        model = Qwen3Target(cfg)
    return sum(p.numel() for p in model.parameters()) * torch.empty((), dtype=dtype).element_size()

"""Qwen3 building blocks shared by the target and the draft: RMSNorm, RoPE, GQA attention, SwiGLU.

Attention reads keys and values from a cache addressed by absolute position, so one layer serves
the causal target (a query sees keys at positions <= its own) and the non-causal draft block (every
block query sees the context before the anchor and the whole block). What a query may see is given
per forward as a boolean mask built once for all layers (`AttentionStep`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dspark.config import BackboneConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos/sin tables [..., head_dim] for absolute `positions` (computed in float32, as transformers does)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: [B, heads, T, D]; cos/sin: [B, T, D]."""
    cos, sin = cos[:, None], sin[:, None]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


@dataclass
class AttentionStep:
    """What every layer of one forward shares: query positions, RoPE tables and the visibility mask."""

    positions: Tensor  # [B, T] absolute positions of the queries; their K/V are written there
    cos: Tensor
    sin: Tensor
    mask: Tensor  # [B, 1, T, kv_len] bool, True where the query may attend to the key
    kv_len: int  # keys at positions 0..kv_len-1 are read from the cache

    @classmethod
    def build(cls, positions: Tensor, limits: Tensor, kv_len: int, cfg: BackboneConfig, dtype: torch.dtype):
        """`limits[b, t]`: the highest key position query (b, t) may see (its own position when causal)."""
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, dtype)
        key_pos = torch.arange(kv_len, device=positions.device)
        mask = (key_pos <= limits[..., None])[:, None]
        return cls(positions, cos, sin, mask, kv_len)


class KVCache:
    """Preallocated K/V for every layer, addressed by absolute position.

    Rolling back after a rejection needs no work here: the engine keeps the committed length, later
    writes overwrite the stale rows, and the mask never lets a query see a position above its limit.
    """

    def __init__(self, num_layers: int, batch: int, num_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        shape = (num_layers, batch, num_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def write(self, layer: int, positions: Tensor, k: Tensor, v: Tensor) -> None:
        """k, v: [B, kv_heads, T, D] for the tokens at `positions` [B, T]."""
        rows = torch.arange(positions.shape[0], device=positions.device)[:, None]
        self.k[layer][rows, :, positions] = k.transpose(1, 2)
        self.v[layer][rows, :, positions] = v.transpose(1, 2)

    def read(self, layer: int, kv_len: int) -> tuple[Tensor, Tensor]:
        return self.k[layer, :, :, :kv_len], self.v[layer, :, :, :kv_len]


class Attention(nn.Module):
    def __init__(self, cfg: BackboneConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=bias)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def _heads(self, x: Tensor, n: int) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, n, self.head_dim).transpose(1, 2)

    def project_kv(self, x: Tensor, step: AttentionStep) -> tuple[Tensor, Tensor]:
        """Normed, rotated keys and values [B, kv_heads, T, D] of `x` at `step.positions`."""
        k = apply_rope(self.k_norm(self._heads(self.k_proj(x), self.num_kv_heads)), step.cos, step.sin)
        return k, self._heads(self.v_proj(x), self.num_kv_heads)

    def forward(self, x: Tensor, step: AttentionStep, cache: KVCache, layer: int) -> Tensor:
        q = apply_rope(self.q_norm(self._heads(self.q_proj(x), self.num_heads)), step.cos, step.sin)
        k, v = self.project_kv(x, step)
        cache.write(layer, step.positions, k, v)
        keys, values = cache.read(layer, step.kv_len)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=step.mask,
                                             enable_gqa=self.num_heads != self.num_kv_heads)
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: BackboneConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm Qwen3 layer; parameter names follow Hugging Face's checkpoints."""

    def __init__(self, cfg: BackboneConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, step: AttentionStep, cache: KVCache, layer: int) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), step, cache, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """The usual Hugging Face init: normal(0, std) matrices and embeddings, zero biases, unit norms."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, RMSNorm):
            nn.init.ones_(m.weight)

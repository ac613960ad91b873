"""Qwen3 building blocks shared by the target and the draft: RMSNorm, RoPE, GQA attention, SwiGLU.

Attention reads keys and values from a cache addressed by absolute position, so one layer serves
the causal target (a query sees keys at positions <= its own) and the non-causal draft block (every
block query sees the context before the anchor and the whole block). What a query may see is given
per forward as a boolean mask built once for all layers (`AttentionStep`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dspark import kernels
from dspark.config import BackboneConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return kernels.rms_norm_ref(x, self.weight, self.eps)

    def add_forward(self, x: Tensor, delta: Tensor | None) -> tuple[Tensor, Tensor]:
        """(x + delta, norm(x + delta)) in one pass on the GPU."""
        return kernels.add_rms_norm(x, delta, self.weight, self.eps)


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos/sin tables [..., head_dim] for absolute `positions` (computed in float32, as transformers does)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


@dataclass
class AttentionStep:
    """What every layer of one forward shares: query positions, RoPE tables and the visibility mask."""

    positions: Tensor  # [B, T] absolute positions of the queries (RoPE)
    cos: Tensor
    sin: Tensor
    limits: Tensor  # [B, T] the highest key slot each query may see
    kv_len: int  # keys in slots 0..kv_len-1 are read from the cache
    slots: Tensor  # [B, T] cache slots the queries' K/V are written to: their positions when decoding
    mask: Tensor | None = None  # [B, 1, T, kv_len] explicit visibility (training blocks); replaces limits
    causal: bool = False  # a prefill from position 0: query t sits in slot t and sees slots <= t

    @classmethod
    def build(cls, positions: Tensor, limits: Tensor, kv_len: int, cfg: BackboneConfig, dtype: torch.dtype,
              slots: Tensor | None = None, mask: Tensor | None = None, causal: bool = False):
        """`limits[b, t]`: the highest key slot query (b, t) may see (its own position when causal)."""
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, dtype)
        return cls(positions, cos, sin, limits, kv_len, positions if slots is None else slots, mask, causal)


class KVCache:
    """Preallocated K/V for every layer, addressed by absolute position.

    Rolling back after a rejection needs no work here: the engine keeps the committed length, later
    writes overwrite the stale rows, and the mask never lets a query see a position above its limit.
    """

    def __init__(self, num_layers: int, batch: int, num_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        # One tensor per layer: a layer's writes never touch what autograd saved for another (training).
        shape = (batch, num_kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @property
    def max_len(self) -> int:
        return self.k[0].shape[2]


def _fused(module: nn.Module, attr: str, parts: list[nn.Linear]) -> tuple[Tensor, Tensor | None]:
    """One weight (and bias) for several projections of the same input, built once and kept.

    The projections' own parameters become views of it, so checkpoints, in-place updates and
    state dicts see the usual names; loading or converting a module replaces them, and the next
    call builds the fused tensor again. With autograd on (training) the parts are used as they are.
    """
    cached = getattr(module, attr, None)
    first = parts[0].weight
    if cached is None or cached[0].data_ptr() != first.data_ptr() or cached[0].dtype != first.dtype:
        # built as a normal tensor even inside inference mode: the parameters become views of it, and
        # a model that generated must still train afterwards
        with torch.inference_mode(False), torch.no_grad():
            weight = torch.cat([p.weight.detach() for p in parts])
            bias = torch.cat([p.bias.detach() for p in parts]) if parts[0].bias is not None else None
        offset = 0
        for p in parts:
            rows = p.weight.shape[0]
            p.weight = nn.Parameter(weight[offset : offset + rows], requires_grad=p.weight.requires_grad)
            if bias is not None:
                p.bias = nn.Parameter(bias[offset : offset + rows], requires_grad=p.bias.requires_grad)
            offset += rows
        cached = (weight, bias)
        object.__setattr__(module, attr, cached)
    return cached


def _project(module: nn.Module, attr: str, parts: list[nn.Linear], x: Tensor) -> Tensor:
    if torch.is_grad_enabled():
        return torch.cat([p(x) for p in parts], dim=-1)
    weight, bias = _fused(module, attr, parts)
    return kernels.linear(x, weight, bias)


class Attention(nn.Module):
    def __init__(self, cfg: BackboneConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.eps = cfg.rms_norm_eps
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=bias)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def store_kv(self, kv: Tensor, step: AttentionStep, cache: KVCache, layer: int) -> None:
        """Projected [k | v] rows: k_norm and RoPE at their true positions, then both into the cache."""
        kernels.qk_norm_rope_cache(kv, 0, self.num_kv_heads, self.q_norm.weight, self.k_norm.weight, self.eps,
                                   step.cos, step.sin, step.slots, cache.k[layer], cache.v[layer])

    def forward(self, x: Tensor, step: AttentionStep, cache: KVCache, layer: int) -> Tensor:
        qkv = _project(self, "_qkv", [self.q_proj, self.k_proj, self.v_proj], x)
        q = kernels.qk_norm_rope_cache(qkv, self.num_heads, self.num_kv_heads, self.q_norm.weight,
                                       self.k_norm.weight, self.eps, step.cos, step.sin, step.slots,
                                       cache.k[layer], cache.v[layer])
        out = kernels.attention(q, cache.k[layer], cache.v[layer], step.limits, step.kv_len, step.mask, step.causal)
        b, _, t, _ = out.shape
        return kernels.linear(out.transpose(1, 2).reshape(b, t, -1), self.o_proj.weight, self.o_proj.bias)


class MLP(nn.Module):
    def __init__(self, cfg: BackboneConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        act = kernels.silu_mul(_project(self, "_gate_up", [self.gate_proj, self.up_proj], x))
        return kernels.linear(act, self.down_proj.weight)


class DecoderLayer(nn.Module):
    """Pre-norm Qwen3 layer; parameter names follow Hugging Face's checkpoints.

    The residual add of the previous layer's MLP output is fused into this layer's first norm:
    a layer takes (x, delta) and returns (x', delta') whose sum is its output.
    """

    def __init__(self, cfg: BackboneConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, delta: Tensor | None, step: AttentionStep, cache: KVCache,
                layer: int) -> tuple[Tensor, Tensor]:
        x, h = self.input_layernorm.add_forward(x, delta)
        x, h = self.post_attention_layernorm.add_forward(x, self.self_attn(h, step, cache, layer))
        return x, self.mlp(h)


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """The usual Hugging Face init: normal(0, std) matrices and embeddings, zero biases, unit norms."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, RMSNorm):
            nn.init.ones_(m.weight)

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
from dspark.models.config import BackboneConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return kernels.rms_norm(x, self.weight, self.eps)


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos/sin tables [..., head_dim] for absolute `positions` (computed in float32, as transformers does)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


_ROPE_TABLES: dict[tuple, list[tuple[Tensor, Tensor]]] = {}  # per shape, every table built (the last is current)


def rope_table(length: int, head_dim: int, theta: float, dtype: torch.dtype,
               device: torch.device) -> tuple[Tensor, Tensor]:
    """cos/sin [>= length, head_dim] of positions 0, 1, ... (`rope_cos_sin`'s numbers), built once per
    shape and kept: a cache takes them when made (`KVCache.rope`), and a forward gathers its rows in two
    launches instead of computing them in about ten. It grows (doubling) when a longer cache asks. A table it replaces stays alive: another engine
    on the same process may have captured CUDA graphs that read it, and freed, its memory would be
    handed to other tensors under those graphs (the demo's plain decoding went wrong on the H200 when a
    DSpark engine's longer cache grew the table between its replays)."""
    key = (head_dim, theta, dtype, torch.device(device))
    tables = _ROPE_TABLES.setdefault(key, [])
    if not tables or tables[-1][0].shape[0] < length:
        size = max(length, 2 * tables[-1][0].shape[0] if tables else 0)
        with torch.inference_mode():
            tables.append(rope_cos_sin(torch.arange(size, device=device), head_dim, theta, dtype))
    return tables[-1]


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
              slots: Tensor | None = None, mask: Tensor | None = None, causal: bool = False,
              tables: tuple[Tensor, Tensor] | None = None):
        """`limits[b, t]`: the highest key slot query (b, t) may see (its own position when causal).
        `tables`: a cache's RoPE tables (`KVCache.rope`, every position below their length): without autograd
        the RoPE rows are gathered from them."""
        if tables is not None and not torch.is_grad_enabled():
            cos, sin = (t[positions] for t in tables)
        else:
            cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, dtype)
        if mask is None and kv_len and kernels.use_cpu_forms(cos):  # built once here, not once per layer
            mask = kernels.visibility(limits, kv_len)
        return cls(positions, cos, sin, limits, kv_len, positions if slots is None else slots, mask, causal)


class KVCache:
    """Preallocated K/V for every layer, addressed by absolute position.

    Rolling back after a rejection needs no work here: the engine keeps the committed length, later
    writes overwrite the stale rows, and the mask never lets a query see a position above its limit.
    """

    def __init__(self, num_layers: int, batch: int, num_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str, rope_theta: float | None = None):
        # One tensor per layer: a layer's writes never touch what autograd saved for another (training).
        shape = (batch, num_kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        # The RoPE rows of every position the cache holds, taken when it is made (`rope_table`): a step reads
        # them from here, a tensor of its own, never from the process-wide table (whose growth a CUDA graph or
        # a compiled step must not see).
        self.rope = None if rope_theta is None else rope_table(max_len, head_dim, rope_theta, dtype, torch.device(device))

    @property
    def max_len(self) -> int:
        return self.k[0].shape[2]


def check_fused(module: nn.Module, fused: tuple[Tensor, Tensor | None] | None, first: Tensor) -> None:
    """Refuse a forward whose fused projection weight is missing or no longer holds `first` (the first
    projection's weight: replaced since `fuse`). Checked eagerly only: under torch.compile the pointer
    comparison would break the graph at every layer (14 breaks in the demo's decode step)."""
    if torch.compiler.is_compiling():
        return
    if fused is None or fused[0].data_ptr() != first.data_ptr():
        raise RuntimeError(f"{type(module).__name__}: projections not fused (or replaced since); call the model's "
                           "fuse() after building or loading it (the loaders and builders do)")


def fuse_linears(parts: list[nn.Linear]) -> tuple[Tensor, Tensor | None]:
    """One weight (and bias) for several projections of the same input; the projections' own
    parameters become views of it, so checkpoints, in-place updates (training) and state dicts see
    the usual names and one copy of the numbers."""
    # built as normal tensors even inside inference mode: a model loaded or converted there must still train
    with torch.inference_mode(False), torch.no_grad():
        weight = device_layout(torch.cat([p.weight.detach() for p in parts]))
        bias = torch.cat([p.bias.detach() for p in parts]) if parts[0].bias is not None else None
        offset = 0
        for p in parts:
            rows = p.weight.shape[0]
            _make_view(p, "weight", weight[offset : offset + rows])
            if bias is not None:
                _make_view(p, "bias", bias[offset : offset + rows])
            offset += rows
    return weight, bias


def device_layout(weight: Tensor) -> Tensor:
    """A product's weight [N, K] stored as its device's products read it fastest, same shape and numbers:
    on a CPU its transpose is what is contiguous ([K, N] in memory), so x @ W^T runs as MKL's plain
    product, 1.6x faster at the 8 rows of a verify than the transposed one (benchmarks/cpu_layout.py);
    elsewhere row-major, as the GPU kernels stream it."""
    if weight.device.type != "cpu":
        return weight.contiguous()
    return weight if weight.t().is_contiguous() else weight.t().contiguous().t()


def lay_out_products(model: nn.Module) -> None:
    """Give every product weight of `model` its device's layout (`device_layout`), at load. Weights inside a
    larger storage (the views of a fused q/k/v or gate/up weight) were laid out when fused and stay. A weight
    that two modules share (tied embeddings, a draft's copy of the target's head) stays one tensor."""
    laid: dict[int, tuple[Tensor, nn.Parameter]] = {}  # id -> (the old weight, kept alive; the laid-out one)
    with torch.inference_mode(False), torch.no_grad():
        for module in model.modules():
            w = module.weight if isinstance(module, nn.Linear) else None
            if w is None or id(w) in laid or w.untyped_storage().nbytes() > w.numel() * w.element_size():
                continue
            new = device_layout(w.detach())
            if new.data_ptr() != w.data_ptr():
                _make_view(module, "weight", new)
            laid[id(w)] = (w, module.weight)
        for module in model.modules():  # the old tensor under another module's name: the laid-out one there too
            for name, p in list(module.named_parameters(recurse=False)):
                if id(p) in laid and laid[id(p)][0] is p and laid[id(p)][1] is not p:
                    setattr(module, name, laid[id(p)][1])


def _make_view(module: nn.Module, name: str, view: Tensor) -> None:
    param = getattr(module, name)
    if param.is_inference():  # made inside inference mode (loaded there): only a new Parameter is a normal tensor
        setattr(module, name, nn.Parameter(view, requires_grad=param.requires_grad))
    else:
        param.data = view  # the same Parameter object: optimizers and callers holding it keep seeing the model's


class FusedProjections(nn.Module):
    """A module whose projections of one input run as one matrix product once `fuse()` has run.

    The loaders and random builders call `fuse()` (through the model's); a forward without autograd
    reads the fused tensors and never builds them. Conversions (`.to`, `.cuda`, `.float`, ...) give
    the parameters new storage, so they fuse again at once. With autograd on (training) the
    projections run one by one, on the same numbers.
    """

    def __init__(self):
        super().__init__()
        self.fused: tuple[Tensor, Tensor | None] | None = None

    def parts(self) -> list[nn.Linear]:
        raise NotImplementedError

    def fuse(self) -> None:
        self.fused = fuse_linears(self.parts())

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        if self.fused is not None:
            self.fuse()
        return out

    def project_normed(self, x: Tensor, norm: RMSNorm, gated: bool = False) -> Tensor:
        """The projections of norm(x); `gated` (the [gate; up] pair): silu(gate) * up. On the GPU the norm
        and SwiGLU run inside the product's launch."""
        parts = self.parts()
        if torch.is_grad_enabled():
            h = norm(x)
            y = torch.cat([p(h) for p in parts], dim=-1)
            return kernels.silu_mul(y) if gated else y
        check_fused(self, self.fused, parts[0].weight)
        return kernels.norm_linear(x, norm.weight, norm.eps, *self.fused, gated=gated)


class Attention(FusedProjections):
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

    def parts(self) -> list[nn.Linear]:
        return [self.q_proj, self.k_proj, self.v_proj]

    def store_kv(self, kv: Tensor, step: AttentionStep, cache: KVCache, layer: int) -> None:
        """Projected [k | v] rows: k_norm and RoPE at their true positions, then both into the cache."""
        kernels.qk_norm_rope_cache(kv, 0, self.num_kv_heads, self.q_norm.weight, self.k_norm.weight, self.eps,
                                   step.cos, step.sin, step.slots, cache.k[layer], cache.v[layer])

    def forward(self, qkv: Tensor, step: AttentionStep, cache: KVCache, layer: int, residual: Tensor) -> Tensor:
        """`residual` plus the attention of the projected [q | k | v] rows (normed, rotated, K/V cached)
        through o_proj (the add in o_proj's epilogue on the GPU)."""
        q = kernels.qk_norm_rope_cache(qkv, self.num_heads, self.num_kv_heads, self.q_norm.weight,
                                       self.k_norm.weight, self.eps, step.cos, step.sin, step.slots,
                                       cache.k[layer], cache.v[layer])
        out = kernels.attention(q, cache.k[layer], cache.v[layer], step.limits, step.kv_len, step.mask, step.causal)
        b, _, t, _ = out.shape
        return kernels.linear(out.transpose(1, 2).reshape(b, t, -1), self.o_proj.weight, self.o_proj.bias, residual)


class MLP(FusedProjections):
    def __init__(self, cfg: BackboneConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def parts(self) -> list[nn.Linear]:
        return [self.gate_proj, self.up_proj]

    def forward(self, act: Tensor, residual: Tensor) -> Tensor:
        """`residual` plus down_proj of silu(gate) * up (`project_normed(..., gated=True)` gives it)."""
        return kernels.linear(act, self.down_proj.weight, residual=residual)


class DecoderLayer(nn.Module):
    """Pre-norm Qwen3 layer; parameter names follow Hugging Face's checkpoints.

    On the GPU its four products carry everything else but attention: each norm runs inside the
    product that reads it (q/k/v, gate/up) and each residual add inside the one that makes the delta
    (o_proj, down), so a layer is four products, the q/k norm and RoPE, and attention.
    """

    def __init__(self, cfg: BackboneConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def fuse(self) -> None:
        self.self_attn.fuse()
        self.mlp.fuse()

    def forward(self, x: Tensor, step: AttentionStep, cache: KVCache, layer: int) -> Tensor:
        qkv = self.self_attn.project_normed(x, self.input_layernorm)
        x = self.self_attn(qkv, step, cache, layer, residual=x)
        act = self.mlp.project_normed(x, self.post_attention_layernorm, gated=True)
        return self.mlp(act, residual=x)


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """The usual Hugging Face init: normal(0, std) matrices and embeddings, zero biases, unit norms."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, RMSNorm):
            nn.init.ones_(m.weight)

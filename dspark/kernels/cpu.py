"""The CPU forms: what the references compute, in the fewest PyTorch operators.

At the demo's sizes a CPU step is bound by how many operators Python calls, not by the bytes they move
(2,314 per plain step, 48 % of the copy-rate floor: benchmarks/results/cpu_compile_probe.json): each costs
a few microseconds before it does any work. These forms cut the count without changing the arithmetic:
RMSNorm as PyTorch's one operator, the q/k norms of every head in one call, RoPE as a roll and two
products, grouped-query attention without copies of K and V (SDPA's own GQA, bit-equal to the repeated
form), a cache write by `index_copy_`. Tests hold each to its reference (`tests/test_kernels_cpu.py`);
`DSPARK_KERNELS=0` (or `kernels.references()`) runs the references instead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from dspark.kernels.launch import kernels_on


def use_cpu_forms(t: Tensor) -> bool:
    """Inference on a CPU tensor of a float type (training keeps the references' autograd graph)."""
    return t.device.type == "cpu" and kernels_on() and t.is_floating_point() and not torch.is_grad_enabled()


def use_cpu_norm_forms(t: Tensor) -> bool:
    """The norms' forms need float32, where the references' casts to float32 and back are no-ops."""
    return use_cpu_forms(t) and t.dtype == torch.float32


def rms_norm_cpu(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """`rms_norm_ref` (float32) in one operator."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def rope_cpu(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """`rope_ref` on x [..., T, heads, D] (cos/sin [..., T, 1, D]): rotate-half is a roll of the halves,
    its sign folded into sin's first half (the two halves of sin are the same frequencies)."""
    half = x.shape[-1] // 2
    signed = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
    return x * cos + x.roll(half, dims=-1) * signed


def qk_norm_rope_cache_cpu(qkv: Tensor, num_heads: int, num_kv_heads: int, q_norm: Tensor, k_norm: Tensor,
                           eps: float, cos: Tensor, sin: Tensor, positions: Tensor, cache_k: Tensor,
                           cache_v: Tensor) -> Tensor:
    """`qk_norm_rope_cache_ref` (float32): the q and k heads normed and rotated together, in the [B, T, heads, D]
    layout the projection wrote (no transposes until the return); one norm over every head, then each head's
    weight (the reference's order)."""
    b, t, _ = qkv.shape
    d = q_norm.shape[0]
    heads = qkv.view(b, t, num_heads + 2 * num_kv_heads, d)
    qk, v = heads[:, :, : num_heads + num_kv_heads], heads[:, :, num_heads + num_kv_heads :]
    normed = F.rms_norm(qk, (d,), None, eps) * torch.cat((q_norm.expand(num_heads, d), k_norm.expand(num_kv_heads, d)))
    qk = rope_cpu(normed, cos[:, :, None], sin[:, :, None])
    q, k = qk[:, :, :num_heads], qk[:, :, num_heads:]
    write_cache(cache_k, k, positions)
    write_cache(cache_v, v, positions)
    return q.transpose(1, 2)


def write_cache(cache: Tensor, rows: Tensor, positions: Tensor) -> None:
    """cache [B, heads, L, D][b, :, positions[b, t]] = rows [B, T, heads, D][b, t]."""
    if cache.shape[0] == 1:
        cache[0].index_copy_(1, positions[0], rows[0].transpose(0, 1))
    else:
        cache[torch.arange(cache.shape[0], device=cache.device)[:, None], :, positions] = rows


def attention_cpu(q: Tensor, cache_k: Tensor, cache_v: Tensor, mask: Tensor) -> Tensor:
    """`attention_ref` given its mask [B, 1, T, kv_len]: SDPA reads the cache's K and V in place, each KV head
    serving its group of query heads."""
    kv_len = mask.shape[-1]
    return F.scaled_dot_product_attention(q, cache_k[:, :, :kv_len], cache_v[:, :, :kv_len], attn_mask=mask,
                                          enable_gqa=q.shape[1] != cache_k.shape[1])

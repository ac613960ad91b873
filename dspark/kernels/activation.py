"""SwiGLU's silu(gate) * up on a fused [gate | up] output (the many-row path; decoding fuses it into the product)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from dspark.kernels.launch import tl, triton, use_triton


def silu_mul_ref(gate_up: Tensor) -> Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_mul(gate_up: Tensor) -> Tensor:
    if not use_triton(gate_up):
        return silu_mul_ref(gate_up)
    shape = gate_up.shape
    inter = shape[-1] // 2
    g2 = gate_up.reshape(-1, shape[-1]).contiguous()
    out = torch.empty(g2.shape[0], inter, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(g2.shape[0], triton.cdiv(inter, block))](g2, out, inter, BLOCK=block)
    return out.view(*shape[:-1], inter)


# Above this many query rows per sequence (a prefill, the trainer's target pass) attention goes to
# PyTorch's fused SDPA: the split-KV kernel runs one program per query row, with the GQA group padded
# to 16 rows, and its work grows as rows x keys without tensor-core tiles over the rows
# (benchmarks/attention_bench.py measures the crossover on the H200). A half-precision prefill from
# position 0 takes SDPA's causal kernel (no mask; 3.3x the masked call's speed at 4096 rows there);
# float32 keeps the masked call, which measured faster than causal at the trainer's shape.


if triton is not None:

    @triton.jit
    def _silu_mul_kernel(gu_ptr, out_ptr, inter, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < inter
        g = tl.load(gu_ptr + row * 2 * inter + cols, mask=mask, other=0.0)
        u = tl.load(gu_ptr + row * 2 * inter + inter + cols, mask=mask, other=0.0)
        gf = g.to(tl.float32)
        act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)  # silu in float, rounded, then the product, as torch
        tl.store(out_ptr + row * inter + cols, act * u, mask=mask)

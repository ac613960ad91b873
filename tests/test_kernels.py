"""Each fused Triton kernel against its PyTorch reference, on the GPU, in float32 and bfloat16."""

from __future__ import annotations

import pytest
import torch

from dspark import kernels as K
from dspark.layers import rope_cos_sin

pytestmark = pytest.mark.cuda

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


@pytest.fixture(params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def dtype(request):
    return request.param


def test_add_rms_norm(dtype):
    x, d = torch.randn(2, 7, 4096, device="cuda", dtype=dtype), torch.randn(2, 7, 4096, device="cuda", dtype=dtype)
    w = torch.rand(4096, device="cuda", dtype=dtype) + 0.5
    (sx, h), (rx, rh) = K.add_rms_norm(x, d, w, 1e-6), K.add_rms_norm_ref(x, d, w, 1e-6)
    assert torch.equal(sx, rx) and _rel(h, rh) < TOL[dtype]


def test_silu_mul(dtype):
    gu = torch.randn(3, 5, 2 * 12288, device="cuda", dtype=dtype)
    assert _rel(K.silu_mul(gu), K.silu_mul_ref(gu)) < TOL[dtype]


@pytest.mark.parametrize("heads", [(32, 8), (0, 8), (4, 4)])
def test_qk_norm_rope_cache(dtype, heads):
    hq, hkv = heads
    b, t, d, s = 2, 8, 128, 300
    qkv = torch.randn(b, t, (hq + 2 * hkv) * d, device="cuda", dtype=dtype)
    qn, kn = torch.rand(d, device="cuda", dtype=dtype) + 0.5, torch.rand(d, device="cuda", dtype=dtype) + 0.5
    pos = torch.stack([torch.randperm(s - 1, device="cuda")[:t] for _ in range(b)])  # distinct per row
    cos, sin = rope_cos_sin(pos, d, 1e6, dtype)
    caches = [torch.randn(b, hkv, s, d, device="cuda", dtype=dtype) for _ in range(2)]
    ref_caches = [c.clone() for c in caches]
    q = K.qk_norm_rope_cache(qkv, hq, hkv, qn, kn, 1e-6, cos, sin, pos, *caches)
    rq = K.qk_norm_rope_cache_ref(qkv, hq, hkv, qn, kn, 1e-6, cos, sin, pos, *ref_caches)
    if hq:
        assert _rel(q, rq) < TOL[dtype]
    assert _rel(caches[0], ref_caches[0]) < TOL[dtype] and torch.equal(caches[1], ref_caches[1])


@pytest.mark.parametrize("t,kv_len", [(1, 1100), (8, 1100), (16, 77)])
def test_attention(dtype, t, kv_len):
    b, hq, hkv, d = 1, 32, 8, 128
    q = torch.randn(b, hq, t, d, device="cuda", dtype=dtype)
    ck, cv = (torch.randn(b, hkv, kv_len + 10, d, device="cuda", dtype=dtype) for _ in range(2))
    limits = torch.sort(torch.randint(0, kv_len, (b, t), device="cuda"), dim=-1).values
    assert _rel(K.attention(q, ck, cv, limits, kv_len), K.attention_ref(q, ck, cv, limits, kv_len)) < TOL[dtype]


@pytest.mark.parametrize("m", [1, 8, 16])
@pytest.mark.parametrize("n,k", [(4096, 4096), (6144, 4096), (24576, 4096), (4096, 12288), (1000, 300)])
def test_linear(dtype, m, n, k):
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    w = torch.randn(n, k, device="cuda", dtype=dtype) * 0.02
    assert _rel(K.linear(x, w), torch.nn.functional.linear(x, w)) < TOL[dtype]


def test_linear_falls_back_beyond_16_rows_and_with_autograd():
    x = torch.randn(17, 256, device="cuda")
    w = torch.randn(64, 256, device="cuda", requires_grad=True)
    y = K.linear(x, w)
    y.sum().backward()  # the PyTorch path: gradients flow
    assert w.grad is not None


@pytest.mark.parametrize("t", [17, 300])
def test_causal_prefill_attention(t):
    """A half-precision prefill from slot 0 runs SDPA's causal kernel: equal to the masked reference."""
    b, hq, hkv, d = 2, 32, 8, 128
    q = torch.randn(b, hq, t, d, device="cuda", dtype=torch.bfloat16)
    ck, cv = (torch.randn(b, hkv, t + 10, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    limits = torch.arange(t, device="cuda")[None].expand(b, t)
    out = K.attention(q, ck, cv, limits, t, causal=True)
    assert _rel(out, K.attention_ref(q, ck, cv, limits, t)) < TOL[torch.bfloat16]

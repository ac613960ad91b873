"""Each fused Triton kernel against its PyTorch reference, on the GPU, in float32 and bfloat16.

With `TRITON_INTERPRET=1` on a machine without CUDA (and Triton installed) they run on the CPU in
Triton's interpreter: slow, float32 only, but it checks the kernels' logic anywhere.
"""

from __future__ import annotations

import os

import pytest
import torch

from dspark import kernels as K
from dspark.models.layers import rope_cos_sin

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available()
DEVICE = "cpu" if INTERPRET else "cuda"
pytestmark = [] if INTERPRET else pytest.mark.cuda

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


@pytest.fixture(autouse=True)
def _inference():
    """The kernels serve inference: with autograd on, every function runs its reference instead."""
    with torch.inference_mode():
        yield


@pytest.fixture(params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def dtype(request):
    if INTERPRET and request.param == torch.bfloat16:
        pytest.skip("Triton's CPU interpreter gets bfloat16 products wrong; bfloat16 is checked on the GPU")
    return request.param


def test_rms_norm(dtype):
    x = torch.randn(2, 7, 4096, device=DEVICE, dtype=dtype)
    w = torch.rand(4096, device=DEVICE, dtype=dtype) + 0.5
    assert _rel(K.rms_norm(x, w, 1e-6), K.rms_norm_ref(x, w, 1e-6)) < TOL[dtype]


def test_silu_mul(dtype):
    gu = torch.randn(3, 5, 2 * 12288, device=DEVICE, dtype=dtype)
    assert _rel(K.silu_mul(gu), K.silu_mul_ref(gu)) < TOL[dtype]


@pytest.mark.parametrize("heads", [(32, 8), (0, 8), (4, 4)])
def test_qk_norm_rope_cache(dtype, heads):
    hq, hkv = heads
    b, t, d, s = 2, 8, 128, 300
    qkv = torch.randn(b, t, (hq + 2 * hkv) * d, device=DEVICE, dtype=dtype)
    qn, kn = torch.rand(d, device=DEVICE, dtype=dtype) + 0.5, torch.rand(d, device=DEVICE, dtype=dtype) + 0.5
    pos = torch.stack([torch.randperm(s - 1, device=DEVICE)[:t] for _ in range(b)])  # distinct per row
    cos, sin = rope_cos_sin(pos, d, 1e6, dtype)
    caches = [torch.randn(b, hkv, s, d, device=DEVICE, dtype=dtype) for _ in range(2)]
    ref_caches = [c.clone() for c in caches]
    q = K.qk_norm_rope_cache(qkv, hq, hkv, qn, kn, 1e-6, cos, sin, pos, *caches)
    rq = K.qk_norm_rope_cache_ref(qkv, hq, hkv, qn, kn, 1e-6, cos, sin, pos, *ref_caches)
    if hq:
        assert _rel(q, rq) < TOL[dtype]
    assert _rel(caches[0], ref_caches[0]) < TOL[dtype] and torch.equal(caches[1], ref_caches[1])


@pytest.mark.parametrize("rows", [1, 8])
def test_products_overlapped_in_a_graph_equal_plain_launches(dtype, rows):
    """A chain of products launched as programmatic dependents (each starting in the tail of the one before,
    reading its output) and replayed from a CUDA graph: bit-equal to the same chain launched plainly."""
    if INTERPRET:
        pytest.skip("programmatic dependent launch needs a GPU")
    h, f = 512, 1536
    x = torch.randn(rows, h, device=DEVICE, dtype=dtype)
    nw = torch.rand(h, device=DEVICE, dtype=dtype) + 0.5
    w_up, w_down, w_o = (torch.randn(s, device=DEVICE, dtype=dtype) * 0.05 for s in ((2 * f, h), (h, f), (h, h)))

    def chain():
        y = K.norm_linear(x, nw, 1e-6, w_up, gated=True)
        y = K.linear(y, w_down, residual=x)
        return K.linear(y, w_o, residual=y)

    outs = []
    for on in (False, True):
        with K.overlap_mode(on):
            chain()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = chain()
        graph.replay()
        torch.cuda.synchronize()
        outs.append(out.clone())
    assert torch.equal(outs[0], outs[1])
    y = K.linear_ref(K.norm_linear_ref(x, nw, 1e-6, w_up, gated=True), w_down, residual=x)
    assert _rel(outs[1], K.linear_ref(y, w_o, residual=y)) < TOL[dtype]


@pytest.mark.parametrize("b,t,kv_len,hq", [(1, 1, 1100, 32), (1, 8, 1100, 32), (1, 16, 77, 32), (2, 8, 1100, 64),
                                           (2, 16, 300, 64), (3, 5, 130, 8)])
def test_attention(dtype, b, t, kv_len, hq):
    """All T rows of a KV head's group share one tile (T x G rows: 8 to 128 here, padding included), each row
    masked at its own limit, rows in one tile as far apart as key 0 and the last key."""
    hkv, d = 8, 128
    q = torch.randn(b, hq, t, d, device=DEVICE, dtype=dtype)
    ck, cv = (torch.randn(b, hkv, kv_len + 10, d, device=DEVICE, dtype=dtype) for _ in range(2))
    limits = torch.sort(torch.randint(0, kv_len, (b, t), device=DEVICE), dim=-1).values
    limits[:, 0], limits[:, -1] = 0, kv_len - 1
    assert _rel(K.attention(q, ck, cv, limits, kv_len), K.attention_ref(q, ck, cv, limits, kv_len)) < TOL[dtype]


@pytest.mark.parametrize("m", [1, 8, 16])
@pytest.mark.parametrize("n,k", [(4096, 4096), (6144, 4096), (24576, 4096), (4096, 12288), (1000, 300)])
def test_linear(dtype, m, n, k):
    x = torch.randn(m, k, device=DEVICE, dtype=dtype)
    w = torch.randn(n, k, device=DEVICE, dtype=dtype) * 0.02
    assert _rel(K.linear(x, w), torch.nn.functional.linear(x, w)) < TOL[dtype]


@pytest.mark.parametrize("m", [1, 8])
@pytest.mark.parametrize("n,k", [(4096, 1024), (4096, 12288), (6144, 4096)])  # o_proj's, down's, a wider tile
def test_linear_adds_the_residual_in_its_epilogue_as_torch_rounds_it(dtype, m, n, k):
    """o_proj's and down's epilogue: residual + (x @ W^T rounded), the sum rounded: bit-equal to adding the
    kernel's own product afterwards."""
    x, r = torch.randn(m, k, device=DEVICE, dtype=dtype), torch.randn(m, n, device=DEVICE, dtype=dtype)
    w = torch.randn(n, k, device=DEVICE, dtype=dtype) * 0.02
    y = K.linear(x, w, residual=r)
    assert torch.equal(y, r + K.linear(x, w)) and _rel(y, K.linear_ref(x, w, residual=r)) < TOL[dtype]


def test_linear_falls_back_beyond_16_rows_and_with_autograd():
    with torch.inference_mode(False), torch.enable_grad():
        x = torch.randn(17, 256, device=DEVICE)
        w = torch.randn(64, 256, device=DEVICE, requires_grad=True)
        y = K.linear(x, w)
        y.sum().backward()  # the PyTorch path: gradients flow
    assert w.grad is not None


@pytest.mark.parametrize("t", [17, 300])
def test_causal_prefill_attention(t):
    """A half-precision prefill from slot 0 runs SDPA's causal kernel: equal to the masked reference."""
    b, hq, hkv, d = 2, 32, 8, 128
    q = torch.randn(b, hq, t, d, device=DEVICE, dtype=torch.bfloat16)
    ck, cv = (torch.randn(b, hkv, t + 10, d, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    limits = torch.arange(t, device=DEVICE)[None].expand(b, t)
    out = K.attention(q, ck, cv, limits, t, causal=True)
    assert _rel(out, K.attention_ref(q, ck, cv, limits, t)) < TOL[torch.bfloat16]


@pytest.mark.parametrize("rows", [1, 8, 16])
@pytest.mark.parametrize("n,k", [(6144, 4096), (1000, 300)])
def test_norm_linear(dtype, rows, n, k):
    """RMSNorm inside the product: the norm weight on x's tiles, 1/rms (from x @ x^T's diagonal) on the
    accumulator; within rounding of norm-then-product, rows of very different scale each normed by
    their own sum of squares."""
    x = torch.randn(rows, k, device=DEVICE, dtype=dtype) * torch.logspace(-2, 2, rows, device=DEVICE, dtype=dtype)[:, None]
    nw = torch.rand(k, device=DEVICE, dtype=dtype) + 0.5
    w = torch.randn(n, k, device=DEVICE, dtype=dtype) * 0.02
    assert _rel(K.norm_linear(x, nw, 1e-6, w), K.norm_linear_ref(x, nw, 1e-6, w)) < TOL[dtype]


@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize("k,inter", [(512, 1536), (4096, 12288)])  # a small tile, and Qwen3-8B's gate/up tile
def test_norm_linear_gated(dtype, rows, k, inter):
    """gate/up with the norm and SwiGLU in the one launch: silu(h @ gate^T) * (h @ up^T), h = norm(x)."""
    x = torch.randn(rows, k, device=DEVICE, dtype=dtype)
    nw = torch.rand(k, device=DEVICE, dtype=dtype) + 0.5
    w = torch.randn(2 * inter, k, device=DEVICE, dtype=dtype) * 0.05
    y = K.norm_linear(x, nw, 1e-6, w, gated=True)
    assert y.shape == (rows, inter) and _rel(y, K.norm_linear_ref(x, nw, 1e-6, w, gated=True)) < TOL[dtype]


def test_norm_linear_many_rows_runs_the_kernels_one_by_one():
    x = torch.randn(2, 20, 256, device=DEVICE)
    nw, w = torch.rand(256, device=DEVICE) + 0.5, torch.randn(2 * 96, 256, device=DEVICE) * 0.05
    assert _rel(K.norm_linear(x, nw, 1e-6, w, gated=True), K.norm_linear_ref(x, nw, 1e-6, w, gated=True)) < 1e-5


@pytest.mark.parametrize("vocab", [151936, 1000])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_vocab_draw_equals_its_reference(vocab, temperature):
    """Multi-block race arg-max and probabilities: the same winner as the reference, the same distribution."""
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    logits = torch.randn(3, vocab, device=DEVICE, generator=gen) * 4
    greedy = temperature == 0.0
    noise = None if greedy else torch.empty(3, vocab, device=DEVICE).exponential_(generator=gen)
    (idx, p), (ridx, rp) = (f(logits, noise, temperature, greedy, True) for f in (K.vocab_draw, K.vocab_draw_ref))
    assert torch.equal(idx, ridx)
    torch.testing.assert_close(p, rp, rtol=1e-4, atol=1e-7)
    idx_only, none = K.vocab_draw(logits, noise, temperature, greedy, False)
    assert none is None and torch.equal(idx_only, ridx)


def test_vocab_draw_breaks_ties_at_the_lowest_index():
    logits = torch.zeros(2, 5000, device=DEVICE)
    logits[0, [4000, 700, 2500]] = 3.0  # equal maxima in different blocks
    logits[1, [1, 3]] = 1.0  # and in one block
    idx, p = K.vocab_draw(logits, None, 0.0, True, True)
    assert idx.tolist() == [700, 1] and p.sum(-1).tolist() == [1.0, 1.0] and p[0, 700] == 1.0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("rank", [256, 24])
def test_markov_sample_equals_its_reference(dtype, temperature, rank):
    """The fused slot loop: the same drafts, previous tokens, corrected logits and q as the step-by-step
    reference (bias = w2 @ w1[prev] rounded to the weights' dtype), given the same noise."""
    n, vocab, target_vocab = 7, 151936 if rank == 256 else 3000, 152064 if rank == 256 else 3100
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    logits = torch.randn(n, vocab, device=DEVICE, generator=gen) * 3
    w1 = (torch.randn(target_vocab, rank, device=DEVICE, generator=gen) * 0.5).to(dtype)
    w2 = (torch.randn(vocab, rank, device=DEVICE, generator=gen) * 0.5).to(dtype)
    to_target = torch.arange(vocab, device=DEVICE) + 17  # a reduced vocabulary's map
    anchor = torch.tensor([5], device=DEVICE)
    greedy = temperature == 0.0
    noise = None if greedy else torch.empty(n, vocab, device=DEVICE).exponential_(generator=gen)

    def bias_of(prev, k):
        return torch.nn.functional.linear(w1[prev], w2).float()

    q, ids, prevs, corrected = K.markov_sample(logits, w1, w2, to_target, anchor, noise, temperature, greedy)
    rq, rids, rprevs, rcorrected = K.markov_sample_ref(logits, bias_of, to_target, anchor, noise, temperature, greedy)
    assert torch.equal(ids, rids) and torch.equal(prevs, rprevs)
    assert prevs.tolist() == [5] + (to_target[ids[:-1]]).tolist()
    # the bias sums 256 products in another order than cuBLAS before rounding to the weights' dtype: in
    # bfloat16 a few of the million biases land one unit of their last place (2^-7 of their size) apart
    bias_rtol = 2.0**-7 if dtype == torch.bfloat16 else TOL[dtype]
    torch.testing.assert_close(corrected - logits, rcorrected - logits, rtol=bias_rtol, atol=TOL[torch.float32])
    # q is exactly the distribution of the kernel's own corrected logits
    torch.testing.assert_close(q, K.vocab_draw_ref(corrected, None, temperature, greedy, True)[1], rtol=1e-3, atol=1e-6)
    if dtype == torch.float32:
        torch.testing.assert_close(q, rq, rtol=1e-3, atol=1e-6)


def test_attention_splits_follow_the_live_length(dtype):
    """A short context in a long cache: the splits share the live keys; stale keys past the limit never count."""
    b, hq, hkv, d, cache_len = 1, 32, 8, 128, 4096
    q = torch.randn(b, hq, 1, d, device=DEVICE, dtype=dtype)
    ck, cv = (torch.randn(b, hkv, cache_len, d, device=DEVICE, dtype=dtype) for _ in range(2))
    for live in (1, 63, 64, 65, 700, cache_len - 1):
        limits = torch.tensor([[live - 1]], device=DEVICE)
        out = K.attention(q, ck, cv, limits, cache_len - 1)
        assert _rel(out, K.attention_ref(q, ck, cv, limits, cache_len - 1)) < TOL[dtype], live


@pytest.mark.parametrize("vocab", [151936, 700])
@pytest.mark.parametrize("with_counts", [True, False])
def test_accept_equals_its_reference(vocab, with_counts):
    """The fused acceptance rule: the same accepted counts and next tokens as the reference, given the same
    uniforms and arrival times, over rows that accept nothing, some and everything, and a row whose
    residual is empty (p <= q everywhere: the next token comes from p)."""
    b, n = 6, 7
    gen = torch.Generator(device=DEVICE).manual_seed(3)
    q = torch.softmax(torch.randn(b, n, vocab, device=DEVICE, generator=gen) * 3, -1)
    p = torch.softmax(torch.randn(b, n + 1, vocab, device=DEVICE, generator=gen) * 3, -1)
    p[1, :n] = q[1]  # accepts everything: the bonus row
    tokens = torch.stack([torch.multinomial(q[i], 1, generator=gen)[:, 0] for i in range(b)])
    p[2, 0] = q[2, 0]
    p[2, 0, tokens[2, 0]] = 0.0  # slot 0 always rejected, and p <= q leaves an empty residual
    tokens[3] = q[3].argmin(-1)  # improbable drafts, accepted whenever p is larger there
    counted = torch.tensor([7, 7, 7, 3, 0, 5], device=DEVICE) if with_counts else None
    for _ in range(5):
        u = torch.rand(b, n, device=DEVICE, generator=gen)
        noise = torch.empty(b, vocab, device=DEVICE).exponential_(generator=gen)
        got = K.accept(tokens, q, p, counted, u, noise)
        want = K.accept_ref(tokens, q, p, counted, u, noise)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("greedy", [True, False])
def test_markov_sample_topk(dtype, greedy):
    """The top-k Markov head's one-launch loop against its PyTorch reference: the same drafts and previous tokens,
    the candidates' corrected logits and q within tolerance, every other token at -inf."""
    if INTERPRET:
        pytest.skip("a loop over slots of gathers: checked on the GPU")
    torch.manual_seed(0)
    n, vocab, rank, k = 7, 5000, 256, 64
    logits = torch.randn(n, vocab, device=DEVICE) * 3
    w1 = (torch.randn(vocab, rank, device=DEVICE) * 0.3).to(dtype)
    w2 = (torch.randn(vocab, rank, device=DEVICE) * 0.3).to(dtype)
    to_target, anchor = torch.randperm(vocab, device=DEVICE), torch.tensor([11], device=DEVICE)
    noise = None if greedy else torch.empty(n, vocab, device=DEVICE).exponential_()
    t = 0.0 if greedy else 0.9
    got = K.markov_sample_topk(logits, w1, w2, to_target, anchor, noise, t, greedy, k)
    want = K.markov_sample_topk_ref(logits, w1, w2, to_target, anchor, noise, t, greedy, k)
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    finite = torch.isfinite(want[3])
    assert torch.equal(torch.isfinite(got[3]), finite) and int(finite.sum()) == n * k
    assert _rel(got[3][finite], want[3][finite]) < TOL[dtype] and _rel(got[0], want[0]) < TOL[dtype]

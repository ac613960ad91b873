"""Can a decoder layer's products run with no add+RMSNorm kernel between them?

Today a layer runs six launches around its products: add+RMSNorm, q/k/v, o_proj, add+RMSNorm,
gate/up (SwiGLU epilogue), down. The candidate runs four: the residual add moves into the epilogue
of the product that makes the delta (o_proj, down), and the RMSNorm into the product that reads it
(q/k/v, gate/up): each program scales its tiles of x by the norm weight as it streams W and applies
the row's 1/rms, which needs the whole row, in the epilogue. The sum of squares is kept without a
reduction per step (an earlier prologue that reduced each step and stored x from one program made
the products 2.9x slower): either an elementwise float32 accumulator reduced once at the end
("elementwise") or x @ x^T on the tensor cores, whose diagonal is read at the end ("dot").

For M = 1 (decode) and M = 8 (verify), Qwen3-8B shapes in bf16, this captures a CUDA graph of one
layer's products over 6 layers of distinct weights (2.3 GB, so nothing stays in L2), times its replay
and prints microseconds per layer and the weight bandwidth, beside each candidate kernel alone
against the engine's product at the same tiles. Attention is left out: it is the same in both.

    python benchmarks/norm_epilogue_bench.py
"""

from __future__ import annotations

import json
import statistics

import torch
import triton
import triton.language as tl

from dspark import kernels as K

HIDDEN, INTER, QKV, LAYERS, EPS = 4096, 12288, 6144, 6, 1e-6


@triton.jit
def fused_gemv(x_ptr, nw_ptr, r_ptr, w_ptr, y_ptr, M, N, K, eps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, NORM: tl.constexpr, SQ_DOT: tl.constexpr, RESIDUAL: tl.constexpr,
               GATED: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    sq = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
    gram = tl.zeros([BLOCK_M, BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        wmask = (rn[:, None] < N) & (rk[None, :] < K)
        w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=wmask, other=0.0)
        x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        if NORM:
            xf = x.to(tl.float32)
            if SQ_DOT:
                gram += tl.dot(x, tl.trans(x))
            else:
                sq += xf * xf
            x = (xf * tl.load(nw_ptr + rk, mask=rk < K, other=0.0).to(tl.float32)[None, :]).to(w.dtype)
        acc += tl.dot(x, tl.trans(w))
        if GATED:
            wu = tl.load(w_ptr + (rn[:, None] + N) * K + rk[None, :], mask=wmask, other=0.0)
            acc_up += tl.dot(x, tl.trans(wu))
    if NORM:
        if SQ_DOT:
            ss = tl.sum(tl.where(rm[:, None] == tl.arange(0, BLOCK_M)[None, :], gram, 0.0), axis=1)
        else:
            ss = tl.sum(sq, axis=1)
        inv = 1.0 / tl.sqrt(ss / K + eps)
        acc = acc * inv[:, None]
        acc_up = acc_up * inv[:, None]
    out = acc.to(y_ptr.dtype.element_ty)
    if GATED:
        gf = out.to(tl.float32)
        out = (gf / (1.0 + tl.exp(-gf))).to(y_ptr.dtype.element_ty) * acc_up.to(y_ptr.dtype.element_ty)
    ymask = (rm[:, None] < M) & (rn[None, :] < N)
    if RESIDUAL:
        r = tl.load(r_ptr + rm[:, None] * N + rn[None, :], mask=ymask, other=0.0)
        out = (out.to(tl.float32) + r.to(tl.float32)).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], out, mask=ymask)


def tiles(n: int, gated: bool) -> tuple[int, int, int]:
    """The engine's tile choice (dspark.kernels.gemv._gemv) for bf16."""
    rows_read = 2 * n if gated else n
    block_n, block_k, stages = (64, 256 if n >= 65536 else 128, 3) if rows_read >= 16384 else \
        (64, 256, 5) if n > 4096 else (32, 512, 3)
    return (block_n // 2 if gated else block_n), block_k, stages


def fused(x, w, *, nw=None, residual=None, gated=False, sq_dot=False):
    m, k = x.shape
    n = w.shape[0] // 2 if gated else w.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_n, block_k, stages = tiles(n, gated)
    fused_gemv[(triton.cdiv(n, block_n),)](
        x, x if nw is None else nw, x if residual is None else residual, w, y, m, n, k, EPS, BLOCK_M=16,
        BLOCK_N=block_n, BLOCK_K=block_k, NORM=nw is not None, SQ_DOT=sq_dot, RESIDUAL=residual is not None,
        GATED=gated, num_warps=4, num_stages=stages)
    return y


def graph_us(fn, calls: int, reps: int = 40) -> float:
    """Median microseconds per call of fn() replayed `calls` times... fn runs all calls itself."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


@torch.inference_mode()
def main() -> None:
    torch.manual_seed(0)
    dt = torch.bfloat16
    layers = [{"qkv": torch.randn(QKV, HIDDEN, device="cuda", dtype=dt) * 0.02,
               "o": torch.randn(HIDDEN, HIDDEN, device="cuda", dtype=dt) * 0.02,
               "gu": torch.randn(2 * INTER, HIDDEN, device="cuda", dtype=dt) * 0.02,
               "down": torch.randn(HIDDEN, INTER, device="cuda", dtype=dt) * 0.02,
               "n1": torch.rand(HIDDEN, device="cuda", dtype=dt) + 0.5,
               "n2": torch.rand(HIDDEN, device="cuda", dtype=dt) + 0.5} for _ in range(LAYERS)]
    layer_bytes = sum(layers[0][k].numel() * 2 for k in ("qkv", "o", "gu", "down"))
    for m in (1, 8):
        x0 = torch.randn(m, HIDDEN, device="cuda", dtype=dt)
        attn = torch.randn(m, HIDDEN, device="cuda", dtype=dt)  # stands for attention's output

        # correctness of the candidates against the references first
        L = layers[0]
        for sq_dot in (False, True):
            got = fused(x0, L["qkv"], nw=L["n1"], sq_dot=sq_dot)
            ref = K.norm_linear_ref(x0, None, L["n1"], EPS, L["qkv"])[1]
            got_g = fused(x0, L["gu"], nw=L["n2"], gated=True, sq_dot=sq_dot)
            ref_g = K.norm_linear_ref(x0, None, L["n2"], EPS, L["gu"], gated=True)[1]
            for a, b in ((got, ref), (got_g, ref_g)):
                err = ((a.float() - b.float()).norm() / b.float().norm()).item()
                if err > 2e-2:
                    raise SystemExit(f"norm epilogue (sq_dot={sq_dot}) M={m}: relative error {err:.3g}")
        got = fused(attn, L["o"], residual=x0)
        if not torch.equal(got, x0 + K.linear(attn, L["o"])):
            raise SystemExit("residual epilogue differs from product + add")

        def engine_chain():
            x, d = x0, None
            for L in layers:
                x, qkv = K.norm_linear(x, d, L["n1"], EPS, L["qkv"])
                d = K.linear(attn, L["o"])
                x, act = K.norm_linear(x, d, L["n2"], EPS, L["gu"], gated=True)
                d = K.linear(act, L["down"])

        def fused_chain(sq_dot):
            def run():
                x = x0
                for L in layers:
                    fused(x, L["qkv"], nw=L["n1"], sq_dot=sq_dot)
                    x = fused(attn, L["o"], residual=x)
                    act = fused(x, L["gu"], nw=L["n2"], gated=True, sq_dot=sq_dot)
                    x = fused(act, L["down"], residual=x)
            return run

        cases = {"engine: norm kernels (6 launches)": engine_chain,
                 "fused, elementwise sum of squares (4)": fused_chain(False),
                 "fused, x @ x^T sum of squares (4)": fused_chain(True)}
        for _ in range(2):  # alternated twice
            for case, fn in cases.items():
                us = graph_us(fn, LAYERS)
                print(json.dumps({"M": m, "case": case, "us_per_layer": round(us, 2),
                                  "weight_tbps": round(layer_bytes / (us * 1e-6) / 1e12, 3)}), flush=True)
        # each product alone (6 calls on the 6 layers' weights), engine kernel against the candidate
        xs = {"qkv": x0, "o": attn, "gu": x0, "down": torch.randn(m, INTER, device="cuda", dtype=dt)}
        for name in ("qkv", "o", "gu", "down"):
            gated = name == "gu"
            nbytes = layers[0][name].numel() * 2
            one = {"engine": lambda: [K.norm_linear(xs[name], None, L["n1"], EPS, L[name], gated=gated)[1]
                                      if name in ("qkv", "gu") else K.linear(xs[name], L[name]) for L in layers],
                   "candidate": lambda: [fused(xs[name], L[name], nw=L["n1"] if name in ("qkv", "gu") else None,
                                               residual=x0 if name in ("o", "down") else None, gated=gated, sq_dot=True)
                                         for L in layers]}
            for case, fn in one.items():
                us = graph_us(fn, LAYERS)
                print(json.dumps({"M": m, "product": name, "case": case, "us": round(us, 2),
                                  "weight_tbps": round(nbytes / (us * 1e-6) / 1e12, 3)}), flush=True)


if __name__ == "__main__":
    main()

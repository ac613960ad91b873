"""Are the engine's matrix-vector tiles still the best ones, now that the norm and the residual add run inside?

The tiles in `dspark.kernels.gemv._gemv` (read off its launches here) were picked by `gemv_bench.py`
from eager timings of a bare product. This times the engine's own kernel, with the flags each Qwen3-8B product runs with (q/k/v: the
norm inside; o_proj and down: the residual add; gate/up: the norm and SwiGLU), in a CUDA graph over
three weights in turn (beyond L2), for M = 1 (decode) and 8 (verify), over a grid of tiles, and prints
the engine's current choice beside the best one. A configuration that does not fit the shared memory
is skipped.

    python benchmarks/gemv_tiles.py > gemv_tiles.jsonl
"""

from __future__ import annotations

import itertools
import json

import torch
import triton

from dspark.kernels import gemv

HIDDEN, INTER, EPS = 4096, 12288, 1e-6
# name: (rows of W, K, norm inside, residual in the epilogue, gated)
PRODUCTS = {"qkv": (6144, HIDDEN, True, False, False), "o_proj": (HIDDEN, HIDDEN, False, True, False),
            "gate_up": (2 * INTER, HIDDEN, True, False, True), "down": (HIDDEN, INTER, False, True, False)}
TILES = list(itertools.product((16, 32, 64), (128, 256, 512), (3, 5)))  # block_n, block_k, stages


def engine_tiles(call) -> tuple[int, int, int]:
    """The tiles the engine's `_gemv` picks for `call()`, read off its launch (not a copy of its rule)."""
    seen = []
    kernel = gemv._gemv_kernel

    class Recorder:
        def __getitem__(self, grid):
            def run(*args, **options):
                seen.append((options["BLOCK_N"], options["BLOCK_K"], options["num_stages"]))
                return kernel[grid](*args, **options)
            return run

    gemv._gemv_kernel = Recorder()
    try:
        call()
    finally:
        gemv._gemv_kernel = kernel
    return seen[-1]


def launch(x, w, nw, r, y, tiles, norm, residual, gated):
    m, k = x.shape
    n = y.shape[1]
    block_n, block_k, stages = tiles
    gemv._gemv_kernel[(triton.cdiv(n, block_n),)](
        x, nw, r, w, y, m, n, k, EPS, BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k, IEEE=False, NORM=norm,
        GATED=gated, RESIDUAL=residual, num_warps=4, num_stages=stages)
    return y


@torch.inference_mode()
def main() -> None:
    torch.manual_seed(0)
    dt = torch.bfloat16
    for name, (rows, k, norm, residual, gated) in PRODUCTS.items():
        n = rows // 2 if gated else rows
        ws = [torch.randn(rows, k, device="cuda", dtype=dt) * 0.02 for _ in range(3)]
        nw = torch.rand(k, device="cuda", dtype=dt) + 0.5
        nbytes = rows * k * 2
        for m in (1, 8):
            x = torch.randn(m, k, device="cuda", dtype=dt)
            r = torch.randn(m, n, device="cuda", dtype=dt)
            y = torch.empty(m, n, device="cuda", dtype=dt)
            current_tiles = engine_tiles(lambda: gemv.norm_linear(x, nw, EPS, ws[0], gated=gated) if norm
                                         else gemv.linear(x, ws[0], residual=r))
            ref = (gemv.norm_linear_ref(x, nw, EPS, ws[0], gated=gated) if norm
                   else gemv.linear_ref(x, ws[0], residual=r)).float()
            results = []
            for tiles in TILES:
                try:
                    out = launch(x, ws[0], nw, r, y, tiles, norm, residual, gated).float()
                except Exception:  # (triton's OutOfResources: the tiles do not fit the shared memory)
                    continue
                if (out - ref).norm() / ref.norm() > 2e-2:
                    raise SystemExit(f"{name} {tiles}: wrong result")

                def step(tiles=tiles):
                    for w in ws:
                        launch(x, w, nw, r, y, tiles, norm, residual, gated)

                us = triton.testing.do_bench_cudagraph(step, rep=60, return_mode="median") * 1e3 / len(ws)
                results.append((us, tiles))
            current = next(us for us, t in results if t == current_tiles)
            best_us, best = min(results)
            print(json.dumps({"product": name, "M": m, "engine_tiles": current_tiles, "engine_us": round(current, 2),
                              "engine_tbps": round(nbytes / current / 1e6, 3), "best_tiles": best,
                              "best_us": round(best_us, 2), "best_tbps": round(nbytes / best_us / 1e6, 3),
                              "configs": len(results)}), flush=True)


if __name__ == "__main__":
    main()

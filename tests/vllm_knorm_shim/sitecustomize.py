"""Test-only, on PYTHONPATH of `tests/test_markov_topk.py`'s vLLM run alone: `tests/vllm_shim` (vLLM's V2
runner on a CPU through Triton's interpreter) plus the per-layer fix of a vLLM CPU bug, so that vLLM's
DSpark rounds can be held against ours round by round.

The bug (docs/vllm.md, `../shared/docs/vllm.md`): `DFlashQwen3Model._normalize_context_k` normalises the
context keys of every draft layer with one `ops.rms_norm` call on a stacked `[layers, head_dim]` weight,
which the CPU kernel reads as layer 0's alone; vLLM's DSpark rounds then differ from ours whatever else
is compared. The fix is the same kernel called once per layer with that layer's weight. It is applied as
vLLM's module is imported (an import hook: importing vLLM here, at interpreter start, would be slow and
too early), in whichever process imports it. Product code never patches vLLM."""

import importlib.abc
import importlib.machinery
import runpy
import sys
from pathlib import Path

runpy.run_path(str(Path(__file__).parents[1] / "vllm_shim" / "sitecustomize.py"))  # (one sitecustomize runs)

MODULE = "vllm.model_executor.models.qwen3_dflash"


def _per_layer(module) -> None:
    """Replace the grouped context-key norm by one `ops.rms_norm` per layer."""
    import torch

    def normalize_context_k(self, all_k: torch.Tensor) -> torch.Tensor:  # all_k: [L, num_ctx, nkv, head_dim]
        out = torch.empty_like(all_k)
        for layer in range(all_k.shape[0]):
            module.ops.rms_norm(out[layer], all_k[layer].contiguous(), self._k_norm_weights[layer].contiguous(),
                                self._rms_norm_eps)
        return out

    module.DFlashQwen3Model._normalize_context_k = normalize_context_k


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds vLLM's module as Python would, and fixes it once it has run."""

    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _per_layer(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PatchOnImport())

"""Fused GPU kernels (Triton) for the small operations around the matrix products, with their reference.

Each public function computes the same thing as its `*_ref` twin in plain PyTorch; tests hold each kernel and
CPU form to it. What runs by default, and why:

- CUDA tensors, inference: the Triton kernels below. Each runs one launch where PyTorch would run several, and
  at a decode step's few rows the products stream the weights faster than cuBLAS does at these shapes
  (benchmarks/results/gemv_h200.txt).
- On Hopper or later the products also launch as programmatic dependents (`DSPARK_OVERLAP`, on): a product's
  programs are scheduled in the tail of the one before and wait for its output. It made decode, verify and the
  round about 1.2 % faster on the H200 (6520b67, benchmarks/RESULTS.md, issue 44); `DSPARK_OVERLAP=0` launches
  them plainly, bit-equal (`benchmarks/launch_probe.py` times both).
- CPU tensors, inference: the CPU forms (`cpu`) for the norms, the attention prologue and attention: the
  references' arithmetic in the fewest PyTorch operators, because a CPU step at the demo's sizes is bound by how
  many operators Python calls. `TRITON_INTERPRET=1` runs the Triton kernels on a CPU instead (the kernel tests).
- Autograd on (training), `DSPARK_KERNELS=0` or inside `references()`: the references everywhere, the eager
  form the others are tested against.

The kernels:
- `rms_norm`: RMSNorm in one pass, where no product takes it in (final norms, many-row forwards).
- `qk_norm_rope_cache`: per-head q/k RMSNorm, RoPE on both, K/V written to the cache at their positions.
- `silu_mul`: SwiGLU's silu(gate) * up on the fused gate/up projection output.
- `attention`: GQA attention of T query rows over the cache, each row seeing keys up to its limit (split-KV
  kernels for up to 16 rows, SDPA above).
- `linear`: x @ W^T for up to 16 rows, the residual add (o_proj, down) in its epilogue.
- `norm_linear`: the product of x's RMSNorm (q/k/v, gate/up) in the same launch, the norm's weight on
  x's tiles and its 1/rms in the epilogue; for gate/up, SwiGLU's silu(gate) * up there too.
- `vocab_draw`: sampling and distributions over the whole vocabulary, spread over many programs: the
  exponential race's arg-max (a token drawn from softmax(logits / T)) and softmax or one-hot probs.
- `accept`: the lossless acceptance rule (accepted prefix, residual or bonus token) in two launches.
- `markov_sample`: the vanilla Markov head's left-to-right loop, one launch per slot (bias product,
  noise, arg-max and the softmax statistics), then one launch for every slot's probabilities;
  `markov_sample_topk`, vLLM's top-k projection (the bias for each slot's top-k base logits only).

A layer's attention half as one persistent launch measured 3.2 % slower a layer than these four launches on the
H200 and was removed in issue 53; benchmarks/RESULTS.md (issue 44, ea73a8e) keeps its record.
"""

from dspark.kernels.activation import silu_mul, silu_mul_ref
from dspark.kernels.attention import SPLIT_KV_MAX_QUERIES, attention, attention_ref, split_kv_attention, visibility
from dspark.kernels.cpu import use_cpu_forms
from dspark.kernels.gemv import linear, linear_ref, norm_linear, norm_linear_ref
from dspark.kernels.launch import kernels_on, overlap_mode, references, use_triton
from dspark.kernels.norms import qk_norm_rope_cache, qk_norm_rope_cache_ref, rms_norm, rms_norm_ref, rope_ref
from dspark.kernels.sampling import (
                                     SAMPLE_BLOCK,
                                     accept,
                                     accept_ref,
                                     markov_sample,
                                     markov_sample_ref,
                                     markov_sample_topk,
                                     markov_sample_topk_ref,
                                     vocab_draw,
                                     vocab_draw_ref,
)

__all__ = ["SAMPLE_BLOCK", "SPLIT_KV_MAX_QUERIES", "accept", "accept_ref", "attention", "attention_ref", "kernels_on",
           "linear", "linear_ref", "markov_sample", "markov_sample_ref", "markov_sample_topk", "markov_sample_topk_ref",
           "norm_linear", "norm_linear_ref", "overlap_mode", "qk_norm_rope_cache", "qk_norm_rope_cache_ref",
           "references", "rms_norm", "rms_norm_ref", "rope_ref", "silu_mul", "silu_mul_ref", "split_kv_attention",
           "use_cpu_forms", "use_triton", "visibility", "vocab_draw", "vocab_draw_ref"]

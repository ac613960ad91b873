"""Fused GPU kernels (Triton) for the small operations around the matrix products, with their reference.

Each public function computes the same thing as its `*_ref` twin in plain PyTorch; on CUDA tensors
it runs one Triton kernel instead of several PyTorch ones (the reference runs without Triton, or when
`DSPARK_KERNELS=0`; a CPU runs the CPU forms below). Tests check each kernel against its reference.

- `rms_norm`: RMSNorm in one pass, where no product takes it in (final norms, many-row forwards).
- `qk_norm_rope_cache`: per-head q/k RMSNorm, RoPE on both, K/V written to the cache at their positions.
- `silu_mul`: SwiGLU's silu(gate) * up on the fused gate/up projection output.
- `attention_block`: a layer's attention half (q/k norm, RoPE, the cache write, attention, its merge, o_proj and
  the residual add) as one persistent launch, the weight stream running on under attention.
- `attention`: GQA attention of T query rows over the cache, each row seeing keys up to its limit.
- `linear`: x @ W^T for up to 16 rows, streaming W faster than cuBLAS does at these shapes
  (benchmarks/results/gemv_h200.txt), the residual add (o_proj, down) in its epilogue.
- `norm_linear`: the product of x's RMSNorm (q/k/v, gate/up) in the same launch, the norm's weight on
  x's tiles and its 1/rms in the epilogue; for gate/up, SwiGLU's silu(gate) * up there too.
- `race`: sampling and distributions over the whole vocabulary, spread over many programs: the
  exponential race's arg-max (a token drawn from softmax(logits / T)) and softmax or one-hot probs.
- `accept`: the lossless acceptance rule (accepted prefix, residual or bonus token) in two launches.
- `markov_sample`: the vanilla Markov head's left-to-right loop, one launch per slot (bias product,
  noise, arg-max and the softmax statistics), then one launch for every slot's probabilities;
  `markov_sample_topk`, vLLM's top-k projection (the bias for each slot's top-k base logits only).

On CPU tensors (inference) the norms, the attention prologue and attention run their CPU forms (`cpu`): the
references' arithmetic in the fewest PyTorch operators. `references()` (or `DSPARK_KERNELS=0`) runs the
references everywhere: the eager reference the fused and CPU forms are tested against.
"""

from dspark.kernels.activation import silu_mul, silu_mul_ref
from dspark.kernels.attention import SPLIT_KV_MAX_QUERIES, attention, attention_ref, split_kv_attention, visibility
from dspark.kernels.attention_block import attention_block, attention_block_fits, attention_block_ref
from dspark.kernels.cpu import use_cpu_forms
from dspark.kernels.gemv import linear, linear_ref, norm_linear, norm_linear_ref
from dspark.kernels.launch import kernels_on, overlap_mode, persistent_mode, references, use_triton
from dspark.kernels.norms import qk_norm_rope_cache, qk_norm_rope_cache_ref, rms_norm, rms_norm_ref, rope_ref
from dspark.kernels.sampling import (SAMPLE_BLOCK, accept, accept_ref, markov_sample, markov_sample_ref,
                                     markov_sample_topk, markov_sample_topk_ref, race, race_ref)

__all__ = ["SAMPLE_BLOCK", "SPLIT_KV_MAX_QUERIES", "accept", "accept_ref", "attention", "attention_block",
           "attention_block_fits", "attention_block_ref", "attention_ref", "kernels_on", "linear", "linear_ref",
           "markov_sample", "markov_sample_ref", "markov_sample_topk", "markov_sample_topk_ref", "norm_linear",
           "norm_linear_ref", "overlap_mode", "persistent_mode", "qk_norm_rope_cache", "qk_norm_rope_cache_ref",
           "race", "race_ref", "references", "rms_norm", "rms_norm_ref", "rope_ref", "silu_mul", "silu_mul_ref",
           "split_kv_attention", "use_cpu_forms", "use_triton", "visibility"]

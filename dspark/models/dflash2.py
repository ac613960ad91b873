"""z-lab's DFlash 2 parts (`dflash` 0.1.0, `DFlash2DraftModel`): a DFlash draft whose layers run grouped dynamic
causal convolutions around attention and the MLP, and whose plain head is replaced by a candidate selector.

Convolution: over the block's query rows only (the anchor is row 0, zeros before it), each output channel is a
sum over `kernel_size` taps of (a learnt base weight per tap and channel + a dynamic weight per row, tap and
channel group, projected from the row itself) times the input `offset` rows earlier. `prepare` convolves the
normed stream before a sub-layer and projects the dynamic weights of the convolution that `finish` applies to the
sub-layer's output; the context rows (the tapped target features) never pass through it. The operations and their
order are z-lab's, so that float32 results round as theirs do (exactness against z-lab is shown at float32 only:
see the selector below).

Selector: per slot the top-k of the draft's logits are re-scored left to right, candidate c of slot i getting
unary(c) + <predecessor(x_{i-1}) * P h_i, successor(c)> (x_{-1} the anchor, P the hidden projection), and the slot
takes the arg-max (T = 0) or a draw from softmax(scores / T) (T > 0). The head's logits are float32
(`DraftModel.base_logits`) and the scores summed in float32, where z-lab sums them in the model's dtype: the same at
float32, where our tokens and rounds equal z-lab's; in bfloat16 a near-tie between candidates may round otherwise.
Everything is device work with fixed shapes, so a drafter built on it can run inside a CUDA graph.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dspark import kernels
from dspark.models.config import BackboneConfig
from dspark.models.layers import AttentionStep, DecoderLayer, FusedProjections, KVCache, check_fused
from dspark.sampling import GREEDY_TEMPERATURE, probs, sample


def convolve(hidden: Tensor, dynamic: Tensor, base: Tensor, group_size: int, rows: int) -> Tensor:
    """hidden [B, T, H] convolved causally within each block of `rows` rows (T a multiple of it): out[t] =
    sum_o (base[o] + dynamic[t, o, group]) * hidden[t - o], zero where t - o falls before the block's first row
    (dynamic [B, T, taps, groups], base [taps, H]), accumulated tap by tap as z-lab's `_grouped_dynamic_convolve`.
    Inference runs one block (T = rows, the split a view); training many blocks of a sequence in one row, which
    must not see each other (`dspark.training.block_objective`)."""
    h = hidden.shape[-1]
    taps, groups = base.shape[0], h // group_size
    blocks = hidden.view(-1, rows, groups, group_size)
    dynamic = dynamic.reshape(-1, rows, taps, groups, 1)
    out = torch.zeros_like(blocks)
    for offset in range(taps):
        values = blocks if offset == 0 else F.pad(blocks, (0, 0, 0, 0, offset, 0))[:, :rows]
        out = out + base[offset].view(1, 1, groups, group_size).to(hidden.dtype) * values
        out = torch.addcmul(out, dynamic[:, :, offset], values)
    return out.view_as(hidden)


class GroupedDynamicCausalConv(nn.Module):
    """One of a layer's two convolutions (parameter names as z-lab's checkpoints)."""

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int, block_size: int):
        super().__init__()
        self.kernel_size, self.group_size, self.block_size = kernel_size, group_size, block_size
        self.base_kernel = nn.Parameter(torch.empty(2, kernel_size, hidden_size))
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * (hidden_size // group_size), bias=False)

    def prepare(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x convolved (the first kernel), and the dynamic weights of the second (for `finish`), both from x."""
        dynamic = kernels.linear(x, self.kernel_projection.weight)
        dynamic = dynamic.view(*x.shape[:-1], 2, self.kernel_size, x.shape[-1] // self.group_size)
        return (convolve(x, dynamic[..., 0, :, :], self.base_kernel[0], self.group_size, self.block_size),
                dynamic[..., 1, :, :])

    def finish(self, x: Tensor, dynamic: Tensor) -> Tensor:
        return convolve(x, dynamic, self.base_kernel[1], self.group_size, self.block_size)


def _project(module: FusedProjections, x: Tensor, gated: bool = False) -> Tensor:
    """A fused q/k/v (or gate/up, through SwiGLU) product of x as it is: here the norm comes before the convolution,
    so it cannot run inside the product as in `FusedProjections.project_normed`."""
    check_fused(module, module.fused, module.parts()[0].weight)
    y = kernels.linear(x, *module.fused)
    return kernels.silu_mul(y) if gated else y


class DFlash2Layer(DecoderLayer):
    """A Qwen3 draft layer with z-lab's convolutions: norm, convolve, attention, convolve, add; the same for the MLP."""

    def __init__(self, cfg: BackboneConfig, kernel_size: int, group_size: int, block_size: int):
        super().__init__(cfg)
        self.attention_conv = GroupedDynamicCausalConv(cfg.hidden_size, kernel_size, group_size, block_size)
        self.mlp_conv = GroupedDynamicCausalConv(cfg.hidden_size, kernel_size, group_size, block_size)

    def forward(self, x: Tensor, step: AttentionStep, cache: KVCache, layer: int) -> Tensor:
        h, dynamic = self.attention_conv.prepare(self.input_layernorm(x))
        x = x + self.attention_conv.finish(self.self_attn(_project(self.self_attn, h), step, cache, layer, None),
                                           dynamic)
        h, dynamic = self.mlp_conv.prepare(self.post_attention_layernorm(x))
        return x + self.mlp_conv.finish(self.mlp(_project(self.mlp, h, gated=True), None), dynamic)


class CandidateSelector(nn.Module):
    """z-lab's candidate selector (parameter names as its checkpoints; the codebooks are embeddings here, stored
    without their `.weight` by z-lab's releases: `dspark.formats.zlab`)."""

    def __init__(self, vocab_size: int, hidden_size: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Embedding(vocab_size, rank)
        self.successor_codebook = nn.Embedding(vocab_size, rank)
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)

    def select(self, hidden: Tensor, logits: Tensor, anchor: Tensor, temperature: float,
               generator: torch.Generator | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """hidden [n, H] and logits [n, V] of the n slots, anchor [1] -> (the tokens [n], the candidates [n, k], q
        [n, k]: the distribution each slot's token was drawn from over its candidates (one-hot at T = 0), the
        scores [n, k] it was drawn by). Only temperature shapes q: z-lab's selector applies no top-p or top-k."""
        unary, candidates = torch.topk(logits, self.top_k, dim=-1, sorted=False)
        projected = kernels.linear(hidden, self.hidden_projection.weight)
        successors = self.successor_codebook(candidates)  # [n, k, r]
        predecessor, tokens, qs, all_scores = anchor, [], [], []
        for slot in range(hidden.shape[0]):
            pair = self.predecessor_codebook(predecessor) * projected[slot]  # [1, r]
            scores = unary[slot : slot + 1] + torch.einsum("br,bkr->bk", pair, successors[slot : slot + 1]).float()
            q = probs(scores, temperature)
            index = scores.argmax(-1) if temperature <= GREEDY_TEMPERATURE else sample(q, generator)
            predecessor = candidates[slot].index_select(0, index)
            tokens.append(predecessor)
            qs.append(q)
            all_scores.append(scores)
        return torch.cat(tokens), candidates, torch.cat(qs), torch.cat(all_scores)

    def score_candidates(self, hidden: Tensor, logits: Tensor, predecessors: Tensor, candidates: Tensor) -> Tensor:
        """`select`'s scores of given candidates [..., k] for given predecessors [...] (hidden [..., H], logits
        [..., V]), every slot at once: what training scores with the true predecessors (teacher forcing)."""
        pair = self.predecessor_codebook(predecessors) * self.hidden_projection(hidden)  # [..., r]
        return logits.gather(-1, candidates) + (pair[..., None, :] * self.successor_codebook(candidates)).sum(-1)


def dflash2_layers(cfg, count: int) -> list[DecoderLayer]:
    """The layers of a draft of `cfg` (a DraftConfig): DFlash 2's where it sets a convolution, else plain ones."""
    b = cfg.backbone
    if not cfg.conv_kernel_size:
        return [DecoderLayer(b) for _ in range(count)]
    return [DFlash2Layer(b, cfg.conv_kernel_size, cfg.conv_group_size, cfg.block_size) for _ in range(count)]


def identity_convolutions(model: nn.Module) -> None:
    """Every convolution the identity (tap 0's base kernel 1, the rest and the dynamic projection 0), as
    vllm-project/speculators starts a DFlash 2 draft it trains: the fresh draft is then a plain DFlash one."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, GroupedDynamicCausalConv):
                module.base_kernel.zero_()
                module.base_kernel[:, 0].fill_(1.0)
                module.kernel_projection.weight.zero_()


def init_convolutions(model: nn.Module, std: float) -> None:
    """The base kernels `init_weights` does not reach (plain parameters): normal(0, std) as the rest."""
    for module in model.modules():
        if isinstance(module, GroupedDynamicCausalConv):
            nn.init.normal_(module.base_kernel, std=std)

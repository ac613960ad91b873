"""The EAGLE-3 draft: one decoder layer over [token embedding, hidden state], chained token by token.

A row at position p reads the embedding of the token at p + 1 and a hidden state: at the first chain
step `fc` of the target's tapped states at p, later the draft's own pre-norm output of the row
before. Its attention input is [input_layernorm(embedding), hidden_norm(hidden)] (2H wide); the
residual is the raw hidden (the normed one with `norm_before_residual`); its output, before the final
norm, is what the next step reads, and `lm_head(norm(output))` scores the draft vocabulary (target
id = draft id + d2t[draft id]). The layer keeps its keys and values in its own position-addressed
cache (`KVCache`, one layer). Parameter names are ours (`midlayer.*`, as the EAGLE authors name
the layer); each format's key table maps its names onto them (`dspark.formats.eagle3`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dspark import kernels
from dspark.models.block_draft import DraftBase
from dspark.models.config import Eagle3Config
from dspark.models.layers import MLP, AttentionStep, KVCache, RMSNorm, check_fused, fuse_linears, init_weights, lay_out_products


class Eagle3Attention(nn.Module):
    """GQA attention whose q/k/v read the 2H-wide [embedding; hidden] input; Qwen3-style per-head q/k
    norms when the checkpoint has them, Llama-style without."""

    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        b = cfg.backbone
        self.num_heads, self.num_kv_heads, self.head_dim, self.eps = b.num_heads, b.num_kv_heads, b.head_dim, b.rms_norm_eps
        width, bias = 2 * b.hidden_size, b.attention_bias
        self.q_proj = nn.Linear(width, b.num_heads * b.head_dim, bias=bias)
        self.k_proj = nn.Linear(width, b.num_kv_heads * b.head_dim, bias=bias)
        self.v_proj = nn.Linear(width, b.num_kv_heads * b.head_dim, bias=bias)
        self.o_proj = nn.Linear(b.num_heads * b.head_dim, b.hidden_size, bias=bias)
        self.q_norm = RMSNorm(b.head_dim, b.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(b.head_dim, b.rms_norm_eps) if cfg.qk_norm else None
        self.fused: tuple[Tensor, Tensor | None] | None = None

    def fuse(self) -> None:
        self.fused = fuse_linears([self.q_proj, self.k_proj, self.v_proj])

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        if self.fused is not None:
            self.fuse()
        return out

    def forward(self, x: Tensor, step: AttentionStep, cache: KVCache, residual: Tensor) -> Tensor:
        """`residual` plus the attention of rows `x` [B, T, 2H] at `step`'s positions through o_proj; their
        keys and values land in the cache slots `step.slots`. Returns [B, T, H]."""
        if torch.is_grad_enabled():
            qkv = torch.cat([p(x) for p in (self.q_proj, self.k_proj, self.v_proj)], dim=-1)
        else:
            check_fused(self, self.fused, self.q_proj.weight)
            qkv = kernels.linear(x, *self.fused)
        if self.q_norm is not None:
            q = kernels.qk_norm_rope_cache(qkv, self.num_heads, self.num_kv_heads, self.q_norm.weight,
                                           self.k_norm.weight, self.eps, step.cos, step.sin, step.slots,
                                           cache.k[0], cache.v[0])
        else:
            q = rope_cache(qkv, self.num_heads, self.num_kv_heads, self.head_dim, step, cache)
        out = kernels.attention(q, cache.k[0], cache.v[0], step.limits, step.kv_len, step.mask, step.causal)
        b, _, t, _ = out.shape
        return kernels.linear(out.transpose(1, 2).reshape(b, t, -1), self.o_proj.weight, self.o_proj.bias, residual)


def rope_cache(qkv: Tensor, num_heads: int, num_kv_heads: int, head_dim: int, step: AttentionStep,
               cache: KVCache) -> Tensor:
    """The Llama-style attention prologue: RoPE on q and k (no per-head norms), k and v into the cache at
    `step.slots`. Returns q [B, heads, T, D]."""
    b, t, _ = qkv.shape
    q, k, v = qkv.view(b, t, num_heads + 2 * num_kv_heads, head_dim).split([num_heads, num_kv_heads, num_kv_heads],
                                                                           dim=2)
    q = kernels.rope_ref(q.transpose(1, 2), step.cos, step.sin)
    k = kernels.rope_ref(k.transpose(1, 2), step.cos, step.sin)
    rows = torch.arange(b, device=qkv.device)[:, None]
    cache.k[0][rows, :, step.slots] = k.transpose(1, 2)
    cache.v[0][rows, :, step.slots] = v
    return q


class Eagle3Layer(nn.Module):
    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        b = cfg.backbone
        self.norm_before_residual = cfg.norm_before_residual
        self.input_layernorm = RMSNorm(b.hidden_size, b.rms_norm_eps)  # (it norms the embedding)
        self.hidden_norm = RMSNorm(b.hidden_size, b.rms_norm_eps)
        self.self_attn = Eagle3Attention(cfg)
        self.post_attention_layernorm = RMSNorm(b.hidden_size, b.rms_norm_eps)
        self.mlp = MLP(b)

    def fuse(self) -> None:
        self.self_attn.fuse()
        self.mlp.fuse()

    def forward(self, embeds: Tensor, hidden: Tensor, step: AttentionStep, cache: KVCache) -> Tensor:
        h = self.hidden_norm(hidden)
        x = self.self_attn(torch.cat((self.input_layernorm(embeds), h), dim=-1), step, cache,
                           residual=h if self.norm_before_residual else hidden)
        act = self.mlp.project_normed(x, self.post_attention_layernorm, gated=True)
        return self.mlp(act, residual=x)


class Eagle3Draft(DraftBase):  # (one layer: its config holds num_layers 1)
    def __init__(self, cfg: Eagle3Config, with_embeddings: bool = True):
        super().__init__()
        self.config = cfg
        b = cfg.backbone
        # A frozen copy of the target's; shared with the target when the checkpoint has none.
        self.embed_tokens = nn.Embedding(b.vocab_size, b.hidden_size) if with_embeddings else None
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.feature_size, b.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(cfg)
        self.norm = RMSNorm(b.hidden_size, b.rms_norm_eps)
        self.lm_head = nn.Linear(b.hidden_size, cfg.vocab_size, bias=False)  # the draft's own, over its vocabulary
        # Reduced vocabulary: target id = draft id + d2t[draft id].
        self.register_buffer("d2t", torch.zeros(cfg.vocab_size, dtype=torch.long) if cfg.reduced_vocab else None)

    def init_random(self, std: float = 0.02) -> None:
        init_weights(self, std)

    def fuse(self) -> "Eagle3Draft":
        """Fuse q/k/v and gate/up once the weights are final (the loaders and builders call it)."""
        self.midlayer.fuse()
        lay_out_products(self)
        return self

    def share_embeddings(self, embed_tokens: nn.Embedding) -> None:
        """Use the target's token embedding (EAGLE-3 drafts keep a frozen copy of it)."""
        self.embed_tokens = embed_tokens

    def project_features(self, feats: Tensor) -> Tensor:
        """The first chain step's hidden input: `fc` of the tapped target states [..., taps*H]."""
        return kernels.linear(feats, self.fc.weight)

    def forward(self, embeds: Tensor, hidden: Tensor, positions: Tensor, cache: KVCache, kv_len: int,
                slots: Tensor | None = None, limits: Tensor | None = None, mask: Tensor | None = None,
                causal: bool = False) -> tuple[Tensor, Tensor]:
        """Rows [B, T] of embeddings and hidden inputs (H wide each) at `positions`, each seeing the keys up
        to `limits` (default: its own position; `mask` instead, in training; `causal`: rows 0..T-1 of a
        prefill), its own K/V written to `slots` (default: its position). Returns (final-normed output,
        pre-norm output): the first scores the vocabulary, the second feeds the next chain step."""
        b = self.config.backbone
        step = AttentionStep.build(positions, positions if limits is None else limits, kv_len, b, embeds.dtype,
                                   slots, mask, causal, tables=None if mask is not None else cache.rope)
        pre = self.midlayer(embeds, hidden, step, cache)
        return self.norm(pre), pre

    def logits(self, normed: Tensor) -> Tensor:
        """Scores over the draft vocabulary, float32."""
        return kernels.linear(normed, self.lm_head.weight).float()

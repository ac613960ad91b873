"""The DSpark / DFlash draft: KV-injected context, one non-causal block forward, Markov and confidence heads
(and z-lab's DFlash 2: convolutions in each layer and a candidate selector, `dspark.models.dflash2`).

Per draft layer the context is never run through attention or the MLP: the tapped target features
go through `fc` + `hidden_norm` once, and each layer projects them to keys (k_norm, RoPE at their
true positions) and values, kept in the draft's own position-addressed cache. The query block
`[anchor, mask, ..., mask]` then sees the context before the anchor and the whole block.
Parameter names follow the DeepSpec checkpoint (`layers.*`, `fc`, `hidden_norm`, `markov_head.*`).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor, nn

from dspark import kernels
from dspark.errors import DSparkError
from dspark.models.config import DraftConfig
from dspark.models.dflash2 import CandidateSelector, dflash2_layers, init_convolutions
from dspark.models.layers import AttentionStep, KVCache, RMSNorm, device_layout, init_weights, lay_out_products


class MarkovHead(nn.Module):
    """Low-rank bias on slot k's logits from the token sampled before it (spec §3)."""

    def __init__(self, kind: str, rank: int, hidden: int, target_vocab: int, draft_vocab: int):
        super().__init__()
        self.kind = kind
        self.markov_w1 = nn.Embedding(target_vocab, rank)  # indexed by target ids
        self.markov_w2 = nn.Linear(rank, draft_vocab, bias=False)  # bias over draft ids
        if kind == "gated":
            self.gate_proj = nn.Linear(hidden + rank, rank)
        elif kind == "rnn":
            self.joint_proj = nn.Linear(2 * rank + hidden, 3 * rank)

    def step(self, h: Tensor, prev: Tensor, state: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
        """h [B, H] slot hidden, prev [B] previous token -> (bias [B, Vd] float32, e [B, r], new state)."""
        e = self.markov_w1(prev)
        if self.kind == "vanilla":
            z = e
        elif self.kind == "gated":
            z = torch.sigmoid(self.gate_proj(torch.cat((h, e), dim=-1))) * e
        else:
            if state is None:
                state = torch.zeros_like(e)
            g_raw, c_raw, o_raw = self.joint_proj(torch.cat((state, e, h), dim=-1)).chunk(3, dim=-1)
            g = torch.sigmoid(g_raw)
            state = g * state + (1 - g) * torch.tanh(c_raw)
            z = torch.tanh(o_raw)
        return kernels.linear(z, self.markov_w2.weight).float(), e, state


class ConfidenceHead(nn.Module):
    """Logit of slot k being accepted given the earlier slots were; sees h_k and x_{k-1}, never x_k."""

    def __init__(self, in_features: int):
        super().__init__()
        self.proj = nn.Linear(in_features, 1)

    def forward(self, h: Tensor, e: Tensor | None) -> Tensor:
        feats = h if e is None else torch.cat((h, e), dim=-1)
        return self.proj(feats).squeeze(-1).float()


class DraftBase(nn.Module):
    """What a block draft and an EAGLE-3 draft do alike, written once: both read tapped target states
    through `fc`, keep a K/V cache of their layers and, over a reduced vocabulary, map draft ids to
    target ids with `d2t`."""

    def target_ids(self) -> Tensor:
        """Target id of every draft id."""
        ids = torch.arange(self.config.vocab_size, device=self.fc.weight.device)
        return ids + self.d2t if self.d2t is not None else ids

    def new_cache(self, max_len: int, batch: int = 1) -> KVCache:
        b = self.config.backbone
        w = self.fc.weight
        return KVCache(b.num_layers, batch, b.num_kv_heads, max_len, b.head_dim, w.dtype, w.device, b.rope_theta)


class DraftModel(DraftBase):
    def __init__(self, cfg: DraftConfig, with_embeddings: bool = True):
        super().__init__()
        self.config = cfg
        b = cfg.backbone
        self.layers = nn.ModuleList(dflash2_layers(cfg, b.num_layers))  # (z-lab's DFlash 2: convolutions in each)
        self.norm = RMSNorm(b.hidden_size, b.rms_norm_eps)
        self.fc = nn.Linear(len(cfg.target_layer_ids) * b.hidden_size, b.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(b.hidden_size, b.rms_norm_eps)
        # Frozen copies of the target's; shared with the target when the checkpoint has none.
        self.embed_tokens = nn.Embedding(b.vocab_size, b.hidden_size) if with_embeddings else None
        self.lm_head = nn.Linear(b.hidden_size, cfg.vocab_size, bias=False) if with_embeddings else None
        self.markov_head = (
            MarkovHead(cfg.markov_head_type, cfg.markov_rank, b.hidden_size, b.vocab_size, cfg.vocab_size)
            if cfg.markov_rank > 0 else None
        )
        self.confidence_head = (
            ConfidenceHead(b.hidden_size + (cfg.markov_rank if cfg.confidence_head_with_markov else 0))
            if cfg.confidence_head else None
        )
        self.candidate_selector = (  # z-lab's DFlash 2: re-scores the head's top-k candidates left to right
            CandidateSelector(b.vocab_size, b.hidden_size, cfg.selector_rank, cfg.selector_top_k)
            if cfg.selector_rank else None
        )
        self.mask_embedding: nn.Parameter | None = None  # z-lab's optional separate mask row
        # Reduced vocabulary: target id = draft id + d2t[draft id].
        self.register_buffer("d2t", torch.zeros(cfg.vocab_size, dtype=torch.long) if cfg.reduced_vocab else None)
        self.context_kv: tuple[Tensor, Tensor | None] | None = None  # see fuse()
        self._context_versions: tuple[int, ...] = ()

    def init_random(self, std: float = 0.02) -> None:
        init_weights(self, std)
        init_convolutions(self, std)

    def fuse(self) -> "DraftModel":
        """Fuse every layer's projections (q/k/v, gate/up) and stack all layers' [k; v] weights for
        the context's one matrix product. Called once the weights are final, by the loaders and the
        random builders; conversions (`.to`, ...) redo it, and so does eval() after in-place training."""
        for layer in self.layers:
            layer.fuse()
        self._stack_context_kv()
        lay_out_products(self)
        return self

    def _context_projections(self) -> list[nn.Linear]:
        return [p for layer in self.layers for p in (layer.self_attn.k_proj, layer.self_attn.v_proj)]

    def _versions(self) -> tuple[int, ...]:
        return tuple(p.weight._version for p in self._context_projections())

    def _stack_context_kv(self) -> None:
        """A copy (each layer's fused q/k/v holds these rows too), so in-place changes need it again."""
        projs = self._context_projections()
        with torch.inference_mode(False), torch.no_grad():
            weight = device_layout(torch.cat([p.weight.detach() for p in projs]))
            bias = torch.cat([p.bias.detach() for p in projs]) if projs[0].bias is not None else None
        self.context_kv = (weight, bias)
        self._context_versions = self._versions()

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)  # the layers fuse again themselves
        if self.context_kv is not None:
            self._stack_context_kv()
        return out

    def train(self, mode: bool = True) -> "DraftModel":
        super().train(mode)
        if not mode and self.context_kv is not None and self._versions() != self._context_versions:
            self._stack_context_kv()  # trained in place: the layers' fused views saw it, the copy did not
        return self

    def share_embeddings(self, embed_tokens: nn.Embedding, lm_head: nn.Linear) -> None:
        """Use the target's embedding and LM head (rows picked by d2t for a reduced vocabulary)."""
        self.embed_tokens = embed_tokens
        if self.config.reduced_vocab:
            head = nn.Linear(lm_head.in_features, self.config.vocab_size, bias=False)
            head.weight = nn.Parameter(lm_head.weight[self.target_ids()].detach().clone(), requires_grad=False)
            self.lm_head = head.to(lm_head.weight.device)
        else:
            self.lm_head = lm_head

    def add_context(self, feats: Tensor, positions: Tensor, cache: KVCache, slots: Tensor | None = None) -> None:
        """Write the K/V of new context rows (tapped target features [B, n, T*H] at `positions`).

        One matrix product projects the rows to the keys and values of every draft layer at once.
        """
        fed = kernels.linear(feats, self.fc.weight)
        step = AttentionStep.build(positions, positions, 0, self.config.backbone, fed.dtype, slots,
                                   tables=cache.rope if slots is None else None)
        attns = [layer.self_attn for layer in self.layers]
        if torch.is_grad_enabled():
            c = self.hidden_norm(fed)
            kvs = [torch.cat((a.k_proj(c), a.v_proj(c)), dim=-1) for a in attns]
        else:
            # (the version check runs eagerly only: compiled, reading the counters would break the graph)
            stale = not torch.compiler.is_compiling() and self._versions() != self._context_versions
            if self.context_kv is None or stale:
                raise RuntimeError("DraftModel: the context projections are not fused, or changed in place since; "
                                   "call fuse() after building, loading or editing the weights (the loaders do)")
            kv = kernels.norm_linear(fed, self.hidden_norm.weight, self.hidden_norm.eps, *self.context_kv)
            kvs = kv.chunk(len(attns), dim=-1)
        for i, (attn, kv) in enumerate(zip(attns, kvs)):
            attn.store_kv(kv, step, cache, i)

    def block_hidden(self, block_ids: Tensor, positions: Tensor, cache: KVCache, kv_len: int,
                     slots: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        """Final-normed hidden states [B, block, H] of the query block at `positions` [B, block].

        The block's own K/V land in the cache slots of its positions, where the next context rows
        overwrite them; every block query sees keys up to the block's last position (`kv_len` - 1).
        Training runs many blocks at once: each in its own `slots`, with an explicit `mask`.
        """
        x = self.embed_tokens(block_ids)
        if self.config.input_embedding_scale != 1.0:
            x = x * self.config.input_embedding_scale
        if self.mask_embedding is not None:
            x = torch.cat((x[:, :1], self.mask_embedding.to(x.dtype).expand(x.shape[0], x.shape[1] - 1, -1)), dim=1)
        last = positions[:, -1:].expand_as(positions)
        step = AttentionStep.build(positions, last, kv_len, self.config.backbone, x.dtype, slots, mask,
                                   tables=cache.rope if slots is None else None)
        steps = self._layer_steps(step, mask is not None)
        for i, layer in enumerate(self.layers):
            x = layer(x, steps[i], cache, i)
        return self.norm(x)

    def _layer_steps(self, step: AttentionStep, trained: bool) -> list[AttentionStep]:
        """Each layer's view of the block: `step` for every layer of a draft whose layers are all non-causal
        (every draft but a z-lab one with causal or sliding-window layers), else per layer its own limits
        (causal: a query sees the block up to its own slot) and, with a window, an explicit mask."""
        cfg = self.config
        n = len(self.layers)
        if not cfg.layer_causal and not cfg.layer_window:
            return [step] * n
        if trained:
            raise DSparkError("training a draft with causal or sliding-window layers (z-lab's layer_types) is not "
                              "supported; train one whose layer_types are all full_attention")
        made: dict[tuple, AttentionStep] = {}
        kinds = [(bool(cfg.layer_causal and cfg.layer_causal[i]), cfg.layer_window[i] if cfg.layer_window else None)
                 for i in range(n)]
        for causal, window in set(kinds):
            limits = step.positions if causal else step.limits
            mask = kernels.visibility(limits, step.kv_len) if window is not None or step.mask is not None else None
            if window is not None:
                ahead = step.positions[..., None] - torch.arange(step.kv_len, device=limits.device)
                near = (ahead < window) if causal else (ahead < window) & (-ahead < window)
                mask = mask & near[:, None]
            made[causal, window] = replace(step, limits=limits, mask=mask)
        return [made[kind] for kind in kinds]

    def base_logits(self, hidden: Tensor) -> Tensor:
        """The head's logits (float32), times z-lab's `output_multiplier` and soft-capped where it says."""
        logits = kernels.linear(hidden, self.lm_head.weight).float()
        cfg = self.config
        if cfg.output_multiplier != 1.0:
            logits = logits * cfg.output_multiplier
        if cfg.final_logit_softcapping is not None:
            logits = torch.tanh(logits / cfg.final_logit_softcapping) * cfg.final_logit_softcapping
        return logits

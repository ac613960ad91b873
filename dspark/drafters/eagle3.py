"""The EAGLE-3 drafter: a chain of drafts, one token per forward of the draft's single layer.

Every committed position p holds, in the draft's cache, the layer's keys and values for the row
(embedding of the token at p + 1, fc of the target's states at p). A round's propose step:

1. the rows the last round committed (the old anchor and the accepted drafts, whose target states
   wait in `state.verify_feats`) go through the layer at once: their K/V enter the cache, and the
   last one's output (it reads the new anchor's embedding) is the first chain step;
2. each further step is one row at the next position, reading the token just drawn and the previous
   step's pre-norm output in place of a target state.

The token after each context row is the next row's token, and the target's forward already embeds
those: the drafter taps the target's embedding output (`-1`) beside its layers, and the next row's
tap is the row's token input (the last committed row reads the anchor, embedded by the draft). So
the draft must embed tokens as the target does, which every EAGLE-3 draft does (a frozen copy of
the target's table; the loader refuses one that differs). The whole step is device work on fixed
shapes: one CUDA graph.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dspark.engine.steps import DecodeState, scratch_positions, visible_len
from dspark.models.eagle3_draft import Eagle3Draft
from dspark.models.layers import KVCache
from dspark.sampling import GREEDY_TEMPERATURE, draw, top2_margin
from dspark.schedule import ProposalCut


class Eagle3Drafter:
    method = "eagle3"
    graphable = True
    has_confidence = False  # EAGLE-3 has no confidence head

    def __init__(self, model: Eagle3Draft, num_tokens: int | None = None, margins: bool = False):
        self.model = model
        self.margins = margins
        cfg = model.config
        self.taps = (-1, *cfg.target_layer_ids)  # the embedding output first: the context rows' token inputs
        self.block_size = num_tokens or cfg.num_speculative_tokens
        self.cache: KVCache | None = None
        self._width = cfg.feature_size  # one tap's width (the embedding's too)
        self._to_target = model.target_ids()

    def allocate(self, max_len: int) -> None:
        if self.cache is None or self.cache.max_len != max_len:
            self.cache = self.model.new_cache(max_len)

    def start(self, state: DecodeState, prompt_feats: Tensor | None, prompt_ids: Tensor) -> None:
        """The prompt's rows but its last into the cache; the last waits, as a committed row does, for the
        first propose step (it reads the anchor, the prefill's token)."""
        n, w = prompt_feats.shape[1], self._width
        if n > 1:
            positions = torch.arange(n - 1, device=prompt_feats.device)[None]
            self.model(prompt_feats[:, 1:, :w], self.model.project_features(prompt_feats[:, :-1, w:]), positions,
                       self.cache, n - 1, causal=True)
        state.verify_feats[0, 0].copy_(prompt_feats[0, -1])
        state.pending_start.fill_(n - 1)
        state.pending_count.fill_(1)

    def propose(self, state: DecodeState, temperature: float, cut: ProposalCut, generator: torch.Generator,
                history: list[int]) -> None:
        """The committed rows through the layer, then the chain: `block_size` drafts and their distributions."""
        model, w = self.model, self._width
        feats = state.verify_feats[0]  # [R, (1 + taps) * w]
        rows = feats.shape[0]
        count = state.pending_count
        anchor = model.embed_tokens(state.anchor)  # [1, w]
        below = (torch.arange(rows, device=feats.device) + 1 < count)[:, None]
        tokens_in = torch.where(below, torch.cat((feats[1:, :w], anchor)), anchor)  # each row's next token
        positions = (state.pending_start + torch.arange(rows, device=feats.device))[None]
        slots = scratch_positions(state.pending_start, count, rows, self.cache)
        normed, pre = model(tokens_in[None], model.project_features(feats[None, :, w:]), positions, self.cache,
                            visible_len(self.cache), slots=slots)
        last = (count - 1).clamp_min(0)  # (0 only while graphs are captured on an empty state)
        normed, pre = normed[0].index_select(0, last), pre[0].index_select(0, last)  # [1, H]
        ids, qs, logits_all = [], [], []
        for j in range(self.block_size):
            logits = model.logits(normed)  # [1, Vd]
            draft_id, q = draw(logits, temperature, generator, with_probs=True)
            ids.append(draft_id)
            qs.append(q)
            logits_all.append(logits)
            if j + 1 == self.block_size:
                break
            token = self._to_target[draft_id]
            position = (state.position + j).view(1, 1)  # the chain's rows follow the anchor's position
            normed, pre = model(model.embed_tokens(token)[None], pre[None], position, self.cache,
                                visible_len(self.cache))
            normed, pre = normed[0], pre[0]
        draft_ids, q = torch.cat(ids), torch.cat(qs)  # [k], [k, Vd]
        if self.margins and temperature <= GREEDY_TEMPERATURE:  # the logits each greedy step took its arg-max of
            state.draft_margin.copy_(top2_margin(torch.cat(logits_all)))
        state.draft_tokens[0].copy_(self._to_target[draft_ids])
        if model.config.reduced_vocab:  # verification needs q over the target vocabulary
            state.draft_probs[0].zero_().index_copy_(1, self._to_target, q)
        else:
            state.draft_probs[0].copy_(q)
        state.confidence.fill_(1.0)
        state.num_proposed.fill_(self.block_size)

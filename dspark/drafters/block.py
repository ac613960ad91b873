"""The block drafter: a DSpark (Markov-corrected) or DFlash (independent slots) draft model proposing a
whole block from one non-causal forward."""

from __future__ import annotations

import torch
from torch import Tensor

from dspark import kernels
from dspark.engine.steps import DecodeState, scratch_positions, visible_len
from dspark.models.block_draft import DraftModel
from dspark.models.layers import KVCache
from dspark.sampling import GREEDY_TEMPERATURE, draw, race_noise, top2_margin
from dspark.schedule import ProposalCut


class BlockDrafter:
    """A DSpark (Markov-corrected) or DFlash (independent slots) draft model."""

    graphable = True

    def __init__(self, model: DraftModel, margins: bool = False, markov_topk: int = 0):
        self.model = model
        self.margins = margins
        # > 0: the vanilla Markov head's bias only for each slot's top-k base logits (`kernels.markov_sample_topk`)
        self.markov_topk = markov_topk
        cfg = model.config
        self.method = cfg.method
        self.taps = cfg.target_layer_ids
        self.block_size = cfg.num_drafts
        self.has_confidence = model.confidence_head is not None
        self.cache: KVCache | None = None
        device = model.fc.weight.device
        self._masks = torch.full((cfg.block_size - 1,), cfg.mask_token_id, dtype=torch.long, device=device)
        self._to_target = model.target_ids()

    def allocate(self, max_len: int) -> None:
        if self.cache is None or self.cache.max_len != max_len:
            self.cache = self.model.new_cache(max_len)

    def start(self, state: DecodeState, prompt_feats: Tensor | None, prompt_ids: Tensor) -> None:
        n = prompt_feats.shape[1]
        self.model.add_context(prompt_feats, torch.arange(n, device=prompt_feats.device)[None], self.cache)
        state.pending_count.zero_()

    def propose(self, state: DecodeState, temperature: float, cut: ProposalCut, generator: torch.Generator,
                history: list[int]) -> None:
        """The whole draft step: pending context rows in, block forward, slot sampling, proposal out."""
        model, cfg = self.model, self.model.config
        hidden = self.slot_hidden(state)
        logits = model.base_logits(hidden)  # [n, Vd]
        if model.markov_head is None:
            draft_ids, q = draw(logits, temperature, generator, with_probs=True)
            conf = model.confidence_head(hidden, None) if model.confidence_head else None
        else:
            q, draft_ids, conf, logits = self._markov_sample(hidden, logits, state.anchor, temperature, generator)
        if self.margins and temperature <= GREEDY_TEMPERATURE:  # the logits each greedy slot took its arg-max of
            state.draft_margin.copy_(top2_margin(logits))
        state.draft_tokens[0].copy_(self._to_target[draft_ids])
        if cfg.reduced_vocab:  # verification needs q over the target vocabulary
            state.draft_probs[0].zero_().index_copy_(1, self._to_target, q)
        else:
            state.draft_probs[0].copy_(q)
        n = cfg.num_drafts
        if conf is None:
            state.confidence.fill_(1.0)
            state.num_proposed.fill_(n)
            return
        state.confidence[0].copy_(torch.sigmoid(conf))
        state.num_proposed.copy_(cut.length(conf))

    def slot_hidden(self, state: DecodeState) -> Tensor:
        """The pending context rows into the draft's cache, then the block forward: the hidden state [n, H] of each
        proposal slot."""
        model, cfg = self.model, self.model.config
        rows = state.verify_feats.shape[1]
        model.add_context(state.verify_feats, scratch_positions(state.pending_start, state.pending_count, rows,
                                                                self.cache), self.cache)
        block = torch.cat((state.anchor, self._masks))[None]
        positions = (state.position + torch.arange(cfg.block_size, device=block.device))[None]
        hidden = model.block_hidden(block, positions, self.cache, visible_len(self.cache))[0]
        return hidden[cfg.block_size - cfg.num_drafts :]  # fill-in layout: slot 0 predicts nothing

    def _markov_sample(self, hidden: Tensor, logits: Tensor, anchor: Tensor, temperature: float,
                       generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
        """Left to right: slot k's logits get the bias of the token sampled at slot k-1 (the anchor for k=0).
        Returns (q, the drafts, their confidence logits, the corrected logits).

        Only the sampling is sequential (the race on the corrected logits, noise drawn for all slots at
        once); the distributions q are formed afterwards for all slots at once. The vanilla head runs
        as one fused launch per slot (`kernels.markov_sample`); the gated and recurrent heads, whose
        bias also depends on the slot's hidden state, step through `MarkovHead.step`.
        """
        head = self.model.markov_head
        noise = race_noise(tuple(logits.shape), temperature, generator, logits.device)
        greedy = temperature <= GREEDY_TEMPERATURE
        if head.kind == "vanilla" and self.markov_topk:
            q, ids, prevs, corrected = kernels.markov_sample_topk(logits, head.markov_w1.weight, head.markov_w2.weight,
                                                                  self._to_target, anchor, noise, temperature, greedy,
                                                                  self.markov_topk)
        elif head.kind == "vanilla":
            q, ids, prevs, corrected = kernels.markov_sample(logits, head.markov_w1.weight, head.markov_w2.weight,
                                                             self._to_target, anchor, noise, temperature, greedy)
        else:
            state = None

            def bias_of(prev: Tensor, k: int) -> Tensor:
                nonlocal state
                bias, _, state = head.step(hidden[k : k + 1], prev, state)
                return bias

            q, ids, prevs, corrected = kernels.markov_sample_ref(logits, bias_of, self._to_target, anchor, noise,
                                                                 temperature, greedy)
        conf = None
        if self.model.confidence_head is not None:  # slot k sees h_k and x_{k-1}, never x_k: batched after the loop
            e = head.markov_w1(prevs) if self.model.config.confidence_head_with_markov else None
            conf = self.model.confidence_head(hidden, e)
        return q, ids, conf, corrected

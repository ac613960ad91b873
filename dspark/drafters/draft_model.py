"""The classic draft model (vLLM's `draft_model`): a smaller model of the target's family and tokenizer
decodes k tokens autoregressively, each from its own forward, with its own KV cache; the target verifies
them in one forward, as it verifies every drafter's proposal.

Every committed position p < the anchor's holds, in the draft's cache, the draft's keys and values of the
token at p. A round's propose step:

1. one forward over two rows, the token just before the anchor (at position - 1) and the anchor: the first
   row is the catch-up (when the last round accepted all k drafts, its last draft was never fed; otherwise
   it rewrites that position with the same token), the second gives the first draft's logits;
2. k - 1 further forwards of one row each, the draft just drawn at the next position.

Which token sits at position - 1 is known on the device: the last round's chain (its anchor, then its
drafts) at index accepted = `pending_count - 1`. No step takes a host value that changes per round, so the
round is `graphable` (a CUDA graph on the GPU, the same code eagerly on the CPU); the prompt enters the
draft's cache in `start`, from the ids the engine gives every drafter after its prefill.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dspark.engine.steps import DecodeState, visible_len
from dspark.models.layers import KVCache
from dspark.models.target import Qwen3Target
from dspark.sampling import GREEDY_TEMPERATURE, draw, top2_margin
from dspark.schedule import ProposalCut


class DraftModelDrafter:
    method = "draft_model"
    taps: tuple[int, ...] = ()  # it reads the committed tokens, never the target's states
    graphable = True  # device work only: the prompt enters in `start` (see the module's docstring)
    has_confidence = False

    def __init__(self, model: Qwen3Target, num_tokens: int, margins: bool = False):
        self.model = model
        self.block_size = num_tokens
        self.margins = margins
        self.cache: KVCache | None = None
        device = model.lm_head.weight.device
        # the last round's anchor and drafts: index a is the token the round that accepted a drafts left at
        # the new anchor's position - 1
        self._chain = torch.zeros(num_tokens + 1, dtype=torch.long, device=device)

    def allocate(self, max_len: int) -> None:
        if self.cache is None or self.cache.max_len != max_len:
            self.cache = self.model.new_cache(max_len)

    def start(self, state: DecodeState, prompt_feats: Tensor | None, prompt_ids: Tensor) -> None:
        """A new request: the prompt but its last token into the cache, from position 0; the last is the first
        round's catch-up row (`pending_count` 1 reads `_chain[0]`)."""
        n = prompt_ids.shape[1]
        if n > 1:
            self.model(prompt_ids[:, :-1], None, self.cache, n - 1)
        self._chain[0].copy_(prompt_ids[0, -1])
        state.pending_count.fill_(1)

    def propose(self, state: DecodeState, temperature: float, cut: ProposalCut, generator: torch.Generator,
                history: list[int]) -> None:
        """The catch-up and anchor rows, then the chain: `block_size` drafts and their distributions (device
        work only)."""
        model, kv_len = self.model, visible_len(self.cache)
        # the token at position - 1 (a round accepts 0..k drafts; the bounds hold for states no round left: the
        # warm-up's, engine-bench's reset to 4 committed rows). The warm-up's anchor sits at position 0: its two
        # rows go to positions 0 and 1 (never -1, outside the cache); a request's anchor is never at 0.
        before = self._chain.index_select(0, (state.pending_count - 1).clamp(0, self.block_size))
        ids = torch.cat((before, state.anchor))[None]
        positions = ((state.position - 1).clamp_min(0) + torch.arange(2, device=ids.device))[None]
        hidden, _ = model(ids, positions, self.cache, kv_len)
        hidden = hidden[:, -1]
        ids_out, qs, logits_all = [], [], []
        for j in range(self.block_size):
            logits = model.logits(hidden)  # [1, V]
            draft_id, q = draw(logits, temperature, generator, with_probs=True)
            ids_out.append(draft_id)
            qs.append(q)
            logits_all.append(logits)
            if j + 1 == self.block_size:
                break
            position = (state.position + j + 1).view(1, 1)
            hidden, _ = model(draft_id.view(1, 1), position, self.cache, kv_len)
            hidden = hidden[:, -1]
        drafts = torch.cat(ids_out)  # [k]
        if self.margins and temperature <= GREEDY_TEMPERATURE:  # the logits each greedy step took its arg-max of
            state.draft_margin.copy_(top2_margin(torch.cat(logits_all)))
        self._chain.copy_(torch.cat((state.anchor, drafts)))
        state.draft_tokens[0].copy_(drafts)
        state.draft_probs[0].copy_(torch.cat(qs))
        state.confidence.fill_(1.0)
        state.num_proposed.fill_(self.block_size)

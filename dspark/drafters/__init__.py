"""Drafters: what proposes tokens for the target to verify. All share one interface (`base.Drafter`) and
one verify path.

A drafter starts a request from the prompt's tapped features, then, once per round, writes a
proposal into the request's `DecodeState` (tokens, the distributions they were drawn from, how
many count). The block drafters (DSpark, DFlash, DFlash 2) and the EAGLE-3 chain drafter work on the device
only, so their step can be a CUDA graph; the n-gram drafter looks the history up on the host, and the
classic draft model (`draft_model`) reads the prompt from it once, its rounds on the device.
"""

from dspark.drafters.base import Drafter
from dspark.drafters.block import BlockDrafter
from dspark.drafters.dflash2 import DFlash2Drafter
from dspark.drafters.draft_model import DraftModelDrafter
from dspark.drafters.eagle3 import Eagle3Drafter
from dspark.drafters.ngram import NgramDrafter
from dspark.models.block_draft import DraftModel
from dspark.models.eagle3_draft import Eagle3Draft


def drafter_for(model: DraftModel | Eagle3Draft, num_tokens: int | None = None,
                margins: bool = False, markov_topk: int = 0) -> BlockDrafter | Eagle3Drafter:
    """The drafter that runs a draft model: EAGLE-3's chain (`num_tokens` long, else its checkpoint's
    length), DFlash 2's selector, or the block drafter (its block is its checkpoint's; `markov_topk`: see
    BlockDrafter)."""
    if isinstance(model, Eagle3Draft):
        return Eagle3Drafter(model, num_tokens, margins)
    if model.candidate_selector is not None:
        return DFlash2Drafter(model, margins)
    return BlockDrafter(model, margins, markov_topk)


__all__ = ["BlockDrafter", "DFlash2Drafter", "DraftModelDrafter", "Drafter", "Eagle3Drafter", "NgramDrafter", "drafter_for"]

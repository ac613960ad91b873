"""Model shapes of published checkpoints, for random-weight timing runs (never for acceptance claims)."""

from __future__ import annotations

from dataclasses import replace

import torch

from dspark.errors import DSparkError
from dspark.formats.common import our_ids
from dspark.formats.eagle3.common import vllm_default_taps
from dspark.models.block_draft import DraftModel
from dspark.models.config import AnyDraftConfig, BackboneConfig, DraftConfig, Eagle3Config, TargetConfig
from dspark.models.eagle3_draft import Eagle3Draft
from dspark.models.target import Qwen3Target

QWEN3_8B = TargetConfig(
    backbone=BackboneConfig(hidden_size=4096, intermediate_size=12288, num_layers=36, num_heads=32, num_kv_heads=8,
                            head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6, vocab_size=151936),
    tie_word_embeddings=False, max_position_embeddings=40960, eos_token_ids=(151645, 151643),
)
QWEN3_4B = TargetConfig(
    backbone=replace(QWEN3_8B.backbone, hidden_size=2560, intermediate_size=9728),
    tie_word_embeddings=True, max_position_embeddings=40960, eos_token_ids=(151645, 151643),
)
# Qwen3-0.6B: the classic draft model (`draft_model`) teams deploy for Qwen3-8B, a Qwen3 of its tokenizer
QWEN3_0_6B = TargetConfig(
    backbone=replace(QWEN3_8B.backbone, hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16),
    tie_word_embeddings=True, max_position_embeddings=40960, eos_token_ids=(151645, 151643),
)
TARGETS = {"qwen3-8b": QWEN3_8B, "qwen3-4b": QWEN3_4B, "qwen3-0.6b": QWEN3_0_6B}
TOKENIZERS = {"qwen3-8b": "Qwen/Qwen3-8B", "qwen3-4b": "Qwen/Qwen3-4B",
              "qwen3-0.6b": "Qwen/Qwen3-0.6B"}  # read from the hub cache where present


def evenly_spaced_taps(num_target_layers: int, count: int = 5) -> tuple[int, ...]:
    """DeepSeek's and z-lab's rule: `count` ids from 1 to L-3, rounded ([1,9,17,25,33] for 36 layers);
    fewer for targets too shallow to hold that many."""
    last = max(1, num_target_layers - 3)
    count = max(1, min(count, last))
    if count == 1:
        return (min(1, num_target_layers - 2),)
    return tuple(round(1 + i * (last - 1) / (count - 1)) for i in range(count))


def dspark_draft_config(target: TargetConfig, block_size: int = 7, layers: int = 5, markov_rank: int = 256,
                        sample_from_anchor: bool = True, confidence: bool = True) -> DraftConfig:
    """The shape of deepseek-ai/dspark_qwen3_*_block7 (markov_rank 0 and no confidence: their DFlash; a fill-in
    draft, not sampling from the anchor, is z-lab's DFlash and its format)."""
    return DraftConfig(
        format="deepspec" if sample_from_anchor else "zlab", backbone=replace(target.backbone, num_layers=layers), block_size=block_size,
        target_layer_ids=evenly_spaced_taps(target.backbone.num_layers), sample_from_anchor=sample_from_anchor,
        mask_token_id=151669 if target.backbone.vocab_size > 151669 else target.backbone.vocab_size - 1,
        markov_rank=markov_rank, markov_head_type="vanilla" if markov_rank else None, confidence_head=confidence,
        confidence_head_with_markov=confidence and markov_rank > 0, num_target_layers=target.backbone.num_layers,
    )


def dflash2_draft_config(target: TargetConfig, block_size: int = 16, layers: int = 5) -> DraftConfig:
    """A z-lab DFlash 2 draft for `target`. z-lab publishes no DFlash 2 configuration for Qwen3-8B that we can read
    (its card is out of reach here), and its package sets no default for the DFlash 2 fields (its code requires
    them); so the shape is the z-lab DFlash preset's (`zlab-dflash-qwen3-8b-b16`: 5 full-attention, non-causal
    layers of the target's width, z-lab's default block of 16, the taps spread as z-lab spreads them), with the
    convolution and selector of z-lab's own DFlash 2 release for Qwen3.8-27B (z-lab/Qwen3.8-27B-DFlash2, as a
    public test quotes its config.json: conv_kernel_size 2, conv_group_size 16, selector_rank 256, selector_top_k
    16; vllm-project/speculators trains DFlash 2 with the same four by default). That release drafts blocks of 8
    through sliding-window layers; the block and layers here stay the DFlash preset's, so the two presets differ in
    DFlash 2's parts alone."""
    return replace(dspark_draft_config(target, block_size=block_size, layers=layers, markov_rank=0, confidence=False,
                                       sample_from_anchor=False),
                   conv_kernel_size=2, conv_group_size=16, selector_rank=256, selector_top_k=16)


def vllm_default_eagle3_taps(num_target_layers: int) -> tuple[int, ...]:
    """vLLM's default EAGLE-3 taps as ours ((1, 17, 32) for 36 layers), sorted and without repeats as vLLM
    reads them, for targets too shallow to hold three."""
    return our_ids(sorted(set(vllm_default_taps(num_target_layers))))


def eagle3_draft_config(target: TargetConfig, num_tokens: int = 7, draft_vocab_size: int | None = 32000,
                        qk_norm: bool = False) -> Eagle3Config:
    """The shape of the published Qwen3-8B EAGLE-3 drafts (AngelSlim/Qwen3-8B_eagle3,
    RedHatAI/Qwen3-8B-speculator.eagle3): one Llama-style layer of the target's width, a 32,000-token
    draft vocabulary, vLLM's default taps."""
    b = target.backbone
    return Eagle3Config(format="eagle", backbone=replace(b, num_layers=1),
                        target_layer_ids=vllm_default_eagle3_taps(b.num_layers), num_speculative_tokens=num_tokens,
                        qk_norm=qk_norm, draft_vocab_size=draft_vocab_size if draft_vocab_size != b.vocab_size else None,
                        num_target_layers=b.num_layers)


DRAFTS = {
    "dspark-qwen3-8b-block7": lambda: dspark_draft_config(QWEN3_8B),
    "dflash-qwen3-8b-block7": lambda: dspark_draft_config(QWEN3_8B, markov_rank=0, confidence=False),
    "zlab-dflash-qwen3-8b-b16": lambda: dspark_draft_config(QWEN3_8B, block_size=16, markov_rank=0, confidence=False,
                                                            sample_from_anchor=False),
    "zlab-dflash2-qwen3-8b-b16": lambda: dflash2_draft_config(QWEN3_8B),
    "eagle3-qwen3-8b": lambda: eagle3_draft_config(QWEN3_8B),
}


def build_random(target_cfg: TargetConfig, draft_cfg: AnyDraftConfig | None, device: str, dtype: torch.dtype,
                 seed: int = 0, std: float = 0.02) -> tuple[Qwen3Target, DraftModel | Eagle3Draft | None]:
    """Random models allocated straight on `device` and drawn from normal(0, std) there (never zeros or
    uninitialised memory, which can run faster than real data); the draft as `random_draft_on` draws
    it. Both come back fused, as loaded ones do."""
    with torch.device("meta"):
        target = Qwen3Target(target_cfg)
        draft = _meta_draft(draft_cfg) if draft_cfg else None
    gen_device = torch.device(device)
    torch.manual_seed(seed)
    if gen_device.type == "cuda":
        torch.cuda.manual_seed(seed)
    target = target.to_empty(device=device).to(dtype)
    if target_cfg.tie_word_embeddings:
        target.lm_head.weight = target.model.embed_tokens.weight
    target.init_random(std)
    target = target.eval().requires_grad_(False).fuse()
    return target, random_draft_on(target, draft, std) if draft is not None else None


def random_draft_for(target: Qwen3Target, cfg: AnyDraftConfig, seed: int = 1, std: float = 0.02) -> DraftModel | Eagle3Draft:
    """A random draft of `cfg` beside an already built target (a second draft in the same bench)."""
    with torch.device("meta"):
        draft = _meta_draft(cfg)
    torch.manual_seed(seed)
    if target.lm_head.weight.device.type == "cuda":
        torch.cuda.manual_seed(seed)
    return random_draft_on(target, draft, std)


def _meta_draft(cfg: AnyDraftConfig) -> DraftModel | Eagle3Draft:
    if isinstance(cfg, Eagle3Config):
        return Eagle3Draft(cfg, with_embeddings=False)
    return DraftModel(cfg, with_embeddings=False)


def random_draft_on(target: Qwen3Target, draft: DraftModel | Eagle3Draft, std: float = 0.02) -> DraftModel | Eagle3Draft:
    """`draft` (built on the meta device) drawn from normal(0, std) on the target's device and dtype, fused.
    A block draft shares the target's embedding and LM head, as a loaded DeepSpec draft does; an EAGLE-3
    draft its embedding, with a head of its own over its vocabulary (draft id i is target id i)."""
    weight = target.lm_head.weight
    if isinstance(draft, DraftModel) and draft.config.reduced_vocab:
        raise DSparkError("random drafts with a reduced vocabulary are not built; use the full vocabulary")
    draft = draft.to_empty(device=weight.device).to(weight.dtype)
    draft.init_random(std)
    if isinstance(draft, Eagle3Draft):
        if draft.d2t is not None:
            draft.d2t = torch.zeros_like(draft.d2t, dtype=torch.long)
        draft.share_embeddings(target.model.embed_tokens)
    else:
        draft.share_embeddings(target.model.embed_tokens, target.lm_head)
    return draft.eval().requires_grad_(False).fuse()

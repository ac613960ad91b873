"""Tiny target/draft pairs for engine tests, in memory.

`bigram_pair` builds a DSpark draft that agrees with its target by construction, so rounds accept
many tokens without training: the target is close to a bigram model (its layers add only a small
perturbation to the embedding before the head), and the draft's Markov head holds exactly that
bigram (W1 = the target's normed embedding, W2 = its LM head) while its backbone output is zeroed.
The perturbation sets how often the two disagree.
"""

from __future__ import annotations

import torch

from dspark.tiny import random_draft, random_target, tiny_draft_config, tiny_target_config


def bigram_pair(vocab: int = 64, perturb: float = 0.006, block_size: int = 5, dtype=torch.float64, seed: int = 0,
                head_scale: float = 1.0):
    tcfg = tiny_target_config(vocab_size=vocab, hidden=32, layers=3, heads=4, kv_heads=2, head_dim=8,
                              intermediate=64, eos=())
    target = random_target(tcfg, seed, std=0.3, dtype=dtype)
    with torch.no_grad():
        target.lm_head.weight.mul_(head_scale)
        for layer in target.model.layers:
            layer.self_attn.o_proj.weight.mul_(perturb)
            layer.mlp.down_proj.weight.mul_(perturb)
    dcfg = tiny_draft_config(tcfg, layers=1, block_size=block_size, taps=(0, 1), markov_rank=32,
                             mask_token_id=vocab - 1)
    draft = random_draft(dcfg, target, seed + 1, std=0.3)
    with torch.no_grad():
        draft.norm.weight.zero_()  # backbone logits U = 0: the Markov bias alone decides
        emb = target.model.embed_tokens.weight
        draft.markov_head.markov_w1.weight.copy_(target.model.norm(emb))
        draft.markov_head.markov_w2.weight.copy_(target.lm_head.weight)
    return target, draft


def random_pair(vocab: int = 64, block_size: int = 5, dtype=torch.float64, seed: int = 0, std: float = 0.3,
                markov_rank: int = 8, sample_from_anchor: bool = True, confidence: bool = True, tie: bool = False):
    tcfg = tiny_target_config(vocab_size=vocab, hidden=32, layers=3, heads=4, kv_heads=2, head_dim=8,
                              intermediate=64, eos=(), tie=tie)
    target = random_target(tcfg, seed, std=std, dtype=dtype)
    dcfg = tiny_draft_config(tcfg, layers=1, block_size=block_size, taps=(0, 1), markov_rank=markov_rank,
                             confidence=confidence, sample_from_anchor=sample_from_anchor, mask_token_id=vocab - 1)
    return target, random_draft(dcfg, target, seed + 1, std=std)


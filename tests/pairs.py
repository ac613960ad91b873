"""Tiny target/draft pairs for engine tests, in memory.

`bigram_pair` builds a DSpark draft that agrees with its target by construction, so rounds accept
many tokens without training: the target is close to a bigram model (its layers add only a small
perturbation to the embedding before the head), and the draft's Markov head holds exactly that
bigram (W1 = the target's normed embedding, W2 = its LM head) while its backbone output is zeroed.
The perturbation sets how often the two disagree.
"""

from __future__ import annotations

import torch

from dspark.synthetic.tiny import random_draft, random_target, tiny_draft_config, tiny_target_config


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



def eagle3_pair(vocab: int = 8, std: float = 0.3, dtype=torch.float64, seed: int = 0, num_tokens: int = 4,
                qk_norm: bool = False, norm_before_residual: bool = False, draft_vocab: int | None = None):
    """A tiny target and a random EAGLE-3 draft reading three of its layers. Over a small vocabulary a
    random draft's greedy choice matches the target's often enough for rounds that accept several drafts."""
    from dspark.synthetic.tiny import random_eagle3, tiny_eagle3_config

    tcfg = tiny_target_config(vocab_size=vocab, hidden=32, layers=3, heads=4, kv_heads=2, head_dim=8,
                              intermediate=64, eos=())
    target = random_target(tcfg, seed, std=std, dtype=dtype)
    dcfg = tiny_eagle3_config(tcfg, taps=(0, 1, 2), num_tokens=num_tokens, qk_norm=qk_norm,
                              norm_before_residual=norm_before_residual, draft_vocab_size=draft_vocab)
    return target, random_eagle3(dcfg, target, seed + 1, std=std)


def eagle3_close_pair(vocab: int = 16, perturb: float = 0.006, dtype=torch.float64, seed: int = 0,
                      num_tokens: int = 4, sharpness: float = 30.0):
    """A near-bigram target and an EAGLE-3 draft that holds the same bigram by construction, so rounds
    accept long runs. The target's layers barely touch the embedding, so it predicts B(x) from the
    current token. The draft row at p reads the embedding of x(p+1): its attention keys and queries
    are that embedding, sharpened so each row attends to itself (and to rows of the same token, whose
    values are the same), its values pass it through unchanged, and the residual, the hidden input
    and the MLP are zeroed (`norm_before_residual` with a zero `hidden_norm`). Its output is then the
    normed embedding of x(p+1), and its head, the target's, scores B(x(p+1)) = x(p+2)."""
    from dspark.synthetic.tiny import random_eagle3, tiny_eagle3_config

    tcfg = tiny_target_config(vocab_size=vocab, hidden=16, layers=3, heads=4, kv_heads=4, head_dim=4,
                              intermediate=32, eos=())
    target = random_target(tcfg, seed, std=0.3, dtype=dtype)
    with torch.no_grad():
        for layer in target.model.layers:
            layer.self_attn.o_proj.weight.mul_(perturb)
            layer.mlp.down_proj.weight.mul_(perturb)
    dcfg = tiny_eagle3_config(tcfg, taps=(0, 1, 2), num_tokens=num_tokens, norm_before_residual=True)
    draft = random_eagle3(dcfg, target, seed + 1, std=0.3)
    h = tcfg.backbone.hidden_size
    eye = torch.cat((torch.eye(h), torch.zeros(h, h)), dim=1).to(dtype)  # reads the embedding half
    with torch.no_grad():
        a = draft.midlayer.self_attn
        a.q_proj.weight.copy_(eye * sharpness ** 0.5)
        a.k_proj.weight.copy_(eye * sharpness ** 0.5)
        a.v_proj.weight.copy_(eye)
        a.o_proj.weight.copy_(torch.eye(h, dtype=dtype))
        draft.midlayer.hidden_norm.weight.zero_()
        draft.midlayer.input_layernorm.weight.fill_(1.0)
        draft.midlayer.mlp.down_proj.weight.zero_()
        draft.norm.weight.fill_(1.0)
        draft.lm_head.weight.copy_(target.lm_head.weight)
    return target, draft.fuse()

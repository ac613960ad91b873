"""The EAGLE-3 drafter: greedy output equal to plain decoding, every proposal equal to the chain
recomputed from scratch by an independent reference of the layer, and lossless sampling (the
engine's chi-square test, with the biased control failing).

Verification keeps any drafter's output exact, so equal outputs alone say nothing about the drafts:
the reference test does. It recomputes, for the committed tokens of each round, the whole context
(target states from a plain forward, the draft layer written out in plain PyTorch from the model's
weights, with no cache) and the chain, and requires the engine's proposal to be the same tokens.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from pairs import eagle3_close_pair, eagle3_pair
from test_lossless import PROMPT, biased_rejection_sample, chi_square_p, exact_joint, sampled_joint

import dspark.engine.steps
from dspark.drafters import Eagle3Drafter
from dspark.engine import Engine, GenerationConfig
from dspark.errors import DSparkError

VARIANTS = {  # (qk_norm, norm_before_residual, draft vocabulary): the layer styles the formats hold
    "llama": (False, False, None),
    "qwen3-qk-norm": (True, False, None),
    "norm-before-residual": (False, True, None),
    "reduced-vocab": (False, False, 5),
}


def _prompt(n: int, vocab: int, seed: int = 0) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_eagle3_equals_plain_decoding(variant):
    qk_norm, nbr, draft_vocab = VARIANTS[variant]
    target, draft = eagle3_pair(vocab=8, qk_norm=qk_norm, norm_before_residual=nbr, draft_vocab=draft_vocab)
    for seed, n in ((0, 1), (1, 9), (2, 30)):
        prompt = _prompt(n, 8, seed)
        cfg = GenerationConfig(max_new_tokens=60, temperature=0.0)
        plain = Engine(target).generate(prompt, cfg)
        spec = Engine(target, Eagle3Drafter(draft)).generate(prompt, cfg)
        assert spec.tokens == plain.tokens
        assert spec.num_rounds > 10 and all(p == draft.config.num_drafts for p in spec.proposal_lengths)


def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, positions, theta):
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = positions.double()[:, None] * inv
    cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()
    return x * cos + torch.cat((-x[..., d // 2:], x[..., : d // 2]), -1) * sin


def _reference_layer(draft, embeds, hidden, positions):
    """The EAGLE-3 layer over rows [T, H] at `positions`, causal, from the weights, no cache: returns
    (normed, pre-norm) outputs."""
    cfg, L = draft.config, draft.midlayer
    b = cfg.backbone
    eps = b.rms_norm_eps
    h = _rms(hidden, L.hidden_norm.weight, eps)
    x = torch.cat((_rms(embeds, L.input_layernorm.weight, eps), h), -1)
    a = L.self_attn
    t = x.shape[0]
    q = (x @ a.q_proj.weight.T).view(t, b.num_heads, b.head_dim).transpose(0, 1)
    k = (x @ a.k_proj.weight.T).view(t, b.num_kv_heads, b.head_dim).transpose(0, 1)
    v = (x @ a.v_proj.weight.T).view(t, b.num_kv_heads, b.head_dim).transpose(0, 1)
    if a.q_norm is not None:
        q, k = _rms(q, a.q_norm.weight, eps), _rms(k, a.k_norm.weight, eps)
    q, k = _rope(q, positions, b.rope_theta), _rope(k, positions, b.rope_theta)
    group = b.num_heads // b.num_kv_heads
    k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    out = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]
    h1 = (h if cfg.norm_before_residual else hidden) + out.transpose(0, 1).reshape(t, -1) @ a.o_proj.weight.T
    m = _rms(h1, L.post_attention_layernorm.weight, eps)
    h2 = h1 + (F.silu(m @ L.mlp.gate_proj.weight.T) * (m @ L.mlp.up_proj.weight.T)) @ L.mlp.down_proj.weight.T
    return _rms(h2, draft.norm.weight, eps), h2


def reference_chain(target, draft, committed: list[int], k: int) -> list[int]:
    """The greedy chain after `committed` (the anchor last), recomputed from scratch."""
    m = len(committed) - 1  # the anchor's position
    ids = torch.tensor([committed])
    with torch.inference_mode():
        _, feats = target(ids, None, target.new_cache(m + 1), m + 1, draft.config.target_layer_ids)
    embed = target.model.embed_tokens.weight
    rows = feats[0, :m] @ draft.fc.weight.T  # target states of positions 0..m-1
    embeds = embed[torch.tensor(committed[1:])]  # each row's next token
    positions = torch.arange(m)
    to_target = draft.target_ids()
    out = []
    for step in range(k):
        normed, pre = _reference_layer(draft, embeds, rows, positions)
        token = int(to_target[(normed[-1] @ draft.lm_head.weight.T).argmax()])
        out.append(token)
        embeds = torch.cat((embeds, embed[token][None]))  # the chain row: the drawn token, the last pre-norm output
        rows = torch.cat((rows, pre[-1:]))
        positions = torch.arange(m + step + 1)
    return out


class Recording(Eagle3Drafter):
    def __init__(self, model):
        super().__init__(model)
        self.rounds: list[list[int]] = []

    def propose(self, state, *args):
        super().propose(state, *args)
        self.rounds.append(state.draft_tokens[0].tolist())


def _checked_rounds(target, draft, prompt: list[int], max_new: int):
    drafter = Recording(draft)
    r = Engine(target, drafter).generate(prompt, GenerationConfig(max_new_tokens=max_new, temperature=0.0))
    committed = prompt + r.tokens[:1]
    for proposal, emitted in zip(drafter.rounds, r.acceptance_lengths):
        assert proposal == reference_chain(target, draft, committed, draft.config.num_drafts)
        committed += r.tokens[len(committed) - len(prompt): len(committed) - len(prompt) + emitted]
    return r


def test_every_proposal_is_the_chain_recomputed_from_scratch_when_rounds_accept_runs():
    target, draft = eagle3_close_pair()
    r = _checked_rounds(target, draft, _prompt(12, 16), 60)
    assert max(r.accepted_counts) == draft.config.num_drafts and min(r.accepted_counts) == 0
    assert sum(r.acceptance_lengths) / r.num_rounds > 1.5  # committed several rows at once, often


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_proposal_of_each_layer_style_is_the_chain_recomputed_from_scratch(variant):
    qk_norm, nbr, draft_vocab = VARIANTS[variant]
    target, draft = eagle3_pair(vocab=6, qk_norm=qk_norm, norm_before_residual=nbr, draft_vocab=draft_vocab)
    _checked_rounds(target, draft, _prompt(11, 6, 3), 24)


def test_a_run_sets_the_chain_length():
    target, draft = eagle3_pair(vocab=8)
    r = Engine(target, Eagle3Drafter(draft, num_tokens=3)).generate(_prompt(5, 8), GenerationConfig(max_new_tokens=20))
    assert set(r.proposal_lengths) == {3}


def test_eagle3_has_no_confidence_threshold():
    target, draft = eagle3_pair(vocab=8)
    with pytest.raises(DSparkError, match="confidence head"):
        Engine(target, Eagle3Drafter(draft)).generate([1, 2], GenerationConfig(confidence_threshold=0.5))


N_SAMPLES = 600


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_eagle3_samples_the_target_distribution(temperature):
    target, draft = eagle3_pair(vocab=4, std=1.0, num_tokens=2)
    counts, lengths, _ = sampled_joint(Engine(target, Eagle3Drafter(draft)), temperature, 0.0, N_SAMPLES)
    assert chi_square_p(counts, exact_joint(target, PROMPT, temperature)) > 1e-3
    assert 1 in lengths and max(lengths) == 3  # rejections and whole accepted chains both happened


def test_the_eagle3_distribution_test_catches_a_biased_sampler(monkeypatch):
    target, draft = eagle3_pair(vocab=4, std=1.0, num_tokens=2)
    monkeypatch.setattr(dspark.engine.steps, "rejection_sample", biased_rejection_sample)
    counts, _, _ = sampled_joint(Engine(target, Eagle3Drafter(draft)), 1.0, 0.0, N_SAMPLES)
    assert chi_square_p(counts, exact_joint(target, PROMPT, 1.0)) < 1e-6

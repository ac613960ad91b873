"""Losslessness: speculative sampling draws exactly from the target's own distribution.

Two levels. The acceptance rule alone (`rejection_sample`), batched over many draws of fixed p and q.
Then the whole engine: the joint distribution of the first three tokens after the prefill token,
which pass through acceptance, rejection with residual sampling and bonus sampling, against the
exact distribution enumerated from the target, with a chi-square test. Seeds are fixed, so each
test's outcome is deterministic; a deliberately biased sampler (rejected slots resampled from p
instead of the residual) is shown to fail the same test.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from pairs import bigram_pair, random_pair

import dspark.engine.steps
from dspark.drafters import BlockDrafter
from dspark.engine import Engine, GenerationConfig
from dspark.sampling import Streams, probs, rejection_sample, sample

stats = pytest.importorskip("scipy.stats")

PASS_P = 1e-3  # a correct sampler passes at this level; the biased one falls far below


def chi_square_p(counts: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Pearson chi-square p-value, cells with expected count < 5 pooled into one."""
    n = counts.sum().item()
    expected = expected_probs.flatten().double() * n
    counts = counts.flatten().double()
    small = expected < 5
    obs = torch.cat((counts[~small], counts[small].sum()[None]))
    exp = torch.cat((expected[~small], expected[small].sum()[None]))
    keep = exp > 0
    return float(stats.chisquare(obs[keep].numpy(), exp[keep].numpy() * obs[keep].sum().item() / exp[keep].sum().item()).pvalue)


def biased_rejection_sample(draft_tokens, draft_probs, target_probs, streams, num_proposed=None):
    """The classic mistake: resample a rejected slot from p itself rather than from max(p - q, 0)."""
    accepted, _ = rejection_sample(draft_tokens, draft_probs, target_probs, streams, num_proposed)
    rows = torch.arange(draft_tokens.shape[0], device=draft_tokens.device)
    return accepted, sample(target_probs[rows, accepted], streams.target)


# ---- the acceptance rule alone -----------------------------------------------------------------

def _rule_distribution(sampler, n_draws: int = 200_000, vocab: int = 6, n: int = 2, device: str = "cpu"):
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(n + 1, vocab, generator=g) * 2, -1).to(device)  # rows independent of the prefix
    q = torch.softmax(torch.randn(n, vocab, generator=g) * 2, -1).to(device)
    streams = Streams.from_seed(1, device)
    drafts = sample(q.expand(n_draws, n, vocab), streams.draft)
    accepted, nxt = sampler(drafts, q.expand(n_draws, n, vocab), p.expand(n_draws, n + 1, vocab), streams)
    # Output token at slot 0: the first draft when accepted, else the resampled token.
    first = torch.where(accepted > 0, drafts[:, 0], nxt)
    return torch.bincount(first, minlength=vocab), p[0], accepted


def test_acceptance_rule_keeps_the_target_distribution():
    counts, p0, accepted = _rule_distribution(rejection_sample)
    assert chi_square_p(counts, p0) > PASS_P
    assert 0 < accepted.float().mean() < 2  # both acceptance and rejection happened


def test_acceptance_rule_test_catches_a_biased_rule():
    counts, p0, _ = _rule_distribution(biased_rejection_sample)
    assert chi_square_p(counts, p0) < 1e-9


# ---- the whole engine ------------------------------------------------------------------------------

VOCAB = 4
PROMPT = [0, 3, 1, 2, 3, 1]


def exact_joint(target, prompt: list[int], temperature: float) -> torch.Tensor:
    """P(x1, x2, x3) after the prompt, the prefill token x0 summed out: [V, V, V], by enumeration."""
    seqs = torch.tensor(list(itertools.product(range(VOCAB), repeat=4)))  # x0..x3
    n = len(prompt)
    ids = torch.cat((torch.tensor(prompt).expand(len(seqs), n), seqs[:, :3]), dim=1)
    positions = torch.arange(n + 3).expand_as(ids)
    with torch.inference_mode():
        hidden, _ = target(ids, positions, target.new_cache(n + 3, batch=len(seqs)), n + 3)
        p = probs(target.logits(hidden[:, n - 1 :]), temperature)  # rows predict x0..x3
    joint = p.gather(-1, seqs[..., None]).squeeze(-1).double().prod(-1)
    return joint.view(VOCAB, VOCAB, VOCAB, VOCAB).sum(0)


def sampled_joint(engine: Engine, temperature: float, threshold: float, n_samples: int, schedule: tuple = ()):
    """Counts of (x1, x2, x3) over seeds 0..n-1, with every round's acceptance and proposal length (a
    threshold or a scheduler's cost table cutting the proposals)."""
    counts = torch.zeros(VOCAB**3, dtype=torch.long)
    lengths, proposed = [], []
    for seed in range(n_samples):
        r = engine.generate(PROMPT, GenerationConfig(max_new_tokens=4, temperature=temperature, seed=seed,
                                                     confidence_threshold=threshold, confidence_schedule=schedule))
        x1, x2, x3 = r.tokens[1:4]
        counts[(x1 * VOCAB + x2) * VOCAB + x3] += 1
        lengths += r.acceptance_lengths
        proposed += r.proposal_lengths
    return counts, lengths, proposed


def _pair(kind: str):
    if kind == "close":  # the Markov head holds the target's bigram: most drafts are accepted
        return bigram_pair(vocab=VOCAB, block_size=2, perturb=0.05, head_scale=0.5)
    return random_pair(vocab=VOCAB, block_size=2, std=1.0)  # independent and peaky: most are rejected


N_SAMPLES = 600


class RecordingDrafter(BlockDrafter):
    def __init__(self, model):
        super().__init__(model)
        self.confidences: list[float] = []

    def propose(self, state, *args):
        super().propose(state, *args)
        self.confidences += state.confidence[0].tolist()


def median_confidence(target, draft, temperature: float) -> float:
    """A threshold that cuts about half the slots, so truncation happens at every length."""
    drafter = RecordingDrafter(draft)
    sampled_joint(Engine(target, drafter), temperature, 0.0, 30)
    return float(torch.tensor(drafter.confidences).median())


@pytest.mark.parametrize("kind", ["close", "far"])
@pytest.mark.parametrize("truncate,temperature", [(None, 1.0), (None, 0.7), ("threshold", 1.0), ("threshold", 0.7),
                                                  ("schedule", 1.0)])
def test_engine_samples_the_target_distribution(temperature, kind, truncate):
    """With every proposal length policy: all slots, DeepSpec's threshold, the prefix scheduler (costs 1,
    1 + m, 1 + m + m^2 for m the median confidence: each length wins when the survivals sit above or below m)."""
    target, draft = _pair(kind)
    median = median_confidence(target, draft, temperature) if truncate else 0.0
    threshold = median if truncate == "threshold" else 0.0
    schedule = (1.0, 1.0 + median, 1.0 + median + median**2) if truncate == "schedule" else ()
    drafter = RecordingDrafter(draft)
    engine = Engine(target, drafter)
    counts, lengths, proposed = sampled_joint(engine, temperature, threshold, N_SAMPLES, schedule)
    expected = exact_joint(target, PROMPT, temperature)
    assert chi_square_p(counts, expected) > PASS_P
    mean_len = sum(lengths) / len(lengths)
    if not truncate:  # the two drafts really are close and far
        assert mean_len > 2.0 if kind == "close" else mean_len < 1.9
    else:  # proposals of every length were verified, and some tokens accepted
        assert set(proposed) == {0, 1, 2} and mean_len > 1.0


def test_engine_test_catches_a_biased_sampler(monkeypatch):
    target, draft = _pair("far")
    monkeypatch.setattr(dspark.engine.steps, "rejection_sample", biased_rejection_sample)
    counts, _, _ = sampled_joint(Engine(target, BlockDrafter(draft)), 1.0, 0.0, N_SAMPLES)
    assert chi_square_p(counts, exact_joint(target, PROMPT, 1.0)) < 1e-6


def test_the_top_k_markov_head_with_every_token_is_the_full_head():
    """With k = V the top-k form draws the same drafts and the same q as the full head, greedy and sampled."""
    from dspark.kernels import markov_sample_ref
    from dspark.kernels import markov_sample_topk_ref as markov_sample_topk

    torch.manual_seed(0)
    n, vocab, rank = 5, 11, 3
    logits, w1, w2 = torch.randn(n, vocab, dtype=torch.float64), torch.randn(vocab, rank, dtype=torch.float64), \
        torch.randn(vocab, rank, dtype=torch.float64)
    to_target, anchor = torch.arange(vocab), torch.tensor([4])
    for noise, temperature, greedy in ((None, 0.0, True), (torch.empty(n, vocab, dtype=torch.float64).exponential_(),
                                                           0.8, False)):
        full = markov_sample_ref(logits, lambda prev, k: torch.nn.functional.linear(w1[prev], w2), to_target, anchor,
                                 noise, temperature, greedy)
        top = markov_sample_topk(logits, w1, w2, to_target, anchor, noise, temperature, greedy, vocab)
        assert torch.equal(full[1], top[1]) and torch.equal(full[2], top[2])
        assert torch.allclose(full[0], top[0]) and torch.allclose(full[3], top[3])
    top = markov_sample_topk(logits, w1, w2, to_target, anchor, None, 0.0, True, 2)
    assert ((top[3] > float("-inf")).sum(-1) == 2).all()  # two candidates a slot, every other token at -inf


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_top_k_markov_head_keeps_the_target_distribution(temperature):
    """vLLM's top-k projection changes what the draft proposes (two of four tokens a slot here), never what the
    engine emits: the joint of the next three tokens is the target's."""
    target, draft = _pair("close")
    engine = Engine(target, BlockDrafter(draft, markov_topk=2))
    counts, lengths, _ = sampled_joint(engine, temperature, 0.0, N_SAMPLES)
    assert chi_square_p(counts, exact_joint(target, PROMPT, temperature)) > PASS_P
    assert sum(lengths) / len(lengths) > 1.5  # it still drafts tokens the target accepts

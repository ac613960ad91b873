"""Speculative decoding at batch size 1: greedy equality with plain decoding, and the accounting rules."""

from __future__ import annotations

import math

import pytest
import torch
from pairs import bigram_pair, random_pair

from dspark.drafters import BlockDrafter, NgramDrafter
from dspark.engine import Engine, GenerationConfig
from dspark.errors import DSparkError


def _prompt(n: int = 40, vocab: int = 63, seed: int = 0) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _check_accounting(r, max_new: int, block: int):
    assert r.num_rounds == len(r.proposal_lengths) == len(r.acceptance_lengths)
    for n_prop, emitted in zip(r.proposal_lengths, r.acceptance_lengths):
        assert 0 <= n_prop <= block
        assert 1 <= emitted <= n_prop + 1
    produced = 1 + sum(r.acceptance_lengths)  # the prefill token is not a round
    assert len(r.tokens) <= max_new
    if r.stop_reason == "max_new_tokens":
        assert len(r.tokens) == max_new
        # only the last round may overshoot, and it keeps its count
        assert 0 <= produced - max_new < r.acceptance_lengths[-1] if r.num_rounds else produced == max_new
    else:
        assert produced == len(r.tokens)


CASES = {
    "dspark-bigram": lambda: bigram_pair(),  # accepts long runs and partial blocks
    "dspark-random": lambda: random_pair(),
    "dflash-anchor-first": lambda: random_pair(markov_rank=0, confidence=False),
    "dflash-fill-in": lambda: random_pair(markov_rank=0, confidence=False, sample_from_anchor=False, block_size=8),
}


@pytest.mark.parametrize("case,threshold", [(c, 0.0) for c in CASES] + [("dspark-bigram", 0.5), ("dspark-random", 0.5)])
def test_greedy_speculative_equals_plain(case, threshold):
    target, draft = CASES[case]()
    max_new = 100
    lengths = []
    for seed in range(2):
        prompt = _prompt(seed=seed)
        cfg = GenerationConfig(max_new_tokens=max_new, temperature=0.0, seed=seed, confidence_threshold=threshold)
        plain = Engine(target).generate(prompt, cfg)
        spec = Engine(target, BlockDrafter(draft)).generate(prompt, cfg)
        assert spec.tokens == plain.tokens
        assert plain.num_rounds == 0
        _check_accounting(spec, max_new, draft.config.num_drafts)
        assert spec.num_rounds > 15
        lengths += spec.acceptance_lengths
    if case == "dspark-bigram" and threshold == 0:
        assert sum(lengths) / len(lengths) > 3  # the rounds really accepted multi-token runs
        assert min(lengths) < draft.config.num_drafts + 1  # and rejected some


def test_confidence_threshold_truncates_proposals():
    target, draft = bigram_pair()
    prompt = _prompt()
    cfg = GenerationConfig(max_new_tokens=60, temperature=0.0)
    full = Engine(target, BlockDrafter(draft)).generate(prompt, cfg)
    assert set(full.proposal_lengths) == {draft.config.num_drafts}
    cut = Engine(target, BlockDrafter(draft)).generate(prompt, GenerationConfig(
        max_new_tokens=60, temperature=0.0, confidence_threshold=0.5))
    assert cut.tokens == full.tokens
    assert min(cut.proposal_lengths) < draft.config.num_drafts
    # A threshold no confidence reaches empties every proposal: each round is one plain step.
    none = Engine(target, BlockDrafter(draft)).generate(prompt, GenerationConfig(
        max_new_tokens=30, temperature=0.0, confidence_threshold=1.0))
    assert set(none.proposal_lengths) == {0} and set(none.acceptance_lengths) == {1}
    assert none.tokens == full.tokens[:30]


def test_recorded_confidences_are_the_ones_the_threshold_cut_by():
    """Each round records every slot's confidence (a probability); with a threshold, the round verified
    exactly the slots before the first recorded confidence under it. Off, nothing is recorded."""
    target, draft = random_pair()
    prompt, n = _prompt(), draft.config.num_drafts
    cut = Engine(target, BlockDrafter(draft)).generate(prompt, GenerationConfig(
        max_new_tokens=60, temperature=0.0, confidence_threshold=0.5))
    assert len(cut.draft_confidences) == cut.num_rounds and all(len(row) == n for row in cut.draft_confidences)
    assert all(0.0 < c < 1.0 for row in cut.draft_confidences for c in row)
    for row, proposed in zip(cut.draft_confidences, cut.proposal_lengths):
        assert proposed == next((k for k, c in enumerate(row) if c < 0.5), n)
    assert min(cut.proposal_lengths) < max(cut.proposal_lengths)  # the threshold really cut, by round
    off = Engine(target, BlockDrafter(draft)).generate(prompt, GenerationConfig(
        max_new_tokens=60, temperature=0.0, confidence_threshold=0.5, record_confidences=False))
    assert off.draft_confidences == [] and off.tokens == cut.tokens and off.proposal_lengths == cut.proposal_lengths
    dflash = random_pair(markov_rank=0, confidence=False)[1]
    assert Engine(target, BlockDrafter(dflash)).generate(prompt, GenerationConfig(max_new_tokens=20)).draft_confidences == []


def test_the_scheduler_picks_the_prefix_with_the_most_tokens_per_cost():
    from dspark.schedule import ProposalCut, scheduled_length

    logit = lambda p: math.log(p / (1 - p))  # noqa: E731
    logits = torch.tensor([logit(0.9), logit(0.5), logit(0.2)])
    # survivals 0.9, 0.45, 0.09: expected tokens 1, 1.9, 2.35, 2.44 for l = 0..3
    assert scheduled_length(logits, None, torch.tensor([1.0, 1.0, 1.0, 1.0])).item() == 3  # flat cost: all
    assert scheduled_length(logits, None, torch.tensor([1.0, 1.1, 1.3, 1.5])).item() == 2  # 1.73, 1.81, 1.63
    assert scheduled_length(logits, None, torch.tensor([1.0, 2.0, 3.0, 4.0])).item() == 0  # 1, 0.95, ...
    # T = 2 on slot 1 lowers its confidence to sigmoid(logit(0.9) / 2) = 0.75: survivals 0.75, 0.375, 0.075,
    # expected 1, 1.75, 2.125, 2.2; against costs 1, 1.8, 2.3, 2.3 that is 1, 0.97, 0.92, 0.96 (unscaled: 1.06 at 3)
    costs = torch.tensor([1.0, 1.8, 2.3, 2.3])
    assert scheduled_length(logits, None, costs).item() == 3
    assert scheduled_length(logits, torch.tensor([2.0, 1.0, 1.0]), costs).item() == 0
    assert ProposalCut(costs=torch.ones(4)).cuts and ProposalCut(threshold=0.3).cuts and not ProposalCut().cuts
    assert ProposalCut(threshold=0.6).length(logits).item() == 1 and ProposalCut().length(logits).item() == 3


def test_scheduled_proposals_keep_greedy_output_and_verify_fewer_rows():
    target, draft = random_pair()
    prompt, n = _prompt(), draft.config.num_drafts
    costs = tuple(1.0 + 0.35 * k for k in range(n + 1))  # each verified draft costs a third of a round more
    full = Engine(target, BlockDrafter(draft)).generate(prompt, GenerationConfig(max_new_tokens=60))
    engine = Engine(target, BlockDrafter(draft))
    cut = engine.generate(prompt, GenerationConfig(max_new_tokens=60, confidence_schedule=costs))
    assert cut.tokens == full.tokens and len(set(cut.proposal_lengths)) > 1
    for row, proposed in zip(cut.draft_confidences, cut.proposal_lengths):  # the choice the scheduler had to make
        survival, expected = 1.0, [1.0]
        for c in row:
            survival *= c
            expected.append(expected[-1] + survival)
        rates = [e / c for e, c in zip(expected, costs)]
        assert rates[proposed] == pytest.approx(max(rates), rel=1e-5)
    with pytest.raises(DSparkError, match="give 6 positive costs"):
        engine.generate(prompt, GenerationConfig(max_new_tokens=8, confidence_schedule=(1.0, 2.0)))
    with pytest.raises(DSparkError, match="STS temperatures"):
        engine.generate(prompt, GenerationConfig(max_new_tokens=8, confidence_schedule=costs,
                                                 confidence_temperatures=(1.0,)))


def test_confidence_threshold_needs_a_confidence_head():
    target, draft = random_pair(markov_rank=0, confidence=False)
    with pytest.raises(DSparkError, match="confidence head"):
        Engine(target, BlockDrafter(draft)).generate(_prompt(), GenerationConfig(
            max_new_tokens=10, confidence_threshold=0.3))


def test_ngram_greedy_equals_plain():
    target, _ = random_pair()
    prompt = (_prompt(12) * 4)[:45]  # repeats, so lookups find matches
    cfg = GenerationConfig(max_new_tokens=120, temperature=0.0)
    plain = Engine(target).generate(prompt, cfg)
    spec = Engine(target, NgramDrafter(num_tokens=5)).generate(prompt, cfg)
    assert spec.tokens == plain.tokens
    _check_accounting(spec, 120, 5)
    assert max(spec.proposal_lengths) > 0 and 0 in spec.proposal_lengths
    assert max(spec.acceptance_lengths) > 1


def test_stop_token_is_last_and_rounds_count_up_to_it():
    target, draft = bigram_pair()
    prompt = _prompt()
    free = Engine(target, BlockDrafter(draft)).generate(prompt, GenerationConfig(max_new_tokens=80))
    # Stop on a token that first appears inside an accepted run (not the prefill token).
    position = next(i for i, t in enumerate(free.tokens) if i > 3 and t not in free.tokens[:i])
    stop = free.tokens[position]
    cfg = GenerationConfig(max_new_tokens=80, stop_token_ids=(stop,))
    spec = Engine(target, BlockDrafter(draft)).generate(prompt, cfg)
    plain = Engine(target).generate(prompt, cfg)
    assert spec.tokens == plain.tokens == free.tokens[: position + 1]
    assert spec.stop_reason == plain.stop_reason == "stop_token"
    assert 1 + sum(spec.acceptance_lengths) == len(spec.tokens)


def test_stop_on_prefill_token_makes_no_round():
    target, draft = bigram_pair()
    prompt = _prompt()
    first = Engine(target).generate(prompt, GenerationConfig(max_new_tokens=1)).tokens[0]
    r = Engine(target, BlockDrafter(draft)).generate(prompt, GenerationConfig(max_new_tokens=50,
                                                                             stop_token_ids=(first,)))
    assert r.tokens == [first] and r.num_rounds == 0 and r.stop_reason == "stop_token"


@pytest.mark.parametrize("max_new", [1, 2, 7, 13])
def test_overshoot_is_cut_but_round_kept(max_new):
    target, draft = bigram_pair()
    r = Engine(target, BlockDrafter(draft)).generate(_prompt(), GenerationConfig(max_new_tokens=max_new))
    assert len(r.tokens) == max_new
    _check_accounting(r, max_new, draft.config.num_drafts)
    if max_new == 1:
        assert r.num_rounds == 0


def test_seed_reproduces_a_sampled_run():
    target, draft = bigram_pair()
    cfg = GenerationConfig(max_new_tokens=60, temperature=1.0, seed=7)
    a = Engine(target, BlockDrafter(draft)).generate(_prompt(), cfg)
    b = Engine(target, BlockDrafter(draft)).generate(_prompt(), cfg)
    c = Engine(target, BlockDrafter(draft)).generate(_prompt(), GenerationConfig(max_new_tokens=60, temperature=1.0,
                                                                                seed=8))
    assert (a.tokens, a.acceptance_lengths) == (b.tokens, b.acceptance_lengths)
    assert a.tokens != c.tokens


def test_engine_reuses_its_caches_across_requests():
    target, draft = bigram_pair()
    engine = Engine(target, BlockDrafter(draft))
    cfg = GenerationConfig(max_new_tokens=40)
    first = engine.generate(_prompt(seed=1), cfg)
    engine.generate(_prompt(60, seed=2), cfg)
    again = engine.generate(_prompt(seed=1), cfg)
    assert first.tokens == again.tokens and first.acceptance_lengths == again.acceptance_lengths


def test_timed_generation_reports_each_round_and_changes_nothing():
    from pairs import bigram_pair

    target, draft = bigram_pair(dtype=torch.float32)
    prompt = list(range(1, 20))
    cfg = GenerationConfig(max_new_tokens=40, temperature=0.0)
    plain, timed_plain = Engine(target).generate(prompt, cfg), Engine(target, timing=True).generate(prompt, cfg)
    assert timed_plain.tokens == plain.tokens and plain.round_ms == {}
    assert set(timed_plain.round_ms) == {"decode", "host"}
    assert len(timed_plain.round_ms["decode"]) == len(plain.tokens) - 1  # one step per token after the prefill
    spec = Engine(target, BlockDrafter(draft), timing=True).generate(prompt, cfg)
    assert spec.tokens == plain.tokens
    assert set(spec.round_ms) == {"propose", "verify", "accept", "host"}
    assert all(len(v) == spec.num_rounds and min(v) >= 0 for v in spec.round_ms.values())
    assert sum(map(sum, spec.round_ms.values())) <= spec.decode_s * 1e3 + 1.0  # rounds fit in the decode time


def test_a_stop_token_among_the_accepted_drafts_ends_the_round_without_a_bonus():
    """accepted_counts holds the drafts a round accepted, the stop token included; the round emits
    exactly those (acceptance length = accepted, not accepted + 1)."""
    from pairs import bigram_pair

    target, draft = bigram_pair(dtype=torch.float32)
    prompt = list(range(1, 20))
    free = Engine(target, BlockDrafter(draft)).generate(prompt, GenerationConfig(max_new_tokens=60))
    assert free.accepted_counts == [n - 1 for n in free.acceptance_lengths]
    # a token that first appears inside a round, as an accepted draft that is not the round's last token
    start = 1
    for n, a in zip(free.acceptance_lengths, free.accepted_counts):
        for j in range(min(a, n - 1)):
            tok = free.tokens[start + j]
            if tok not in free.tokens[:start + j]:
                stopped = Engine(target, BlockDrafter(draft)).generate(
                    prompt, GenerationConfig(max_new_tokens=60, stop_token_ids=(tok,)))
                assert stopped.tokens == free.tokens[: start + j + 1] and stopped.stop_reason == "stop_token"
                assert stopped.accepted_counts[-1] == stopped.acceptance_lengths[-1] == j + 1
                return
        start += n
    pytest.fail("no accepted draft token to stop on")


def test_greedy_draft_margins_are_the_top2_gap_of_the_logits_each_draft_was_chosen_from(monkeypatch):
    """With margins on, each round records, for its slots up to the first rejected one, how far the
    chosen draft's logit led the runner-up: from the very logits the arg-max was taken of (the Markov-
    corrected ones for DSpark); nothing else changes, and at T > 0 nothing is recorded."""
    import dspark.drafters.block as drafters

    target, draft = CASES["dspark-bigram"]()
    prompt, cfg = _prompt(), GenerationConfig(max_new_tokens=60, temperature=0.0)
    seen = []
    real = drafters.top2_margin
    monkeypatch.setattr(drafters, "top2_margin", lambda logits: seen.append(logits.clone()) or real(logits))
    off = Engine(target, BlockDrafter(draft)).generate(prompt, cfg)
    assert off.draft_margins == [] and seen == []
    on = Engine(target, BlockDrafter(draft, margins=True)).generate(prompt, cfg)
    assert (on.tokens, on.accepted_counts, on.proposal_lengths) == (off.tokens, off.accepted_counts,
                                                                    off.proposal_lengths)
    assert [len(m) for m in on.draft_margins] == [min(a + 1, d) for a, d in zip(on.accepted_counts,
                                                                                on.proposal_lengths)]
    assert len(seen) == on.num_rounds
    token = 1  # round r's accepted drafts are the output tokens it emitted, chosen as the arg-max of its logits
    for logits, margins, a in zip(seen, on.draft_margins, on.accepted_counts):
        top = logits.float().topk(2, dim=-1)
        emitted = on.tokens[token:token + a]  # (the last round's may be cut at max_new_tokens)
        assert top.indices[: len(emitted), 0].tolist() == emitted
        assert margins == pytest.approx((top.values[:, 0] - top.values[:, 1])[: len(margins)].tolist())
        token += a + 1
    sampled = Engine(target, BlockDrafter(draft, margins=True)).generate(prompt, GenerationConfig(
        max_new_tokens=30, temperature=1.0))
    assert sampled.draft_margins == []

"""Synthetic acceptance: the profiles, the goodness-of-fit check, and our engine's accept step at a profile.

The engine's accepted counts are held against the profile's distribution with Pearson's chi-square (on the
CPU, the same step code the GPU runs inside its graphs; test_cuda holds the graphs equal to it), and the
same counts against another profile, so the test can fail.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from pairs import random_pair
from scipy import stats

from dspark.drafters import NgramDrafter, drafter_for
from dspark.engine import Engine, GenerationConfig
from dspark.errors import DSparkError
from dspark.synthetic.acceptance import (
    PROFILES,
    chi2_sf,
    count_probabilities,
    geometric_rates,
    goodness_of_fit,
    realised_rates,
    resolve,
)


@pytest.mark.parametrize("mean", [1.0, 1.1, 2.33, 3.41, 4.81, 7.9, 8.0])
def test_a_mean_length_spreads_geometrically_and_keeps_its_mean(mean):
    rates = geometric_rates(mean, 7)
    assert 1 + sum(rates) == pytest.approx(mean, abs=1e-9)
    assert all(b <= a for a, b in zip(rates, rates[1:]))
    conditional = resolve(str(mean), 7).conditional
    assert max(conditional) - min(conditional) < 1e-6  # one constant conditional rate


def test_every_named_profile_has_a_source_and_valid_rates():
    for name, profile in PROFILES.items():
        assert profile.source
        for k in (7, 15):
            s = resolve(name, k)
            assert len(s.rates) == k and all(0 <= r <= 1 for r in s.rates)
            assert sum(count_probabilities(s.rates)) == pytest.approx(1.0)
            assert s.name == name and s.to_dict()["mean_length"] == pytest.approx(1 + sum(s.rates), abs=1e-6)
    assert resolve("official-coding", 7).mean_length == pytest.approx(3.41)
    with pytest.raises(DSparkError, match="cannot be reached with 2 drafts"):
        resolve("official-coding", 2)  # a mean length of 3.41 needs at least 3 drafts a round
    assert resolve("community", 7).rates[:2] == (0.605, 0.341)
    assert resolve("community", 9).rates[7:] == (0.0, 0.0)  # past the published positions: nothing accepted


@pytest.mark.parametrize("spec,fragment", [("fast", "not a profile"), ("0.9,0.8", "2 rates for a proposal of 7"),
                                           ("9", "cannot be reached with 7"), ("0.5,0.6,0.4,0.3,0.2,0.1,0.0", "rise"),
                                           ("1.2,0.8,0.7,0.6,0.5,0.4,0.3", "[0, 1]"), ("nan", "finite"),
                                           ("inf", "finite"), ("0", "at least 1"), ("-1", "at least 1"),
                                           ("0.9,,0.8", "not a profile")])
def test_a_bad_spec_is_refused_in_one_line(spec, fragment):
    with pytest.raises(DSparkError, match=None) as exc:
        resolve(spec, 7)
    assert fragment in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("x,dof", [(0.3, 1), (2.0, 2), (7.5, 5), (30.0, 7), (200.0, 14), (0.01, 9)])
def test_chi2_survival_matches_scipy(x, dof):
    assert chi2_sf(x, dof) == pytest.approx(stats.chi2.sf(x, dof), rel=1e-9, abs=1e-300)


def _draws(rates, n, seed=0):
    rng, out = random.Random(seed), []
    for _ in range(n):
        a = 0
        while a < len(rates) and rng.random() < rates[a] / (rates[a - 1] if a else 1.0):
            a += 1
        out.append(a)
    return out


def test_a_profile_of_one_outcome_is_checked_and_counts_past_k_are_impossible():
    assert goodness_of_fit([7] * 50, (1.0,) * 7)["p_value"] == 1.0  # every slot always accepted: nothing to test
    assert goodness_of_fit([0] * 50, (0.0,) * 7)["p_value"] == 1.0
    assert goodness_of_fit([8, 1, 2], resolve("official-coding", 7).rates)["p_value"] == 0.0


def test_goodness_of_fit_accepts_its_profile_and_rejects_another():
    rates = resolve("official-coding", 7).rates
    counts = _draws(rates, 3000)
    fit = goodness_of_fit(counts, rates)
    assert fit["p_value"] > 1e-3 and fit["dof"] == 7
    observed = [counts.count(j) for j in range(8)]  # (every cell expects well over 5 rounds: none pooled)
    scipy_fit = stats.chisquare(observed, [p * len(counts) for p in count_probabilities(rates)])
    assert (fit["chi2"], fit["p_value"]) == pytest.approx((scipy_fit.statistic, scipy_fit.pvalue), rel=1e-6)
    assert goodness_of_fit(counts, resolve("dspark-paper", 7).rates)["p_value"] < 1e-12
    assert realised_rates(counts, 7)[0] == pytest.approx(rates[0], abs=0.03)
    few = goodness_of_fit(counts[:4], rates)
    assert few["p_value"] is None and "too few rounds" in few["reason"]
    never = goodness_of_fit([0, 3], (0.5, 0.0, 0.0))
    assert never["p_value"] == 0.0 and "never" in never["reason"]


def _engine_counts(profile: str, temperature: float, requests: int = 6, tokens: int = 220):
    target, draft = random_pair(dtype=torch.float32)
    engine = Engine(target, drafter_for(draft))
    rates = resolve(profile, draft.config.block_size).rates
    counts = []
    for seed in range(requests):
        prompt = torch.randint(0, 60, (9,), generator=torch.Generator().manual_seed(seed)).tolist()
        r = engine.generate(prompt, GenerationConfig(max_new_tokens=tokens, temperature=temperature, seed=seed,
                                                     synthetic_rates=rates))
        assert r.proposal_lengths and set(r.proposal_lengths) == {draft.config.block_size}  # the whole block verified
        assert r.acceptance_lengths == [a + 1 for a in r.accepted_counts]
        counts += r.accepted_counts
    return counts, rates


@pytest.mark.parametrize("profile,temperature", [("dspark-ascend-gsm8k", 0.0), ("official-coding", 1.0),
                                                 ("collapse", 0.0)])
def test_our_engine_accepts_at_the_profile(profile, temperature):
    counts, rates = _engine_counts(profile, temperature)
    fit = goodness_of_fit(counts, rates)
    assert fit["p_value"] is not None and fit["p_value"] > 1e-3, fit
    other = "collapse" if profile != "collapse" else "official-coding"
    assert goodness_of_fit(counts, resolve(other, len(rates)).rates)["p_value"] < 1e-6
    mean = 1 + sum(rates)
    assert sum(a + 1 for a in counts) / len(counts) == pytest.approx(mean, abs=6 * math.sqrt(len(rates) ** 2 / len(counts)))


def test_the_same_seed_accepts_the_same_counts():
    a, _ = _engine_counts("official-coding", 1.0, requests=2, tokens=80)
    b, _ = _engine_counts("official-coding", 1.0, requests=2, tokens=80)
    assert a == b


def test_synthetic_acceptance_is_refused_where_it_means_nothing():
    target, draft = random_pair(dtype=torch.float32)
    n = draft.config.block_size
    cases = [(Engine(target), (0.5,) * n, "needs a drafter"),
             (Engine(target, drafter_for(draft)), (0.5,) * (n - 1), f"for {n} draft slots"),
             (Engine(target, NgramDrafter(n)), (0.5,) * n, None)]
    for engine, rates, message in cases:
        cfg = GenerationConfig(max_new_tokens=8, synthetic_rates=rates)
        if message is None:
            engine.generate([1, 2, 3, 1, 2, 3], cfg)  # n-gram: rounds it proposes are accepted at the profile
            continue
        with pytest.raises(DSparkError, match=message):
            engine.generate([1, 2, 3], cfg)
    with pytest.raises(DSparkError, match="confidence policy"):
        Engine(target, drafter_for(draft)).generate([1, 2, 3], GenerationConfig(
            max_new_tokens=8, synthetic_rates=(0.5,) * n, confidence_threshold=0.5))


def test_the_check_tests_each_level_apart_since_a_requests_seed_repeats_across_levels():
    """A served sweep replays the same request seeds at each level: the same rounds four times are one sample."""
    from harness.analysis.synthetic_check import check

    profile = resolve("official-coding", 7).to_dict()
    counts = _draws(tuple(profile["rates"]), 600, seed=3)
    records = [{"temperature": 0.0, "max_concurrency": c, "accepted_counts": counts[i::6], "proposal_lengths":
                [7] * len(counts[i::6])} for c in (1, 4, 16, 32) for i in range(6)]
    result = check(records, profile)
    one = goodness_of_fit(counts, tuple(profile["rates"]))["p_value"]
    assert result["groups"] == 4 and [g["p_value"] for g in result["by_group"]] == pytest.approx([one] * 4)
    assert result["p_value"] == pytest.approx(min(1.0, 4 * one))
    pooled = goodness_of_fit(counts * 4, tuple(profile["rates"]))["p_value"]
    assert pooled < one  # (what pooling the repeats would have claimed)

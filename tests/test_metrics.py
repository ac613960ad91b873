"""The run's metric functions on examples computed by hand."""

from __future__ import annotations

import math

import pytest

from harness.analysis.metrics import acceptance, first_difference, latency_stats, percentile, speedup


def test_acceptance_pooled_over_rounds():
    # Three rounds: 3 proposed / 3 accepted, 3 proposed / 0 accepted, 2 proposed (a cut proposal) / 1 accepted.
    m = acceptance([4, 1, 2], [3, 3, 2])
    assert m["num_rounds"] == 3
    assert m["spec_decode_acceptance_length"] == pytest.approx(1 + 4 / 3)
    assert m["spec_decode_acceptance_rate"] == pytest.approx(4 / 8)
    assert m["spec_decode_num_draft_tokens"] == 8 and m["spec_decode_num_accepted_tokens"] == 4
    # joint: position 1 accepted in 2 of 3 rounds proposing it, position 2 in 1 of 3, position 3 in 1 of 2
    assert m["spec_decode_per_position_acceptance_rates"] == pytest.approx([2 / 3, 1 / 3, 1 / 2])
    # conditional: position 2 reached (1 accepted, 2 proposed) by rounds 1 and 3, accepted in round 1
    assert m["spec_decode_conditional_acceptance_rates"] == pytest.approx([2 / 3, 1 / 2, 1.0])
    assert m["spec_decode_acceptance_histogram"] == [1, 1, 0, 1]


def test_acceptance_of_no_rounds_and_of_plain_decoding():
    assert acceptance([], [])["spec_decode_acceptance_length"] is None
    never = acceptance([1, 1], [2, 2])
    assert never["spec_decode_acceptance_length"] == 1.0 and never["spec_decode_acceptance_rate"] == 0.0
    assert never["spec_decode_conditional_acceptance_rates"] == [0.0, None]  # nobody reached position 2


def test_percentiles_and_latency_stats():
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)
    assert percentile([7], 99) == 7 and percentile([], 50) is None
    s = latency_stats("tpot_ms", [10.0, 20.0, None, 30.0])
    assert s == {"mean_tpot_ms": 20.0, "median_tpot_ms": 20.0, "p90_tpot_ms": pytest.approx(28.0),
                 "p99_tpot_ms": pytest.approx(29.8)}


def test_speedup_is_the_paired_geometric_mean_with_an_interval():
    s = speedup([10.0, 20.0], [5.0, 5.0])
    assert s["speedup"] == pytest.approx(math.sqrt(8)) and s["speedup_pairs"] == 2
    lo, hi = s["speedup_ci95"]
    assert 2.0 <= lo <= s["speedup"] <= hi <= 4.0
    same = speedup([3.0] * 5, [3.0] * 5)
    assert same["speedup"] == pytest.approx(1.0) and same["speedup_ci95"] == pytest.approx([1.0, 1.0])
    assert speedup([], []) is None


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is True
    assert first_difference([1, 9, 3], [1, 2, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_a_stop_token_accepted_as_a_draft_counts_as_accepted():
    # the last round accepted 2 drafts, the second a stop token: 2 tokens emitted and no bonus
    m = acceptance([3, 2], [3, 3], accepted_counts=[2, 2])
    assert m["spec_decode_num_accepted_tokens"] == 4 and m["spec_decode_acceptance_histogram"] == [0, 0, 2, 0]


def test_macro_speedup_and_its_interval_describe_the_same_number():
    from harness.analysis.metrics import speedup_macro

    # one category of one prompt at 3x, one of 99 prompts at 1x: the macro speedup is sqrt(3)
    s = speedup_macro([([3.0], [1.0]), ([1.0] * 99, [1.0] * 99)])
    assert s["speedup"] == pytest.approx(math.sqrt(3)) and s["speedup_pairs"] == 100
    lo, hi = s["speedup_ci95"]
    assert lo <= s["speedup"] <= hi


def test_one_prompt_per_category_still_shows_the_spread_between_prompts():
    """Four prompts in four categories: resampled within its own category each would never move, and the
    interval would be a point. One-item categories draw from each other, so it widens with their spread."""
    from harness.analysis.metrics import speedup_macro

    s = speedup_macro([([0.68], [1.0]), ([0.9], [1.0]), ([1.0], [1.0]), ([1.33], [1.0])])
    lo, hi = s["speedup_ci95"]
    assert lo < s["speedup"] < hi and hi - lo > 0.2
    alike = speedup_macro([([1.1], [1.0])] * 4)  # no spread: no width
    assert alike["speedup_ci95"] == pytest.approx([1.1, 1.1])

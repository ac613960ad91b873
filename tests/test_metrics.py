"""The run's metric functions on examples computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from harness.analysis.metrics import (MIN_PAIRS, acceptance, first_difference, latency_stats, percentile,
                                      ratio_interval, speedup, speedup_macro, speedup_with_contention, t_quantile)


def test_acceptance_pooled_over_rounds():
    # Three rounds: 3 proposed / 3 accepted, 3 proposed / 0 accepted, 2 proposed (a cut proposal) / 1 accepted.
    m = acceptance([4, 1, 2], [3, 3, 2])
    assert m["num_rounds"] == 3
    assert m["spec_decode_acceptance_length"] == pytest.approx(1 + 4 / 3)
    assert m["spec_decode_acceptance_rate"] == pytest.approx(4 / 8)
    assert m["spec_decode_num_draft_tokens"] == 8 and m["spec_decode_num_accepted_tokens"] == 4
    # joint, over all 3 rounds: position 1 accepted in 2, position 2 in 1, position 3 in 1 (the round that
    # proposed 2 accepts nothing at 3): they sum to AL - 1
    assert m["spec_decode_per_position_acceptance_rates"] == pytest.approx([2 / 3, 1 / 3, 1 / 3])
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
    """Two pairs (the issue's `--num-prompts 2`): the speedup, and no interval (a bootstrap over them gave
    one as tight as 2.0-4.0 here). Six: the Student t interval on the log ratios, as scipy computes it."""
    s = speedup([10.0, 20.0], [5.0, 5.0])
    assert s["speedup"] == pytest.approx(math.sqrt(8)) and s["speedup_pairs"] == 2
    assert s["speedup_ci95"] is None and s["speedup_ci95_reason"] == "too few prompts (2) for an interval"
    s = speedup([10.0, 20.0] * 3, [5.0] * 6)
    logs = np.log([2.0, 4.0] * 3)
    lo, hi = np.exp(stats.t.interval(0.95, 5, loc=logs.mean(), scale=stats.sem(logs)))
    assert s["speedup"] == pytest.approx(math.sqrt(8)) and s["speedup_ci95"] == pytest.approx([lo, hi], rel=1e-9)
    assert s["speedup_ci95"] == pytest.approx([1.8989, 4.2129], abs=1e-4) and s["speedup_ci95_reason"] is None
    same = speedup([3.0] * 6, [3.0] * 6)
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
    # one category of one prompt at 3x, one of 99 prompts at 1x: the macro speedup is sqrt(3)
    s = speedup_macro([([3.0], [1.0]), ([1.0] * 99, [1.0] * 99)])
    assert s["speedup"] == pytest.approx(math.sqrt(3)) and s["speedup_pairs"] == 100
    lo, hi = s["speedup_ci95"]
    assert lo <= s["speedup"] <= hi


def test_one_prompt_per_category_still_shows_the_spread_between_prompts():
    """Prompts in categories of one each: within its own category none has a spread, and the interval
    would be a point. One-item categories count as one for the spread, so it widens with their spread:
    the one-sample t interval of their values. Four such prompts are too few for a verdict; six are not."""
    four = [[0.68], [0.9], [1.0], [1.33]]
    got = ratio_interval(four)
    logs = np.log([0.68, 0.9, 1.0, 1.33])
    want = np.exp(stats.t.interval(0.95, 3, loc=logs.mean(), scale=stats.sem(logs)))
    assert got["df"] == 3 and got["ci"] == pytest.approx(list(want), rel=1e-9)
    assert got["ci"][0] < got["centre"] < got["ci"][1] and got["ci"][1] - got["ci"][0] > 0.2
    s = speedup_macro([([r[0]], [1.0]) for r in four])
    assert s["speedup_ci95"] is None and s["speedup_ci95_reason"] == "too few prompts (4) for an interval"
    six = speedup_macro([([r], [1.0]) for r in (0.68, 0.9, 1.0, 1.33, 0.95, 1.1)])
    lo, hi = six["speedup_ci95"]
    assert lo < six["speedup"] < hi and hi - lo > 0.2
    alike = speedup_macro([([1.1], [1.0])] * 6)  # no spread: no width
    assert alike["speedup_ci95"] == pytest.approx([1.1, 1.1])


def test_t_quantiles_are_students():
    """The analysis code's own t quantile (it has no scipy) against scipy's, from 1 degree of freedom
    (12.706) to the normal limit, fractional degrees included."""
    for df in (1, 2, 3, 4, 5, 7, 10, 29.5, 100, 1e4):
        for p in (0.6, 0.9, 0.975, 0.995, 0.025):
            assert t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-9, abs=1e-12), (p, df)
    assert t_quantile(0.975, 1) == pytest.approx(12.7062, abs=1e-4)


def test_a_stratified_interval_pools_the_spread_within_categories():
    """Categories of 3 and 4 prompts and one of a single prompt: the centre is the mean of the
    categories' mean logs, the variance the pooled within-category one times sum(1/n_k) / K^2, on
    (3 - 1) + (4 - 1) degrees of freedom (the single prompt borrows the others' spread)."""
    strata = [[1.2, 1.5, 1.3], [0.9, 1.0, 1.1, 0.95], [2.0]]
    logs = [np.log(s) for s in strata]
    centre = np.mean([x.mean() for x in logs])
    pooled = sum(((x - x.mean()) ** 2).sum() for x in logs[:2]) / 5
    se = math.sqrt(pooled * sum(1 / len(x) for x in logs)) / 3
    half = stats.t.ppf(0.975, 5) * se
    got = ratio_interval(strata)
    assert got["df"] == 5 and got["centre"] == pytest.approx(math.exp(centre))
    assert got["ci"] == pytest.approx([math.exp(centre - half), math.exp(centre + half)], rel=1e-9)
    one = ratio_interval([[1.2, 1.5, 1.3, 0.9]])  # one category: the one-sample t interval of the logs
    x = np.log([1.2, 1.5, 1.3, 0.9])
    assert one["ci"] == pytest.approx(list(np.exp(stats.t.interval(0.95, 3, loc=x.mean(), scale=stats.sem(x)))))
    assert ratio_interval([[1.3]]) == {"centre": pytest.approx(1.3), "ci": None, "df": 0}


def test_the_interval_widens_as_the_sample_shrinks():
    """The same spread (log ratios of standard deviation 0.2 around a speedup of 1.3) from n = 12 down to
    n = 2 prompts: every step down widens the interval, as t_{0.975,n-1} * 0.2 / sqrt(n) says; at 2 it
    is 2 x 12.7 x 0.2 / sqrt(2) wide in logs, 0.09x to 19x. Below MIN_PAIRS (6) no interval is shown."""
    widths = []
    for n in range(12, 1, -1):
        z = np.arange(n, dtype=float)
        logs = math.log(1.3) + 0.2 * (z - z.mean()) / z.std(ddof=1)
        got = ratio_interval([list(np.exp(logs))])
        width = math.log(got["ci"][1]) - math.log(got["ci"][0])
        assert width == pytest.approx(2 * stats.t.ppf(0.975, n - 1) * 0.2 / math.sqrt(n), rel=1e-9)
        widths.append(width)
        shown = speedup_macro([(list(np.exp(logs)), [1.0] * n)])["speedup_ci95"]
        assert (shown is None) == (n < MIN_PAIRS) and (shown is None or shown == pytest.approx(got["ci"]))
    assert all(a < b for a, b in zip(widths, widths[1:]))
    assert got["ci"] == pytest.approx([1.3 * math.exp(-12.7062 * 0.2 / math.sqrt(2)),
                                       1.3 * math.exp(12.7062 * 0.2 / math.sqrt(2))], rel=1e-4)


def test_contention_widens_an_interval_and_too_few_pairs_still_give_none():
    """Contention keeps widening the t interval (to cover the quiet-machine figure); with too few pairs
    there is no interval to widen, and the quiet-machine speedup is still reported."""
    timed = [([20.0, 22.0, 18.0, 21.0, 19.0, 20.5], [8.0, 9.0, 7.5, 8.5, 8.0, 8.2])]
    quiet = [([10.0, 11.0, 9.0, 10.5, 9.5, 10.25], [8.0, 9.0, 7.5, 8.5, 8.0, 8.2])]
    wide = speedup_with_contention(timed, quiet)
    alone, other = speedup_macro(timed), speedup_macro(quiet)
    assert wide["speedup_ci95_timed"] == alone["speedup_ci95"] and wide["speedup"] == alone["speedup"]
    assert wide["speedup_ci95"] == [other["speedup_ci95"][0], alone["speedup_ci95"][1]]
    few = speedup_with_contention([(b[:3], m[:3]) for b, m in timed], [(b[:3], m[:3]) for b, m in quiet])
    assert few["speedup_ci95"] is None and "speedup_ci95_timed" not in few
    assert few["speedup_ci95_reason"] == "too few prompts (3) for an interval"
    assert few["speedup_uncontended"] == pytest.approx(speedup_macro([(b[:3], m[:3]) for b, m in quiet])["speedup"])

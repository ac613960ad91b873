"""The figures of a run, as the field defines them (names from vLLM bench where it has one).

A round proposes d draft tokens, accepts a <= d of them and emits a + 1 tokens (the +1 is the
target's bonus or correction token). `acceptance_lengths` holds a + 1 per round and
`proposal_lengths` d per round, as the engine reports them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def acceptance(acceptance_lengths: Sequence[int], proposal_lengths: Sequence[int],
               accepted_counts: Sequence[int] | None = None) -> dict:
    """Pooled over all rounds given (of any number of requests).

    - `spec_decode_acceptance_length`: tokens per round (1 + accepted / rounds), as vLLM;
    - `spec_decode_acceptance_rate`: accepted / proposed draft tokens;
    - `spec_decode_num_accepted_tokens_per_pos`: rounds that accepted position k (vLLM's counter);
    - `spec_decode_per_position_acceptance_rates`: joint, P(position k accepted) over every round (a round
      that proposed fewer than k drafts, n-gram's with no match among them, accepts nothing at k): they
      sum to acceptance length - 1, whatever the proposals;
    - `spec_decode_conditional_acceptance_rates`: P(k accepted | k - 1 accepted and k proposed);
    - `spec_decode_acceptance_histogram`: rounds by accepted draft count (index 0..max proposed).
    Conditional rates of positions no round reached are None. `accepted_counts` (drafts accepted per round)
    default to acceptance length - 1; they differ in a round whose accepted draft was a stop token (no bonus).
    """
    rounds = len(acceptance_lengths)
    if rounds == 0:
        return {"num_rounds": 0, "spec_decode_acceptance_length": None, "spec_decode_acceptance_rate": None,
                "spec_decode_num_draft_tokens": 0, "spec_decode_num_accepted_tokens": 0,
                "spec_decode_num_accepted_tokens_per_pos": [], "spec_decode_per_position_acceptance_rates": [],
                "spec_decode_conditional_acceptance_rates": [], "spec_decode_acceptance_histogram": []}
    accepted = list(accepted_counts) if accepted_counts is not None else [n - 1 for n in acceptance_lengths]
    k_max = max(proposal_lengths)
    accepted_at = [sum(a >= k for a in accepted) for k in range(1, k_max + 1)]
    joint = [acc / rounds for acc in accepted_at]
    conditional = []
    for k in range(1, k_max + 1):
        # rounds that accepted k - 1 and proposed k: the ones that could accept position k
        reached = sum(a >= k - 1 and d >= k for a, d in zip(accepted, proposal_lengths))
        conditional.append(accepted_at[k - 1] / reached if reached else None)
    histogram = [0] * (k_max + 1)
    for a in accepted:
        histogram[a] += 1
    return {
        "num_rounds": rounds,
        "spec_decode_acceptance_length": 1 + sum(accepted) / rounds,
        "spec_decode_acceptance_rate": sum(accepted) / sum(proposal_lengths) if sum(proposal_lengths) else None,
        "spec_decode_num_draft_tokens": sum(proposal_lengths),
        "spec_decode_num_accepted_tokens": sum(accepted),
        "spec_decode_num_accepted_tokens_per_pos": accepted_at,
        "spec_decode_per_position_acceptance_rates": joint,
        "spec_decode_conditional_acceptance_rates": conditional,
        "spec_decode_acceptance_histogram": histogram,
    }


def acceptance_from_totals(totals: Sequence[dict]) -> dict:
    """`acceptance`'s figures from totals alone (vLLM's per-request totals, or a server's counters over
    a wave): speculative steps, draft tokens, accepted drafts and, where known, accepted drafts per
    position. Per-position rates are accepted at k / steps, as vLLM's; the histogram needs rounds and
    stays empty."""
    steps = sum(t.get("num_spec_steps") or 0 for t in totals)
    drafts = sum(t.get("num_draft_tokens") or 0 for t in totals)
    accepted = sum(t.get("num_accepted_draft_tokens") or 0 for t in totals)
    per_pos: list[float] = []
    if totals and all(t.get("accepted_per_pos") or not t.get("num_spec_steps") for t in totals):  # (no step: none)
        width = max(len(t.get("accepted_per_pos") or []) for t in totals)  # (a step-less request's may be absent)
        per_pos = [sum(((t.get("accepted_per_pos") or []) + [0] * width)[k] for t in totals) for k in range(width)]
    return {"num_rounds": steps, "spec_decode_acceptance_length": 1 + accepted / steps if steps else None,
            "spec_decode_acceptance_rate": accepted / drafts if drafts else None,
            "spec_decode_num_draft_tokens": drafts, "spec_decode_num_accepted_tokens": accepted,
            "spec_decode_num_accepted_tokens_per_pos": per_pos,
            "spec_decode_per_position_acceptance_rates": [a / steps for a in per_pos] if steps else [],
            "spec_decode_conditional_acceptance_rates": [a / p if p else None for a, p in
                                                         zip(per_pos, [steps] + per_pos[:-1])] if steps else [],
            "spec_decode_acceptance_histogram": []}


def request_latencies(prefill_s: float | None, decode_s: float, output_tokens: int) -> dict:
    """One request's TTFT, TPOT and end-to-end latency in ms, defined as `vllm bench serve` defines them, so
    that its figures and ours on one server are the same quantities: TPOT is the time after the first token
    over the tokens after it; None where there is no second token or the backend cannot tell the TTFT."""
    ttft = None if prefill_s is None else prefill_s * 1e3
    e2el = ((prefill_s or 0.0) + decode_s) * 1e3
    tpot = (e2el - ttft) / (output_tokens - 1) if output_tokens > 1 and ttft is not None else None
    return {"ttft_ms": ttft, "tpot_ms": tpot, "e2el_ms": e2el}


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between order statistics (numpy's default)."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def latency_stats(name: str, values: Sequence[float]) -> dict:
    """mean / median / p90 / p99 of one latency in milliseconds, as `mean_<name>` ... `p99_<name>`."""
    vals = [v for v in values if v is not None]
    return {f"mean_{name}": sum(vals) / len(vals) if vals else None, f"median_{name}": percentile(vals, 50),
            f"p90_{name}": percentile(vals, 90), f"p99_{name}": percentile(vals, 99)}


Z95 = 1.959964  # the normal quantile of a two-sided 95 % interval


def wilson(successes: float, trials: float, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion: honest with few trials or a share near 0 or 1, where
    the normal approximation claims a spread of 0."""
    if not trials:
        return math.nan, math.nan
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z / (1 + z * z / trials) * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    return max(0.0, centre - half), min(1.0, centre + half)


MIN_PAIRS = 6
"""The fewest prompt pairs a speedup gets an interval (and so a verdict) from; below it the speedup is shown
with "too few prompts (n) for an interval". Why 6: the interval is a Student t interval on the log ratios,
exact only if they are normal, and fewer than 6 pairs cannot check that or do without it: even with every
pair faster, the exact sign test (or Wilcoxon's signed-rank test) of n pairs cannot reach 5 % before n = 6
(two-sided p = 2 x 0.5^n: 0.0625 at n = 5, 0.031 at n = 6), so below 6 a verdict would rest on the normal
assumption alone. The t interval itself is already wide there (half-width t_{0.975,n-1} / sqrt(n) standard
deviations: 9.0 at n = 2, 2.5 at 3, 1.6 at 4, 1.24 at 5, 1.05 at 6, 0.84 at 8), and with 2 to 4 pairs the
standard deviation it scales is itself a guess (from 2 points, the true one is anywhere from 0.45 to 32
times it at 95 %)."""


def too_few(n: int, what: str) -> str:
    """What a figure from fewer than MIN_PAIRS prompts (pairs) or requests shows instead of an interval."""
    return f"too few {what} ({n}) for an interval"


def side_text(v: float, digits: int = 2) -> str:
    """A ratio to `digits` decimals, or more where rounding would print a value that is not 1 as 1
    (0.9966: "0.997", never "1.00"): a speedup, or an interval's end, keeps in print the side of 1 that
    its verdict rests on."""
    d = digits
    while v != 1 and float(f"{v:.{d}f}") == 1 and d < 15:
        d += 1
    return f"{v:.{d}f}"


def interval_text(ci: Sequence[float], digits: int = 2) -> str:
    """An interval as "lo-hi", each end by `side_text`: one that excludes 1 never prints as touching it."""
    return f"{side_text(ci[0], digits)}-{side_text(ci[1], digits)}"


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes 6.4)."""
    tiny = 1e-300

    def nonzero(v: float) -> float:
        return v if abs(v) > tiny else tiny

    c, d = 1.0, 1 / nonzero(1 - (a + b) * x / (a + 1))
    h = d
    for m in range(1, 10_000):
        for aa in (m * (b - m) * x / ((a - 1 + 2 * m) * (a + 2 * m)),
                   -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 1 + 2 * m))):
            d = 1 / nonzero(1 + aa * d)
            c = nonzero(1 + aa / c)
            h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (the continued fraction where it converges
    fast, else through I_x(a, b) = 1 - I_{1-x}(b, a))."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1 - front * _betacf(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * betainc(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The p-quantile (0 < p < 1) of Student's t with `df` degrees of freedom, by bisection on `t_cdf`
    (the analysis code has no scipy): t_quantile(0.975, 1) = 12.706, (0.975, 5) = 2.571."""
    if p < 0.5:
        return -t_quantile(1 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def ratio_interval(strata: Sequence[Sequence[float]], level: float = 0.95) -> dict:
    """The geometric mean over strata (categories) of each stratum's geometric mean of ratios, with a
    Student t interval: on the log ratios, exponentiated. The centre is the mean over strata of each
    stratum's mean log ratio; its variance is the pooled within-stratum variance s^2 times
    sum_k(1/n_k) / K^2, with the pooled degrees of freedom. One stratum: the one-sample t interval on the
    logs (s^2 / n, n - 1 degrees of freedom). Strata of one ratio have no spread of their own: together
    they count as one stratum for the variance (their differences taken as noise, the conservative
    reading), and a lone one borrows the others'. The interval widens as the sample shrinks twice over:
    a larger standard error and a larger t quantile (12.7 at 1 degree of freedom, 2.57 at 5, 1.96 in the
    limit). {"centre", "ci" (None from one ratio: no spread to estimate), "df"}; `strata` holds at least
    one ratio."""
    logs = [[math.log(r) for r in s] for s in strata if s]
    means = [sum(s) / len(s) for s in logs]
    centre = sum(means) / len(means)
    singles = [s[0] for s in logs if len(s) == 1]
    spread = [s for s in logs if len(s) > 1] + ([singles] if len(singles) > 1 else [])
    df = sum(len(s) - 1 for s in spread)  # (0 only from a single ratio)
    if df == 0:
        return {"centre": math.exp(centre), "ci": None, "df": 0}
    squares = sum((x - sum(s) / len(s)) ** 2 for s in spread for x in s)
    se = math.sqrt(squares / df * sum(1 / len(s) for s in logs)) / len(logs)
    half = t_quantile(0.5 + level / 2, df) * se
    return {"centre": math.exp(centre), "ci": [math.exp(centre - half), math.exp(centre + half)], "df": df}


def length_interval(strata: Sequence[Sequence[tuple[float, float]]], level: float = 0.95) -> dict:
    """An acceptance length (per stratum, a category: 1 + accepted / rounds pooled over its requests; then
    the mean over strata, as the summary's overall row) with the speedups' rule for an interval: a Student
    t interval on per-request values, none below MIN_PAIRS requests. A request's value is its residual
    from its stratum's pooled length, (accepted - R x rounds) / mean rounds (the linearised ratio
    estimator: a long request weighs as much as its rounds); the variance is pooled within strata as
    `ratio_interval`'s, strata of one request counting together as one. `strata` holds (rounds, accepted)
    per request. {"centre", "ci" (None with too few requests or no spread), "requests", "reason"}."""
    strata = [[(n, a) for n, a in s if n] for s in strata]
    strata = [s for s in strata if s]
    if not strata:
        return {"centre": None, "ci": None, "requests": 0, "reason": None}
    lengths = [1 + sum(a for _, a in s) / sum(n for n, _ in s) for s in strata]
    centre = sum(lengths) / len(lengths)
    requests = sum(map(len, strata))
    if requests < MIN_PAIRS:
        return {"centre": centre, "ci": None, "requests": requests, "reason": too_few(requests, "requests")}
    residuals = [[(a - (length - 1) * n) / (sum(m for m, _ in s) / len(s)) for n, a in s]
                 for s, length in zip(strata, lengths)]
    singles = [length for s, length in zip(strata, lengths) if len(s) == 1]  # (their spread: across them)
    spread = [r for r in residuals if len(r) > 1] + ([singles] if len(singles) > 1 else [])
    df = sum(len(r) - 1 for r in spread)
    squares = sum((x - sum(r) / len(r)) ** 2 for r in spread for x in r)
    if not df or not squares:  # (every request alike: no spread to scale an interval by)
        return {"centre": centre, "ci": None, "requests": requests, "reason": "no spread between requests"}
    se = math.sqrt(squares / df * sum(1 / len(s) for s in strata)) / len(strata)
    half = t_quantile(0.5 + level / 2, df) * se
    return {"centre": centre, "ci": [centre - half, centre + half], "requests": requests, "reason": None}


def speedup_macro(groups: Sequence[tuple[Sequence[float], Sequence[float]]]) -> dict | None:
    """The geometric mean over groups (categories) of each group's paired speedup (baseline TPOT / the
    system's, prompt by prompt), with its 95 % t interval (`ratio_interval`) from MIN_PAIRS pairs on;
    with fewer, `speedup_ci95` is None and `speedup_ci95_reason` says why. None without pairs."""
    per = [[b / s for b, s in zip(base, mine) if b and s] for base, mine in groups]
    per = [r for r in per if r]
    if not per:
        return None
    pairs = sum(map(len, per))
    interval = ratio_interval(per)
    enough = pairs >= MIN_PAIRS
    return {"speedup": interval["centre"], "speedup_ci95": interval["ci"] if enough else None,
            "speedup_pairs": pairs, "speedup_ci95_reason": None if enough else too_few(pairs, "prompts")}


def speedup_with_contention(timed: Sequence[tuple[Sequence[float], Sequence[float]]],
                            uncontended: Sequence[tuple[Sequence[float], Sequence[float]]]) -> dict | None:
    """`speedup_macro` of the timed pairs, its interval widened, where contention touched them, to cover the
    interval of the same pairs with each contended request's time scaled back to an uncontended machine
    (`uncontended`, same shape). The two bracket the truth: wall times charge the pair's waits for a core
    to whichever side waited; the scaled times assume all of a contended request's lost CPU share was
    waiting. `speedup_ci95_timed` keeps the wall-time interval, `speedup_uncontended` the other estimate.
    Too few pairs for an interval: none, widened or not."""
    s = speedup_macro(timed)

    def ratios(groups):
        return [[b / m for b, m in zip(*g) if b and m] for g in groups]

    if s is None or ratios(timed) == ratios(uncontended):  # (no pair touched, or both sides scaled alike)
        return s
    other = speedup_macro(uncontended)
    s = s | {"speedup_uncontended": other["speedup"]}
    if s["speedup_ci95"] is None:
        return s
    lo, hi = s["speedup_ci95"]
    return s | {"speedup_ci95": [min(lo, other["speedup_ci95"][0]), max(hi, other["speedup_ci95"][1])],
                "speedup_ci95_timed": [lo, hi]}


def speedup(baseline_tpot: Sequence[float], system_tpot: Sequence[float]) -> dict | None:
    """Geometric mean over prompts of baseline TPOT / system TPOT (paired: index i is one prompt in
    both), with its 95 % t interval over prompts (from MIN_PAIRS pairs on). None without pairs."""
    return speedup_macro([(baseline_tpot, system_tpot)])


def first_difference(tokens: Sequence[int], baseline: Sequence[int]) -> bool | int:
    """True when the token lists are equal, else the index of the first difference."""
    for i, (a, b) in enumerate(zip(tokens, baseline)):
        if a != b:
            return i
    return True if len(tokens) == len(baseline) else min(len(tokens), len(baseline))

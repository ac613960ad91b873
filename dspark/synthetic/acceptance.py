"""Synthetic acceptance: what a round accepts when no real draft decides it, from a published profile.

A profile is per-position *unconditional* acceptance rates r_1 >= r_2 >= ... >= r_k: r_i is the share of
rounds that accept at least i drafts (vLLM's `synthetic_acceptance_rates` means the same). A round then
accepts slot i with the conditional rate r_i / r_{i-1} while every slot before it was accepted, so the
accepted count a of a round of k drafts has P(a >= i) = r_i, and the mean acceptance length (tokens per
round, the bonus included) is 1 + sum(r_i). Random weights with a profile time a system at that acceptance;
they never say what any draft accepts.

A profile published as a mean acceptance length only is spread over the positions geometrically
(r_i = alpha^i, the constant conditional rate of Leviathan et al.'s model, alpha solved for the mean), not as
vLLM's `synthetic_acceptance_length` does (every slot accepted up to the mean, then none: a round-to-round
variance of almost zero that no draft has). Both engines are given the same rates.

No torch here: the run's summary and notebooks check realised acceptance with `goodness_of_fit`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dspark.errors import DSparkError

SPEC_HELP = ("a profile name, a mean acceptance length (one number, e.g. 3.41) or per-position unconditional "
             "rates (non-increasing numbers in [0, 1], comma-separated, one per draft slot)")


@dataclass(frozen=True)
class Profile:
    """A named acceptance profile and where it comes from. `rates` are as published (per position,
    unconditional); `mean_length` alone means they are derived geometrically for the system's k."""

    name: str
    source: str
    rates: tuple[float, ...] = ()
    mean_length: float | None = None

    def rates_for(self, k: int) -> tuple[float, ...]:
        """The per-position unconditional rates for a proposal of `k` drafts: published positions past k are
        dropped and positions past the published ones accept nothing; a mean length is spread geometrically
        over k slots (its mean kept)."""
        if self.mean_length is not None:
            return geometric_rates(self.mean_length, k)
        return tuple(self.rates[:k]) + (0.0,) * max(0, k - len(self.rates))

    @property
    def basis(self) -> str:
        if self.mean_length is not None:
            return f"mean acceptance length {self.mean_length:g}, spread geometrically over the slots"
        return "per-position rates as published"


# The named profiles: each one a figure someone published for a Qwen3-8B draft, with its conditions.
PROFILES = {p.name: p for p in (
    Profile("official-coding", "deepseek-ai/dspark_qwen3_8b_block7 on SPEED-Bench qualitative coding: AL 3.41 (vLLM fork, "
            "1x H100, T = 1, k = 7, drafts sampled; the 'same harness' reference on the Dogacel/Qwen3-8B-DSpark card)",
            mean_length=3.41),
    Profile("dspark-paper", "DSpark paper (arXiv 2607.05147) Table 1, Qwen3-8B DSpark block 7: macro tau 4.81 over nine "
            "sets (DeepSpec's transformers loop, T = 1, fixed block of 7)", mean_length=4.81),
    Profile("dflash-paper", "DSpark paper Table 1, Qwen3-8B DFlash block 7 trained alike: macro tau 4.07 (T = 1)",
            mean_length=4.07),
    Profile("eagle3-paper", "DSpark paper Table 1, Qwen3-8B EAGLE-3 (1 layer, TTT 7, chain drafting): macro tau 3.80 "
            "(T = 1)", mean_length=3.80),
    Profile("community", "Dogacel/Qwen3-8B-DSpark card: per-position acceptance 60.5/34.1/18.6/9.9/5.2/2.7/1.4 % on "
            "SPEED-Bench coding (AL 2.33; vLLM fork, 1x H100, T = 1, k = 7)",
            rates=(0.605, 0.341, 0.186, 0.099, 0.052, 0.027, 0.014)),
    Profile("collapse", "a speculators-layout DSpark draft read anchor-first (the community draft's failure mode): "
            "acceptance length about 1.1 (sglang PR #30982; docs: spec pitfall 1)", mean_length=1.1),
    Profile("dspark-ascend-gsm8k", "vllm-ascend PR #11153: deepseek-ai/dspark_qwen3_8b_block7 on GSM8K (first 100, "
            "T = 0, k = 7): per-position 0.94/0.87/0.81/0.74/0.69/0.63/0.59 (AL 6.30)",
            rates=(0.94, 0.87, 0.81, 0.74, 0.69, 0.63, 0.59)),
    Profile("dflash-ascend-gsm8k", "vllm-ascend PR #11153: deepseek-ai/dflash_qwen3_8b_block7 on GSM8K (first 100, "
            "T = 0, k = 7): per-position 0.85/0.71/0.59/0.50/0.42/0.36/0.30 (AL 4.73)",
            rates=(0.85, 0.71, 0.59, 0.50, 0.42, 0.36, 0.30)),
)}


def conditional_rates(rates: tuple[float, ...]) -> tuple[float, ...]:
    """c_i = r_i / r_{i-1} (r_0 = 1): the rate slot i is accepted at once the slots before it were."""
    return tuple(r / prev if prev > 0 else 0.0 for r, prev in zip(rates, (1.0, *rates[:-1])))


def geometric_rates(mean_length: float, k: int) -> tuple[float, ...]:
    """r_i = alpha^i with 1 + sum_{i<=k} alpha^i = mean_length (alpha by bisection; 1 and k + 1 exactly)."""
    if not 1.0 <= mean_length <= k + 1:
        raise DSparkError(f"a mean acceptance length of {mean_length:g} cannot be reached with {k} drafts a round; "
                          f"give one from 1 to {k + 1}")
    low, high = 0.0, 1.0
    for _ in range(200):
        mid = (low + high) / 2
        if 1 + sum(mid**i for i in range(1, k + 1)) < mean_length:
            low = mid
        else:
            high = mid
    alpha = (low + high) / 2
    return tuple(round(alpha**i, 12) for i in range(1, k + 1))


@dataclass(frozen=True)
class Synthetic:
    """A system's synthetic acceptance as resolved for its k: the spec it was given, the profile's name
    (the spec itself when it named none), its source and the rates both engines are given."""

    spec: str
    name: str
    source: str
    rates: tuple[float, ...]

    @property
    def mean_length(self) -> float:
        return 1 + sum(self.rates)

    @property
    def conditional(self) -> tuple[float, ...]:
        return conditional_rates(self.rates)

    def to_dict(self) -> dict:
        return {"spec": self.spec, "name": self.name, "source": self.source, "rates": list(self.rates),
                "mean_length": round(self.mean_length, 6)}


def resolve(spec: str, k: int, where: str = "--acceptance", given: str = "on the command line") -> Synthetic:
    """`spec` (SPEC_HELP) for a proposal of `k` drafts; a one-line DSparkError names what is wrong, `where`
    it was given (an option, or an experiment's system) and the fix."""
    spec = spec.strip()
    if spec in PROFILES:
        p = PROFILES[spec]
        if p.mean_length is not None and not p.mean_length <= k + 1:
            raise DSparkError(f"{where} {spec}: its mean acceptance length {p.mean_length:g} cannot be reached with "
                              f"{k} drafts a round (at most {k + 1}); give another profile")
        return Synthetic(spec, p.name, f"{p.source}; {p.basis}", p.rates_for(k))
    values = _numbers(spec, where)
    if len(values) == 1 and "," not in spec:
        if not 1.0 <= values[0] <= k + 1:
            raise DSparkError(f"{where} {spec}: a mean acceptance length of {values[0]:g} cannot be reached with {k} "
                              f"drafts a round; give one from 1 to {k + 1}")
        return Synthetic(spec, f"mean length {values[0]:g}", f"mean acceptance length {values[0]:g} given {given}, "
                         "spread geometrically over the slots", geometric_rates(values[0], k))
    if len(values) != k:
        raise DSparkError(f"{where} {spec}: {len(values)} rates for a proposal of {k} drafts; give {k}")
    return Synthetic(spec, "rates " + "/".join(f"{v:g}" for v in values), f"per-position rates given {given}",
                     tuple(values))


def _numbers(spec: str, where: str) -> list[float]:
    """The spec's numbers: one mean length, or rates that are probabilities and never rise."""
    try:
        values = [float(v) for v in spec.split(",")]
    except ValueError:
        raise DSparkError(f"{where} {spec!r}: not a profile, a mean length or a list of rates; give {SPEC_HELP}. "
                          f"Profiles: {', '.join(PROFILES)}") from None
    if not all(math.isfinite(v) for v in values):
        raise DSparkError(f"{where} {spec!r}: give finite numbers: {SPEC_HELP}")
    if len(values) == 1 and "," not in spec:
        if values[0] < 1:
            raise DSparkError(f"{where} {spec}: a mean acceptance length is at least 1 (a round emits its next token "
                              "whatever it accepts); give one from 1 to the drafts a round plus 1")
        return values
    if not all(0.0 <= v <= 1.0 for v in values):
        raise DSparkError(f"{where} {spec}: rates are probabilities; give numbers in [0, 1]")
    if any(b > a for a, b in zip(values, values[1:])):
        raise DSparkError(f"{where} {spec}: unconditional rates cannot rise from one slot to the next (a round accepts "
                          "slot i only if it accepted every slot before it); give non-increasing ones")
    return values


def check_spec(spec: str, where: str = "--acceptance") -> None:
    """Refuse a spec that no proposal length makes valid, before any model loads (its length against each
    system's proposal is checked when the system is known)."""
    if spec.strip() not in PROFILES:
        _numbers(spec.strip(), where)


def count_probabilities(rates: tuple[float, ...]) -> list[float]:
    """P(a round of len(rates) drafts accepts exactly j), j = 0..k: r_j - r_{j+1} (r_0 = 1, r_{k+1} = 0)."""
    r = (1.0, *rates, 0.0)
    return [max(0.0, r[j] - r[j + 1]) for j in range(len(rates) + 1)]


def realised_rates(accepted_counts: list[int], k: int) -> list[float | None]:
    """Per position, the share of rounds that accepted at least that many drafts (None with no rounds)."""
    n = len(accepted_counts)
    return [sum(1 for a in accepted_counts if a >= i) / n if n else None for i in range(1, k + 1)]


def goodness_of_fit(accepted_counts: list[int], rates: tuple[float, ...], min_expected: float = 5.0) -> dict:
    """Pearson's chi-square test of the rounds' accepted counts against the profile's distribution.
    Neighbouring counts are pooled until each cell expects `min_expected` rounds (the test's usual
    condition); counts the profile says cannot happen are refused outright. Returns the statistic, its
    degrees of freedom, the p-value and the cells, or a reason when there are too few rounds to test."""
    k = len(rates)
    probs = count_probabilities(rates)
    n = len(accepted_counts)
    observed = [0] * (k + 1)
    outside = sorted({a for a in accepted_counts if not 0 <= a <= k})
    for a in accepted_counts:
        if 0 <= a <= k:
            observed[a] += 1
    impossible = outside + [j for j in range(k + 1) if probs[j] == 0 and observed[j]]
    if impossible:
        return {"rounds": n, "chi2": math.inf, "dof": None, "p_value": 0.0, "cells": [],
                "reason": f"rounds accepted {sorted(impossible)} drafts, which the profile never does"}
    if sum(1 for p in probs if p > 0) == 1:  # one outcome only (every slot always, or never, accepted)
        return {"rounds": n, "chi2": 0.0, "dof": 0, "p_value": 1.0 if n else None, "cells": [],
                "reason": None if n else "no rounds to test"}
    done: list[tuple[int, int, int, float]] = []  # (first count, last count, observed, expected) per cell
    cells, obs, exp = [], 0, 0.0
    for j in range(k + 1):
        if probs[j] == 0:
            continue
        obs, exp = obs + observed[j], exp + probs[j] * n
        cells.append(j)
        if exp >= min_expected:
            done.append((cells[0], cells[-1], obs, exp))
            cells, obs, exp = [], 0, 0.0
    if cells and done:  # a short tail joins the last full cell
        first, _, o, e = done.pop()
        done.append((first, cells[-1], o + obs, e + exp))
    elif cells:
        done.append((cells[0], cells[-1], obs, exp))
    if len(done) < 2:
        return {"rounds": n, "chi2": None, "dof": None, "p_value": None, "cells": done,
                "reason": f"too few rounds ({n}) to test: every cell must expect {min_expected:g} rounds"}
    chi2 = sum((o - e) ** 2 / e for _, _, o, e in done)
    dof = len(done) - 1
    return {"rounds": n, "chi2": chi2, "dof": dof, "p_value": chi2_sf(chi2, dof), "reason": None,
            "cells": [{"accepted": [a, b], "observed": o, "expected": round(e, 3)} for a, b, o, e in done]}


def chi2_sf(x: float, dof: int) -> float:
    """P(X >= x) for X chi-square with `dof` degrees of freedom: the regularised upper incomplete gamma
    Q(dof / 2, x / 2), by its series below s + 1 and its continued fraction above (Lentz's method)."""
    s, z = dof / 2.0, x / 2.0
    if z <= 0:
        return 1.0
    log_front = s * math.log(z) - z - math.lgamma(s)
    if z < s + 1:
        term = total = 1.0 / s
        for n in range(1, 1000):
            term *= z / (s + n)
            total += term
            if term < total * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(log_front))
    tiny = 1e-300
    b = z + 1.0 - s
    c, d = 1.0 / tiny, 1.0 / b
    h = d
    for i in range(1, 1000):
        an = -i * (i - s)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return min(1.0, math.exp(log_front) * h)

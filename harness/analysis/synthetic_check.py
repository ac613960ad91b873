"""What a run with random weights or synthetic acceptance must say, and the check that its acceptance
is the profile's.

Such a run times a system; it says nothing of any draft's quality. Its summary gets a `label` ("random
weights, synthetic acceptance: <profile>") that every table title and headline carries, and per
system a `synthetic` check: the realised per-position rates (the share of full rounds that accepted at
least i drafts) beside the profile's, and Pearson's chi-square test of the rounds' accepted counts
against the profile (`dspark.synthetic.acceptance.goodness_of_fit`), per temperature and concurrency level. Rows
of such systems carry the profile's mean acceptance length and the realised rates, which stand where
acceptance and greedy equality with plain decoding stand in a real run (neither means anything here).
No torch, no rich.
"""

from __future__ import annotations

from collections import defaultdict

from dspark.synthetic.acceptance import goodness_of_fit, realised_rates

MISMATCH_P = 1e-3  # below this p-value a system's realised acceptance is reported as not its profile's


def label(settings: dict) -> str | None:
    """The run's label, or None for a real run: random weights and/or synthetic acceptance, profiles named."""
    profiles = settings.get("acceptance") or {}
    parts = ["random weights"] if settings.get("weights") == "random" else []
    if profiles:
        named = list(dict.fromkeys(f"{p['name']} (AL {p['mean_length']:.2f})" for p in profiles.values()))
        parts.append("synthetic acceptance: " + ", ".join(named))
    return ", ".join(parts) or None


def full_round_counts(records: list[dict], k: int) -> list[int]:
    """Accepted counts of the rounds that verified all k drafts (a shorter last round is conditioned on the
    request's end, not the profile); from vLLM's per-request histogram where a record has no rounds."""
    counts = []
    for r in records:
        if r.get("failed"):
            continue
        if r.get("accepted_counts"):
            counts += [a for a, p in zip(r["accepted_counts"], r["proposal_lengths"]) if p == k]
        else:
            histogram = (r.get("acceptance_totals") or {}).get("acceptance_histogram") or []
            counts += [j for j, n in enumerate(histogram) for _ in range(int(n or 0))]
    return counts


def check(records: list[dict], profile: dict) -> dict:
    """One system's realised acceptance against its profile. The test runs per temperature and concurrency
    level: a request's seed is the same at every level, so an engine that seeds its acceptance per request
    (both do) draws the same rounds at each level, and pooling the levels would count one sample several
    times. The system's p-value is the smallest group's, Bonferroni-corrected (times the groups)."""
    rates = tuple(profile["rates"])
    groups = defaultdict(list)
    for r in records:
        groups[(r["temperature"], r.get("max_concurrency", 1))].append(r)
    fits = {key: goodness_of_fit(full_round_counts(group, len(rates)), rates) for key, group in sorted(groups.items())}
    tested = [f for f in fits.values() if f["p_value"] is not None]
    p_value = min(1.0, min(f["p_value"] for f in tested) * len(tested)) if tested else None
    counts = full_round_counts(records, len(rates))
    realised = realised_rates(counts, len(rates))
    verdict = None if p_value is None else "matches" if p_value >= MISMATCH_P else "differs"
    worst = min(tested, key=lambda f: f["p_value"]) if tested else next(iter(fits.values()), {})
    return {"profile": profile["name"], "source": profile["source"], "rates": list(rates),
            "mean_length": profile["mean_length"], "realised_rates": realised,
            "realised_mean_length": 1 + sum(x or 0 for x in realised) if counts else None,
            "rounds": len(counts), "groups": len(fits), "chi2": worst.get("chi2"), "dof": worst.get("dof"),
            "p_value": p_value, "verdict": verdict, "reason": worst.get("reason") if not tested else None,
            "by_group": [{"temperature": t, "max_concurrency": c, "rounds": f["rounds"], "chi2": f["chi2"],
                          "p_value": f["p_value"]} for (t, c), f in fits.items()]}


def add_synthetic(summary: dict, settings: dict, records: list[dict]) -> dict:
    """`summary` with the run's label, each synthetic system's check, and its rows' profile figures."""
    text = label(settings)
    if text is None:
        return summary
    profiles = settings.get("acceptance") or {}
    by_system = defaultdict(list)
    for r in records:
        by_system[r["system"]].append(r)
    checks = {name: check(by_system[name], p) for name, p in profiles.items() if by_system[name]}
    for row in summary["rows"]:
        row["label"] = text  # (every row: the CSV says it too)
        profile = profiles.get(row["system"])
        if profile is None:
            continue
        row["acceptance_profile"] = profile["name"]
        mine = [r for r in by_system[row["system"]] if r["temperature"] == row["temperature"]
                and r.get("max_concurrency", 1) == row["max_concurrency"]
                and (row["category"] == "overall" or r["category"] == row["category"])]
        row["profile_acceptance_length"] = profile["mean_length"]
        row["realised_rates"] = realised_rates(full_round_counts(mine, len(profile["rates"])), len(profile["rates"]))
    return summary | {"label": text, "synthetic": checks}


def mismatches(summary: dict) -> list[str]:
    """A warning per synthetic system whose realised acceptance is not its profile's."""
    out = []
    for name, c in (summary.get("synthetic") or {}).items():
        if c["verdict"] == "differs":
            out.append(f"{name}: realised acceptance differs from its profile {c['profile']} (worst chi-square "
                       f"{c['chi2']:.1f} on {c['dof']} degrees of freedom, p = {c['p_value']:.2g} over {c['groups']} "
                       f"temperature and concurrency groups, {c['rounds']} full rounds; realised mean length "
                       f"{c['realised_mean_length']:.2f} against {c['mean_length']:.2f}): "
                       "the engine did not accept at the profile; its figures do not time that profile")
        elif c["verdict"] is None:
            out.append(f"{name}: its acceptance could not be checked against profile {c['profile']} ({c['reason']})")
    return out

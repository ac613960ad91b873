"""The report's figures, each a function that returns a matplotlib figure whose title says what produced
it (backend, device, model, date: `Runs.caption`). Built from the frames of `harness.analysis.frames`
and the dicts of `summary` and `parity`; no torch, no rich."""

from __future__ import annotations

import math
import random

import matplotlib.pyplot as plt  # (the backend is the caller's: inline in a notebook, Agg for files)
import pandas as pd

from harness.analysis.frames import Profiles, Runs, positions
from harness.analysis.metrics import geometric_mean, percentile

BASELINE = "plain"


def _titled(fig, what: str, caption: str):
    fig.suptitle(f"{what}\n{caption}", fontsize=8)
    fig.tight_layout()
    return fig


def _bootstrap(values: list[float], stat, resamples: int = 1000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    boot = sorted(stat([values[rng.randrange(len(values))] for _ in values]) for _ in range(resamples))
    return percentile(boot, 2.5), percentile(boot, 97.5)


def acceptance_length(runs: Runs):
    """Acceptance length (tokens per round, pooled over a group's rounds) per system and category, one
    panel per temperature, with a 95 % bootstrap interval over requests."""
    rounds = runs.rounds[~runs.rounds["failed"]]
    temps = sorted(rounds["temperature"].unique()) if len(rounds) else [0.0]
    fig, axes = plt.subplots(1, len(temps), figsize=(5.5 * len(temps), 4), squeeze=False)
    for ax, temp in zip(axes[0], temps):
        here = rounds[rounds["temperature"] == temp]
        systems = list(dict.fromkeys(here["system"]))
        cats = sorted(here["category"].unique())
        width = 0.8 / max(1, len(systems))
        for j, system in enumerate(systems):
            xs, ys, lo, hi = [], [], [], []
            for i, cat in enumerate(cats):
                g = here[(here["system"] == system) & (here["category"] == cat)]
                per_request = [(len(r), r["accepted"].sum()) for _, r in g.groupby(["run", "question_id", "turn"])]
                if not per_request:
                    continue

                def pooled(sample):
                    return 1 + sum(a for _, a in sample) / sum(n for n, _ in sample)

                value = pooled(per_request)
                low, high = _bootstrap(per_request, pooled)
                xs.append(i + (j - (len(systems) - 1) / 2) * width)
                ys.append(value)
                lo.append(value - low)
                hi.append(high - value)
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=system)
        ax.set_xticks(range(len(cats)), cats, rotation=30, ha="right", fontsize=7)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set(ylabel="acceptance length (tokens per round)", title=f"T={temp:g}")
        if systems:
            ax.legend(fontsize=7)
    return _titled(fig, "acceptance length by category, 95 % interval over requests", runs.caption())


def position_curves(runs: Runs):
    """Per draft position, the joint acceptance (share of rounds accepting it) and the conditional one
    (given the position before it was accepted)."""
    pos = positions(runs.rounds[~runs.rounds["failed"]])
    fig, (joint, cond) = plt.subplots(1, 2, figsize=(11, 4))
    for key, g in pos.groupby(["run", "system", "temperature"], sort=False) if len(pos) else []:
        label = f"{key[1]} T={key[2]:g}" + (f" ({key[0]})" if runs.meta.shape[0] > 1 else "")
        joint.plot(g["position"], g["joint"], marker="o", label=label)
        cond.plot(g["position"], g["conditional"], marker="o", label=label)
    for ax, what in ((joint, "joint: P(position k accepted)"), (cond, "conditional: P(k | k - 1 accepted)")):
        ax.set(xlabel="draft position", ylabel="acceptance", ylim=(0, 1.02), title=what)
        if ax.lines:
            ax.legend(fontsize=7)
    return _titled(fig, "acceptance by draft position", runs.caption())


def accepted_histogram(runs: Runs):
    """Rounds by how many drafts they accepted, as a share of each system's rounds."""
    rounds = runs.rounds[~runs.rounds["failed"]]
    fig, ax = plt.subplots(figsize=(7, 4))
    groups = list(rounds.groupby(["system", "temperature"], sort=False)) if len(rounds) else []
    width = 0.8 / max(1, len(groups))
    for j, ((system, temp), g) in enumerate(groups):
        counts = g["accepted"].value_counts(normalize=True).sort_index()
        ax.bar(counts.index + (j - (len(groups) - 1) / 2) * width, counts.values, width, label=f"{system} T={temp:g}")
    ax.set(xlabel="drafts accepted in a round", ylabel="share of rounds")
    if groups:
        ax.legend(fontsize=7)
    return _titled(fig, "accepted drafts per round", runs.caption())


def acceptance_vs_confidence(runs: Runs):
    """Per request, acceptance length against the target's mean confidence, where the run recorded it;
    None when no request did."""
    req = runs.requests.dropna(subset=["target_confidence", "acceptance_length"]) if len(runs.requests) else None
    if req is None or req.empty:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for system, g in req.groupby("system", sort=False):
        ax.scatter(g["target_confidence"], g["acceptance_length"], s=12, label=system)
    ax.set(xlabel="target confidence (mean top-1 probability)", ylabel="acceptance length")
    ax.legend(fontsize=7)
    return _titled(fig, "acceptance against the target's confidence", runs.caption())


def latency_distributions(runs: Runs):
    """TPOT and end-to-end latency per request, per system and temperature."""
    req = runs.requests[~runs.requests["failed"]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    groups = list(req.groupby(["system", "temperature"], sort=False)) if len(req) else []
    for ax, column, label in ((axes[0], "tpot_ms", "TPOT ms"), (axes[1], "e2el_ms", "end-to-end latency ms")):
        data = [g[column].dropna().to_numpy() for _, g in groups]
        if data:
            ax.boxplot(data, showmeans=True)
            ax.set_xticks(range(1, len(groups) + 1), [f"{s}\nT={t:g}" for (s, t), _ in groups], fontsize=7)
        ax.set(ylabel=label)
    return _titled(fig, "latency per request (box: quartiles, triangle: mean)", runs.caption())


def prompt_speedups(runs: Runs) -> pd.DataFrame:
    """Per prompt, plain decoding's TPOT over each system's (the same prompt ids, level and temperature),
    with the request's acceptance length."""
    req = runs.requests[~runs.requests["failed"]].dropna(subset=["tpot_ms"])
    key = ["run", "question_id", "turn", "temperature", "max_concurrency"]
    base = req[req["method"] == BASELINE].set_index(key)["tpot_ms"]
    rows = []
    for r in req[req["method"] != BASELINE].itertuples():
        b = base.get((r.run, r.question_id, r.turn, r.temperature, r.max_concurrency))
        if b is not None and r.tpot_ms:
            rows.append({"run": r.run, "system": r.system, "temperature": r.temperature, "category": r.category,
                         "max_concurrency": r.max_concurrency, "question_id": r.question_id,
                         "speedup": b / r.tpot_ms, "acceptance_length": r.acceptance_length})
    return pd.DataFrame(rows)


def paired_speedup(runs: Runs):
    """Each prompt's speedup over plain decoding, per system, with the geometric mean and its 95 %
    bootstrap interval."""
    sp = prompt_speedups(runs)
    fig, ax = plt.subplots(figsize=(7, 4))
    groups = list(sp.groupby(["system", "temperature"], sort=False)) if len(sp) else []
    for i, ((system, temp), g) in enumerate(groups):
        values = list(g["speedup"])
        ax.scatter([i + random.Random(k).uniform(-0.15, 0.15) for k in range(len(values))], values, s=10, alpha=0.6)
        mean = geometric_mean(values)
        low, high = _bootstrap(values, geometric_mean) if len(values) > 1 else (mean, mean)
        ax.errorbar([i + 0.3], [mean], yerr=[[mean - low], [high - mean]], fmt="D", color="black", capsize=3)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(groups)), [f"{s}\nT={t:g}" for (s, t), _ in groups], fontsize=7)
    ax.set(ylabel="plain TPOT / system TPOT", yscale="log")
    return _titled(fig, "speedup per prompt; diamond: geometric mean, 95 % interval", runs.caption())


def speedup_vs_acceptance(runs: Runs, round_over_decode: float | None = None):
    """Per prompt, speedup against acceptance length; with `round_over_decode` (a round's cost in decode
    steps, from `engine-bench --json`), the curve the step costs predict: speedup = AL / round cost."""
    sp = prompt_speedups(runs).dropna(subset=["acceptance_length"])
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for (system, temp), g in sp.groupby(["system", "temperature"], sort=False) if len(sp) else []:
        ax.scatter(g["acceptance_length"], g["speedup"], s=12, label=f"{system} T={temp:g}")
    if round_over_decode:
        top = max([2.0] + list(sp["acceptance_length"])) if len(sp) else 8.0
        xs = [1 + (top - 1) * i / 50 for i in range(51)]
        ax.plot(xs, [x / round_over_decode for x in xs], color="black", linewidth=1,
                label=f"AL / round cost ({round_over_decode:.2f} decode steps, engine-bench)")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set(xlabel="acceptance length (tokens per round)", ylabel="speedup over plain (TPOT)")
    if ax.collections or ax.lines[1:]:
        ax.legend(fontsize=7)
    return _titled(fig, "speedup against acceptance length", runs.caption())


def speedup_vs_concurrency(rows: pd.DataFrame, caption: str, baseline: str | None = BASELINE):
    """A sweep: per system, output throughput and the TPOT speedup over plain decoding at the same
    concurrency (95 % interval) against the level. `rows`: summary rows (overall ones are used)."""
    overall = rows[rows["category"] == "overall"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for (system, temp), g in overall.groupby(["system", "temperature"], sort=False):
        g = g.sort_values("max_concurrency")
        levels, label = list(g["max_concurrency"]), f"{system} T={temp:g}"
        left.plot(levels, [v if v is not None else math.nan for v in g["output_throughput"]], marker="o", label=label)
        if (g["method"] != BASELINE).all() and system != baseline:
            values = [v if v is not None and not pd.isna(v) else math.nan for v in g["speedup"]]
            cis = [ci if isinstance(ci, (list, tuple)) else (v, v) for ci, v in zip(g["speedup_ci95"], values)]
            right.errorbar(levels, values, yerr=[[max(0.0, v - c[0]) for v, c in zip(values, cis)],
                                                 [max(0.0, c[1] - v) for v, c in zip(values, cis)]],
                           marker="o", capsize=3, label=label)
    levels = sorted(overall["max_concurrency"].unique())
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.minorticks_off()
        ax.set_xlabel("max concurrency (requests in flight)")
        if ax.lines:
            ax.legend(fontsize=7)
    left.set(ylabel="output tokens / s", title="output throughput")
    right.axhline(1.0, color="grey", linewidth=0.8)
    right.set(ylabel="speedup over plain (TPOT)", title="speedup over plain at the same concurrency, 95 % interval")
    return _titled(fig, "concurrency sweep", caption)


def kernel_shares(profiles: Profiles, caption: str):
    """Each profiled system's GPU kernel time by category, as shares, side by side."""
    cats = profiles.categories
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if len(cats):
        table = cats.pivot_table(index=["profile", "system"], columns="category", values="share", aggfunc="sum",
                                 fill_value=0.0)
        bottom = [0.0] * len(table)
        for category in table.columns:
            ax.bar(range(len(table)), table[category], bottom=bottom, label=category)
            bottom = [b + v for b, v in zip(bottom, table[category])]
        ax.set_xticks(range(len(table)), [f"{s}\n({p})" for p, s in table.index], fontsize=7)
        ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left")
    ax.set(ylabel="share of GPU kernel time", ylim=(0, 1))
    return _titled(fig, "where the GPU time goes: kernel categories", caption)


def step_times(profiles: Profiles, caption: str):
    """Mean milliseconds per call of each NVTX step range (prefill, propose, verify, ...), per system."""
    ranges = profiles.ranges
    fig, ax = plt.subplots(figsize=(8, 4))
    if len(ranges):
        table = ranges.pivot_table(index="range", columns="system", values="avg_ns", aggfunc="mean") / 1e6
        table.plot.barh(ax=ax)
        ax.legend(fontsize=7)
    ax.set(xlabel="ms per call (NVTX range, host-side duration)", ylabel="")
    return _titled(fig, "step ranges", caption)


def launches_per_token(profiles: Profiles, caption: str):
    """Kernel launches and GPU kernel time per generated token, per system (where the profile's run
    folders give the token count; else per profile)."""
    lp = profiles.launches
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    if len(lp):
        per = lp["output_tokens"].where(lp["output_tokens"].fillna(0) > 0)
        labels = [f"{s}\n({p})" for p, s in zip(lp["profile"], lp["system"])]
        unit = "per token" if per.notna().all() else "in the capture"
        left.bar(labels, lp["kernels"] / per.fillna(1))
        right.bar(labels, lp["gpu_ns"] / 1e3 / per.fillna(1))
        left.set(ylabel=f"kernel launches {unit}")
        right.set(ylabel=f"GPU kernel µs {unit}")
        for ax in (left, right):
            ax.tick_params(axis="x", labelsize=7)
    return _titled(fig, "launches and GPU time", caption)


def parity_positions(result: dict):
    """Per compared group of a `parity` result, accepted drafts per position in run A and run B."""
    groups = [g for g in result["groups"] if g["method"] != BASELINE]
    fig, axes = plt.subplots(1, max(1, len(groups)), figsize=(5 * max(1, len(groups)), 4), squeeze=False)
    a, b = result["runs"]
    for ax, g in zip(axes[0], groups):
        for i, (pooled, run) in enumerate(zip(g["pooled"], (a, b))):
            counts = pooled["accepted_per_position"]
            ax.bar([k + 1 + (i - 0.5) * 0.4 for k in range(len(counts))], counts, 0.4,
                   label=f"{'AB'[i]}: {run['backend']} (AL {pooled['acceptance_length'] or 0:.2f})")
        ax.set(xlabel="draft position", ylabel="rounds accepting it", title=f"{g['system']} T={g['temperature']:g}")
        ax.legend(fontsize=7)
    caption = f"A = {a['path']} ({a['backend']}, {a['device']}); B = {b['path']} ({b['backend']}, {b['device']})"
    return _titled(fig, "cross-engine parity: accepted drafts per position", caption)

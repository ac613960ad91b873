"""The report's figures, each a function that returns a matplotlib figure whose title says what produced
it (backend, device, model, date: `Runs.caption`), or, where the inputs hold nothing for it to draw (a
run without plain decoding has no speedup, a CPU profile no kernels), one line that says why. `show`
displays either in a notebook, a figure with alt text. Built from the frames of
`harness.analysis.frames` and the dicts of `summary` and `parity`; no torch, no rich. Axes are
linear; acceptance by position carries Wilson 95 % intervals."""

from __future__ import annotations

import math
import random

import matplotlib.pyplot as plt  # (the backend is the caller's: inline in a notebook, Agg for files)
import pandas as pd
from matplotlib.ticker import MaxNLocator

from harness.analysis.frames import BASELINE, Profiles, Runs, positions, prompt_speedups
from harness.analysis.metrics import MIN_PAIRS, length_interval, side_text
from harness.analysis.report_text import Note

MIN_ROUNDS = 10  # a conditional acceptance from fewer rounds reaching its position is left out: noise
STYLES = ("-", "--", ":", "-.")  # one per temperature


def _titled(fig, what: str, caption: str, note: str | None = None):
    top = 1 - 0.3 / fig.get_figheight()  # (in inches: the title and caption take the same room in any figure)
    fig.suptitle(what, fontsize=11, y=1 - 0.05 / fig.get_figheight(), va="top")
    fig.text(0.5, 1 - 0.28 / fig.get_figheight(), caption, ha="center", va="top", fontsize=8, color="dimgrey")
    if note:
        fig.text(0.01, 0.005, note, ha="left", va="bottom", fontsize=8, color="dimgrey", wrap=True)
    fig.tight_layout(rect=(0, 0.35 / fig.get_figheight() if note else 0, 1, top - 0.15 / fig.get_figheight()))
    return fig


def alt_text(fig) -> str:
    """A figure described in words, for its image's alt text: the title, then each panel's title, axes
    and series."""
    parts = [t.get_text().replace("\n", " ") for t in ([fig._suptitle] if fig._suptitle else [])]
    for ax in fig.axes:
        legend = ax.get_legend()
        series = [t.get_text() for t in legend.get_texts()] if legend else []
        if not ax.get_visible() or not ax.axison:
            parts += [t.get_text() for t in ax.texts]  # (a panel that says why it is empty)
            continue
        ticks = [t.get_text().replace("\n", " ") for t in ax.get_xticklabels() if t.get_text()]
        groups = f"; groups: {', '.join(ticks)}" if not ax.get_xlabel() and ticks else ""
        axes = f"{ax.get_ylabel() or 'value'} against {ax.get_xlabel() or 'group'}"
        parts.append(f"{ax.get_title() or 'panel'}: {axes}{groups}" + (f"; series: {', '.join(series)}" if series else ""))
    return ". ".join(p for p in parts if p)


def show(drawn) -> None:
    """Display a figure (closed first, so the inline backend does not draw it again) with its alt text,
    the one line a figure function returned instead, or a table or note as it is."""
    from IPython.display import display

    if isinstance(drawn, str):
        display(Note(drawn))
    elif isinstance(drawn, plt.Figure):
        plt.close(drawn)
        display(drawn, metadata={"image/png": {"alt": alt_text(drawn)}})
    elif drawn is not None:
        display(drawn)


def _label(key: dict, several_runs: bool) -> str:
    """A series' name: system, temperature (where the key has one), level of a sweep, run of several."""
    text = key["system"] + (f" T={key['temperature']:g}" if "temperature" in key else "")
    if key.get("max_concurrency", 1) not in (1, None):
        text += f" c={key['max_concurrency']}"
    return text + (f" ({key['run']})" if several_runs else "")


def _tick(key: dict, several_runs: bool) -> str:
    """A group's name under a tick: system, then temperature and level, then run, one a line."""
    level = f" c={key['max_concurrency']}" if key.get("max_concurrency", 1) not in (1, None) else ""
    return f"{key['system']}\nT={key['temperature']:g}{level}" + (f"\n{key['run']}" if several_runs else "")


def _done(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[~frame["failed"].astype(bool)]


def _no_requests(runs: Runs, what: str) -> str | None:
    """Why there is nothing at all to draw (no finished request, or only failed ones), else None."""
    if runs.requests.empty:
        return f"{what}: no finished request in these runs yet"
    if _done(runs.requests).empty:
        return f"{what}: every request failed (see the warnings)"
    return None


def no_acceptance(runs: Runs, what: str) -> str:
    """Why a run has no acceptance figure to draw, in one line."""
    methods = set(_done(runs.requests)["method"])
    if _no_requests(runs, what) or methods == {BASELINE}:
        return _no_requests(runs, what) or f"{what}: no speculative system in these runs (plain decoding only)"
    return f"{what}: the backend reported no per-request acceptance (a server's counters count whole waves; " \
           "the summary rows give the pooled figure)"


def no_speedup(runs: Runs, what: str) -> str:
    """Why a run has no speedup to draw, in one line."""
    methods = set(_done(runs.requests)["method"])
    if _no_requests(runs, what) or BASELINE not in methods:
        return _no_requests(runs, what) or f"{what}: no plain-decoding baseline in this run (add plain to --systems)"
    if methods == {BASELINE}:
        return f"{what}: plain decoding only, no speculative system to compare with it"
    if _done(runs.requests)["tpot_ms"].isna().all():
        return f"{what}: no request has a TPOT (the backend reported no first-token time)"
    return f"{what}: no speculative request pairs with a plain-decoding one (same prompt, temperature and " \
           "concurrency, both with a TPOT)"


def acceptance_length(runs: Runs):
    """Acceptance length (tokens per round, pooled over a group's rounds) per system and category, one
    panel per temperature, with the 95 % t interval over requests of `metrics.length_interval` (no bar from
    fewer than MIN_PAIRS requests)."""
    req = _done(runs.requests)
    req = req[req["spec_rounds"].fillna(0) > 0]
    if req.empty:
        return no_acceptance(runs, "acceptance length")
    temps = sorted(req["temperature"].unique())
    fig, axes = plt.subplots(1, len(temps), figsize=(5.5 * len(temps), 4), squeeze=False, sharey=True)
    several = runs.meta.shape[0] > 1
    for ax, temp in zip(axes[0], temps):
        here = req[req["temperature"] == temp]
        groups = list(dict.fromkeys(zip(here["run"], here["system"], here["max_concurrency"])))
        cats = sorted(here["category"].unique())
        width = 0.8 / len(groups)
        for j, (run, system, level) in enumerate(groups):
            xs, ys, lo, hi = [], [], [], []
            for i, cat in enumerate(cats):
                g = here[(here["run"] == run) & (here["system"] == system) & (here["max_concurrency"] == level)
                         & (here["category"] == cat)]
                sample = list(zip(g["spec_rounds"], g["spec_accepted"]))
                if not sample:
                    continue
                got = length_interval([sample])
                value = got["centre"]
                low, high = got["ci"] or (value, value)
                xs.append(i + (j - (len(groups) - 1) / 2) * width)
                ys.append(value)
                lo.append(value - low)
                hi.append(high - value)
            bars = ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2,
                          label=_label({"run": run, "system": system, "max_concurrency": level}, several))
            ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=2, label_type="center")
        ax.set_xticks(range(len(cats)), cats, rotation=30 if len(cats) > 3 else 0, ha="right" if len(cats) > 3
                      else "center", fontsize=8)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set(title=f"T={temp:g}", xlabel="category")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("acceptance length (tokens per round)")
    return _titled(fig, f"acceptance length by category, 95 % t interval over requests (none below {MIN_PAIRS})",
                   runs.caption())


def _colours(keys: list[tuple]) -> dict[tuple, str]:
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {k: cycle[i % len(cycle)] for i, k in enumerate(dict.fromkeys(keys))}


def position_curves(runs: Runs, min_rounds: int = MIN_ROUNDS):
    """Per draft position, the joint acceptance (share of all rounds accepting it: a round that proposed
    nothing accepts nothing) and the conditional one (given the position before it was accepted and this
    one proposed), each with its Wilson 95 % interval; a conditional
    point from fewer than `min_rounds` rounds reaching it is left out (the figure says which)."""
    pos = positions(runs.counts[~runs.counts["method"].isin([BASELINE])])
    if pos.empty:
        return no_acceptance(runs, "acceptance by draft position")
    fig, (joint, cond) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    several = runs.meta.shape[0] > 1
    colours = _colours(list(zip(pos["run"], pos["system"])))
    temps = sorted(pos["temperature"].unique())
    dropped = []
    series = pos.groupby(["run", "system", "temperature"], sort=False)
    shade = 0.15 if len(series) <= 3 else 0.07
    for key, g in series:
        label = _label(dict(zip(("run", "system", "temperature"), key)), several)
        style = {"color": colours[key[:2]], "linestyle": STYLES[temps.index(key[2]) % len(STYLES)]}
        joint.plot(g["position"], g["joint"], marker="o", markersize=3, label=label, **style)
        joint.fill_between(g["position"], g["joint_lo"], g["joint_hi"], color=style["color"], alpha=shade)
        few = g[g["reached"] < min_rounds]
        kept = g[g["position"] < few["position"].min()] if len(few) else g
        if len(few):
            dropped.append(f"{label} from {few['position'].min()}")
        cond.plot(kept["position"], kept["conditional"], marker="o", markersize=3, label=label, **style)
        cond.fill_between(kept["position"], kept["conditional_lo"], kept["conditional_hi"], color=style["color"],
                          alpha=shade)
    for ax, what in ((joint, "joint: P(k accepted), over all rounds"),
                     (cond, "conditional: P(k accepted | k - 1 accepted, k proposed)")):
        ax.set(xlabel="draft position", ylim=(0, 1.02), title=what)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    joint.set_ylabel("share of rounds")
    joint.legend(fontsize=7)
    note = "Joint: rounds accepting position k over every round, those that proposed fewer than k drafts " \
           "included (the points sum to the pooled AL - 1). Shaded: Wilson 95 % intervals." + (
        f" Conditional points from fewer than {min_rounds} rounds reaching their position are left out, from the "
        f"position given: {', '.join(dropped)}." if dropped else "")
    return _titled(fig, "acceptance by draft position", runs.caption(), note)


def accepted_histogram(runs: Runs):
    """Rounds by how many drafts they accepted, as a share of each system's rounds."""
    rounds = _done(runs.rounds)
    if rounds.empty:
        if not runs.counts.empty:
            return "accepted drafts per round: the backend reported totals, not rounds"
        return no_acceptance(runs, "accepted drafts per round")
    fig, ax = plt.subplots(figsize=(8, 4))
    several = runs.meta.shape[0] > 1
    groups = list(rounds.groupby(["run", "system", "temperature"], sort=False))
    width = 0.8 / len(groups)
    for j, (key, g) in enumerate(groups):
        counts = g["accepted"].value_counts(normalize=True).sort_index()
        ax.bar(counts.index + (j - (len(groups) - 1) / 2) * width, counts.values, width,
               label=_label(dict(zip(("run", "system", "temperature"), key)), several))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="drafts accepted in a round", ylabel="share of rounds")
    ax.legend(fontsize=7)
    return _titled(fig, "accepted drafts per round", runs.caption())


def acceptance_vs_confidence(runs: Runs):
    """Per request, acceptance length against the target's mean confidence, where the run recorded it."""
    req = runs.requests.dropna(subset=["target_confidence", "acceptance_length"])
    if req.empty:
        return "acceptance against the target's confidence: no request recorded the target's confidence"
    fig, ax = plt.subplots(figsize=(6, 4))
    for system, g in req.groupby("system", sort=False):
        ax.scatter(g["target_confidence"], g["acceptance_length"], s=12, label=system)
    ax.set(xlabel="target confidence (mean top-1 probability)", ylabel="acceptance length")
    ax.legend(fontsize=7)
    return _titled(fig, "acceptance against the target's confidence", runs.caption())


def latency_distributions(runs: Runs):
    """TPOT and end-to-end latency per request, per system and temperature."""
    req = _done(runs.requests)
    if req.empty:
        return _no_requests(runs, "latency per request")
    several = runs.meta.shape[0] > 1
    n = req.groupby(["run", "system", "temperature", "max_concurrency"]).ngroups
    fig, axes = plt.subplots(1, 2, figsize=(min(16.0, max(11.0, 1.4 * n)), 4.2))
    for ax, column, label in ((axes[0], "tpot_ms", "TPOT ms"), (axes[1], "e2el_ms", "end-to-end latency ms")):
        groups = [(key, g[column].dropna().astype(float).to_numpy()) for key, g in
                  req.groupby(["run", "system", "temperature", "max_concurrency"], sort=False)]
        groups = [(key, data) for key, data in groups if len(data)]
        if not groups:
            ax.text(0.5, 0.5, f"no request has a {label.split(' ms')[0]}", ha="center", va="center",
                    transform=ax.transAxes)
            ax.set_axis_off()
            continue
        ax.boxplot([d for _, d in groups], showmeans=True)
        ax.set_xticks(range(1, len(groups) + 1), [_tick(dict(zip(("run", "system", "temperature", "max_concurrency"), k)),
                                                        several) for k, _ in groups], fontsize=7)
        ax.set(ylabel=label)
        ax.grid(axis="y", alpha=0.3)
    return _titled(fig, "latency per request (box: quartiles, triangle: mean)", runs.caption())


def _speedup_axis(ax, values: list[float]) -> None:
    """A linear speedup axis that always shows 1 (plain decoding's), with plain decimal ticks."""
    finite = [v for v in values if v is not None and not math.isnan(v)] + [1.0]
    low, high = min(finite), max(finite)
    pad = max(0.05, 0.08 * (high - low))
    ax.set_ylim(max(0.0, low - pad), high + pad)
    ax.yaxis.set_major_locator(MaxNLocator(nbins=8, steps=[1, 2, 2.5, 5, 10]))
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:g}x")
    ax.axhline(1.0, color="grey", linewidth=0.9, linestyle="--")
    ax.grid(axis="y", alpha=0.3)


def paired_speedup(runs: Runs):
    """Each prompt's speedup over plain decoding, per system, with the summary's speedup (the geometric
    mean, over categories their geometric mean) and its 95 % interval."""
    sp = prompt_speedups(runs)
    if sp.empty:
        return no_speedup(runs, "speedup per prompt")
    overall = runs.summary[runs.summary["category"] == "overall"].set_index(
        ["run", "system", "temperature", "max_concurrency"])
    several = runs.meta.shape[0] > 1
    groups = list(sp.groupby(["run", "system", "temperature", "max_concurrency"], sort=False))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(groups) + 2), 4.2))
    shown = []
    for i, (key, g) in enumerate(groups):
        values = list(g["speedup"])
        shown += values
        ax.scatter([i - 0.12 + random.Random(k).uniform(-0.08, 0.08) for k in range(len(values))], values, s=12,
                   alpha=0.6, color="tab:blue")
        row = overall.loc[key] if key in overall.index else None
        mean = row["speedup"] if row is not None else None
        if mean is None or pd.isna(mean):
            continue
        ci = row["speedup_ci95"] if isinstance(row["speedup_ci95"], (list, tuple)) else (mean, mean)
        shown += list(ci)
        ax.errorbar([i + 0.15], [mean], yerr=[[mean - ci[0]], [ci[1] - mean]], fmt="D", color="black", capsize=4)
        few = isinstance(row.get("speedup_ci95_reason"), str)  # (too few prompts: the diamond alone, and why)
        note = f"\ntoo few\nprompts ({row['speedup_pairs']:.0f})" if few else ""
        ax.annotate(f"{side_text(mean)}x{note}", (i + 0.22, mean), fontsize=8, va="center")
    ax.set_xticks(range(len(groups)), [_tick(dict(zip(("run", "system", "temperature", "max_concurrency"), k)),
                                             several) for k, _ in groups], fontsize=8)
    ax.set_xlim(-0.6, len(groups) - 0.4)
    _speedup_axis(ax, shown)
    ax.set(ylabel="speedup: plain TPOT / system TPOT")
    return _titled(fig, "speedup per prompt (dots); diamond: the summary's speedup, 95 % interval",
                   runs.caption())


def speedup_vs_concurrency(rows: pd.DataFrame, caption: str, baseline: str | None = BASELINE):
    """A sweep: per system, output throughput and the TPOT speedup over plain decoding at the same
    concurrency (95 % interval) against the level. `rows`: summary rows (overall ones are used)."""
    overall = rows[rows["category"] == "overall"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    shown = []
    for (system, temp), g in overall.groupby(["system", "temperature"], sort=False):
        g = g.sort_values("max_concurrency")
        levels, label = list(g["max_concurrency"]), f"{system} T={temp:g}"
        left.plot(levels, [v if v is not None else math.nan for v in g["output_throughput"]], marker="o", label=label)
        if (g["method"] != BASELINE).all() and system != baseline:
            values = [v if v is not None and not pd.isna(v) else math.nan for v in g["speedup"]]
            cis = [ci if isinstance(ci, (list, tuple)) else (v, v) for ci, v in zip(g["speedup_ci95"], values)]
            shown += values + [c for ci in cis for c in ci]
            right.errorbar(levels, values, yerr=[[max(0.0, v - c[0]) for v, c in zip(values, cis)],
                                                 [max(0.0, c[1] - v) for v, c in zip(values, cis)]],
                           marker="o", capsize=3, label=label)
    levels = sorted(overall["max_concurrency"].unique())
    for ax in (left, right):
        ax.set_xscale("log", base=2)  # (the levels double; each is labelled by its value)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.minorticks_off()
        ax.set_xlabel("max concurrency (requests in flight)")
        if ax.lines:
            ax.legend(fontsize=7)
    left.set(ylabel="output tokens / s", title="output throughput")
    left.set_ylim(bottom=0)
    if not any(v == v for v in shown):  # (all NaN or none)
        right.text(0.5, 0.5, "no plain-decoding baseline: no speedup", ha="center", va="center",
                   transform=right.transAxes)
    _speedup_axis(right, shown)
    right.set(ylabel="speedup over plain (TPOT)", title="speedup over plain at the same concurrency, 95 % interval")
    return _titled(fig, "concurrency sweep", caption)


def kernel_shares(profiles: Profiles, caption: str):
    """Each profiled system's GPU kernel time by category, as shares, side by side."""
    cats = profiles.categories
    if cats.empty:
        return "kernel categories: the profiles recorded no GPU kernels (a CPU profile has none; see the step ranges)"
    fig, ax = plt.subplots(figsize=(8, 4.5))
    table = cats.pivot_table(index=["profile", "system"], columns="category", values="share", aggfunc="sum",
                             fill_value=0.0)
    bottom = [0.0] * len(table)
    for category in table.columns:
        ax.bar(range(len(table)), table[category], bottom=bottom, label=category)
        bottom = [b + v for b, v in zip(bottom, table[category])]
    ax.set_xticks(range(len(table)), [f"{s}\n({p})" for p, s in table.index], fontsize=8)
    ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left")
    ax.set(ylabel="share of GPU kernel time", ylim=(0, 1), xlabel="system (profile)")
    return _titled(fig, "where the GPU time goes: kernel categories", caption)


def step_times(profiles: Profiles, caption: str):
    """Mean milliseconds per call of each NVTX step range (prefill, propose, verify, ...), per system."""
    ranges = profiles.ranges.dropna(subset=["avg_ns"])
    if ranges.empty:
        return "step ranges: the traces hold no step ranges (NVTX or record_function)"
    fig, ax = plt.subplots(figsize=(8, 4))
    table = ranges.pivot_table(index="range", columns="system", values="avg_ns", aggfunc="mean") / 1e6
    table.plot.barh(ax=ax)
    ax.legend(fontsize=7)
    ax.grid(axis="x", alpha=0.3)
    ax.set(xlabel="ms per call (step range, host-side duration)", ylabel="")
    return _titled(fig, "step ranges", caption)


def launches_per_token(profiles: Profiles, caption: str):
    """Kernel launches and GPU kernel time per generated token, per system (where the profile's run
    folders give the token count; else per profile)."""
    lp = profiles.launches
    lp = lp[lp["kernels"].fillna(0) > 0] if len(lp) else lp
    if lp.empty:
        return "launches and GPU time: the profiles launched no GPU kernels (a CPU profile has none)"
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    per = lp["output_tokens"].where(lp["output_tokens"].fillna(0) > 0)
    labels = [f"{s}\n({p})" for p, s in zip(lp["profile"], lp["system"])]
    unit = "per token" if per.notna().all() else "in the capture"
    left.bar(labels, lp["kernels"] / per.fillna(1))
    right.bar(labels, lp["gpu_ns"] / 1e3 / per.fillna(1))
    left.set(ylabel=f"kernel launches {unit}", title="kernel launches")
    right.set(ylabel=f"GPU kernel µs {unit}", title="GPU kernel time")
    for ax in (left, right):
        ax.tick_params(axis="x", labelsize=8)
    return _titled(fig, "launches and GPU time", caption)


def parity_positions(result: dict):
    """Per compared group of a `parity` result, accepted drafts per position in run A and run B."""
    groups = [g for g in result["groups"] if g["method"] != BASELINE
              and any(p["accepted_per_position"] for p in g["pooled"])]
    if not groups:
        return "accepted drafts per position: the two runs share no speculative system and temperature with " \
               "rounds to compare"
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 4), squeeze=False)
    a, b = result["runs"]
    for ax, g in zip(axes[0], groups):
        for i, (pooled, run, colour) in enumerate(zip(g["pooled"], (a, b), ("tab:blue", "tab:orange"))):
            counts = pooled["accepted_per_position"]
            length = pooled["acceptance_length"]
            ax.bar([k + 1 + (i - 0.5) * 0.4 for k in range(len(counts))], counts, 0.4, color=colour,
                   label=f"{'AB'[i]}: {run['backend']} " + (f"(AL {length:.2f})" if length else "(no rounds recorded)"))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set(xlabel="draft position", ylabel="rounds accepting it", title=f"{g['system']} T={g['temperature']:g}")
        ax.legend(fontsize=7)
    caption = f"A = {a['path']} ({a['backend']}, {a['device']}); B = {b['path']} ({b['backend']}, {b['device']})"
    return _titled(fig, "cross-engine parity: accepted drafts per position", caption)

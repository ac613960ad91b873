"""Measured speedups held against the ones step costs derive: per prompt against acceptance length with
each system's own predicted line (any run), and the study's figures, measured against derived and our
engine beside vLLM, each titled with what produced it and the acceptance profile (random weights,
synthetic acceptance: never a draft's quality). The study's rows are `study.measured_vs_derived`'s; the
concurrency sweep is `figures.speedup_vs_concurrency`."""

from __future__ import annotations

import matplotlib.pyplot as plt  # (the backend is the caller's: inline in a notebook, Agg for files)
from matplotlib.ticker import LogLocator, NullFormatter

from harness.analysis.frames import Runs, prompt_speedups
from harness.analysis.report_figures import _label, _speedup_axis, _titled, no_acceptance, no_speedup
from harness.analysis.study import predicted_costs

SERIES = ("run", "system", "temperature", "max_concurrency")


def speedup_vs_acceptance(runs: Runs, engine_bench: dict | None = None):
    """Per prompt, speedup against acceptance length; with `engine_bench` (`engine-bench --json`), for
    each system of a native run whose method engine-bench timed, the line its own round cost predicts
    (speedup = AL / round cost in decode steps), in its colour and named with whose round it is. A
    round's cost is a method's own (n-gram's, EAGLE-3's and DSpark's differ), so no line is drawn
    through a system whose cost was not measured, nor through a vLLM run's: the figure says which."""
    sp = prompt_speedups(runs)
    if sp.empty:
        return no_speedup(runs, "speedup against acceptance length")
    sp = sp.dropna(subset=["acceptance_length"])
    if sp.empty:
        return no_acceptance(runs, "speedup against acceptance length")
    several = runs.meta.shape[0] > 1
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours = {}
    for key, g in sp.groupby(list(SERIES), sort=False):
        dots = ax.scatter(g["acceptance_length"], g["speedup"], s=14, label=_label(dict(zip(SERIES, key)), several))
        colours.setdefault(key[:2], dots.get_facecolor()[0])
    shown, unmeasured = list(sp["speedup"]), []
    costs = predicted_costs(engine_bench) if engine_bench else {}
    methods = runs.requests.drop_duplicates(["run", "system"]).set_index(["run", "system"])["method"]
    native = set(runs.meta.loc[runs.meta["backend"].fillna("native") == "native", "run"])
    top = max([2.0] + list(sp["acceptance_length"]))
    xs = [1 + (top - 1) * i / 50 for i in range(51)]
    for (run, system), colour in colours.items() if engine_bench else ():
        cost = costs.get(methods.get((run, system))) if run in native else None
        if cost is None:
            unmeasured.append(_label({"run": run, "system": system}, several))
            continue
        name = _label({"run": run, "system": system}, several)
        ax.plot(xs, [x / cost[0] for x in xs], color=colour, linewidth=1,
                label=f"{name}: AL / {cost[0]:.2f} ({cost[1]}, engine-bench)")
        shown += [xs[0] / cost[0], xs[-1] / cost[0]]
    _speedup_axis(ax, shown)
    ax.set(xlabel="acceptance length (tokens per round)", ylabel="speedup over plain (TPOT)")
    ax.legend(fontsize=7)
    note = (f"No predicted line for {', '.join(unmeasured)}: engine-bench timed no round of "
            f"{'its' if len(unmeasured) == 1 else 'their'} method on this engine." if unmeasured else None)
    return _titled(fig, "speedup against acceptance length" + (", and AL / round cost per system" if costs else ""),
                   runs.caption(), note)


def _name(r: dict) -> str:
    level = f" c={r['max_concurrency']}" if r["max_concurrency"] != 1 else ""
    return f"{r['engine']}: {r['system']}{level} ({r['profile']})"


def _derived(r: dict) -> float | None:
    """engine-bench's derivation where the rows have it, else the run's own step timers'."""
    d = r.get("derived")
    return d if isinstance(d, float) and d == d else r.get("derived_in_run")


def measured_against_derived(rows: list[dict], caption: str):
    """Per engine, system and level: the measured speedup (95 % interval) against the one derived from
    step costs (engine-bench's, else the run's own step timers'); on the diagonal the derivation holds."""
    shown = [r | {"derived": _derived(r)} for r in rows if _derived(r) and r["measured"]]
    fig, ax = plt.subplots(figsize=(7.5, 5))
    values = []
    for r in shown:
        low, high = r["measured_ci95"] or (r["measured"], r["measured"])
        ax.errorbar([r["derived"]], [r["measured"]], yerr=[[r["measured"] - low], [high - r["measured"]]], marker="o",
                    capsize=3, label=_name(r))
        values += [r["derived"], low, high]
    if values:
        lo, hi = min(values) * 0.9, max(values) * 1.05
        ax.plot([lo, hi], [lo, hi], color="black", linewidth=1, label="measured = derived")
    _speedup_axis(ax, values)
    ax.set(xlabel="derived: AL x plain step / round (step costs)", ylabel="measured: plain TPOT / system TPOT")
    ax.legend(fontsize=6, loc="upper left")
    return _titled(fig, "measured against derived speedup (random weights, synthetic acceptance)", caption)


def engines_side_by_side(rows: list[dict], caption: str):
    """TPOT of plain decoding and each synthetic system in our engine and vLLM's at one request."""
    ones = [r for r in rows if r["max_concurrency"] == 1 and r["engine"] in ("ours", "vLLM offline")]
    systems = list(dict.fromkeys(r["system"] for r in ones))
    engines = list(dict.fromkeys(r["engine"] for r in ones))
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(1, len(engines))
    for i, engine in enumerate(engines):
        mine = {r["system"]: r for r in ones if r["engine"] == engine}
        plain = next((r["plain_tpot_ms"] for r in mine.values() if r.get("plain_tpot_ms")), None)
        tpots = [plain or 0.0] + [mine[s]["tpot_ms"] if s in mine else 0.0 for s in systems]
        xs = [j + i * width for j in range(len(tpots))]
        bars = ax.bar(xs, tpots, width, label=engine)
        for bar, v in zip(bars, tpots):
            if v:
                ax.text(bar.get_x() + bar.get_width() / 2, v, f"{v:.2f}", ha="center", va="bottom", fontsize=7)
    profile = {r["system"]: r["profile"] for r in ones}
    ax.set_xticks([j + width * (len(engines) - 1) / 2 for j in range(len(systems) + 1)],
                  ["plain"] + [f"{s}\n({profile[s]})" for s in systems], fontsize=8)
    ax.set(ylabel="TPOT ms (one request)")
    ax.legend(fontsize=8)
    return _titled(fig, "our engine beside vLLM at one request (random weights, synthetic acceptance)", caption)


def crossover_figure(system: str, rows: list[dict], found: dict, caption: str):
    """Where `system` stops paying (`crossover.levels` and `crossovers`): per concurrency level (log x), the
    TPOT speedup pooled over both orders and the output throughput ratio over runs, each with its 95 %
    interval (a level without one: a hollow point), the 1.0 line, and the crossover's bracket shaded with
    its level marked; "not reached" said in the panel where no interval reaches 1. The ratio axis is log
    (a ratio's interval is symmetric in logs) and spans the centres fourfold: an interval from 2 runs (t at
    1 degree of freedom) can be thousands wide and runs off the panel rather than flatten the points."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    panels = (("tpot", "speedup", "TPOT speedup (plain / system, by prompt)"),
              ("throughput", "ratio", "output tok/s ratio (system / plain)"))
    for ax, (key, centre, ylabel) in zip(axes, panels):
        xs, centres = [], [1.0]
        for r in rows:
            v, ci = r[key][centre], r[key]["ci"]
            if v is None:
                continue
            low, high = ci or (v, v)
            ax.errorbar([r["concurrency"]], [v], yerr=[[v - low], [high - v]], marker="o", capsize=3, color="C0",
                        markerfacecolor="C0" if ci else "white")
            xs.append(r["concurrency"])
            centres.append(v)
        f = found[key]
        if f["level"] is not None:
            ax.axvspan(f["bracket"][0] or f["level"] / 1.5, f["level"], color="C3", alpha=0.12)
            ax.axvline(f["level"], color="C3", linewidth=1.2, label=f"crossover {f['text']}")
        else:
            ax.plot([], [], " ", label=f"crossover {f['text']}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_yscale("log")
        ax.set_ylim(min(centres) / 4, max(centres) * 4)
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(lambda v, _: f"{v:g}x")
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.axhline(1.0, color="grey", linewidth=0.9, linestyle="--")
        ax.grid(axis="y", alpha=0.3)
        ax.set(xlabel="concurrency (requests in flight)", ylabel=ylabel)
        ax.legend(fontsize=7, loc="upper right")
    return _titled(fig, f"where {system} stops paying: speedup against concurrency (95 % intervals; hollow: none)",
                   caption)

"""The pictures a run folder gets (matplotlib, no torch or rich): summary.png, and concurrency.png for a
sweep. Their titles say what ran where (backend, device, target, split, categories)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness.analysis.summary import parallel_label


def plot(summary: dict, path: Path, title: str) -> None:
    """summary.png: `summary_figure` saved."""
    import matplotlib.pyplot as plt

    fig = summary_figure(summary, title)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_figure(summary: dict, title: str):
    """summary.png's figure: per-position (joint) acceptance by system over all its rounds (a round that proposed
    fewer than k drafts accepts nothing at k: the points sum to the pooled AL - 1), and each speculative system's speedup over
    plain decoding with its interval, per temperature (plain decoding, 1 by definition, is the line)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    overall = [r for r in summary["rows"] if r["category"] == "overall"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for r in overall:
        rates = r["spec_decode_per_position_acceptance_rates"]
        if rates:
            level = f" c={r['max_concurrency']}" if summary.get("max_concurrency", [1]) != [1] else ""
            left.plot(range(1, len(rates) + 1), [x if x is not None else float("nan") for x in rates], marker="o",
                      label=f"{r['system']} T={r['temperature']:g}{level} (AL {r['spec_decode_acceptance_length']:.2f})")
    left.xaxis.set_major_locator(MaxNLocator(integer=True))
    left.set(xlabel="draft position", ylabel="share of all rounds accepting it", ylim=(0, 1),
             title="acceptance by position, over all rounds")
    if left.lines:
        left.legend(fontsize=7)
    drafted = [r for r in overall if r["system"] != summary.get("baseline")]
    labels = [f"{r['system']}\nT={r['temperature']:g}" + (f" c={r['max_concurrency']}" if r["max_concurrency"] != 1
                                                          else "") for r in drafted]
    values = [r["speedup"] or 0.0 for r in drafted]
    errors = [[max(0.0, v - (r["speedup_ci95"] or [v, v])[0]) for v, r in zip(values, drafted)],
              [max(0.0, (r["speedup_ci95"] or [v, v])[1] - v) for v, r in zip(values, drafted)]]
    right.bar(range(len(values)), values, yerr=errors, capsize=3, color="tab:blue")
    few = [i for i, r in enumerate(drafted) if r.get("speedup_ci95_reason")]
    for i in few:  # (no interval to draw: say why on the bar)
        right.annotate(f"too few\nprompts ({drafted[i]['speedup_pairs']})", (i, values[i]), ha="center",
                       va="bottom", fontsize=6, xytext=(0, 2), textcoords="offset points")
    if few:  # headroom above the tallest bar for its two lines, under the panel's title
        right.set_ylim(top=max([1.0] + [v + e for v, e in zip(values, errors[1])]) * 1.3)
    right.axhline(1.0, color="grey", linewidth=0.8, label="plain decoding")
    right.set_xticks(range(len(values)), labels, fontsize=7)
    right.set(ylabel="speedup over plain (TPOT)", title="speedup, 95 % interval")
    right.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def plot_sweep(summary: dict, path: Path, caption: str) -> None:
    """concurrency.png: throughput and speedup against the concurrency level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from harness.analysis.report_figures import speedup_vs_concurrency

    fig = speedup_vs_concurrency(pd.DataFrame(summary["rows"]), caption, summary.get("baseline"))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_caption(manifest: dict, name: str) -> str:
    """What ran where, for a run's pictures: backend, device, target, split and categories."""
    settings, prov = manifest.get("settings") or {}, manifest.get("provenance") or {}
    device = prov.get("gpu") or settings.get("device")
    cats = ", ".join(settings.get("categories") or []) or "all categories"
    return (f"run {name}: {settings.get('backend', 'native')} backend on {device}, {settings.get('target')}, "
            f"{settings.get('split')} {cats}, {(prov.get('time_utc') or '')[:10]}"
            + (f" [{parallel}]" if (parallel := parallel_label(settings)) else "")
            + (" [load by AIPerf]" if settings.get("load_generator") == "aiperf" else "")
            + (f" [{manifest['label']}]" if manifest.get("label") else ""))

"""Pictures of a run's summary (matplotlib, no torch or rich)."""

from __future__ import annotations

from pathlib import Path


def plot(summary: dict, path: Path, title: str) -> None:
    """summary.png: per-position (joint) acceptance by system, and speedup with its interval, per temperature."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    overall = [r for r in summary["rows"] if r["category"] == "overall"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for r in overall:
        rates = r["spec_decode_per_position_acceptance_rates"]
        if rates:
            left.plot(range(1, len(rates) + 1), [x if x is not None else float("nan") for x in rates], marker="o",
                      label=f"{r['system']} T={r['temperature']:g} (AL {r['spec_decode_acceptance_length']:.2f})")
    left.set(xlabel="draft position", ylabel="share of rounds accepting it", ylim=(0, 1), title="acceptance by position")
    if left.lines:
        left.legend(fontsize=7)
    labels = [f"{r['system']}\nT={r['temperature']:g}" for r in overall]
    values = [r["speedup"] or 0.0 for r in overall]
    errors = [[max(0.0, v - (r["speedup_ci95"] or [v, v])[0]) for v, r in zip(values, overall)],
              [max(0.0, (r["speedup_ci95"] or [v, v])[1] - v) for v, r in zip(values, overall)]]
    right.bar(range(len(values)), values, yerr=errors, capsize=3, color="tab:blue")
    right.axhline(1.0, color="grey", linewidth=0.8)
    right.set_xticks(range(len(values)), labels, fontsize=7)
    right.set(ylabel="speedup over plain (TPOT)", title="speedup, 95 % interval")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

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


def plot_sweep(summary: dict, path: Path, title: str) -> None:
    """concurrency.png: per system, output throughput and the speedup over plain decoding (TPOT, with its
    95 % interval) against the concurrency level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    overall = [r for r in summary["rows"] if r["category"] == "overall"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for system, temp in dict.fromkeys((r["system"], r["temperature"]) for r in overall):
        mine = sorted((r for r in overall if (r["system"], r["temperature"]) == (system, temp)),
                      key=lambda r: r["max_concurrency"])
        levels = [r["max_concurrency"] for r in mine]
        label = f"{system} T={temp:g}"
        left.plot(levels, [r["output_throughput"] or float("nan") for r in mine], marker="o", label=label)
        if system != summary.get("baseline"):
            values = [r["speedup"] if r["speedup"] is not None else float("nan") for r in mine]
            low = [max(0.0, v - (r["speedup_ci95"] or [v, v])[0]) for v, r in zip(values, mine)]
            high = [max(0.0, (r["speedup_ci95"] or [v, v])[1] - v) for v, r in zip(values, mine)]
            right.errorbar(levels, values, yerr=[low, high], marker="o", capsize=3, label=label)
    levels = sorted({r["max_concurrency"] for r in overall})
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.minorticks_off()
        ax.set_xlabel("max concurrency (requests in flight)")
    left.set(ylabel="output tokens / s", title="output throughput")
    right.axhline(1.0, color="grey", linewidth=0.8)
    right.set(ylabel="speedup over plain (TPOT)", title="speedup over plain at the same concurrency, 95 % interval")
    for ax in (left, right):
        if ax.lines:
            ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

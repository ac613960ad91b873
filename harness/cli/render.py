"""What a person sees of a command's results, on a terminal and in a log file alike: the tables.

On a terminal Rich fits a table to the window. Off a terminal (piped, redirected, under CI) Rich
would cut every table to 80 columns, so there a table is printed at the width it needs.
"""

from __future__ import annotations

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from harness.analysis.summary import LEGEND, SWEEP_COLUMNS, SWEEP_LEGEND, cells, columns, sweep_cells

out = Console()  # results
err = Console(stderr=True)  # progress, notices, refusals


def show(console: Console, renderable) -> None:
    """Print `renderable` whole: fitted to a terminal, or as wide as it needs in a log."""
    if console.is_terminal:
        console.print(renderable)
        return
    width = Measurement.get(console, console.options.update_width(10_000), renderable).maximum
    wide = Console(file=console.file, width=max(width, console.width), highlight=False, color_system=None)
    wide.print(renderable)


def summary_table(summary: dict, title: str, category: str = "overall") -> Table:
    """The comparison table of a run: one row per system x temperature of `category`, the legend under it,
    and INCOMPLETE in the title while requests are missing."""
    if summary.get("complete") is False:
        title += f"\nINCOMPLETE: {summary['requests_done']} of {summary['requests_expected']} requests done"
    t = Table(title=title, caption=LEGEND, caption_justify="left")
    cols = columns(summary)
    for header, _ in cols:
        t.add_column(header, justify="left" if header == "system" else "right", no_wrap=header == "system")
    for row in summary["rows"]:
        if row["category"] == category:
            t.add_row(*cells(row, cols))
    return t


def sweep_table(summary: dict, title: str) -> Table:
    """A concurrency sweep: each system's overall figures at each level, speedups against plain decoding
    at the same level."""
    t = Table(title=title, caption=SWEEP_LEGEND, caption_justify="left")
    for header, _ in SWEEP_COLUMNS:
        t.add_column(header, justify="left" if header == "system" else "right", no_wrap=header == "system")
    for row in summary["rows"]:
        if row["category"] == "overall":
            t.add_row(*sweep_cells(row))
    return t


def print_comparison(result: dict, title: str) -> None:
    """One column per system. Times in ms: each step range's total over the timed requests, its calls,
    per call and per generated token; per-token launch and GPU figures where the trace has kernels."""
    rows = result["rows"]
    cats = sorted({c for r in rows for c in r["categories"]})
    ranges = list(dict.fromkeys(k for r in rows for k in r["ranges_ns"]))
    t = Table(title=title, caption="total: summed over the timed requests; per call: total / calls; per token: total / "
              "output tokens; absent: the system has no such step", caption_justify="left")
    t.add_column("figure")
    for r in rows:
        t.add_column(r["name"], justify="right")

    def add(label: str, cell) -> None:
        cells = [cell(r) for r in rows]
        if any(c not in ("-", "absent") for c in cells):
            t.add_row(label, *cells)

    for c in cats:
        add(f"{c}: share of GPU time", lambda r: f"{100 * r['categories'][c]['share']:.1f}%" if c in r["categories"]
            else "-")
        add(f"{c}: kernels", lambda r: str(r["categories"][c]["instances"]) if c in r["categories"] else "-")
    for name in ranges:
        def ms(r, per: str = ""):
            total, calls = r["ranges_ns"].get(name), r["ranges_calls"].get(name)
            if total is None:
                return "absent"
            divisor = {"": 1, "call": calls, "token": r["output_tokens"]}[per]
            return f"{total / divisor / 1e6:.3f}" if divisor else "-"
        add(f"{name}: total ms", ms)
        add(f"{name}: calls", lambda r: "absent" if r["ranges_calls"].get(name) is None else str(r["ranges_calls"][name]))
        add(f"{name}: ms per call", lambda r: ms(r, "call"))
        add(f"{name}: ms per token", lambda r: ms(r, "token"))
    for key, label, digits in (("output_tokens", "output tokens", 0), ("kernels_per_token", "kernels per token", 1),
                               ("graph_launches_per_token", "graph launches per token", 2),
                               ("gpu_us_per_token", "GPU time per token, us", 1)):
        add(label, lambda r: "-" if r[key] is None else f"{r[key]:.{digits}f}")
    show(out, t)
    for r in rows:
        for d in r["diagnosis"]:
            out.print(f"{r['name']}: {d}", style="yellow", highlight=False, soft_wrap=True)


def print_trace_summary(s: dict, file_name: str) -> None:
    """`trace summarize`'s tables, in ms, then the launches, the exporter and the diagnosis as sentences."""
    for key, cols in SUMMARY_TABLES:
        if not s[key]:
            out.print(f"{key}: {'not in this trace' if s[key] is None else 'no rows'}", style="dim", highlight=False)
            continue
        t = Table(title=f"{key} ({file_name}){', the 25 largest' if len(s[key]) > 25 else ''}")
        for header, _, _ in cols:
            t.add_column(header, justify="left" if header in ("range", "kernel", "category") else "right",
                         overflow="ellipsis", max_width=60 if header == "kernel" and out.is_terminal else None)
        for row in s[key][:25]:
            t.add_row(*[fmt(row[field]) for _, field, fmt in cols])
        show(out, t)
    launches = s["launches"]
    graphs = launches["kernels_from_graphs_share"]
    if s["kernels"] is None:
        out.print("launches: no GPU kernels in this trace (a CPU run)", highlight=False)
    else:
        out.print(f"launches: {launches['kernels']} kernels, {launches['graph_launches']} graph launches"
                  + ("" if graphs is None else f", {100 * graphs:.1f}% of kernels run from graphs"), highlight=False)
    out.print(f"exported by: Nsight Systems {s['nsys_version']}" if s.get("nsys_version") else
              f"format: {s['schema'].get('format', '?')}", highlight=False)
    if s.get("unavailable"):
        out.print(f"not in this kind of trace: {', '.join(s['unavailable'])}", style="dim", highlight=False)
    for d in s["diagnosis"]:
        out.print(f"diagnosis: {d}", style="yellow", highlight=False, soft_wrap=True)


def _ms(ns) -> str:
    return "-" if ns is None else f"{ns / 1e6:.3f}"


def _text(v) -> str:
    return "-" if v is None else str(v)


# (header, summary field, formatter) per table of `trace summarize`; times in ms
SUMMARY_TABLES = (
    ("nvtx", (("range", "range", _text), ("calls", "instances", _text), ("total ms", "total_ns", _ms),
              ("per call ms", "avg_ns", _ms), ("median ms", "med_ns", _ms))),
    ("kernels", (("kernel", "name", _text), ("category", "category", _text), ("calls", "instances", _text),
                 ("total ms", "total_ns", _ms), ("per call ms", "avg_ns", _ms), ("median ms", "med_ns", _ms))),
    ("categories", (("category", "category", _text), ("kernels", "instances", _text), ("total ms", "total_ns", _ms),
                    ("share", "share", lambda v: "-" if v is None else f"{100 * v:.1f}%"))),
    ("projection", (("range", "range", _text), ("calls", "range_instances", _text),
                    ("GPU total ms", "proj_total_ns", _ms), ("GPU ops", "gpu_ops", _text))),
)

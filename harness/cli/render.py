"""What a person sees of a command's results, on a terminal and in a log file alike: the tables.

On a terminal a table is fitted to the window without ever cutting a figure: a column declared
`no_wrap` (the numbers) keeps every cell whole, its header wraps; the other columns (names) wrap;
where that is still too wide the borders go, then the gaps narrow. Off a terminal (piped,
redirected, under CI) Rich would cut every table to 80 columns, so there a table is printed at the
width it needs.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from harness.analysis.metrics import side_text
from harness.analysis.table_text import (
    SWEEP_COLUMNS,
    SWEEP_LEGEND,
    cells,
    columns,
    contention_line,
    legend,
    sweep_cells,
    titled,
)

out = Console()  # results
err = Console(stderr=True)  # progress, notices, refusals


def error_line(message: str) -> None:
    """A refusal or failure as one line on stderr, printed as written (no markup, no emoji codes)."""
    err.print(f"error: {' '.join(message.split())}", highlight=False, markup=False, emoji=False, soft_wrap=True)


@contextmanager
def one_line_warnings() -> Iterator[None]:
    """The project's own warnings (a category of dspark or harness: a request recorded twice in a run it
    reads) as one `warning: ...` line on stderr while a command runs, beside its one-line `error:`s; Python
    printed two, its class and file first and the source line after. A notebook, calling the same analysis,
    keeps Python's warning; other libraries' warnings keep it here too."""
    python_shows = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if category.__module__.split(".")[0] in ("dspark", "harness"):
            err.print(f"warning: {' '.join(str(message).split())}", highlight=False, markup=False, emoji=False,
                      soft_wrap=True)
        else:
            python_shows(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = python_shows

NAME_FLOOR = 8  # a wrapping column (a system's name) keeps at least this many characters a line
# (box, show_edge, padding) tried in turn: the table as built, then no borders and two spaces, then one
LAYOUTS = (None, (box.SIMPLE_HEAD, False, (0, 1, 0, 0)), (box.SIMPLE_HEAD, False, (0, 0)))


def show(console: Console, renderable) -> None:
    """Print `renderable` whole: fitted to a terminal (a table's figures never cut), or as wide as it
    needs in a log or where its figures alone are wider than the terminal."""
    if console.is_terminal:
        fitted = fit(console, renderable, console.width) if isinstance(renderable, Table) else renderable
        if fitted is not None:
            console.print(fitted)
            return
    width = Measurement.get(console, console.options.update_width(10_000), renderable).maximum
    wide = Console(file=console.file, width=max(width, console.width), highlight=False,
                   color_system=console.color_system if console.is_terminal else None,
                   force_terminal=console.is_terminal)
    wide.print(renderable)


def fit(console: Console, table: Table, width: int) -> Table | None:
    """`table` made at most `width` wide (its layout and column widths set in place) with every cell
    of its `no_wrap` columns whole: in the first of LAYOUTS where whole header words fit too, else in
    the tightest where the cells do; None (the table unchanged) when even that is too narrow."""
    if Measurement.get(console, console.options.update_width(10_000), table).maximum <= width:
        return table
    built = (table.box, table.show_edge, table.padding)
    for c in table.columns:  # a header wraps, and folds a word too long for its column
        if isinstance(c.header, str):
            c.header = Text(c.header, no_wrap=False, overflow="fold")
    fitting = None
    for layout in LAYOUTS:
        table.box, table.show_edge, table.padding = layout or built
        floor, word, natural = _column_ranges(console, table)
        room = width - _overhead(console, table)
        if sum(floor) > room:
            continue
        widths = list(floor)
        for target in (word, natural):  # grow toward whole header words, then toward one line each
            for i, goal in enumerate(target):
                widths[i] += max(0, min(goal - widths[i], room - sum(widths)))
        fitting = (layout or built, widths)
        if all(w >= g for w, g in zip(widths, word)):
            break
    if fitting is None:
        table.box, table.show_edge, table.padding = built
        return None
    (table.box, table.show_edge, table.padding), widths = fitting
    for c, w in zip(table.columns, widths):
        c.width = w
    return table


def _column_ranges(console: Console, table: Table) -> tuple[list[int], list[int], list[int]]:
    """Per column: the width it must have (a no_wrap column's widest cell, or the longest word of a
    cell of words that may wrap there, `words`; a name column's longest name, up to NAME_FLOOR), the
    width its header's longest word needs, and the width that puts every cell and the header on one
    line."""
    opts = console.options.update_width(10_000)
    floor, word, natural = [], [], []
    for c in table.columns:
        cells = [(Measurement.get(console, opts, cell), cell) for cell in c.cells] or [(Measurement(1, 1), "")]
        head = Measurement.get(console, opts, c.header)
        widest = max(m.maximum for m, _ in cells)
        whole = max(m.minimum if isinstance(cell, Text) and cell.no_wrap is False else m.maximum for m, cell in cells)
        one_line = max(widest, head.maximum)
        if c.max_width is not None:
            one_line = min(one_line, c.max_width)
        need = whole if c.no_wrap else min(widest, NAME_FLOOR, one_line)
        floor.append(need)
        word.append(max(need, min(head.minimum, one_line)))
        natural.append(max(need, one_line))
    return floor, word, natural


def _overhead(console: Console, table: Table) -> int:
    """The borders and padding of `table` in its layout: its width with every column one character
    wide, less those characters."""
    kept = [c.width for c in table.columns]
    for c in table.columns:
        c.width = 1
    width = Measurement.get(console, console.options.update_width(10_000), table).maximum
    for c, w in zip(table.columns, kept):
        c.width = w
    return width - len(table.columns)


def words(cell: str) -> Text:
    """A cell of words in a column of figures (a speedup's "too few prompts (2) for an interval"): it may
    wrap between its words where the table is too wide for it on one line; the figures never do."""
    return Text(cell, no_wrap=False, justify="left")


def _systems(summary: dict, title: str, caption: str, cols: list, cells_of, category: str) -> Table:
    """A summary's rows of `category` under `cols`: figures right-aligned on one line, the system's name
    folded at left, the reason a speedup has no interval as `words`."""
    t = Table(title=title, caption=caption, caption_justify="left")
    for header, _ in cols:
        left = header in ("system", "run", "engine")
        t.add_column(header, justify="left" if left else "right", no_wrap=not left, overflow="fold")
    for row in summary["rows"]:
        if row["category"] == category:
            t.add_row(*[words(c) if key == "speedup_ci95" and row.get("speedup_ci95_reason") else c
                        for c, (_, key) in zip(cells_of(row), cols)])
    return t


def summary_table(summary: dict, title: str, category: str = "overall") -> Table:
    """The comparison table of a run: one row per system x temperature of `category`, the legend under it,
    and INCOMPLETE in the title while requests are missing."""
    title = escape(titled(title, summary))  # (its [label] is text, not markup)
    if summary.get("complete") is False:
        title += f"\nINCOMPLETE: {summary['requests_done']} of {summary['requests_expected']} requests done"
    if summary.get("contended_requests"):
        title += f"\n{contention_line(summary)}"
    cols = columns(summary)
    return _systems(summary, title, legend(summary), cols, lambda row: cells(row, cols), category)


def sweep_table(summary: dict, title: str) -> Table:
    """A concurrency sweep: each system's overall figures at each level, speedups against plain decoding
    at the same level."""
    return _systems(summary, escape(titled(title, summary)), SWEEP_LEGEND, SWEEP_COLUMNS, sweep_cells, "overall")


def together_table(result: dict, title: str, category: str) -> Table:
    """`analysis.together`'s one table of several runs' rows of `category`, its legend under it."""
    from harness.analysis.together import together_cells

    cols = result["columns"]
    return _systems(result, escape(title), result["legend"], cols, lambda row: together_cells(row, cols), category)


DELTAS_LEGEND = ("each figure A -> B; change: B - A (TPOT: B / A, above 1 when B is slower); CIs overlap: whether "
                 "the two speedups' 95% intervals overlap (yes: the change may be noise; too few prompts (A: n): "
                 "a run's speedup has no interval, from n prompt pairs)")


def deltas_table(result: dict, names: tuple[str, str], title: str) -> Table:
    """`compare_runs.deltas`: per system x temperature both runs have, B's speedup, acceptance length and
    TPOT against A's."""
    def two(pair: list, digits: int = 2, text=None) -> str:
        return " -> ".join("-" if v is None else text(v) if text else f"{v:.{digits}f}" for v in pair)

    def num(v, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    t = Table(title=title, caption=DELTAS_LEGEND.replace("A -> B", f"{names[0]} -> {names[1]}"),
              caption_justify="left")
    swept = any(r["max_concurrency"] != 1 for r in result["rows"])
    headers = ["system", "T"] + (["c"] if swept else []) + [
        "speedup", "change", "CIs overlap", "AL", "change", "TPOT ms", "change"]
    for h in headers:
        t.add_column(h, justify="left" if h == "system" else "right", no_wrap=h != "system", overflow="fold")
    for r in result["rows"]:
        overlap = {None: "-", True: "yes", False: "no"}[r["intervals_overlap"]]
        few = [f"{name}: {n}" for name, n, why in zip(names, r["speedup_pairs"], r["speedup_ci95_reason"]) if why]
        if few:
            overlap = words(f"too few prompts ({', '.join(few)})")
        t.add_row(r["system"], f"{r['temperature']:g}", *([str(r["max_concurrency"])] if swept else []),
                  two(r["speedup"], text=side_text), num(r["speedup_diff"], "+.2f"), overlap,
                  two(r["acceptance_length"]), num(r["acceptance_length_diff"], "+.2f"),
                  two(r["tpot_ms"], 1), "-" if r["tpot_ratio"] is None else f"{r['tpot_ratio']:.2f}x")
    return t


def grid(title: str, rows: list, left: tuple[str, ...] = ()) -> Table:
    """A table of a header row and rows of cells: figures right-aligned, the columns named in `left` not."""
    t = Table(title=title)
    for header in rows[0]:
        t.add_column(header, justify="left" if header in left else "right")
    for row in rows[1:]:
        t.add_row(*row)
    return t


def derived_table(rows: list[dict]) -> Table:
    """engine-bench's speedups that the step costs derive at each acceptance profile's mean length."""
    levels = sorted({c for r in rows for c in r["vllm_dspark"]})
    return grid("derived speedups at each profile's mean acceptance length (AL x plain step / round; synthetic "
                "acceptance: a profile, not a draft's quality)",
                [["profile", "AL", "DSpark (ours)", "EAGLE-3 (ours)", *(f"vLLM DSpark c={c}" for c in levels)],
                 *([r["profile"], f"{r['mean_length']:.2f}", *(f"{v:.2f}" if v else "-" for v in (
                     r["dspark"], r["eagle3"], *(r["vllm_dspark"][c] for c in levels)))] for r in rows)], ("profile",))


def print_comparison(result: dict, title: str) -> None:
    """One column per system. Times in ms: each step range's total over the timed requests, its calls,
    per call and per generated token; per-token launch and GPU figures where the trace has kernels; from
    a PyTorch trace, the host time per decoded token inside and outside operators against the profiled
    and unprofiled TPOT."""
    rows = result["rows"]
    cats = sorted({c for r in rows for c in r["categories"]})
    ranges = list(dict.fromkeys(k for r in rows for k in r["ranges_ns"]))
    caption = ("total: summed over the timed requests; per call: total / calls; per token: total / output tokens; "
               "absent: the system has no such step")
    if any(r.get("host") for r in rows):
        caption += ("; host, per decoded token: the time inside the trace's operators (outside prefill) and the "
                    "rest of the requests' decode time (Python, the engine's loop, the profiler's bookkeeping), "
                    "together the profiled TPOT")
    if any((r.get("host") or {}).get("unprofiled_tpot_ms") for r in rows):
        caption += ("; TPOT unprofiled: the same requests, timed in an unprofiled run before the profiles; "
                    "profiler overhead: profiled TPOT less unprofiled")
    t = Table(title=escape(title), caption=caption, caption_justify="left")
    t.add_column("figure")
    for r in rows:
        t.add_column(r["name"], justify="right", no_wrap=True)

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

    def host(key: str, percent: bool = False):
        def cell(r) -> str:
            h = r.get("host") or {}
            if h.get(key) is None:
                return "-"
            return f"{h[key]:.3f}" + (f" ({100 * h['overhead_share']:+.0f}%)" if percent else "")
        return cell

    for key, label in (("operators_ms", "host: in operators, ms per token"),
                       ("host_ms", "host: outside operators, ms per token"),
                       ("tpot_ms", "TPOT profiled, ms (the two above)"), ("unprofiled_tpot_ms", "TPOT unprofiled, ms")):
        add(label, host(key))
    add("profiler overhead, ms per token", host("overhead_ms", percent=True))
    show(out, t)
    for r in rows:
        contended = (r.get("host") or {}).get("contended_requests")
        if contended:
            out.print(f"{r['name']}: {contended} of the requests timed for the overhead ran on a busy machine: "
                      "the overhead is less certain", style="yellow", highlight=False, soft_wrap=True)
        for d in r["diagnosis"]:
            out.print(f"{r['name']}: {d}", style="yellow", highlight=False, soft_wrap=True)


def print_operators(result: dict) -> None:
    """Per system of a PyTorch trace, its host operators by self time: calls, self ms, share of all
    operators' self time, and microseconds per decoded token (outside prefill) where tokens are known
    (a profile folder's requests; a bare trace file has none, and then no such column)."""
    for r in result["rows"]:
        if not r.get("operators"):
            continue
        per_token = any(o.get("us_per_token") is not None for o in r["operators"])
        t = Table(title=f"top host operators: {r['name']}", caption="self: the operator's own time, less the "
                  "operators it called; share: of all operators' self time" + (
                      "; per token: outside prefill, per decoded token" if per_token else ""), caption_justify="left")
        t.add_column("operator")
        for header in ("calls", "self ms", "share") + (("us per token",) if per_token else ()):
            t.add_column(header, justify="right", no_wrap=True)
        for o in r["operators"]:
            t.add_row(o["name"], str(o["calls"]), f"{o['self_ns'] / 1e6:.3f}",
                      "-" if o["share"] is None else f"{100 * o['share']:.1f}%",
                      *(("-" if o.get("us_per_token") is None else f"{o['us_per_token']:.1f}",) if per_token else ()))
        show(out, t)


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

"""A run's summary as text: the comparison table's columns and cells (one row per system, as published
DSpark comparisons print it), their legends, the serving table of served runs, Markdown and CSV. Imports
neither torch nor rich, so notebooks can use it."""

from __future__ import annotations

import csv
import io
import math
import textwrap

from harness.analysis.metrics import MIN_PAIRS, interval_text, side_text
from harness.analysis.summary import warnings


def _fmt(v, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


COLUMNS = [("system", "system"), ("T", "temperature"), ("requests", "requests"), ("tokens", "output_tokens"),
           ("time s", "duration_s"),
           ("TPOT ms", "mean_tpot_ms"), ("speedup", "speedup"), ("95% CI", "speedup_ci95"),
           ("AL", "spec_decode_acceptance_length"),
           ("accept", "spec_decode_acceptance_rate"), ("rounds", "num_rounds"), ("= plain", "matches_baseline")]


SWEPT = ("c", "max_concurrency")  # a column of a sweep's tables, after T
BUSY = ("busy", "contended_requests")  # a column of a run that saw contention, after requests
# a synthetic-acceptance run's columns where a real run's acceptance rate and greedy equality stand
SYNTHETIC = {("accept", "spec_decode_acceptance_rate"): ("profile AL", "profile_acceptance_length"),
             ("= plain", "matches_baseline"): ("realised rates", "realised_rates")}


def swept(summary: dict) -> bool:
    """Whether the run timed requests at a concurrency other than one at a time (a sweep's levels, or one
    level above 1): only then has it a concurrency table. A run with no request has none."""
    return any(k != 1 for k in summary.get("max_concurrency") or [])


WRAP = 110  # the width a warning's lines are wrapped at


def warning_lines(warning: str, lead: str = "warning: ") -> list[str]:
    """A warning as the terminal and summary.md print it: its lines (a line "- x" is an item of a list,
    indented under the first), each wrapped at WRAP characters, never inside a figure or an interval."""
    out = []
    for i, line in enumerate(warning.split("\n")):
        item = line.startswith("- ")
        first = lead if i == 0 else "  - " if item else "  "
        out += textwrap.wrap(line[2:] if item else line, WRAP, initial_indent=first,
                             subsequent_indent=" " * (4 if item else 2), break_long_words=False, break_on_hyphens=False)
    return out


def columns(summary: dict) -> list[tuple[str, str]]:
    """The table's columns: COLUMNS, the concurrency where the run swept it, and how many requests were
    timed on a busy machine where any was."""
    cols = COLUMNS[:2] + [SWEPT] + COLUMNS[2:] if swept(summary) else list(COLUMNS)
    if summary.get("contended_requests"):
        cols.insert(cols.index(("requests", "requests")) + 1, BUSY)
    if summary.get("synthetic"):  # in place of acceptance and equality where every draft is synthetic, else beside
        drafted = [r for r in summary["rows"] if r.get("method") != "plain"]
        if all(r.get("profile_acceptance_length") is not None for r in drafted):
            cols = [SYNTHETIC.get(c, c) for c in cols]
        else:
            cols += list(SYNTHETIC.values())
    return cols


def cells(row: dict, cols: list[tuple[str, str]] = COLUMNS) -> list[str]:
    """A summary row's cells, in `cols`' order, as the table and summary.md print them."""
    cells = []
    for _, key in cols:
        v = row.get(key)
        if key == "realised_rates":
            cells.append("-" if not v else "/".join("-" if x is None else f"{x:.2f}" for x in v))
        elif key == "speedup_ci95":
            cells.append(row.get("speedup_ci95_reason") or ("-" if not v else interval_text(v)))
        elif key == "speedup":
            cells.append(("-" if v is None else side_text(v)) + ("*" if row.get("speedup_ci95_spans_1") or row.get("speedup_ci95_reason") else ""))
        elif key == "requests":
            expected = row.get("requests_expected")
            failed = f" ({row['failed']} failed)" if row.get("failed") else ""
            cells.append((f"{v}/{expected}" if expected is not None and v < expected else str(v)) + failed)
        elif key == "contended_requests":
            cells.append(f"{v}/{row['contention_measured']}" if row.get("contention_measured") else "-")
        elif key == "matches_baseline":
            cells.append("-" if v is None else f"{v}/{row['matches_baseline_of']}")
        elif key == "temperature":
            cells.append(f"{v:g}")
        elif key in ("spec_decode_acceptance_rate", "delivered_acceptance_rate"):
            cells.append("-" if v is None else f"{100 * v:.0f}%")
        else:
            cells.append(_fmt(v, 1 if key in ("duration_s", "mean_tpot_ms") else 2))
    return cells


LEGEND = ("T: temperature; requests: requests summarised "
          "(done/expected while the run is unfinished; failed ones counted, left out of the figures); "
          "tokens: output tokens of those requests; time s: the time any of them was in flight (one at a time: "
          "their summed end-to-end latency); TPOT ms: mean time "
          "per output token after the first; speedup: geometric mean over prompts of plain decoding's TPOT / "
          "this system's, paired by prompt (* when its 95% interval spans 1 or it has none: no clear speedup or "
          "slowdown); 95% CI: a Student t interval of the speedup over prompts (on the log ratios), none from "
          f"fewer than {MIN_PAIRS} prompt pairs (too few to rule out chance); AL: acceptance length, tokens per "
          "verify round; accept: accepted / proposed draft tokens; rounds: verify rounds; = plain: greedy outputs "
          "equal to plain decoding's, of those compared")
LEGEND_OF = {"max_concurrency": "c: requests in flight at most (a sweep's level; speedups are against plain "
                                "decoding at the same c)",
             "contended_requests": "busy: requests timed while other processes competed for the cores (tasks "
                                   "waited for a core), of those measured (a speedup's interval then also covers "
                                   "their times scaled back to a quiet machine)",
             "profile_acceptance_length": "profile AL: the synthetic profile's mean acceptance length (what AL "
                                          "should come to); realised rates: per draft slot, the share of full rounds "
                                          "that accepted at least that many drafts (the profile's unconditional "
                                          "rates are what they should come to); accept and = plain mean nothing "
                                          "under synthetic acceptance and are not shown"}


def legend(summary: dict) -> str:
    """The legend of `columns(summary)`: LEGEND and the definitions of the columns this run adds."""
    return "; ".join([LEGEND] + [LEGEND_OF[key] for _, key in columns(summary) if key in LEGEND_OF])

SWEEP_COLUMNS = [("system", "system"), ("T", "temperature"), ("c", "max_concurrency"), ("req/s", "request_throughput"),
                 ("out tok/s", "output_throughput"), ("TTFT med", "median_ttft_ms"), ("TTFT p99", "p99_ttft_ms"),
                 ("TPOT med", "median_tpot_ms"), ("TPOT p99", "p99_tpot_ms"), ("ITL med", "median_itl_ms"),
                 ("ITL p99", "p99_itl_ms"), ("AL", "spec_decode_acceptance_length"), ("speedup", "speedup"),
                 ("95% CI", "speedup_ci95"), ("tok/s ratio", "throughput_speedup")]  # vllm bench serve's, then ours
SWEEP_LEGEND = ("c: most requests in flight; req/s, out tok/s: completed requests and output tokens per second of the "
                "time any request was in flight; TTFT, TPOT, ITL med, p99: their median and 99th percentile over "
                "requests in ms (ITL over every gap between streamed chunks), all as vllm bench serve's; speedup: "
                "per-prompt TPOT speedup over plain decoding at the same c (geometric mean, * when its 95% interval "
                f"spans 1 or it has none: fewer than {MIN_PAIRS} prompt pairs); tok/s ratio: output throughput over "
                "plain decoding's at the same c")


def sweep_cells(row: dict) -> list[str]:
    """A row of the concurrency table (a system's overall row at one level)."""
    out = []
    for _, key in SWEEP_COLUMNS:
        v = row.get(key)
        if key in ("speedup_ci95", "speedup", "temperature", "max_concurrency", "system",
                   "spec_decode_acceptance_length"):
            out.append(cells(row, [("", key)])[0])
        else:
            out.append(_fmt(v, 1 if key.endswith("_ms") or key == "output_throughput" else 2))
    return out


def contention_line(summary: dict) -> str:
    """The line a table's title gets when requests were timed on a busy machine."""
    return (f"CONTENTION: {summary['contended_requests']} of {summary['contention_measured']} requests timed on a busy "
            "machine (busy column)" + ("; speedup intervals widened" if summary.get("contention_widened") else
                                       "; widening changed no interval" if summary.get("contention_unwidened") else ""))


def titled(title: str, summary: dict) -> str:
    """A table's title with the run's tensor-parallel sizes (TP 2), its load generator where it is not our
    client (load by AIPerf 0.13.0), its label (random weights, synthetic acceptance: <profile>), the
    profiler it was timed under and Triton's interpreter, where it has them."""
    said = marks(summary)
    return f"{title} [{'; '.join(said)}]" if said else title


def marks(summary: dict) -> list[str]:
    """What a run's title says besides its name: TP sizes, load generator, label, profiler, Triton's interpreter."""
    profiled = summary.get("profiled")
    return [m for m in (summary.get("parallel"), summary.get("load_generator"), summary.get("label"),
                        profiled and f"timed under {profiled['profiler']}", summary.get("interpreted")) if m]


def synthetic_lines(summary: dict) -> list[str]:
    """Each synthetic system's profile, its source and the check of its realised acceptance, as sentences."""
    out = []
    for name, c in (summary.get("synthetic") or {}).items():
        test = (f"chi-square p = {c['p_value']:.3g} over {c['rounds']} full rounds ({c.get('groups', 1)} temperature "
                f"and concurrency groups, Bonferroni): {c['verdict']}"
                if c["p_value"] is not None else c["reason"])
        realised = "/".join("-" if x is None else f"{x:.2f}" for x in c["realised_rates"])
        out.append(f"{name}: profile {c['profile']} ({c['source']}); rates "
                   f"{'/'.join(f'{x:.2f}' for x in c['rates'])} (AL {c['mean_length']:.2f}), realised {realised}; {test}")
    return out


def markdown(summary: dict, title: str) -> str:
    lines = [f"# {titled(title, summary)}", ""]
    if summary.get("label"):
        lines += [f"**{summary['label']}**: these figures time the systems; they say nothing of any draft's "
                  "quality.", ""] + [f"- {line}" for line in synthetic_lines(summary)] + [""]
    if summary.get("complete") is False:
        lines += [f"INCOMPLETE: {summary['requests_done']} of {summary['requests_expected']} requests done", ""]
    if summary.get("contended_requests"):
        lines += [contention_line(summary), ""]
    cats = list(dict.fromkeys(r["category"] for r in summary["rows"]))
    for cat in (["overall"] if cats else []) + [c for c in cats if c != "overall"]:  # (no request: no table)
        cols = columns(summary)
        lines += [f"## {cat}", "", "| " + " | ".join(h for h, _ in cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(cells(r, cols)) + " |" for r in summary["rows"] if r["category"] == cat]
        lines.append("")
    for w in warnings(summary):
        lines += warning_lines(w, "**Warning**: ") + [""]
    lines += [legend(summary), ""]
    if swept(summary):
        cols = SWEEP_COLUMNS
        lines += ["## concurrency sweep (overall)", "", "| " + " | ".join(h for h, _ in cols) + " |",
                  "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(sweep_cells(r)) + " |" for r in summary["rows"] if r["category"] == "overall"]
        lines += ["", SWEEP_LEGEND, ""]
    lines += [summary["notes"]]
    return "\n".join(lines) + "\n"


def to_csv(summary: dict) -> str:
    keys = list(dict.fromkeys(k for r in summary["rows"] for k in r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=keys)
    writer.writeheader()
    for r in summary["rows"]:
        writer.writerow({k: "|".join(map(str, v)) if isinstance(v, list) else v for k, v in r.items()})
    return buf.getvalue()

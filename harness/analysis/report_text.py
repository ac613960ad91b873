"""How the report puts its numbers before a reader: the headline (what ran where, each system's
speedup and acceptance length with 95 % intervals, the verdict in one sentence, the runs' warnings),
tables rounded to the digits that mean something with no index column and "-" for a missing value,
and one-line notes for a section that has nothing to draw. Each is an object a notebook displays
(HTML) that prints as plain text too. Needs neither torch, rich nor matplotlib."""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd

from harness.analysis.frames import BASELINE, Profiles, Runs, acceptance_intervals
from harness.analysis.metrics import MIN_PAIRS, interval_text, side_text
from harness.analysis.table_text import warning_lines

TITLE = "DSpark benchmark report"


def missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA or v is pd.NaT


def fmt(v, digits: int = 2) -> str:
    """One cell: "-" for a missing value, floats to `digits`, an interval (a pair) as "lo-hi"."""
    if isinstance(v, (list, tuple)):
        return "-" if len(v) != 2 or any(missing(x) for x in v) else f"{fmt(v[0], digits)}-{fmt(v[1], digits)}"
    if missing(v):
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int) or (isinstance(v, float) and digits == 0):
        return f"{v:.0f}"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def ratio_cell(v) -> str:
    """A speedup, or its interval (a pair), or why it has none: `metrics.side_text`'s digits, so that a
    figure or an interval's end that is not 1 never prints as 1.00."""
    if isinstance(v, str):
        return v
    if isinstance(v, (list, tuple)):
        return "-" if len(v) != 2 or any(missing(x) for x in v) else interval_text(v)
    return "-" if missing(v) else side_text(v)


def percent(v) -> str:
    return "-" if missing(v) else f"{100 * v:.0f} %"


def temperature(v) -> str:
    return "-" if missing(v) else f"{v:g}"


@dataclass
class Note:
    """A section's one line: why it has nothing to draw, or what it found."""
    text: str

    def _repr_html_(self) -> str:
        return f'<p class="dspark-note">{html.escape(self.text)}</p>'

    def __repr__(self) -> str:
        return self.text


# a table column: (key in the frame, header, digits or a function of the value)
Column = tuple[str, str, int | Callable]


@dataclass
class Table:
    """A frame shown as a clean table: the given columns that the frame has, formatted, no index, and
    the columns with no value in any row left out."""
    frame: pd.DataFrame
    columns: Sequence[Column]
    caption: str | None = None

    def cells(self) -> tuple[list[str], list[list[str]], list[bool]]:
        """Headers, rows of formatted cells, and which columns hold numbers (right-aligned)."""
        cols = [c for c in self.columns if c[0] in self.frame.columns]
        body = [[c[2](v) if callable(c[2]) else fmt(v, c[2]) for c, v in zip(cols, row)]
                for row in self.frame[[c[0] for c in cols]].itertuples(index=False)] if cols else []
        keep = [i for i in range(len(cols)) if any(r[i] != "-" for r in body)]
        numeric = [all(_numberlike(r[i]) for r in body) for i in keep]
        return [cols[i][1] for i in keep], [[r[i] for i in keep] for r in body], numeric

    def _repr_html_(self) -> str:
        headers, body, numeric = self.cells()
        if not body:
            return Note(self.caption or "no rows")._repr_html_()
        align = [' class="num"' if n else "" for n in numeric]
        head = "".join(f"<th{a}>{html.escape(h)}</th>" for h, a in zip(headers, align))
        rows = "".join("<tr>" + "".join(f"<td{a}>{html.escape(c)}</td>" for c, a in zip(r, align)) + "</tr>"
                       for r in body)
        caption = f"<caption>{html.escape(self.caption)}</caption>" if self.caption else ""
        return f'<table class="dspark">{caption}<thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'

    def __repr__(self) -> str:
        headers, body, _ = self.cells()
        if not body:
            return self.caption or "no rows"
        widths = [max(len(x) for x in col) for col in zip(headers, *body)]
        lines = ["  ".join(x.ljust(w) for x, w in zip(line, widths)).rstrip() for line in [headers, *body]]
        return "\n".join(([self.caption] if self.caption else []) + lines)


def _numberlike(cell: str) -> bool:
    """A cell of a right-aligned column: a number, an interval, a count "3 of 4", or none."""
    return cell in ("-", "baseline") or cell[:1].isdigit()


def requests_cell(row) -> str:
    """Requests summarised: done (of the plan's, while unfinished), and how many failed."""
    done, expected, failed = row.get("requests"), row.get("requests_expected"), row.get("failed")
    if missing(done):
        return "-"
    text = f"{done:.0f}" + (f" of {expected:.0f}" if not missing(expected) and expected > done else "")
    return text + (f" ({failed:.0f} failed)" if not missing(failed) and failed else "")


def matches_cell(row) -> str:
    got, of = row.get("matches_baseline"), row.get("matches_baseline_of")
    return "-" if missing(got) or missing(of) else f"{got:.0f}/{of:.0f}"


def _is_sweep(summary: pd.DataFrame) -> bool:
    return not summary.empty and summary["max_concurrency"].nunique() > 1


def _lead_columns(runs: Runs, rows: pd.DataFrame, label: str = "system_label") -> list[Column]:
    """The columns that name a row: system (with its run where there are several), temperature, and the
    level where a run swept the concurrency."""
    cols: list[Column] = [(label, "system", 0), ("temperature", "T", temperature)]
    if not rows.empty and (rows["max_concurrency"] != 1).any():
        cols.append(("max_concurrency", "c", 0))
    return cols


def _contended(rows: pd.DataFrame) -> list[Column]:
    """The busy column (requests timed while other processes competed for the cores, of those measured),
    where any row had one."""
    if "contended_requests" in rows.columns and (rows["contended_requests"].fillna(0) > 0).any():
        return [("busy_label", "busy", 0)]
    return []


def busy_cell(row) -> str:
    n, of = row.get("contended_requests"), row.get("contention_measured")
    return "-" if missing(n) or missing(of) or not of else f"{n:.0f}/{of:.0f}"


def summary_table(runs: Runs) -> Table:
    """The headline table, each run's overall rows: system, temperature (and the level of a sweep),
    requests, TPOT, speedup with its interval, acceptance length with its interval, acceptance rate,
    greedy outputs equal to plain's, and requests timed under contention where there were any."""
    rows = overall_rows(runs)
    quality = [("spec_decode_acceptance_rate", "accepted", percent), ("matches_label", "= plain", 0)]
    if "profile_acceptance_length" in rows and rows["profile_acceptance_length"].notna().any():
        # synthetic acceptance: the profile's AL and the realised rates stand where acceptance and equality would,
        # beside them where some drafted rows are real
        rows = rows.assign(realised_label=["-" if not isinstance(v, list) else "/".join(
            "-" if x is None else f"{x:.2f}" for x in v) for v in rows.get("realised_rates", [None] * len(rows))])
        synthetic = [("profile_acceptance_length", "profile AL", 2), ("realised_label", "realised rates", 0)]
        drafted = rows[rows["method"] != BASELINE]
        quality = synthetic if drafted["profile_acceptance_length"].notna().all() else quality + synthetic
    return Table(rows, [*_lead_columns(runs, rows), ("requests_label", "requests", 0), ("mean_tpot_ms", "TPOT ms", 2),
                        ("speedup_label", "speedup", 0), ("speedup_ci95", "95 % CI", ratio_cell),
                        ("spec_decode_acceptance_length", "AL", 2), ("acceptance_ci95", "AL 95 % CI", 2),
                        *quality, *_contended(rows)])


def speed_table(runs: Runs) -> Table:
    """Throughput and latency of each run's overall rows: TTFT, TPOT (mean, p90, coefficient of
    variation), the speedup and its interval, output throughput and the throughput speedup."""
    rows = overall_rows(runs)
    return Table(rows, [*_lead_columns(runs, rows), ("requests_label", "requests", 0), ("mean_ttft_ms", "TTFT ms", 1),
                        ("mean_tpot_ms", "TPOT ms", 2), ("p90_tpot_ms", "p90 TPOT ms", 2), ("cv_tpot_ms", "TPOT cv", 2),
                        ("speedup_label", "speedup", 0), ("speedup_ci95", "95 % CI", ratio_cell),
                        ("output_throughput", "output tok/s", 1), ("throughput_speedup", "throughput speedup", 2),
                        *_contended(rows)], caption=None)


def acceptance_table(runs: Runs) -> Table | Note:
    """Acceptance per category of each speculative system: acceptance length and rate, rounds and
    drafted tokens, and what the acceptance was counted from (rounds, vLLM's totals, server counters);
    the overall rows only where a system ran more than one category."""
    rows = runs.summary[(runs.summary["method"] != BASELINE) & runs.summary["spec_decode_acceptance_length"].notna()]
    if rows.empty:
        return Note("acceptance by category: no speculative system's acceptance in these runs")
    group = ["run", "system", "temperature", "max_concurrency"]
    categories = rows[rows["category"] != "overall"].groupby(group)["category"].nunique()
    single = {key for key, n in categories.items() if n == 1}  # (its overall row repeats its one category's)
    rows = rows[[r["category"] != "overall" or tuple(r[k] for k in group) not in single for _, r in rows.iterrows()]]
    rows = rows.assign(system_label=[f"{r.run}/{r.system}" if runs.meta.shape[0] > 1 else r.system
                                     for r in rows.itertuples()])
    return Table(rows, [*_lead_columns(runs, rows), ("category", "category", 0), ("requests", "requests", 0),
                        ("spec_decode_acceptance_length", "AL", 2), ("spec_decode_acceptance_rate", "accepted", percent),
                        ("num_rounds", "rounds", 0), ("spec_decode_num_draft_tokens", "drafted tokens", 0),
                        ("acceptance_from", "counted from", 0)])


def synthetic_table(runs: Runs) -> Table | Note:
    """Per synthetic-acceptance system and level: its profile and mean length, the realised AL and the
    check against the profile, the measured speedup beside the one the run's own step costs derive (our
    engine's step timers: AL x plain step / round, host time included) and the round's host and accept
    (sampling) milliseconds: what a derivation from isolated step costs leaves out."""
    rows = runs.synthetic
    if rows.empty:
        return Note("synthetic acceptance: no system of these runs accepted at a profile")
    rows = rows.assign(run_system=[f"{r.run}/{r.system}" if runs.meta.shape[0] > 1 else r.system
                                   for r in rows.itertuples()],
                       derived_in_run=rows.get("derived_in_run"), host_ms=rows.get("host_ms"),
                       accept_ms=rows.get("accept_ms"))
    rows = rows.assign(ratio=[m / d if isinstance(d, float) and d == d and d else None
                              for m, d in zip(rows["measured"], rows["derived_in_run"])])
    return Table(rows, [("run_system", "system", 0), ("temperature", "T", lambda v: f"{v:g}"),
                        ("max_concurrency", "c", 0),
                        ("profile", "profile", 0), ("profile_al", "profile AL", 2), ("realised_al", "AL", 2),
                        ("check", "check", 0), ("measured", "speedup", 2), ("derived_in_run", "derived (steps)", 2),
                        ("ratio", "measured / derived", 3), ("host_ms", "host ms / round", 3),
                        ("accept_ms", "accept ms / round", 3)],
                 caption="synthetic acceptance: these time the systems, never a draft's quality; derived (steps): "
                         "AL x plain step / round from the run's own step timers (our engine only)")


def overall_rows(runs: Runs) -> pd.DataFrame:
    """The summary's overall rows, with the acceptance length's interval over requests and the labels
    the tables print (a run's name before its systems where there are several runs)."""
    rows = runs.summary[runs.summary["category"] == "overall"].copy()
    if rows.empty:
        return rows.assign(system_label=[], requests_label=[], speedup_label=[], matches_label=[], busy_label=[],
                           acceptance_ci95=[])
    intervals = acceptance_intervals(runs.requests)[["run", "system", "temperature", "max_concurrency",
                                                     "acceptance_ci95", "acceptance_ci95_reason"]]
    rows = rows.merge(intervals, on=["run", "system", "temperature", "max_concurrency"], how="left")
    several = runs.meta.shape[0] > 1
    rows["system_label"] = [f"{r.run}/{r.system}" if several else r.system for r in rows.itertuples()]
    records = rows.to_dict("records")
    rows["requests_label"] = [requests_cell(r) for r in records]
    rows["matches_label"] = [matches_cell(r) for r in records]
    rows["busy_label"] = [busy_cell(r) for r in records]
    rows["speedup_label"] = ["baseline" if r["method"] == BASELINE else ratio_cell(r.get("speedup")) for r in records]
    rows["acceptance_ci95"] = [interval_cell(r, "acceptance_ci95") for r in records]
    rows["speedup_ci95"] = [None if r["method"] == BASELINE else interval_cell(r, "speedup_ci95") for r in records]
    return rows


def interval_cell(row: dict, key: str):
    """An interval (`key`: speedup_ci95, acceptance_ci95) as the tables show it: the pair, or why there is
    none (too few prompts or requests)."""
    reason = row.get(f"{key}_reason")
    return reason if isinstance(reason, str) else row.get(key)


def clause(row: dict, name: str, sweep: bool) -> str:
    """One system's verdict: faster, slower, or no clear speedup, with the speedup and its interval; none
    from too few prompts for an interval."""
    at = f"T={row['temperature']:g}" + (f", c={row['max_concurrency']}" if sweep else "")
    s, ci, reason = row.get("speedup"), row.get("speedup_ci95"), row.get("speedup_ci95_reason")
    if missing(s):
        return f"{name}: no speedup at {at} (no request paired with plain decoding's)"
    if isinstance(reason, str):
        return f"{name}: {reason} at {at} ({side_text(s)}x measured, no verdict)"
    interval = f"95 % CI {interval_text(ci)}"
    if ci[0] > 1:
        return f"{name}: {side_text(s)}x faster than plain decoding at {at} ({interval})"
    if ci[1] < 1:
        return f"{name}: slower than plain decoding at {at}, {side_text(s)}x ({interval})"
    return f"{name}: no clear speedup at {at}, {side_text(s)}x (the {interval} spans 1)"


def verdict(runs: Runs) -> str:
    """The verdict in one sentence: per speculative system and temperature (and level), faster, slower
    or no clear speedup against plain decoding, with the 95 % interval; or why a run has none."""
    rows = overall_rows(runs)
    several, sweep = runs.meta.shape[0] > 1, _is_sweep(rows)
    parts = []
    for run, note in zip(runs.meta["run"], runs.meta.get("interpreted", [None] * runs.meta.shape[0])):
        mine = rows[rows["run"] == run]
        prefix = f"{run}: " if several else ""
        if mine.empty:
            parts.append(f"{prefix}no finished request yet")
        elif isinstance(note, str):
            parts.append(f"{prefix}no speedup verdict, {note}")
        elif (mine["method"] == BASELINE).all():
            parts.append(f"{prefix}plain decoding only, no speculative system to compare with it")
        elif not (mine["method"] == BASELINE).any():
            parts.append(f"{prefix}no speedup: plain decoding is not among the systems (add plain to --systems)")
        else:
            drafted = mine[mine["method"] != BASELINE].sort_values(["temperature", "max_concurrency"], kind="stable")
            parts += [clause(r, f"{run}/{r['system']}" if several else r["system"], sweep)
                      for r in drafted.to_dict("records")]
    return "; ".join(parts) + "." if parts else "no run given."


def where(meta: dict) -> str:
    """What ran where, for one run: backend, device, target, split and categories, prompts, systems,
    git revision and date."""
    device = meta.get("device") or "?"
    if device == "cpu" and not missing(meta.get("cores")):
        device = f"cpu ({meta.get('cpu') or '?'}, {meta['cores']:.0f} cores)"
    git = ("git " + meta["git"][:7] + (" (uncommitted changes)" if meta.get("dirty") else "") if not
           missing(meta.get("git")) and meta.get("git") else "no git revision recorded")  # (not "git ?": AIPerf folders read by `report --aiperf` have none)
    done, expected = meta.get("requests_done"), meta.get("requests_expected")
    requests = f"{done:.0f}" if not missing(done) else "?"
    if not missing(expected) and not missing(done) and expected != done:
        requests += f" of {expected:.0f}"
    return (f"{meta.get('backend')} backend on {device}; target {meta.get('target')}; {meta.get('split') or '?'} "
            f"split, {meta.get('categories')}; systems {meta.get('systems') or '?'}; {requests} requests; "
            f"{git}; {meta.get('date')}")


def warning_html(warning: str) -> str:
    """A warning as an item of the headline's list: its first line, then its "- " lines as a list under it
    and any other line on its own (`summary.warnings` puts one fact a line)."""
    e = html.escape
    first, *rest = warning.split("\n")
    out = f"<li><strong>Warning:</strong> {e(first)}"
    for i, line in enumerate(rest):
        item = line.startswith("- ")
        opens = item and not (i and rest[i - 1].startswith("- "))
        closes = item and (i + 1 == len(rest) or not rest[i + 1].startswith("- "))
        out += ("<ul>" if opens else "") + (f"<li>{e(line[2:])}</li>" if item else f"<br>{e(line)}") + \
            ("</ul>" if closes else "")
    return out + "</li>"


@dataclass
class Headline:
    """The report's first screen: its title, what ran where, the verdict, the headline table and the
    warnings a reader must see before trusting a figure."""
    runs: Runs

    def warnings(self) -> list[str]:
        several = self.runs.meta.shape[0] > 1
        return [f"{run}: {w}" if several else w for run, ws in self.runs.warnings.items() for w in ws]

    def _repr_html_(self) -> str:
        e = html.escape
        names = ", ".join(self.runs.meta["run"])
        lines = [f'<header class="dspark-headline"><h1>{e(TITLE)}: {e(names)}</h1>']
        for meta in self.runs.meta.to_dict("records"):
            if isinstance(meta.get("label"), str):  # random weights, synthetic acceptance: timing, never quality
                lines.append(f'<p class="dspark-label-run"><strong>{e(meta["run"])}: {e(meta["label"])}</strong> '
                             "(these figures time the systems; they say nothing of any draft's quality)</p>")
            if isinstance(meta.get("interpreted"), str):  # the reverse: acceptance holds, the times say nothing
                lines.append(f'<p class="dspark-label-run"><strong>{e(meta["run"])}: {e(meta["interpreted"])}'
                             "</strong> (its times and speedups are the interpreter's, not the engine's)</p>")
            lines.append(f'<p class="dspark-where"><strong>{e(meta["run"])}</strong>: {e(where(meta))}</p>')
        parts = [part.partition(": ") for part in verdict(self.runs).split("; ")]  # (each system's name in bold)
        sentence = "; ".join(f"<strong>{e(name)}</strong>: {e(rest)}" if rest else e(name) for name, _, rest in parts)
        lines.append(f'<p class="dspark-verdict"><span class="dspark-label">Verdict</span> {sentence}</p>')
        if not overall_rows(self.runs).empty:
            lines.append(summary_table(self.runs)._repr_html_())
        warned = self.warnings()
        if warned:
            lines.append('<ul class="dspark-warnings">' + "".join(warning_html(w) for w in warned) + "</ul>")
        lines.append('<p class="dspark-legend">speedup: geometric mean over prompts of plain decoding\'s TPOT '
                     "over the system's, paired by prompt, with its 95 % Student t interval (on the log ratios; none from "
                     f"fewer than {MIN_PAIRS} prompt pairs, too few to rule out chance); AL: acceptance length "
                     "(tokens per verify round) with its 95 % Student t interval over requests (the speedup's rule, "
                     f"none from fewer than {MIN_PAIRS} requests); accepted: "
                     "accepted / proposed draft tokens; = plain: greedy outputs equal to plain decoding's" +
                     ("; busy: requests timed while other processes competed for the cores, of those measured (a "
                      "speedup's interval then also covers their times scaled back to a quiet machine)"
                      if _contended(overall_rows(self.runs)) else "") + ".</p>")
        return "\n".join(lines) + "</header>"

    def __repr__(self) -> str:
        lines = [f"{TITLE}: {', '.join(self.runs.meta['run'])}"]
        lines += [f"{m['run']}: {m[key]}" for m in self.runs.meta.to_dict("records") for key in ("label", "interpreted")
                  if isinstance(m.get(key), str)]
        lines += [f"{m['run']}: {where(m)}" for m in self.runs.meta.to_dict("records")]
        lines += [f"Verdict: {verdict(self.runs)}"] + ([] if overall_rows(self.runs).empty else
                                                         [repr(summary_table(self.runs))])
        return "\n".join(lines + [line for w in self.warnings() for line in warning_lines(w, "Warning: ")])


def launches_table(profiles: Profiles) -> Table | Note:
    """Per profiled system: kernel and graph launches, GPU kernel time and the tokens they made; one line
    where no profile saw GPU work (a CPU profile)."""
    lp = profiles.launches
    if lp.empty or lp["kernels"].isna().all():
        return Note("launches: no profile saw GPU work (a CPU profile launches no kernels)")
    return Table(lp, [("profile", "profile", 0), ("system", "system", 0), ("kernels", "kernel launches", 0),
                      ("graph_launches", "graph launches", 0), ("gpu_ns", "GPU kernel ns", 0),
                      ("output_tokens", "output tokens", 0)])


def operators_table(profiles: Profiles, top: int = 10) -> Table | Note:
    """Each profiled system's `top` host operators by self time (a PyTorch trace's), with their calls
    and share of all operators' self time. The profile is named once: in the caption when there is
    one, else on the first of its rows."""
    ops = profiles.operators
    if ops.empty:
        return Note("host operators: no trace holds them (only a PyTorch profiler trace records operators)")
    ops = ops.sort_values("self_ns", ascending=False).groupby(["profile", "system"], sort=False).head(top)
    ops = ops.assign(self_ms=ops["self_ns"] / 1e6).sort_values(["profile", "system", "self_ns"],
                                                              ascending=[True, True, False])
    names = list(dict.fromkeys(ops["profile"]))
    caption = f"the {top} operators with the most self time, per system"
    if len(names) == 1:
        ops, caption = ops.drop(columns="profile"), f"{names[0]}: {caption}"
    else:
        ops = ops.assign(profile=ops["profile"].where(ops["profile"] != ops["profile"].shift(), ""))
    return Table(ops, [("profile", "profile", 0), ("system", "system", 0), ("name", "operator", 0),
                       ("calls", "calls", 0), ("self_ms", "self ms", 1), ("share", "share", percent)],
                 caption=caption)


def parity_table(result: dict | str) -> Table | Note:
    """A `parity` result's groups: prompts compared, equal inputs, equal greedy outputs (T = 0) or equal
    sampled outputs of equal seeds (T > 0), and the divergences found by kind; `result` a string: why
    there is none."""
    if isinstance(result, str):
        return Note(result)
    if not result["groups"]:
        return Note("parity: the two runs share no system, temperature and prompt")
    rows = pd.DataFrame([{"system": g["system"], "temperature": g["temperature"], "max_concurrency":
                          g.get("max_concurrency", 1), "prompts": g["prompts"],
                          "inputs": f"{g['prompt_ids_equal']}/{g['prompts']}",
                          "greedy": "-" if g.get("outputs_equal") is None else f"{g['outputs_equal']}/{g['prompts']}",
                          "sampled": "-" if g.get("sampled_outputs_equal") is None else
                          f"{g['sampled_outputs_equal']}/{g['prompts'] if g.get('seeds_equal') is None else g['seeds_equal']}",
                          "found": ", ".join(f"{k} {n}" for k, n in g["kinds"].items() if n) or "none"}
                         for g in result["groups"]])
    return Table(rows, [("system", "system", 0), ("temperature", "T", temperature), ("max_concurrency", "c", 0),
                        ("prompts", "prompts", 0), ("inputs", "equal inputs", 0),
                        ("greedy", "equal greedy outputs", 0), ("sampled", "equal sampled outputs (same seeds)", 0),
                        ("found", "divergences", 0)])


def divergences_table(result: dict | str) -> Table | Note:
    """Each divergence of a `parity` result: system, temperature, kind, prompt, round and what differs."""
    if isinstance(result, str):
        return Note("divergences: no parity result")
    found = [{"system": g["system"], "temperature": g["temperature"], **d, "question": str(d.get("question_id"))[:12]}
             for g in result["groups"] for d in g["divergences"]]
    if not found:
        return Note("no divergences" if result["groups"] else "divergences: nothing compared")
    return Table(pd.DataFrame(found), [("system", "system", 0), ("temperature", "T", temperature), ("kind", "kind", 0),
                                       ("question", "question", 0), ("round", "round", 0), ("detail", "detail", 0)])

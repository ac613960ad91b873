"""Summaries of a run's requests: per system x temperature x category, a macro `overall`, the cells
of the comparison table (one row per system, as published DSpark comparisons print it), Markdown
and CSV. Imports neither torch nor rich, so notebooks can use it."""

from __future__ import annotations

import csv
import io
import json
import math
from collections import Counter, defaultdict
from pathlib import Path

from harness.analysis.metrics import acceptance, latency_stats, speedup, speedup_macro
from harness.analysis.records import MANIFEST, read_requests

BASELINE = "plain"  # the method of the baseline system


def _pairs(records: list[dict], baseline: dict[tuple, dict]) -> tuple[list[float], list[float]]:
    """TPOTs of the requests whose prompt equals the baseline's (a later turn's differs once an earlier
    reply did)."""
    base, mine = [], []
    for r in records:
        b = baseline.get((r["question_id"], r["turn"], r["temperature"]))
        if b is not None and b["tpot_ms"] and r["tpot_ms"] and b.get("prompt_sha256") == r.get("prompt_sha256"):
            base.append(b["tpot_ms"])
            mine.append(r["tpot_ms"])
    return base, mine


def summarize_group(records: list[dict], baseline: dict[tuple, dict], has_baseline: bool) -> dict:
    lengths = [n for r in records for n in r["acceptance_lengths"]]
    proposals = [n for r in records for n in r["proposal_lengths"]]
    accepted = [n for r in records for n in r.get("accepted_counts", [a - 1 for a in r["acceptance_lengths"]])]
    wall_s = sum(r["e2el_ms"] for r in records) / 1e3
    out_tokens = sum(r["output_tokens"] for r in records)
    row = {"requests": len(records), "output_tokens": out_tokens, "wall_s": wall_s,
           "output_throughput": out_tokens / wall_s if wall_s else None,
           **acceptance(lengths, proposals, accepted)}
    for name in ("ttft_ms", "tpot_ms", "e2el_ms"):
        row |= latency_stats(name, [r[name] for r in records])
    row |= spread("tpot_ms", [r["tpot_ms"] for r in records])
    in_time = sorted(records, key=lambda r: r.get("time_utc") or 0)
    loads = [x for r in in_time for x in r.get("load_avg") or []]
    row |= {"load_avg_before": (in_time[0].get("load_avg") or [None])[0],
            "load_avg_after": (in_time[-1].get("load_avg") or [None])[-1], "load_avg_max": max(loads, default=None)}
    for kind in ("propose", "verify", "accept", "decode", "host"):
        per_round = [ms for r in records for ms in r["round_ms"].get(kind, [])]
        row[f"mean_{kind}_ms"] = sum(per_round) / len(per_round) if per_round else None
    memory = [r["peak_memory_bytes"] for r in records if r.get("peak_memory_bytes") is not None]
    row["peak_memory_gb"] = max(memory) / 1e9 if memory else None
    greedy = [r for r in records if r.get("matches_baseline") is not None]
    row["matches_baseline"] = sum(r["matches_baseline"] is True for r in greedy) if greedy else None
    row["matches_baseline_of"] = len(greedy) if greedy else None
    s = speedup(*_pairs(records, baseline)) if has_baseline else None
    row |= s or {"speedup": None, "speedup_ci95": None, "speedup_pairs": 0}
    return row


def spread(name: str, values: list) -> dict:
    """The sample standard deviation of a per-request figure and its coefficient of variation (std / mean):
    part of it is the prompts' real differences, the rest is timing noise."""
    vals = [v for v in values if v is not None]
    if len(vals) < 2:
        return {f"std_{name}": None, f"cv_{name}": None}
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
    return {f"std_{name}": std, f"cv_{name}": std / mean if mean else None}


def expected_requests(jobs: list[tuple[str, float, str]]) -> list[dict]:
    """The run's plan, as its manifest keeps it: requests per system x temperature x category, from one
    (system, temperature, category) per request."""
    counts = Counter(jobs)
    return [{"system": s, "temperature": t, "category": c, "requests": n} for (s, t, c), n in counts.items()]


MACRO = ("spec_decode_acceptance_length", "spec_decode_acceptance_rate", "mean_ttft_ms", "mean_tpot_ms",
         "mean_e2el_ms", "output_throughput")


def summarize(records: list[dict], expected: list[dict] | None = None, cores: int | None = None) -> dict:
    """{"rows": [...]}: one row per system x temperature x category, then each system x temperature's
    `overall`: the macro average over categories (speedup: their geometric mean, with a bootstrap
    interval stratified by category), with pooled counts.

    `expected` (the manifest's plan) gives each row `requests_expected` and the summary
    `requests_done` / `requests_expected` / `complete`; `cores` is what `load_avg_max` is held against
    (a load above it means other work competed for the machine while it was timed)."""
    base_system = next((r["system"] for r in records if r["method"] == BASELINE), None)
    has_baseline = base_system is not None
    baseline = {(r["question_id"], r["turn"], r["temperature"]): r for r in records if r["system"] == base_system}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    order: list[str] = []
    for r in records:
        groups[(r["system"], r["temperature"], r["category"])].append(r)
        if r["system"] not in order:
            order.append(r["system"])
    rows = []
    for system in order:
        for temp in sorted({t for s, t, _ in groups if s == system}):
            cats = sorted(c for s, t, c in groups if s == system and t == temp)
            per_cat = []
            for cat in cats:
                row = {"system": system, "method": groups[(system, temp, cat)][0]["method"], "temperature": temp,
                       "category": cat, **summarize_group(groups[(system, temp, cat)], baseline, has_baseline)}
                per_cat.append(row)
            everything = [r for c in cats for r in groups[(system, temp, c)]]
            overall = {"system": system, "method": per_cat[0]["method"], "temperature": temp, "category": "overall",
                       **summarize_group(everything, baseline, False)}  # pooled; its speedup is the macro one below
            overall["pooled_acceptance_length"] = overall["spec_decode_acceptance_length"]
            for key in MACRO:
                vals = [row[key] for row in per_cat if row[key] is not None]
                overall[key] = sum(vals) / len(vals) if vals else None
            macro = speedup_macro([_pairs(groups[(system, temp, c)], baseline) for c in cats]) if has_baseline \
                else None
            overall |= macro or {"speedup": None, "speedup_ci95": None, "speedup_pairs": 0}
            rows += per_cat + [overall]
    plan = None if expected is None else {(e["system"], float(e["temperature"]), e["category"]): e["requests"]
                                          for e in expected}
    for row in rows:
        key = (row["system"], float(row["temperature"]))
        row["requests_expected"] = (sum(n for (s, t, _), n in plan.items() if (s, t) == key) if row["category"] ==
                                    "overall" else plan.get(key + (row["category"],))) if plan is not None else None
        if row["speedup_pairs"] < 2:  # one prompt pair has no spread: no interval to show
            row["speedup_ci95"] = None
        ci = row["speedup_ci95"]
        row["speedup_ci95_spans_1"] = bool(ci and ci[0] <= 1 <= ci[1]) if row["system"] != base_system else None
    loads = [r["load_avg_max"] for r in rows if r["load_avg_max"] is not None]
    summary = {"rows": rows, "baseline": base_system, "requests_done": len(records),
            "requests_expected": sum(plan.values()) if plan is not None else None,
            "complete": len(records) >= sum(plan.values()) if plan is not None else None,
            "cores": cores, "load_avg_max": max(loads, default=None),
            "notes": "overall = macro average over categories (speedup: geometric mean of the categories' "
                     "speedups, its interval a bootstrap stratified by category); counts, tokens, time and "
                     "percentiles pool every request; pooled_acceptance_length pools every round"}
    return summary | {"warnings": warnings(summary)}


def warnings(summary: dict) -> list[str]:
    """What a reader must know before trusting the figures: an unfinished run, a loaded machine."""
    out = []
    if summary.get("complete") is False:
        out.append(f"incomplete run: {summary['requests_done']} of {summary['requests_expected']} requests done "
                   f"(finish it with dspark-bench run --resume {summary.get('run_dir', 'DIR')})")
    if summary.get("cores") and (summary.get("load_avg_max") or 0) > summary["cores"]:
        out.append(f"noisy timing: the load average reached {summary['load_avg_max']:.1f} on {summary['cores']} "
                   "cores while requests were timed (other work competed for the CPU); compare speedups with care")
    return out


def _fmt(v, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


COLUMNS = [("system", "system"), ("T", "temperature"), ("requests", "requests"), ("tokens", "output_tokens"),
           ("time s", "wall_s"),
           ("TPOT ms", "mean_tpot_ms"), ("speedup", "speedup"), ("95% CI", "speedup_ci95"),
           ("AL", "spec_decode_acceptance_length"),
           ("accept", "spec_decode_acceptance_rate"), ("rounds", "num_rounds"), ("= plain", "matches_baseline")]


def cells(row: dict) -> list[str]:
    """A summary row's cells, in COLUMNS' order, as the table and summary.md print them."""
    cells = []
    for _, key in COLUMNS:
        v = row[key]
        if key == "speedup_ci95":
            cells.append("-" if not v else f"{v[0]:.2f}-{v[1]:.2f}")
        elif key == "speedup":
            cells.append(_fmt(v) + ("*" if row.get("speedup_ci95_spans_1") else ""))
        elif key == "requests":
            expected = row.get("requests_expected")
            cells.append(f"{v}/{expected}" if expected is not None and v < expected else str(v))
        elif key == "matches_baseline":
            cells.append("-" if v is None else f"{v}/{row['matches_baseline_of']}")
        elif key == "temperature":
            cells.append(f"{v:g}")
        elif key == "spec_decode_acceptance_rate":
            cells.append("-" if v is None else f"{100 * v:.0f}%")
        else:
            cells.append(_fmt(v, 1 if key in ("wall_s", "mean_tpot_ms") else 2))
    return cells


LEGEND = ("T: temperature; requests: requests summarised (done/expected while the run is unfinished); "
          "tokens: output tokens of those requests; time s: their summed end-to-end latency; TPOT ms: mean time "
          "per output token after the first; speedup: geometric mean over prompts of plain decoding's TPOT / "
          "this system's, paired by prompt (* when its 95% interval spans 1: no clear speedup or slowdown); "
          "95% CI: a bootstrap interval of the speedup over prompts; AL: acceptance length, tokens per verify "
          "round; accept: accepted / proposed draft tokens; rounds: verify rounds; = plain: greedy outputs equal "
          "to plain decoding's, of those compared")


def markdown(summary: dict, title: str) -> str:
    lines = [f"# {title}", ""]
    if summary.get("complete") is False:
        lines += [f"INCOMPLETE: {summary['requests_done']} of {summary['requests_expected']} requests done", ""]
    cats = list(dict.fromkeys(r["category"] for r in summary["rows"]))
    for cat in ["overall"] + [c for c in cats if c != "overall"]:
        lines += [f"## {cat}", "", "| " + " | ".join(h for h, _ in COLUMNS) + " |",
                  "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(cells(r)) + " |" for r in summary["rows"] if r["category"] == cat]
        lines.append("")
    lines += [f"**Warning**: {w}" for w in warnings(summary)] + ([""] if warnings(summary) else [])
    lines += [LEGEND, "", summary["notes"]]
    return "\n".join(lines) + "\n"


def to_csv(summary: dict) -> str:
    keys = list(dict.fromkeys(k for r in summary["rows"] for k in r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=keys)
    writer.writeheader()
    for r in summary["rows"]:
        writer.writerow({k: "|".join(map(str, v)) if isinstance(v, list) else v for k, v in r.items()})
    return buf.getvalue()




def summarize_folder(run_dir: Path) -> dict:
    """The summary of a run folder's requests (read only: a torn last line is skipped, not cut), held
    against the plan and core count in its manifest."""
    manifest_file = Path(run_dir) / MANIFEST
    manifest = json.loads(manifest_file.read_text()) if manifest_file.is_file() else {}
    summary = summarize(read_requests(run_dir), manifest.get("requests_expected"),
                        (manifest.get("provenance") or {}).get("cores"))
    summary["run_dir"] = str(Path(run_dir).resolve())
    return summary | {"warnings": warnings(summary)}

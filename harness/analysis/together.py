"""`report --together`: every system of several runs in one table, rows run x system, so that DSpark on our
engine, a draft model on vLLM and n-gram lookup on both read side by side.

Two rules make such a table honest. A speedup holds a system against the plain decoding of its own run (the
same engine, device and settings: the run's own summary computed it so); a run without plain decoding has
no speedup, and its cells say why. Acceptance is read with one definition for every engine
(`delivered`: tokens delivered per verify round, every decode step a round), not each engine's own count.
A run timed under Triton's interpreter keeps its figures, marked. Imports neither torch nor rich."""

from __future__ import annotations

from harness.analysis.metrics import MIN_PAIRS, side_text
from harness.analysis.table_text import BUSY, COLUMNS, LEGEND_OF, SWEPT, SYNTHETIC, cells, columns, marks

# the single-run table's columns, its acceptance ones replaced by the one definition every engine shares
ACCEPTANCE = {"spec_decode_acceptance_length": ("AL", "delivered_acceptance_length"),
              "spec_decode_acceptance_rate": ("accept", "delivered_acceptance_rate"),
              "num_rounds": ("rounds", "delivered_rounds")}


def _order() -> list[tuple[str, str]]:
    """Every column a run's table can have (`table_text.columns`), in the order they stand: the together
    table's columns are those its runs' tables have, in this order."""
    cols = COLUMNS[:2] + [SWEPT] + COLUMNS[2:]
    cols.insert(cols.index(("requests", "requests")) + 1, BUSY)
    for real, synthetic in SYNTHETIC.items():
        cols.insert(cols.index(real) + 1, synthetic)
    return [("run", "run"), ("engine", "engine")] + [ACCEPTANCE.get(key, (h, key)) for h, key in cols]


ORDER = _order()
TOGETHER_LEGEND = (
    "run: the run folder (A, B, ... in the order given); engine: the backend that ran it, its version and device; "
    "T: temperature; requests: requests summarised (failed ones counted, left out of the figures); tokens: their "
    "output tokens; time s: the time any of them was in flight; TPOT ms: mean time per output token after the "
    f"first; 95% CI: the speedup's Student t interval over prompts (none from fewer than {MIN_PAIRS} pairs); "
    "speedup: against the plain decoding of the same run (same engine, device and settings; a run without plain "
    "decoding has none), geometric mean over prompts of TPOT ratios, * when its 95% interval spans 1 or it has "
    "none; AL: tokens delivered per verify round, the same for every engine (overall: pooled over categories, "
    "every request's tokens over every round, not their mean): the output's tokens after the first "
    "over the decode steps that made them, a step that verified no draft (an n-gram step without a match, which "
    "vLLM does not list) counted as a round of one token, tokens an engine counted past the output's end (drafts "
    "accepted past the length limit or the stop token) not counted; accept: accepted drafts so delivered / drafts "
    "proposed; rounds: verify rounds so counted; = plain: greedy outputs equal to plain decoding's of the same run; "
    "a blank cell: a column this run's own table does not show")
SWEPT_LEGEND = "c: requests in flight at most (speedups against plain decoding at the same c of the same run)"
# where a row's acceptance comes from a served wave's counters pooling several requests (`delivered`)
BOUND_LEGEND = ("<=: an upper bound, from a served wave's counters pooled over its requests (each request's count "
                "past its own end cannot be told apart; per-request metrics give the count)")


def engine_name(manifest: dict) -> str:
    """`vllm 0.32.0 on cpu`, `native on cuda`: the backend, its version where it has one, the device."""
    settings, backend = manifest.get("settings") or {}, manifest.get("backend") or {}
    prov = manifest.get("provenance") or {}
    version = backend.get("version")
    device = prov.get("gpu") or prov.get("device") or settings.get("device") or "?"
    return f"{settings.get('backend', 'native')}{f' {version}' if version else ''} on {device}"


def together(runs: list[tuple[str, dict, dict]], category: str = "overall") -> dict:
    """{"rows", "columns", "marks", "legend"} of one table: the `category` rows of each (name, summary,
    manifest), in the order given, each naming its run and engine; `marks`: per run what its title would
    say (label, TP sizes, profiler, Triton's interpreter)."""
    rows, said_of, shown = [], {}, set()
    for name, summary, manifest in runs:
        said = marks(summary)
        if said:
            said_of[name] = said
        own = [ACCEPTANCE.get(key, (h, key)) for h, key in columns(summary)]  # (the run's own table's columns)
        shown.update(own)
        for row in summary["rows"]:
            if row["category"] == category:
                rows.append(row | {"run": name, "engine": engine_name(manifest) + (
                    " (Triton interpreter)" if summary.get("interpreted") else ""),
                    "no_plain": summary.get("baseline") is None, "interpreted": summary.get("interpreted"),
                    "columns_shown": [key for _, key in own]})
    cols = [c for c in ORDER if c in shown or c[1] in ("run", "engine")]
    keys = {key for _, key in cols}
    legend = [TOGETHER_LEGEND] + [SWEPT_LEGEND] * (SWEPT[1] in keys)
    legend += [LEGEND_OF[k] for k in (BUSY[1], "profile_acceptance_length") if k in keys]
    legend += [BOUND_LEGEND] * any(r.get("delivered_upper_bound") for r in rows)
    return {"rows": rows, "columns": cols, "marks": said_of, "legend": "; ".join(legend)}


def together_cells(row: dict, cols: list[tuple[str, str]]) -> list[str]:
    """A row's cells: the single-run table's, the system named with the method that ran where they differ,
    the speedup of a run without plain decoding saying so, an interpreted run's marked, a bound marked <=,
    a column the run's own table does not show blank."""
    out = cells(row, cols)
    for i, (_, key) in enumerate(cols):
        if key not in row.get("columns_shown", [key]) and key not in ("run", "engine"):
            out[i] = ""
        elif key in ("delivered_acceptance_length", "delivered_acceptance_rate") and row.get("delivered_upper_bound") \
                and out[i] != "-":
            out[i] = f"<={out[i]}"
        elif key == "system" and row.get("method") not in (None, row["system"]):
            out[i] = f"{row['system']} ({row['method']})"
        elif key != "speedup" or row.get("method") == "plain":
            continue
        elif row["no_plain"]:
            out[i] = f"none: no plain in {row['run']}"
        elif row.get("interpreted") and row.get("speedup") is not None:
            out[i] = f"{side_text(row['speedup'])} (interpreted)"
    return out

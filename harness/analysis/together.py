"""`report --together`: every system of several runs in one table, rows run x system, so that DSpark on our
engine, a draft model on vLLM and n-gram lookup on both read side by side.

Two rules make such a table honest. A speedup holds a system against the plain decoding of its own run (the
same engine, device and settings: the run's own summary computed it so); a run without plain decoding has
no speedup, and its cells say why. Acceptance is read with one definition for every engine
(`delivered`: tokens delivered per verify round, every decode step a round), not each engine's own count.
A run timed under Triton's interpreter keeps its figures, marked. Imports neither torch nor rich."""

from __future__ import annotations

from harness.analysis.metrics import MIN_PAIRS, side_text
from harness.analysis.table_text import COLUMNS, SWEPT, cells, marks

# the single-run table's columns, its acceptance ones replaced by the one definition every engine shares
ACCEPTANCE = {"spec_decode_acceptance_length": ("AL", "delivered_acceptance_length"),
              "spec_decode_acceptance_rate": ("accept", "delivered_acceptance_rate"),
              "num_rounds": ("rounds", "delivered_rounds")}
TOGETHER_COLUMNS = [("run", "run"), ("engine", "engine")] + [ACCEPTANCE.get(key, (h, key)) for h, key in COLUMNS]
TOGETHER_LEGEND = (
    "run: the run folder (A, B, ... in the order given); engine: the backend that ran it, its version and device; "
    "T: temperature; requests: requests summarised (failed ones counted, left out of the figures); tokens: their "
    "output tokens; time s: the time any of them was in flight; TPOT ms: mean time per output token after the "
    f"first; 95% CI: the speedup's Student t interval over prompts (none from fewer than {MIN_PAIRS} pairs); "
    "speedup: against the plain decoding of the same run (same engine, device and settings; a run without plain "
    "decoding has none), geometric mean over prompts of TPOT ratios, * when its 95% interval spans 1 or it has "
    "none; AL: tokens delivered per verify round, the same for every engine: the output's tokens after the first "
    "over the decode steps that made them, a step that verified no draft (an n-gram step without a match, which "
    "vLLM does not list) counted as a round of one token, tokens an engine counted past the output's end (drafts "
    "accepted past the length limit or the stop token) not counted; accept: accepted drafts so delivered / drafts "
    "proposed; rounds: verify rounds so counted; = plain: greedy outputs equal to plain decoding's of the same run")


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
    rows, said_of = [], {}
    for name, summary, manifest in runs:
        said = marks(summary)
        if said:
            said_of[name] = said
        for row in summary["rows"]:
            if row["category"] == category:
                rows.append(row | {"run": name, "engine": engine_name(manifest) + (
                    " (Triton interpreter)" if summary.get("interpreted") else ""),
                    "no_plain": summary.get("baseline") is None, "interpreted": summary.get("interpreted")})
    swept = any(r.get("max_concurrency", 1) != 1 for r in rows)
    cols = TOGETHER_COLUMNS[:4] + [SWEPT] + TOGETHER_COLUMNS[4:] if swept else list(TOGETHER_COLUMNS)
    return {"rows": rows, "columns": cols, "marks": said_of,
            "legend": TOGETHER_LEGEND + ("; c: requests in flight at most (speedups against plain decoding at the same "
                                         "c of the same run)" if swept else "")}


def together_cells(row: dict, cols: list[tuple[str, str]]) -> list[str]:
    """A row's cells: the single-run table's, the system named with the method that ran where they differ,
    the speedup of a run without plain decoding saying so, an interpreted run's marked."""
    out = cells(row, cols)
    for i, (_, key) in enumerate(cols):
        if key == "system" and row.get("method") not in (None, row["system"]):
            out[i] = f"{row['system']} ({row['method']})"
        elif key != "speedup" or row.get("method") == "plain":
            continue
        elif row["no_plain"]:
            out[i] = f"none: no plain in {row['run']}"
        elif row.get("interpreted") and row.get("speedup") is not None:
            out[i] = f"{side_text(row['speedup'])} (interpreted)"
    return out

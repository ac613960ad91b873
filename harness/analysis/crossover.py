"""Where a speculative system stops paying as the batch fills: served sweeps (`dspark-bench run --backend
vllm-server --max-concurrency ...`) of plain decoding and one speculative system, run in both orders (plain
first, then the system first) so a drift across the session moves both sides, read per concurrency level.

Per level: the TPOT speedup (the summary's per-prompt paired one: plain TPOT over the system's, prompt by
prompt, its t interval stratified by run and category) pooled over both orders where the orders agree (their
intervals overlap); where they disagree the interval is the hull of the two orders' intervals, and the row
says so. The output throughput ratio gets an interval over the runs (each run's ratio, a t interval on their
logs): from 2 runs it has 1 degree of freedom (t = 12.7) and is wide; from 1 run there is none; the row says
which. THE CROSSOVER, for TPOT and throughput separately: the lowest level whose interval reaches 1 (its
lower end <= 1), with the bracket it lies in (from the last level whose interval lay wholly above 1), or "not
reached up to L". Where `engine-bench --against vllm` timed vLLM's plain step and DSpark round at a batch of
the level's size, the derived speedup AL x step(b) / round(b) (`study.derived`) and measured over derived,
flagged past 10 %. Random weights and synthetic acceptance time systems, never drafts: every table says so.

No torch, no rich: `benchmarks/study_report.py` and tests import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.analysis.metrics import interval_text, ratio_interval, side_text, speedup_with_contention
from harness.analysis.records import read_manifest, requests_and_notes
from harness.analysis.study import derived, vllm_level_costs
from harness.analysis.summary import pair_key, paired_tpots, summarize_folder, uncontended_tpot

OFF_BY = 0.10  # measured over derived further than this from 1 is flagged
T_AT_1_DF = "2 runs: a t interval at 1 degree of freedom (t = 12.7), wide"


@dataclass
class Sweep:
    """One run folder of the pair: which system it served first, its summary and its finished requests."""
    path: Path
    first: str
    summary: dict
    records: list[dict]


def read_sweeps(runs: list[Path]) -> list[Sweep]:
    """The run folders, each with the system it served first (its manifest's `--systems` order)."""
    out = []
    for run in runs:
        manifest = read_manifest(run) or {}
        order = (manifest.get("options") or {}).get("systems") or (manifest.get("settings") or {}).get("systems") or []
        records, _ = requests_and_notes(run)
        out.append(Sweep(Path(run), order[0] if order else "?", summarize_folder(run),
                         [r for r in records if not r.get("failed")]))
    return out


def _groups(sweeps: list[Sweep], system: str, level: int, quiet: bool) -> list[tuple[list[float], list[float]]]:
    """(plain TPOTs, system TPOTs) paired by prompt, one group per run and category (`summary.paired_tpots`)."""
    groups = []
    for sw in sweeps:
        base = {pair_key(r): r for r in sw.records if r["method"] == "plain"}
        mine = [r for r in sw.records if r["system"] == system and r.get("max_concurrency", 1) == level]
        for cat in sorted({r["category"] for r in mine}):
            rows = [r for r in mine if r["category"] == cat]
            groups.append(paired_tpots(rows, base, uncontended_tpot(sw.records)) if quiet else paired_tpots(rows, base))
    return groups


def tpot_speedup(sweeps: list[Sweep], system: str, level: int) -> dict | None:
    """The summary's paired TPOT speedup over `sweeps` together, its interval widened for contention."""
    return speedup_with_contention(_groups(sweeps, system, level, False), _groups(sweeps, system, level, True))


def _overlap(a: list[float], b: list[float]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def pooled_tpot(sweeps: list[Sweep], system: str, level: int) -> dict:
    """The TPOT speedup pooled over both orders, and per order; where the orders' intervals do not overlap
    (an order effect or a drift the balance does not cancel) the interval is the hull of theirs."""
    orders = {first: [sw for sw in sweeps if sw.first == first] for first in dict.fromkeys(sw.first for sw in sweeps)}
    per = {first: tpot_speedup(group, system, level) for first, group in orders.items()}
    pooled = tpot_speedup(sweeps, system, level)
    if pooled is None:
        return {"speedup": None, "ci": None, "pairs": 0, "pooling": "no pairs", "per_order": {}}
    cis = [p["speedup_ci95"] for p in per.values() if p]
    out = {"speedup": pooled["speedup"], "ci": pooled["speedup_ci95"], "pairs": pooled["speedup_pairs"],
           "reason": pooled.get("speedup_ci95_reason"),
           "per_order": {f"{first} first": (p["speedup"], p["speedup_ci95"]) for first, p in per.items() if p}}
    if len(orders) < 2:
        out["pooling"] = "one order only: a drift across the session is not balanced"
    elif len(cis) < len(orders):
        out["pooling"] = "pooled; the orders' agreement untested (an order with too few pairs for an interval)"
    elif all(_overlap(a, b) for a in cis for b in cis):
        out["pooling"] = "pooled over both orders (their intervals overlap)"
    else:
        out["ci"] = [min(c[0] for c in cis), max(c[1] for c in cis)]
        out["pooling"] = "orders disagree: the interval is the hull of both orders' (" + "; ".join(
            f"{k} {v[0]:.2f}x {interval_text(v[1])}" for k, v in out["per_order"].items()) + ")"
    return out


def throughput_ratio(sweeps: list[Sweep], system: str, level: int) -> dict:
    """Each run's output throughput ratio (system over plain at the level, the summary's
    `throughput_speedup`), their geometric mean and a t interval over the runs."""
    rows = [r for sw in sweeps for r in sw.summary["rows"] if r["category"] == "overall"
            and r["system"] == system and r["max_concurrency"] == level and r.get("throughput_speedup")]
    ratios = [r["throughput_speedup"] for r in rows]
    if not ratios:
        return {"ratio": None, "ci": None, "per_run": [], "note": "no throughput in any run"}
    fit = ratio_interval([ratios])
    note = {1: "1 run: no interval", 2: T_AT_1_DF}.get(len(ratios), f"{len(ratios)} runs")
    return {"ratio": fit["centre"], "ci": fit["ci"], "per_run": ratios, "note": note}


def unfit(sweeps: list[Sweep], bench: dict) -> str | None:
    """Why `bench`'s step costs cannot derive these runs' speedups, or None: they must come from the runs' GPU
    at the runs' target shapes (a derivation from another machine or model says nothing of these runs)."""
    shape = ((bench.get("shapes") or {}).get("target") or {}).get("name")
    for sw in sweeps:
        manifest = read_manifest(sw.path) or {}
        gpu = (manifest.get("provenance") or {}).get("gpu")
        target = str((manifest.get("settings") or {}).get("target"))
        if gpu != bench.get("device_name") or not shape or target.split(":")[-1] != shape:
            return (f"no derivation: the step costs are {shape} on {bench.get('device_name')}, "
                    f"{sw.path.name} ran {target} on {gpu or 'no GPU'}")
    return None


def levels(sweeps: list[Sweep], system: str, bench: dict | None = None) -> list[dict]:
    """One row per concurrency level the system ran at: TPOT speedup (pooled), throughput ratio, AL, and
    with `bench` (`engine-bench --against vllm --json` on the runs' GPU at their target's shapes: `unfit`)
    the derived speedup and measured over derived."""
    refused = unfit(sweeps, bench) if bench else "no engine-bench step costs given"
    costs = {} if refused else vllm_level_costs(bench)
    found = sorted({r["max_concurrency"] for sw in sweeps for r in sw.summary["rows"] if r["system"] == system})
    out = []
    for c in found:
        als = [r.get("spec_decode_acceptance_length") for sw in sweeps for r in sw.summary["rows"]
               if r["category"] == "overall" and r["system"] == system and r["max_concurrency"] == c]
        al = sum(als) / len(als) if als and None not in als else None
        row = {"concurrency": c, "tpot": pooled_tpot(sweeps, system, c), "throughput": throughput_ratio(sweeps, system, c),
               "al": al, "derived": derived(al, *costs[c]) if c in costs else None,
               "derived_note": refused or (None if c in costs else f"engine-bench timed no batch of {c}")}
        d = row["derived"]
        row["tpot_over_derived"] = row["tpot"]["speedup"] / d if d and row["tpot"]["speedup"] else None
        row["throughput_over_derived"] = row["throughput"]["ratio"] / d if d and row["throughput"]["ratio"] else None
        row["off"] = [k for k in ("tpot_over_derived", "throughput_over_derived")
                      if row[k] is not None and abs(row[k] - 1) > OFF_BY]
        out.append(row)
    return out


def crossover(points: list[tuple[int, float | None, list[float] | None]]) -> dict:
    """The lowest level whose interval reaches 1, from (level, centre, interval) rows in any order: its
    bracket (the last level below it whose interval lay wholly above 1) and the evidence; levels without
    an interval are skipped and named, and so are higher levels whose interval lies wholly above 1 again.
    "not reached up to L" where no interval reaches 1."""
    points = sorted(points)
    untested = [c for c, _, ci in points if not ci]
    above = None
    for c, centre, ci in points:
        if not ci:
            continue
        if ci[0] <= 1:
            said = f"{c} ({side_text(centre)}x, 95 % CI {interval_text(ci)})"
            if above is None:
                where = f"at or below {c}"
                evidence = said
            else:
                where = f"between {above[0]} and {c}"
                evidence = f"{above[0]} ({side_text(above[1])}x, 95 % CI {interval_text(above[2])}) to {said}"
            skipped = [u for u in untested if (above is None or u > above[0]) and u < c]
            again = [k for k, _, i in points if k > c and i and i[0] > 1]  # (noise, or a cost that falls again)
            return {"level": c, "bracket": [above[0] if above else None, c], "text": where, "evidence": evidence,
                    "untested_between": skipped, "above_again": again}
        above = (c, centre, ci)
    top = points[-1][0] if points else None
    return {"level": None, "bracket": [above[0] if above else None, None], "untested_between": untested, "above_again": [],
            "text": f"not reached up to {top}" if above else "no level has an interval", "evidence":
            f"{above[0]} ({side_text(above[1])}x, 95 % CI {interval_text(above[2])})" if above else ""}


def crossovers(rows: list[dict]) -> dict:
    """The crossover by TPOT speedup and by output throughput ratio, each on its own."""
    return {"tpot": crossover([(r["concurrency"], r["tpot"]["speedup"], r["tpot"]["ci"]) for r in rows]),
            "throughput": crossover([(r["concurrency"], r["throughput"]["ratio"], r["throughput"]["ci"]) for r in rows])}


def caption(sweeps: list[Sweep]) -> str:
    """What ran, from the runs' manifests and labels: the engine and its version, the GPU (or the CPU), and
    random weights / synthetic acceptance where the runs had them, else that real weights and acceptance ran."""
    manifests = [read_manifest(sw.path) or {} for sw in sweeps]
    versions = sorted({str((m.get("backend") or {}).get("version")) for m in manifests})
    devices = sorted({(m.get("provenance") or {}).get("gpu") or (m.get("provenance") or {}).get("cpu") or "?"
                      for m in manifests})
    labels = sorted({sw.summary.get("label") or "real weights, real acceptance" for sw in sweeps})
    return (f"vLLM {', '.join(versions)} served, {', '.join(devices)}, {'; '.join(labels)}, "
            f"{len(sweeps)} runs ({', '.join(f'{sw.first} first' for sw in sweeps)})")


def _x(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def markdown(system: str, rows: list[dict], found: dict, caption: str) -> list[str]:
    """The crossover table, then the two crossovers in words, under `caption` (random weights, synthetic
    acceptance, engine and GPU)."""
    lines = [f"## Where {system} stops paying: {caption}", "",
             "| c | TPOT speedup | 95 % CI | pairs | pooling | tok/s ratio | 95 % CI | per run | AL | derived | "
             "TPOT / derived | tok/s / derived |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t, th = r["tpot"], r["throughput"]
        flag = " (off > 10 %)" if r["off"] else ""
        lines.append(f"| {r['concurrency']} | {_x(t['speedup'])} | {interval_text(t['ci']) if t['ci'] else '-'} | "
                     f"{t['pairs']} | {t['pooling']} | {_x(th['ratio'])} | "
                     f"{interval_text(th['ci']) if th['ci'] else '-'} | "
                     f"{', '.join(f'{v:.2f}' for v in th['per_run'])} ({th['note']}) | {_x(r['al'])} | "
                     f"{_x(r['derived']) if r['derived'] else r['derived_note']} | {_x(r['tpot_over_derived'], 3)} | "
                     f"{_x(r['throughput_over_derived'], 3)}{flag} |")
    for key, name in (("tpot", "TPOT speedup"), ("throughput", "output throughput ratio")):
        f = found[key]
        lines.append(f"\nCrossover by {name}: {f['text']}" + (f"; {f['evidence']}" if f["evidence"] else "") +
                     (f"; no interval at {', '.join(map(str, f['untested_between']))}" if f["untested_between"] else "") +
                     (f"; wholly above 1 again at {', '.join(map(str, f['above_again']))}" if f["above_again"] else ""))
    return lines

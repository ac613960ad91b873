"""A proposal-length policy against verifying every draft, at each concurrency level, from served runs
(`dspark-bench run --backend vllm-server` with `--max-concurrency`): vLLM's DSpark with adaptive
verification (a system with `confidence = "schedule"`) beside the same draft without it. Runs that hold
both systems in opposite orders (A B, then B A) let a drift across the session move both sides. Per
temperature and concurrency: each system's output throughput in each run, the ratio (policy over all
drafts) per run and their geometric mean, the acceptance length, the drafts verified per round (the
server's counters: draft tokens over speculative steps), and at T = 0 how many requests gave the same
tokens under both, beside how many gave the same tokens in two runs of the one system (the control:
vLLM in bfloat16 is not batch-invariant). vLLM counts the drafts it scheduled (all of them), not the
ones adaptive verification kept, so "verified per round" cannot show its cut. Needs neither torch nor
rich (`benchmarks/vllm_adaptive.py` prints it; the speed notebook shows it).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from harness.analysis.records import read_manifest, read_requests


def policy_pairs(runs: list[Path]) -> list[tuple[str, str]]:
    """(system verifying every draft, system with a policy) of the same draft, from the runs' manifests."""
    pairs: list[tuple[str, str]] = []
    for run in runs:
        manifest = read_manifest(run) or {}
        ran = set((manifest.get("settings") or {}).get("systems") or [])
        # (a run from before systems were recorded in the manifest, or a bare folder, has no policy to pair)
        systems = [s for s in (manifest.get("experiment") or {}).get("systems") or [] if s["name"] in ran]
        for policy in (s for s in systems if s.get("confidence", "off") != "off"):
            base = next((s["name"] for s in systems if s.get("confidence", "off") == "off"
                         and s.get("draft") == policy.get("draft") and s.get("method") == policy.get("method")), None)
            if base and (base, policy["name"]) not in pairs:
                pairs.append((base, policy["name"]))
    return pairs


def overall(run: Path) -> dict[tuple, dict]:
    """(system, temperature, concurrency) -> the summary's overall row of that run."""
    rows = json.loads((run / "summary.json").read_text())["rows"]
    return {(r["system"], r["temperature"], r["max_concurrency"]): r for r in rows if r["category"] == "overall"}


def _greedy_ids(records: list[dict], system: str) -> dict[tuple, list[int]]:
    """(concurrency, question) -> output ids of `system`'s requests at T = 0."""
    return {(r["max_concurrency"], r["question_id"]): r["output_ids"] for r in records
            if r["system"] == system and r["temperature"] == 0 and r.get("output_ids") is not None}


def _tally(pairs: list[tuple[dict, dict]]) -> dict[tuple, tuple[int, int]]:
    """(0.0, concurrency) -> (requests with equal ids on both sides, requests on both sides), over the pairs."""
    out: dict[tuple, list[int]] = {}
    for first, second in pairs:
        for (c, q), ids in first.items():
            if (c, q) in second:
                tally = out.setdefault((0.0, c), [0, 0])
                tally[0] += ids == second[(c, q)]
                tally[1] += 1
    return {k: (v[0], v[1]) for k, v in out.items()}


def same_tokens(records: list[list[dict]], a: str, b: str) -> dict[tuple, tuple[int, int]]:
    """How many T = 0 requests gave the same tokens under a and b, run by run (`_tally`)."""
    return _tally([(_greedy_ids(recs, a), _greedy_ids(recs, b)) for recs in records])


def run_to_run(records: list[list[dict]], system: str) -> dict[tuple, tuple[int, int]]:
    """The control for `same_tokens`: how many T = 0 requests of `system` gave the same tokens in the first two
    runs. vLLM in bfloat16 is not batch-invariant, so a greedy output can change between two runs of one system."""
    return _tally([(_greedy_ids(records[0], system), _greedy_ids(records[1], system))]) if len(records) > 1 else {}


def _mean(values: list[float | None]) -> float | None:
    """The mean, rounded; None where a run lacks the figure (a native run has no server counters)."""
    return None if not values or None in values else round(sum(values) / len(values), 3)


def _per_round(row: dict) -> float | None:
    drafts, rounds = row.get("spec_decode_num_draft_tokens"), row.get("num_rounds")
    return drafts / rounds if drafts is not None and rounds else None


def compare(runs: list[Path], a: str, b: str) -> list[dict]:
    """One row per (temperature, concurrency) that both systems ran in at least one run: `a` (all drafts)
    against `b` (the policy), the runs' figures side by side and the ratio's geometric mean over them."""
    tables = [overall(run) for run in runs]
    keys = sorted({(t, c) for tab in tables for (s, t, c) in tab if s == a})
    records = [read_requests(run) for run in runs]
    equal, control = same_tokens(records, a, b), run_to_run(records, a)
    rows = []
    for t, c in keys:
        pairs = [(tab.get((a, t, c)), tab.get((b, t, c))) for tab in tables]
        pairs = [(x, y) for x, y in pairs if x and y]
        if not pairs:
            continue
        ratios = [y["output_throughput"] / x["output_throughput"] for x, y in pairs]

        xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
        rows.append({
            "temperature": t, "concurrency": c,
            f"{a}_tok_s": [round(x["output_throughput"], 1) for x in xs],
            f"{b}_tok_s": [round(y["output_throughput"], 1) for y in ys],
            "ratio_per_run": [round(r, 3) for r in ratios],
            "ratio_geomean": round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 3),
            f"{a}_al": _mean([x.get("spec_decode_acceptance_length") for x in xs]),
            f"{b}_al": _mean([y.get("spec_decode_acceptance_length") for y in ys]),
            f"{a}_verified_per_round": _mean([_per_round(x) for x in xs]),
            f"{b}_verified_per_round": _mean([_per_round(y) for y in ys]),
            f"{a}_tpot_ms": _mean([x.get("mean_tpot_ms") for x in xs]),
            f"{b}_tpot_ms": _mean([y.get("mean_tpot_ms") for y in ys]),
            "greedy_equal": equal.get((t, c)), f"greedy_equal_{a}_run_to_run": control.get((t, c)),
        })
    return rows

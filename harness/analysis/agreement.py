"""Two load generators held against each other on one server (`benchmarks/load_generators.py`, issue 56):
what must be equal (requests, output tokens, the server's counter-based acceptance), how far the timings
part, with an interval over the interleaved pairs, and the cause of the gap stated from what was measured.

Why here and torch-free: the comparison is plain arithmetic over run summaries and CPU readings, so a
report or a test can redo it without the benchmark's processes; the benchmark only measures.
"""

from __future__ import annotations

import math
from statistics import mean

from harness.analysis.metrics import t_quantile

TIMINGS = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
           "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "output_throughput")
EQUAL = ("requests", "output_tokens", "counter_acceptance")
# The cause thresholds: a gap under NEAR is agreement; a client busier than BUSY of a core is overhead;
# a machine whose server and clients together ask more than FULL of its cores shares them; a client with
# LATE more of its chunk gaps under TOGETHER ms than the other read its stream late.
NEAR, BUSY, FULL, TOGETHER, LATE = 0.05, 0.5, 0.9, 0.05, 0.2


def run_figures(row: dict, waves: list[dict], records: list[dict]) -> dict:
    """One run's figures at one level: the summary row's counts and timings (`vllm bench serve`'s
    definitions, as every table), the server's counter growth over its waves (accepted drafts per
    drafted token, and drafted/accepted counts), and chunks per request (ITL is per chunk)."""
    counters = [w["spec_counters"] for w in waves if w.get("spec_counters")]
    drafted = sum(c["num_draft_tokens"] for c in counters)
    accepted = sum(c["num_accepted_draft_tokens"] for c in counters)
    done = [r for r in records if not r.get("failed")]
    return {"requests": row["requests"], "failed": row["failed"], "output_tokens": row["output_tokens"],
            **{k: row.get(k) for k in TIMINGS},
            "counter_acceptance": f"{accepted}/{drafted}" if counters else None,
            "chunks_per_request": mean(len(r.get("itl_ms") or []) + 1 for r in done) if done else None,
            "gaps_together": together([x for r in done for x in r.get("itl_ms") or []])}


def together(gaps: list[float]) -> float | None:
    """The share of chunk gaps under TOGETHER ms: chunks read in one go. vLLM sends a decode step's chunk
    milliseconds apart, so a client whose process read the socket late (busy cores) finds the chunks
    piled up and stamps them together: its ITL collapses to zero and its TTFT takes the whole wait."""
    return sum(g < TOGETHER for g in gaps) / len(gaps) if gaps else None


def paired(ours: list[float], theirs: list[float], level: float = 0.95) -> dict:
    """`theirs - ours` over interleaved pairs: the mean difference, as a share of ours, and a t interval
    over the pairs (none with fewer than two)."""
    diffs = [t - o for o, t in zip(ours, theirs) if o is not None and t is not None]
    if not diffs:
        return {"ours": None, "theirs": None, "diff": None, "rel": None, "ci95": None, "pairs": 0}
    base = mean(o for o in ours if o is not None)
    d = mean(diffs)
    ci = None
    if len(diffs) > 1:
        sd = math.sqrt(sum((x - d) ** 2 for x in diffs) / (len(diffs) - 1))
        half = t_quantile(0.5 + level / 2, len(diffs) - 1) * sd / math.sqrt(len(diffs))
        ci = [d - half, d + half]
    return {"ours": base, "theirs": mean(t for t in theirs if t is not None), "diff": d,
            "rel": d / base if base else None, "ci95": ci, "pairs": len(diffs)}


def mismatches(ours: list[dict], theirs: list[dict]) -> list[str]:
    """What should be equal pair by pair and is not, named (empty where every pair agrees)."""
    out = []
    for i, (o, t) in enumerate(zip(ours, theirs)):
        out += [f"pair {i + 1}: {k} ours {o[k]} aiperf {t[k]}" for k in EQUAL if o[k] != t[k]]
        out += [f"pair {i + 1}: {name} failed {r['failed']}" for name, r in (("ours", o), ("aiperf", t)) if r["failed"]]
    return out


def cause(comparison: dict, cpu: dict, cores: int) -> str:
    """Why the two part at a level, from what was measured: agreement where TPOT and throughput are
    within NEAR; else chunking where the chunks per request differ (ITL and TPOT then count other
    gaps), late reads where one client stamped many more chunks together (`together`), client overhead where AIPerf's processes used more than BUSY of a core beyond ours, and
    shared cores where the server and the load generator together asked more than FULL of the cores."""
    said = []
    tpot, tput = comparison["mean_tpot_ms"]["rel"], comparison["output_throughput"]["rel"]
    chunks = comparison["chunks_per_request"]
    if chunks["ours"] and chunks["theirs"] and abs(chunks["theirs"] / chunks["ours"] - 1) > NEAR:
        said.append(f"chunking ({chunks['ours']:.1f} vs {chunks['theirs']:.1f} chunks a request)")
    late = comparison["gaps_together"]
    if late["ours"] is not None and late["theirs"] is not None and abs(late["theirs"] - late["ours"]) > LATE:
        said.append(f"late reads ({100 * late['ours']:.0f} % vs {100 * late['theirs']:.0f} % of chunk gaps under "
                    f"{TOGETHER} ms: chunks that piled up, read in one go)")
    extra = cpu["aiperf"]["client_cores"] - cpu["ours"]["client_cores"]
    if extra > BUSY:
        said.append(f"client overhead (AIPerf {cpu['aiperf']['client_cores']:.2f} cores, ours "
                    f"{cpu['ours']['client_cores']:.2f})")
    busy = cpu["aiperf"]["client_cores"] + (cpu["aiperf"]["server_cores"] or 0)  # (server unread: the client's)
    if busy > FULL * cores:
        said.append(f"shared cores (server + AIPerf {busy:.2f} of {cores})")
    agree = all(x is not None and abs(x) <= NEAR for x in (tpot, tput))
    if agree:
        return "agree within 5 % on TPOT and throughput" + (f"; seen: {'; '.join(said)}" if said else "")
    return "; ".join(said) or "not found in the CPU and chunk readings (the timings part without a measured cause)"


def compare(ours: list[dict], theirs: list[dict]) -> dict:
    """Every timing and the chunk count side by side over the pairs."""
    return {k: paired([o[k] for o in ours], [t[k] for t in theirs]) for k in (*TIMINGS, "chunks_per_request", "gaps_together")}

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
# The thresholds: a difference whose whole 95 % interval lies within NEAR of ours is agreement; a client
# busier than BUSY of a core beyond the other in every pair is overhead; a server and AIPerf asking more
# than FULL of the cores in every pair share them; a client with LATE more of its chunk gaps under
# TOGETHER ms than the other (higher in every pair) read its stream late.
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
    """`theirs - ours` over interleaved pairs: the mean difference, as a share of ours, a t interval over
    the pairs (none with fewer than two) and each pair's difference (a cause needs their signs)."""
    diffs = [t - o for o, t in zip(ours, theirs) if o is not None and t is not None]
    if not diffs:
        return {"ours": None, "theirs": None, "diff": None, "rel": None, "ci95": None, "pairs": 0, "diffs": []}
    base = mean(o for o in ours if o is not None)
    d = mean(diffs)
    ci = None
    if len(diffs) > 1:
        sd = math.sqrt(sum((x - d) ** 2 for x in diffs) / (len(diffs) - 1))
        half = t_quantile(0.5 + level / 2, len(diffs) - 1) * sd / math.sqrt(len(diffs))
        ci = [d - half, d + half]
    return {"ours": base, "theirs": mean(t for t in theirs if t is not None), "diff": d,
            "rel": d / base if base else None, "ci95": ci, "pairs": len(diffs), "diffs": diffs}


def mismatches(ours: list[dict], theirs: list[dict]) -> list[str]:
    """What should be equal pair by pair and is not, named (empty where every pair agrees)."""
    out = []
    for i, (o, t) in enumerate(zip(ours, theirs)):
        out += [f"pair {i + 1}: {k} ours {o[k]} aiperf {t[k]}" for k in EQUAL if o[k] != t[k]]
        out += [f"pair {i + 1}: {name} failed {r['failed']}" for name, r in (("ours", o), ("aiperf", t)) if r["failed"]]
    return out


def verdict(c: dict) -> str:
    """TPOT's or throughput's verdict from the whole 95 % interval, never the mean alone: two pairs whose
    mean differs by 1 % may still span +-57 %. Agreement only where the interval lies within NEAR of ours;
    a difference only where it excludes zero; else no difference detected, with the interval's reach."""
    if c["pairs"] < 2 or not c["ours"]:
        return "one pair: no verdict"
    lo, hi = (100 * x / c["ours"] for x in c["ci95"])
    if -100 * NEAR <= lo and hi <= 100 * NEAR:
        return f"agree within {100 * NEAR:.0f} % ({lo:+.1f} to {hi:+.1f} %)"
    if lo > 0 or hi < 0:
        return f"AIPerf {100 * c['rel']:+.1f} % ({lo:+.1f} to {hi:+.1f} %)"
    return f"no difference detected (interval +-{max(-lo, hi):.0f} %)"


def shown(c: dict) -> bool:
    """Whether the pairs show a difference at all: two or more, and every pair's difference of one sign
    or the interval clear of zero. A mean carried by one pair of three names no cause."""
    diffs = c["diffs"]
    same = all(x > 0 for x in diffs) or all(x < 0 for x in diffs)
    return len(diffs) > 1 and (same or (c["ci95"] is not None and (c["ci95"][0] > 0 or c["ci95"][1] < 0)))


def readings(comparison: dict, pairs: list[dict], cores: int) -> list[str]:
    """What the level's readings show, each held in every pair: late reads (and which client read late),
    AIPerf's client overhead, the server and AIPerf sharing the cores (only where the server was read),
    and other load on the machine (the 1-minute load average above the core count in every wave)."""
    said = []
    late = comparison["gaps_together"]
    if late["pairs"] > 1 and shown(late) and abs(late["diff"]) > LATE:
        who, other = ("AIPerf", "ours") if late["diff"] > 0 else ("ours", "AIPerf")
        hi, lo = (late["theirs"], late["ours"]) if who == "AIPerf" else (late["ours"], late["theirs"])
        ahead = sum((x > 0) == (late["diff"] > 0) for x in late["diffs"])
        said.append(f"late reads by {who} ({100 * hi:.0f} % of its chunk gaps under {TOGETHER} ms, {other} "
                    f"{100 * lo:.0f} %, higher in {ahead} of {late['pairs']} pairs: chunks piled up, read in one go)")
    cpu = {g: [p[g]["cpu"] for p in pairs] for g in ("ours", "aiperf")}
    client = {g: mean(c["client_cores"] for c in cpu[g]) for g in cpu}
    if len(pairs) > 1 and all(t["client_cores"] - o["client_cores"] > BUSY for o, t in zip(cpu["ours"], cpu["aiperf"])):
        said.append(f"client overhead (AIPerf {client['aiperf']:.2f} cores, ours {client['ours']:.2f})")
    served = [c["server_cores"] for c in cpu["aiperf"]]
    if len(pairs) > 1 and None not in served and all(
            c["client_cores"] + c["server_cores"] > FULL * cores for c in cpu["aiperf"]):
        said.append(f"shared cores (server {mean(served):.2f} + AIPerf {client['aiperf']:.2f} of {cores} cores)")
    loads = [c["load_avg"] for g in cpu for c in cpu[g]]
    if len(pairs) > 1 and min(loads) > cores:
        said.append(f"other load on the machine: load average {min(loads):.1f} to {max(loads):.1f} on {cores} cores")
    return said


def cause(comparison: dict, pairs: list[dict], cores: int) -> str:
    """The level's verdict on TPOT and throughput (`verdict`), then why they part, from readings that test
    it (`readings`): "cause" where an interval shows a difference, "seen" where none is shown. Chunking
    changes ITL (a gap per chunk), not TPOT or throughput: it stays a note on ITL, never a cause."""
    tpot, tput = verdict(comparison["mean_tpot_ms"]), verdict(comparison["output_throughput"])
    if tpot == tput == "one pair: no verdict":
        return tpot
    said = readings(comparison, pairs, cores)
    out = f"TPOT {tpot}; throughput {tput}"
    if tpot.startswith("AIPerf") or tput.startswith("AIPerf"):
        out += f"; cause: {'; '.join(said)}" if said else "; cause not found in the load, CPU and chunk readings"
    elif said:
        out += f"; seen: {'; '.join(said)}"
    chunks = comparison["chunks_per_request"]
    if chunks["ours"] and shown(chunks) and abs(chunks["rel"]) > NEAR:
        out += f"; ITL note: {chunks['ours']:.1f} vs {chunks['theirs']:.1f} chunks a request (ITL is per chunk)"
    return out


def compare(ours: list[dict], theirs: list[dict]) -> dict:
    """Every timing and the chunk count side by side over the pairs."""
    return {k: paired([o[k] for o in ours], [t[k] for t in theirs]) for k in (*TIMINGS, "chunks_per_request", "gaps_together")}

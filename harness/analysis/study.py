"""Measured against derived: a synthetic run's speedups beside the ones step costs predict.

A speedup can be *derived* from step costs alone: a round that emits AL tokens and costs R, against
plain decoding's step D, gives AL x D / R. `engine-bench` times D and R in isolation (CUDA events,
graphs replayed, no host); a run *measures* the speedup end to end (plain TPOT over the system's,
paired by prompt). Their ratio is what the derivation leaves out: host time between steps, the
scheduler, sampling, the context growing through a request. For our engine the run's own step
timers split the round (propose, verify, accept, host), so the gap is named part by part; for vLLM,
whose steps we do not time, the derivation uses `engine-bench --against vllm`'s step costs at each
concurrency level. Random weights and synthetic acceptance: these time systems, never drafts.

No torch, no rich: notebooks and `benchmarks/study_report.py` import it.
"""

from __future__ import annotations

BLOCK_METHODS = ("dspark", "dflash")  # what engine-bench's block-draft round times (DFlash: no Markov head, a bound)


def derived(al: float | None, step_ms: float | None, round_ms: float | None) -> float | None:
    """AL x step / round: the speedup the step costs predict (None where a figure is missing)."""
    if not al or not step_ms or not round_ms:
        return None
    return al * step_ms / round_ms


def bench_costs(engine_bench: dict) -> dict[str, tuple[float, float]]:
    """{method: (plain step ms, round ms)} from our `engine-bench --json`: the block draft's round for
    DSpark (and, as an upper bound on its cost, DFlash), EAGLE-3's where it was timed."""
    step = engine_bench["decode_ms"]
    out = {m: (step, engine_bench["round_ms"]) for m in BLOCK_METHODS}
    eagle3 = engine_bench.get("eagle3") or {}
    if eagle3.get("round_ms"):
        out["eagle3"] = (step, eagle3["round_ms"])
    return out


def predicted_costs(engine_bench: dict) -> dict[str, tuple[float, str]]:
    """{method: (round cost in plain decode steps, whose round it is)} from our `engine-bench --json`
    (`bench_costs`), for drawing AL / round cost against the systems of those methods only: n-gram and
    any method engine-bench did not time get no prediction. Empty where the file holds no step costs."""
    if not engine_bench.get("decode_ms") or not engine_bench.get("round_ms"):
        return {}
    block = ((engine_bench.get("shapes") or {}).get("draft") or {}).get("name") or "the block draft"
    whose = {"dspark": f"{block}'s round", "dflash": f"{block}'s round, at least DFlash's",
             "eagle3": f"{(engine_bench.get('eagle3') or {}).get('name') or 'EAGLE-3'}'s round"}
    return {m: (rnd / step, whose[m]) for m, (step, rnd) in bench_costs(engine_bench).items()}


def vllm_level_costs(engine_bench: dict) -> dict[int, tuple[float, float]]:
    """{concurrency: (vLLM plain step ms, vLLM DSpark round ms)} from `engine-bench --against vllm --json`."""
    levels = (engine_bench.get("against_vllm") or {}).get("levels") or []
    return {lv["concurrency"]: (lv["plain_ms"]["median"], lv["dspark_round_ms"]["median"]) for lv in levels
            if lv.get("plain_ms") and lv.get("dspark_round_ms")}


def derived_from_bench(engine_bench: dict, profiles: list[dict]) -> list[dict]:
    """Per profile (`Synthetic.to_dict`: its name and mean length): the speedups `engine-bench`'s step costs
    derive at its mean acceptance length: the block draft's (DSpark), EAGLE-3's where it was timed, and
    vLLM's per concurrency level where it ran against vLLM."""
    ours = bench_costs(engine_bench)
    vllm = vllm_level_costs(engine_bench)
    out = []
    for p in profiles:
        al = p["mean_length"]
        out.append({"profile": p["name"], "mean_length": al, "source": p["source"],
                    "dspark": derived(al, *ours["dspark"]),
                    "eagle3": derived(al, *ours["eagle3"]) if "eagle3" in ours else None,
                    "vllm_dspark": {c: derived(al, *cost) for c, cost in vllm.items()}})
    return out


def in_run_parts(plain: dict, row: dict) -> dict:
    """The round as our engine's step timers saw it in the run (ms): propose, verify, accept (sampling),
    host (between steps), and plain decoding's step with its host time; the speedup they predict."""
    round_ms = sum(row.get(f"mean_{k}_ms") or 0.0 for k in ("propose", "verify", "accept", "host"))
    step_ms = (plain.get("mean_decode_ms") or 0.0) + (plain.get("mean_host_ms") or 0.0)
    return {"propose_ms": row.get("mean_propose_ms"), "verify_ms": row.get("mean_verify_ms"),
            "accept_ms": row.get("mean_accept_ms"), "host_ms": row.get("mean_host_ms"),
            "plain_step_ms": step_ms or None, "plain_host_ms": plain.get("mean_host_ms"),
            "round_ms": round_ms or None,
            "derived_in_run": derived(row.get("spec_decode_acceptance_length"), step_ms, round_ms)}


def measured_vs_derived(summary: dict, engine: str, costs: dict[str, tuple[float, float]] | None = None,
                        level_costs: dict[int, tuple[float, float]] | None = None) -> list[dict]:
    """One row per synthetic system and level of a run's summary: its profile, the realised AL, the
    measured speedup and interval, the derived one (from `costs` per method, or `level_costs` per
    concurrency level for DSpark), measured over derived, and for a run with step timers the in-run parts."""
    synthetic = summary.get("synthetic") or {}
    overall = [r for r in summary["rows"] if r["category"] == "overall"]
    plain = {(r["temperature"], r["max_concurrency"]): r for r in overall if r["system"] == summary.get("baseline")}
    out = []
    for row in overall:
        check = synthetic.get(row["system"])
        if check is None:
            continue
        al = row.get("spec_decode_acceptance_length")
        cost = (costs or {}).get(row["method"])
        if level_costs is not None and row["method"] == "dspark":
            cost = level_costs.get(row["max_concurrency"])
        d = derived(al, *cost) if cost else None
        base = plain.get((row["temperature"], row["max_concurrency"])) or {}
        entry = {"engine": engine, "system": row["system"], "method": row["method"], "temperature": row["temperature"],
                 "max_concurrency": row["max_concurrency"], "profile": check["profile"],
                 "profile_al": check["mean_length"], "realised_al": al, "check": check["verdict"],
                 "measured": row.get("speedup"), "measured_ci95": row.get("speedup_ci95"),
                 "throughput_ratio": row.get("throughput_speedup"), "tpot_ms": row.get("mean_tpot_ms"),
                 "plain_tpot_ms": base.get("mean_tpot_ms"), "derived": d,
                 "measured_over_derived": row["speedup"] / d if d and row.get("speedup") else None}
        if row.get("mean_verify_ms") is not None:
            entry |= in_run_parts(base, row)
        out.append(entry)
    return out

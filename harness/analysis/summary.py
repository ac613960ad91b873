"""Summaries of a run's requests: per system x temperature x category, a macro `overall`, and the
warnings a reader must see before trusting them (`table_text` writes them as tables, Markdown and
CSV). Imports neither torch nor rich, so notebooks can use it."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from pathlib import Path

from harness.analysis.delivered import UNKNOWN, from_rounds, from_totals, tokens_after_first
from harness.analysis.metrics import (
    MIN_PAIRS,
    acceptance,
    acceptance_from_totals,
    interval_text,
    latency_stats,
    percentile,
    speedup_with_contention,
)
from harness.analysis.records import REQUESTS, UNPROFILED, read_manifest, read_waves, requests_and_notes
from harness.analysis.synthetic_check import add_synthetic, mismatches

BASELINE = "plain"  # the method of the baseline system
NO_SPEEDUP = {"speedup": None, "speedup_ci95": None, "speedup_pairs": 0, "speedup_ci95_reason": None}


def _timed(r: dict) -> float | None:
    return r["tpot_ms"]


def paired_tpots(records: list[dict], baseline: dict[tuple, dict], tpot=_timed) -> tuple[list[float], list[float]]:
    """TPOTs (as `tpot` reads them from a record) of the requests whose prompt equals the baseline's at the
    same concurrency (a later turn's differs once an earlier reply did)."""
    base, mine = [], []
    for r in records:
        b = baseline.get(pair_key(r))
        if b is not None and b["tpot_ms"] and r["tpot_ms"] and b.get("prompt_sha256") == r.get("prompt_sha256"):
            base.append(tpot(b))
            mine.append(tpot(r))
    return base, mine


def uncontended_tpot(records: list[dict]):
    """A record's TPOT as it would have been with the cores to itself: a contended request's scaled by its
    CPU share (CPU seconds per wall second) over its system's share when uncontended (the median of its
    uncontended requests, else the most any of its requests had). Uncontended requests, and records
    without contention figures (older runs), keep their TPOT."""
    shares: dict[str, list[float]] = defaultdict(list)
    quiet: dict[str, list[float]] = defaultdict(list)
    for r in records:
        c = r.get("contention") or {}
        if c.get("cpu_share"):
            shares[r["system"]].append(c["cpu_share"])
            if not c.get("contended"):
                quiet[r["system"]].append(c["cpu_share"])
    reference = {s: percentile(quiet[s], 50) if quiet[s] else max(v) for s, v in shares.items()}

    def tpot(r: dict) -> float | None:
        c = r.get("contention") or {}
        if not c.get("contended") or not c.get("cpu_share") or not r["tpot_ms"]:
            return r["tpot_ms"]
        return r["tpot_ms"] * min(1.0, c["cpu_share"] / reference[r["system"]])

    return tpot


def contention_figures(records: list[dict]) -> dict:
    """How many of the requests were timed on a shared machine, and how shared (from their `contention`)."""
    seen = [r["contention"] for r in records if r.get("contention") and r["contention"].get("contended") is not None]
    other = [c["other_cores"] for c in seen if c.get("other_cores") is not None and c.get("contended")]
    return {"contention_measured": len(seen), "contended_requests": sum(bool(c.get("contended")) for c in seen),
            "other_cores_mean": sum(other) / len(other) if other else None,
            "other_cores_max": max(other, default=None),
            "cpu_share_min": min((c["cpu_share"] for c in seen if c.get("cpu_share") is not None), default=None)}


def pair_key(r: dict) -> tuple:
    return (r["question_id"], r["turn"], r["temperature"], r.get("max_concurrency", 1))


def busy_seconds(records: list[dict]) -> float:
    """The time any of the requests was in flight: the union of their [sent, ended] intervals, as `vllm
    bench serve`'s duration (one request at a time: the sum of their E2EL; a gap between waves, such
    as a resumed run's, is not counted). Records without a send time count their E2EL."""
    spans = sorted((r["start_utc"], r["start_utc"] + r["e2el_ms"] / 1e3) for r in records
                   if r.get("start_utc") and r.get("e2el_ms") is not None)
    total = sum(r["e2el_ms"] for r in records if not r.get("start_utc") and r.get("e2el_ms") is not None) / 1e3
    end = None
    for lo, hi in spans:
        if end is None or lo > end:
            total += hi - lo
            end = hi
        elif hi > end:
            total += hi - end
            end = hi
    return total


def counted_acceptance(records: list[dict], waves: dict[str, dict],
                       group: list[dict]) -> tuple[list[dict], str | None, list[int], list[int]] | None:
    """Acceptance totals of requests that have no rounds: vLLM's per-request totals, or the server's
    counters of the waves they came in (a wave's counters only when every request of it, failed ones
    included, is in `group`), each with the tokens after the first its requests output (what the totals'
    steps made) and how many finished requests it pools (`delivered.from_totals`). None when some
    request's acceptance cannot be known from these."""
    totals, sources, whole, tokens, pooled = [], set(), set(), [], []
    for r in records:
        source = r.get("acceptance_source")
        sources.add(source)
        if r.get("acceptance_totals"):
            totals.append(r["acceptance_totals"])
            tokens.append(tokens_after_first(r))
            pooled.append(1)
        elif source in ("server counters (request)", "server counters (wave)") and r.get("wave") in waves:
            whole.add(r["wave"])
        else:
            return None
    for wave_id in sorted(whole):
        if sum(r.get("wave") == wave_id for r in group) != waves[wave_id]["requests"]:
            return None  # part of a wave: its counters pool requests outside this group
        totals.append(waves[wave_id]["spec_counters"])
        mine = [r for r in records if r.get("wave") == wave_id]
        tokens.append(sum(map(tokens_after_first, mine)))
        pooled.append(len(mine))
    return totals, ", ".join(sorted(map(str, sources))), tokens, pooled


def summarize_group(records: list[dict], baseline: dict[tuple, dict], has_baseline: bool,
                    waves: dict[str, dict] | None = None, uncontended=_timed) -> dict:
    """One row's figures, over the group's finished requests (failed ones only counted); `uncontended`
    reads a record's TPOT as if its machine had been quiet (`uncontended_tpot`), for the interval."""
    group, failed = records, sum(1 for r in records if r.get("failed"))
    records = [r for r in records if not r.get("failed")]
    lengths = [n for r in records for n in r["acceptance_lengths"]]
    proposals = [n for r in records for n in r["proposal_lengths"]]
    accepted = [n for r in records for n in r.get("accepted_counts", [a - 1 for a in r["acceptance_lengths"]])]
    duration = busy_seconds(records)
    out_tokens = sum(r["output_tokens"] for r in records)
    in_tokens = sum(r.get("prompt_tokens") or 0 for r in records)
    drafted = [r for r in records if r["method"] != BASELINE]
    counted = counted_acceptance([r for r in drafted if not r["acceptance_lengths"]], waves or {}, group) \
        if drafted and not lengths else None
    row = {"requests": len(records) + failed, "completed": len(records), "failed": failed,
           "output_tokens": out_tokens, "input_tokens": in_tokens, "duration_s": duration,
           "request_throughput": len(records) / duration if duration else None,
           "output_throughput": out_tokens / duration if duration else None,
           "total_token_throughput": (in_tokens + out_tokens) / duration if duration else None,
           **(acceptance_from_totals(counted[0]) if counted else acceptance(lengths, proposals, accepted)),
           "acceptance_from": counted[1] if counted else ("rounds" if lengths else None),
           **((from_totals(counted[0], *counted[2:]) if counted else from_rounds(drafted) if drafted and lengths
               else None) or UNKNOWN)}
    for name in ("ttft_ms", "tpot_ms", "e2el_ms"):
        row |= latency_stats(name, [r[name] for r in records])
    row |= latency_stats("itl_ms", [x for r in records for x in r.get("itl_ms") or []])
    row |= spread("tpot_ms", [r["tpot_ms"] for r in records])
    in_time = sorted(records, key=lambda r: r.get("time_utc") or 0) or [{}]
    loads = [x for r in in_time for x in r.get("load_avg") or []]
    row |= {"load_avg_before": (in_time[0].get("load_avg") or [None])[0],
            "load_avg_after": (in_time[-1].get("load_avg") or [None])[-1], "load_avg_max": max(loads, default=None)}
    row |= contention_figures(records)
    for kind in ("propose", "verify", "accept", "decode", "host"):
        per_round = [ms for r in records for ms in r["round_ms"].get(kind, [])]
        row[f"mean_{kind}_ms"] = sum(per_round) / len(per_round) if per_round else None
    memory = [r["peak_memory_bytes"] for r in records if r.get("peak_memory_bytes") is not None]
    row["peak_memory_gb"] = max(memory) / 1e9 if memory else None
    greedy = [r for r in records if r.get("matches_baseline") is not None]
    row["matches_baseline"] = sum(r["matches_baseline"] is True for r in greedy) if greedy else None
    row["matches_baseline_of"] = len(greedy) if greedy else None
    s = speedup_with_contention([paired_tpots(records, baseline)], [paired_tpots(records, baseline, uncontended)]) \
        if has_baseline else None
    row |= s or NO_SPEEDUP
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


def expected_requests(jobs: list[tuple]) -> list[dict]:
    """The run's plan, as its manifest keeps it: requests per system x temperature x category x
    concurrency, from one (system, temperature, category[, concurrency]) per request."""
    counts = Counter(job if len(job) > 3 else (*job, 1) for job in jobs)
    return [{"system": s, "temperature": t, "category": c, "max_concurrency": k, "requests": n}
            for (s, t, c, k), n in counts.items()]


# (the delivered_* figures pool every request, as their rounds and tokens do: their AL is tokens / rounds)
MACRO = ("spec_decode_acceptance_length", "spec_decode_acceptance_rate", "mean_ttft_ms", "mean_tpot_ms", "mean_e2el_ms")
# a served run's categories share its waves' counters: where no category has a figure, the overall keeps the pooled one
POOLED_ONLY = ("spec_decode_acceptance_length",)


def summarize(records: list[dict], expected: list[dict] | None = None, cores: int | None = None,
              waves: list[dict] | None = None, systems: list[str] | None = None) -> dict:
    """{"rows": [...]}: one row per system x temperature x concurrency x category, then each system x
    temperature x concurrency's `overall`: the macro average over categories (speedup: their geometric
    mean, with a t interval over prompts stratified by category), with pooled counts and the throughputs
    of every request together (at a concurrency above 1 the categories share the machine, so only the
    pooled throughput means what it says). Systems come in `systems`' order (the `--systems` the user
    typed), else in the order the records first name them.

    Speedups hold each system against plain decoding at the same concurrency: per prompt by TPOT
    (`speedup`, with no interval and no verdict below `metrics.MIN_PAIRS` prompt pairs:
    `speedup_ci95_reason` says so), and by output throughput (`throughput_speedup`). `expected` (the
    manifest's plan) gives each row `requests_expected` and the summary `requests_done` /
    `requests_expected` / `complete`;
    `cores` is what `load_avg_max` is held against (a load above it means other work competed for the
    machine while it was timed); `waves` (a served run's) give acceptance from the server's counters."""
    by_wave = {w["wave"]: w for w in waves or [] if w.get("spec_counters")}
    base_system = next((r["system"] for r in records if r["method"] == BASELINE), None)
    has_baseline = base_system is not None
    baseline = {pair_key(r): r for r in records if r["system"] == base_system and not r.get("failed")}
    quiet = uncontended_tpot([r for r in records if not r.get("failed")])
    groups: dict[tuple, list[dict]] = defaultdict(list)
    order: list[str] = []
    for r in records:
        groups[(r["system"], r["temperature"], r.get("max_concurrency", 1), r["category"])].append(r)
        if r["system"] not in order:
            order.append(r["system"])
    order = [s for s in systems or [] if s in order] + [s for s in order if s not in (systems or [])]
    rows = []
    for system in order:
        for temp, conc in sorted({(t, k) for s, t, k, _ in groups if s == system}):
            cats = sorted(c for s, t, k, c in groups if (s, t, k) == (system, temp, conc))
            per_cat = []
            for cat in cats:
                group = groups[(system, temp, conc, cat)]
                per_cat.append({"system": system, "method": group[0]["method"], "temperature": temp,
                                "max_concurrency": conc, "category": cat,
                                **summarize_group(group, baseline, has_baseline, by_wave, quiet)})
            everything = [r for c in cats for r in groups[(system, temp, conc, c)]]
            overall = {"system": system, "method": per_cat[0]["method"], "temperature": temp, "max_concurrency": conc,
                       "category": "overall", **summarize_group(everything, baseline, False, by_wave)}
            overall["pooled_acceptance_length"] = overall["spec_decode_acceptance_length"]
            for key in MACRO:
                vals = [row[key] for row in per_cat if row[key] is not None]
                if vals or key not in POOLED_ONLY:  # (wave counters: only the pooled figure)
                    overall[key] = sum(vals) / len(vals) if vals else None
            macro = speedup_with_contention([paired_tpots(groups[(system, temp, conc, c)], baseline) for c in cats],
                                            [paired_tpots(groups[(system, temp, conc, c)], baseline, quiet) for c in cats]) \
                if has_baseline else None
            overall |= macro or NO_SPEEDUP
            rows += per_cat + [overall]
    plain = {(r["temperature"], r["max_concurrency"], r["category"]): r for r in rows if r["system"] == base_system}
    for row in rows:
        b = plain.get((row["temperature"], row["max_concurrency"], row["category"]))
        row["throughput_speedup"] = row["output_throughput"] / b["output_throughput"] \
            if b and b["output_throughput"] and row["output_throughput"] else None
    plan = None if expected is None else {(e["system"], float(e["temperature"]), e.get("max_concurrency", 1),
                                           e["category"]): e["requests"] for e in expected}
    for row in rows:
        key = (row["system"], float(row["temperature"]), row["max_concurrency"])
        row["requests_expected"] = (sum(n for (s, t, k, _), n in plan.items() if (s, t, k) == key) if row["category"]
                                    == "overall" else plan.get(key + (row["category"],))) if plan is not None else None
        ci = row["speedup_ci95"]
        if row["system"] == base_system:  # the baseline against itself says nothing
            row["speedup_ci95_reason"] = row["speedup_ci95_spans_1"] = None
        else:
            row["speedup_ci95_spans_1"] = None if ci is None else bool(ci[0] <= 1 <= ci[1])
    loads = [r["load_avg_max"] for r in rows if r["load_avg_max"] is not None]
    failed = sum(1 for r in records if r.get("failed"))
    summary = {"rows": rows, "baseline": base_system, "requests_done": len(records), "requests_failed": failed,
               "requests_expected": sum(plan.values()) if plan is not None else None,
               "complete": len(records) >= sum(plan.values()) if plan is not None else None,
               "max_concurrency": sorted({r["max_concurrency"] for r in rows}), "speedup_min_pairs": MIN_PAIRS,
               "cores": cores, "load_avg_max": max(loads, default=None),
               **{k: v for k, v in contention_figures([r for r in records if not r.get("failed")]).items()
                  if k in ("contention_measured", "contended_requests", "other_cores_mean", "other_cores_max")},
               **widenings(rows), "acceptance_disagreements": acceptance_disagreements(waves or []),
               "notes": "overall = macro average over categories (speedup: geometric mean of the categories' "
                        "speedups, its interval a t interval over prompts stratified by category, none below "
                        f"{MIN_PAIRS} prompt pairs); counts, tokens, time, "
                        "throughputs and percentiles pool every request; pooled_acceptance_length pools every "
                        "round; so do the delivered_* figures (their AL: delivered_tokens / delivered_rounds); "
                        "speedups are against plain decoding at the same concurrency"}
    return summary | {"warnings": warnings(summary)}


def widenings(rows: list[dict]) -> dict:
    """Which overall intervals contention widened, and by how much: `contention_widened`, one line per row
    whose interval moved (the widened one, the wall-time one and the change), and `contention_unwidened`,
    the rows whose busy requests' times scaled back to a quiet machine gave an interval inside the
    wall-time one (the union is then the wall-time interval: nothing was widened, and saying so is the
    truth)."""
    checked = [r for r in rows if r["category"] == "overall" and r.get("speedup_ci95_timed") and r["speedup_ci95"]]
    widened, unwidened = [], []
    for r in checked:
        (lo, hi), (lo_t, hi_t) = r["speedup_ci95"], r["speedup_ci95_timed"]
        if (lo, hi) == (lo_t, hi_t):
            unwidened.append(row_name(r))
            continue
        moved = ", ".join(f"{side} by {d:.2g}" for side, d in (("lower end down", lo_t - lo), ("upper end up", hi - hi_t))
                          if d > 0)
        widened.append(f"{row_name(r)}: {interval_text([lo, hi])} (wall times alone: {interval_text([lo_t, hi_t])}; "
                       f"{moved})")
    return {"contention_widened": widened, "contention_unwidened": unwidened}


def acceptance_disagreements(waves: list[dict]) -> list[str]:
    """Each served wave whose `acceptance_check` failed (its requests' own figures, which the tables read,
    do not add up to what the server's counters grew by): which wave, each figure both ways. The check
    is what says the two sources are one measurement; a reader must see where it did not hold. So too an
    AIPerf wave whose own scrape of the counters (`aiperf_counters`) parts from ours, which the wave kept."""
    out = []
    for w in waves:
        check, theirs = w.get("acceptance_check") or {}, w.get("aiperf_counters") or {}
        if check.get("checked") and check.get("agrees") is False:
            differ = "; ".join(f"{k} {a} by the requests, {b} by the counters" for k, (a, b) in check["differs"].items())
            out.append(f"{row_name(w)} (wave {w['wave']}): {differ}")
        if theirs.get("agrees") is False:
            differ = "; ".join(f"{k} {v} by AIPerf's scrape, {w['spec_counters'].get(k)} by ours" for k, v in
                               theirs["spec_counters"].items() if v != w["spec_counters"].get(k))
            out.append(f"{row_name(w)} (wave {w['wave']}): {differ} ({theirs.get('why')})")
    return out


def row_name(row: dict) -> str:
    """A summary row as a sentence names it: `dspark T=0`, `ngram T=0 c=4` at a sweep's level."""
    return f"{row['system']} T={row['temperature']:g}" + (f" c={row['max_concurrency']}"
                                                         if row.get("max_concurrency", 1) != 1 else "")


def warnings(summary: dict) -> list[str]:
    """What a reader must know before trusting the figures: an unfinished run, a system whose server did not
    say which method it ran, a loaded machine, speedups from too few prompts for an interval."""
    out = list(summary.get("repeated_requests") or []) + list(summary.get("methods_unknown") or [])
    if summary.get("interpreted"):
        out.append(f"{summary['interpreted']}: every time, TPOT and speedup here is the interpreter's, not the "
                   "engine's (no speedup verdict); acceptance and greedy equality hold")
    if summary.get("profiled"):
        p = summary["profiled"]
        out.append(f"timed under {p['profiler']}: every time and speedup here includes the profiler's overhead "
                   "(not comparable with unprofiled runs); " +
                   (f"the same requests timed without it: dspark-bench report {p['unprofiled']}" if p["unprofiled"]
                    else "this profile timed no unprofiled run (dspark-bench profile --overhead times one)"))
    if summary.get("requests_missing"):  # (what is missing says more than "0 of n done")
        out.append(f"no {REQUESTS} in {summary['run_dir']}: the run's finished requests are gone (deleted or moved), "
                   f"so there is nothing to summarise; put the file back, or time them again with dspark-bench run "
                   f"--resume {summary['run_dir']}")
    elif summary.get("complete") is False:
        out.append(f"incomplete run: {summary['requests_done']} of {summary['requests_expected']} requests done "
                   f"(finish it with dspark-bench run --resume {summary.get('run_dir', 'DIR')})")
    if summary.get("requests_failed"):
        out.append(f"{summary['requests_failed']} requests failed (timed out or refused; each recorded with its "
                   "error in requests.jsonl, left out of every figure, not sent again)")
    if summary.get("contended_requests"):
        out.append(contention_warning(summary))
    elif not summary.get("contention_measured") and summary.get("cores") and \
            (summary.get("load_avg_max") or 0) > summary["cores"]:  # (a run from before contention was measured)
        out.append(f"noisy timing: the load average reached {summary['load_avg_max']:.1f} on {summary['cores']} "
                   "cores while requests were timed (other work competed for the CPU); compare speedups with care")
    out += mismatches(summary)
    if summary.get("acceptance_disagreements"):
        out.append("acceptance check failed: the requests' own acceptance figures (what the tables read) do not add "
                   "up to the server's counters over the wave (another client's requests on the same server, or "
                   "vLLM counting them apart), or AIPerf's scrape of the counters parts from ours; acceptance_check "
                   "and aiperf_counters in waves.jsonl:\n" +
                   "\n".join(f"- {line}" for line in summary["acceptance_disagreements"]))
    few = [r for r in summary.get("rows", []) if r["category"] == "overall" and r.get("speedup_ci95_reason")]
    if few:
        named = [f"{row_name(r)} ({r['speedup_pairs']} pair{'s' if r['speedup_pairs'] != 1 else ''})" for r in few]
        out.append(f"too few prompts for an interval, so no verdict: {', '.join(named)}; a speedup gets an interval "
                   f"and a verdict from {MIN_PAIRS} prompt pairs on (fewer cannot rule out chance even when every "
                   f"prompt is faster); run at least {MIN_PAIRS} prompts (--num-prompts {MIN_PAIRS})")
    return out


def contention_warning(summary: dict) -> str:
    """The contention warning, one fact a line ("- " starts a line of a list): how many requests were
    timed on a busy machine, each interval that covering their quiet-machine times widened and by how
    much, and the rows where it changed nothing."""
    other = summary.get("other_cores_mean")
    widened, unwidened = summary.get("contention_widened") or [], summary.get("contention_unwidened") or []
    lines = [f"contention: {summary['contended_requests']} of {summary['contention_measured']} timed requests ran "
             "while other processes competed for the cores" +
             (f" (they used {other:.1f} of {summary['cores']} cores on average meanwhile)"
              if other is not None and summary.get("cores") else "") + "; rerun on a quiet machine for tight figures"]
    if widened:
        lines += ["speedup intervals widened to cover those requests' times scaled back to a quiet machine:"]
        lines += [f"- {w}" for w in widened]
    if unwidened:
        lines += [("widening changed no interval" if not widened else "not widened") + f": {', '.join(unwidened)}" +
                  " (the busy requests' times scaled back to a quiet machine give an interval inside the wall-time "
                  "one)"]
    return "\n".join(lines)


def parallel_label(settings: dict) -> str | None:
    """"TP n" (and ", draft TP m") where the run set vLLM's tensor-parallel sizes, else None (one device)."""
    args = settings.get("engine_args") or {}
    tp, draft_tp = args.get("tensor_parallel_size"), args.get("speculative_config.draft_tensor_parallel_size")
    return ", ".join(f"{name} {size}" for name, size in (("TP", tp), ("draft TP", draft_tp)) if size is not None) or None


def summarize_folder(run_dir: Path) -> dict:
    """The summary of a run folder's requests (read only: a torn last line is skipped, not cut), held
    against the plan and core count in its manifest, its systems in the order `--systems` gave them."""
    manifest = read_manifest(run_dir) or {}
    records, notes = requests_and_notes(run_dir)
    summary = summarize(records, manifest.get("requests_expected"),
                        (manifest.get("provenance") or {}).get("cores"), read_waves(run_dir),
                        (manifest.get("options") or {}).get("systems"))
    summary = add_synthetic(summary, manifest.get("settings") or {}, records)
    summary["repeated_requests"] = notes  # (said first among the warnings)
    summary["parallel"] = parallel_label(manifest.get("settings") or {})
    generator = (manifest.get("backend") or {}).get("load_generator") or {}  # (our client: no mark, as before)
    summary["load_generator"] = "; ".join([f"load by AIPerf {generator.get('version')}", *(generator.get("notes") or [])]) \
        if generator.get("name") == "aiperf" else None  # (notes: what an imported AIPerf run's tables must say)
    summary["run_dir"] = str(Path(run_dir).resolve())
    summary["requests_missing"] = not (Path(run_dir) / REQUESTS).is_file()
    summary["profiled"] = profiled_by(run_dir, manifest)
    summary["interpreted"] = interpreted(manifest)
    servers = ((manifest.get("backend") or {}).get("servers") or {}).values()  # (a method no server's log named)
    summary["methods_unknown"] = [s["method_unknown"] for s in servers if s.get("method_unknown")]
    return summary | {"warnings": warnings(summary)}


INTERPRETED = "kernels under Triton's interpreter (TRITON_INTERPRET=1): times not meaningful"


def interpreted(manifest: dict) -> str | None:
    """INTERPRETED for a run whose Triton kernels ran interpreted (its provenance's `triton_interpreter`: how
    the tests run vLLM's V2 runner on a CPU), else None. Its times are the interpreter's, 1 s a round where
    the engine takes milliseconds: no speedup of it says anything of the engine, so none gets a verdict."""
    return INTERPRETED if (manifest.get("provenance") or {}).get("triton_interpreter") else None


PROFILERS = {"torch": "the PyTorch profiler", "nsys": "Nsight Systems (nsys)"}


def profiled_by(run_dir: Path, manifest: dict) -> dict | None:
    """A run a profile timed under its profiler (the manifest's `profiled`): which profiler, and the
    profile's run of the same requests without one (its `unprofiled/` folder) where it timed one. Such a
    run's TPOTs include the profiler's overhead; reported bare, they read as the engine's speed."""
    kind = manifest.get("profiled")
    if not kind:
        return None
    reference = Path(run_dir).resolve().parent / UNPROFILED
    timed = (reference / REQUESTS).is_file() and (reference / REQUESTS).stat().st_size > 0  # (made empty at its start)
    return {"profiler": PROFILERS.get(kind, str(kind)), "unprofiled": str(reference) if timed else None}

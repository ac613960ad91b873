"""vLLM's own per-request acceptance, as every vLLM backend records it, and the check that a wave's
requests add up to the server's counters.

vLLM 0.32 reports each request's speculative figures (`--per-request-spec-decode-metrics detailed`):
offline as `CompletionOutput.spec_decode_metrics` (`to_dict()`), served as `metrics.speculative_decoding`
on the stream's final usage chunk; the same fields either way. One reading of them serves both
backends, so a request's rounds, histogram and source read alike offline and served. Where a server
sends none (an older vLLM, or a server at a URL started without the flag) acceptance comes from the
counters around each wave instead, and the record says so (`server counters (request|wave)`).

The counters (`vllm:spec_decode_*`) and the per-request figures are counted at the same place in
vLLM's scheduler, so over a wave the requests' own figures must add up to what the counters grew by;
a wave where they do not (another client's requests on the same server, a request that failed
mid-wave) says so in `waves.jsonl` rather than passing for the same measurement.
"""

from __future__ import annotations

# vLLM's per-request totals a record keeps (`acceptance_totals`), under vLLM's own names
TOTALS = ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens", "acceptance_histogram")
SUMMED = ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens")  # what the counters count too

# What a run's manifest says its served acceptance came from
PER_REQUEST = "per request: vLLM's own metrics (metrics.speculative_decoding on each stream's final usage chunk)"
COUNTERS = ("the server's speculative counters (/metrics) read around each wave (per request at concurrency 1, "
            "pooled over the wave above): the server sends no per-request metrics")


def request_acceptance(metrics: dict | None) -> dict:
    """A request's acceptance fields (`RequestResult`'s) from vLLM's per-request metrics: the per-step
    lists where vLLM gave them (`acceptance_source` "vllm per-step"; a request that never drafted has
    empty lists and is per-step too), else only its totals ("vllm totals", vLLM's `summary` level); the
    totals and the acceptance histogram kept either way. No metrics: no source (the caller's counters
    give it)."""
    if not metrics:
        return {"acceptance_source": None}
    drafted = list(metrics.get("per_step_drafted") or [])
    accepted = list(metrics.get("per_step_accepted") or [])
    totals = {k: metrics.get(k) for k in TOTALS}
    return {"acceptance_lengths": [a + 1 for a in accepted], "accepted_counts": accepted, "proposal_lengths": drafted,
            "acceptance_source": "vllm per-step" if drafted or not totals["num_spec_steps"] else "vllm totals",
            "acceptance_totals": totals}


def accepted_per_pos(histogram: list[int]) -> list[int]:
    """Accepted drafts per position from vLLM's histogram (index j: the steps that accepted exactly j
    drafts): position i is accepted in every step that accepted more than i, as its counter counts."""
    return [sum(histogram[i + 1:]) for i in range(max(len(histogram) - 1, 0))]


def wave_check(totals: list[dict | None], counters: dict | None) -> dict | None:
    """Whether a wave's requests' own totals (each request's `acceptance_totals`, None where it carries
    none) add up to what the server's counters grew by over the wave (`metrics.delta`). None where no
    request carries any: the counters are then the only source and there is nothing to hold them against."""
    if not any(totals):
        return None
    if counters is None:
        return {"checked": False, "why": "the server exposes no speculative counters"}
    missing = sum(t is None for t in totals)
    if missing:
        return {"checked": False, "why": f"{missing} of the wave's {len(totals)} requests carry no per-request "
                                         "metrics (failed, or a server that stopped sending them)"}
    sums = {k: sum(t.get(k) or 0 for t in totals) for k in SUMMED}
    per_pos = [accepted_per_pos(t.get("acceptance_histogram") or []) for t in totals]
    width = max(len(counters["accepted_per_pos"]), *map(len, per_pos))
    pad = lambda xs: list(xs) + [0] * (width - len(xs))
    sums["accepted_per_pos"] = [sum(col) for col in zip(*map(pad, per_pos))]
    differ = {k: [sums[k], counters.get(k)] for k in SUMMED if sums[k] != counters.get(k)}
    if pad(sums["accepted_per_pos"]) != pad(counters["accepted_per_pos"]):
        differ["accepted_per_pos"] = [sums["accepted_per_pos"], counters["accepted_per_pos"]]
    return {"checked": True, "agrees": not differ, "per_request_sums": sums,
            **({"differs": differ, "why": "the requests' own figures and the server's counters over the wave differ "
                                          "(another client's requests on the same server?)"} if differ else {})}

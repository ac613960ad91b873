"""A server's Prometheus counters (`/metrics`): vLLM's speculative-decoding counters, read before and
after a wave of requests, give that wave's acceptance when the server reports none per request (a
server someone else started). At concurrency 1 a wave is one request, so the figures are that
request's; above, they are the wave's, pooled. An offline engine's own counters (`vllm.LLM.get_metrics()`)
read around each request do the same where vLLM reports nothing per request (0.26)."""

from __future__ import annotations

import re

from harness.backends.served.stream import get

# vLLM's counter names (without `_total`), and the key each delta is kept under (vLLM's per-request names)
SPEC_COUNTERS = {"vllm:spec_decode_num_drafts": "num_spec_steps",
                 "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens": "num_accepted_draft_tokens"}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')


def fetch(base_url: str, timeout_s: float = 10.0) -> str | None:
    """The text of `base_url/metrics`, or None where the server has none (or does not answer)."""
    body = get(base_url.rstrip("/") + "/metrics", timeout_s)
    return None if body is None else body.decode("utf-8", errors="replace")


def spec_counters(text: str | None) -> dict | None:
    """vLLM's speculative counters in `text`, summed over engines and models: the three totals and the
    accepted tokens per draft position. None when the server exposes none (no drafts configured)."""
    if not text:
        return None
    totals: dict = {}
    per_pos: dict[int, float] = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m is None or line.startswith("#"):
            continue
        name, labels, value = m.group(1).removesuffix("_total"), m.group(2) or "", m.group(3)
        if name in SPEC_COUNTERS:
            totals[SPEC_COUNTERS[name]] = totals.get(SPEC_COUNTERS[name], 0.0) + float(value)
        elif name == PER_POS:
            pos = re.search(r'position="(\d+)"', labels)
            if pos is not None:
                per_pos[int(pos.group(1))] = per_pos.get(int(pos.group(1)), 0.0) + float(value)
    if not totals:
        return None
    totals["accepted_per_pos"] = [per_pos.get(k, 0.0) for k in range(max(per_pos) + 1)] if per_pos else []
    return totals


def engine_counters(metrics: list) -> dict | None:
    """The same from an offline engine's metrics (`vllm.LLM.get_metrics()`: objects with a `name` and a
    `value`, the per-position counter a `values` list), summed over engines. None when it has none."""
    totals: dict = {}
    per_pos: list[float] = []
    for metric in metrics:
        name = metric.name.removesuffix("_total")
        if name in SPEC_COUNTERS:
            totals[SPEC_COUNTERS[name]] = totals.get(SPEC_COUNTERS[name], 0.0) + float(metric.value)
        elif name == PER_POS:
            for i, value in enumerate(getattr(metric, "values", None) or []):
                per_pos += [0.0] * (i + 1 - len(per_pos))
                per_pos[i] += float(value)
    if not totals:
        return None
    totals["accepted_per_pos"] = per_pos
    return totals


def exported_counters(export: dict | None) -> dict | None:
    """What vLLM's speculative counters grew by over AIPerf's profiling phase, as AIPerf's server-metrics
    export (`server_metrics_export.json`, 0.13.0) holds it: each counter series' `stats.total` is its last
    scrape in the phase less its last scrape before it; series summed over engines and models, as
    `spec_counters` sums them. `delta`'s shape; None where the export holds none (no drafts configured,
    `--no-server-metrics`, no scrape fell in the phase)."""
    metrics = (export or {}).get("metrics") or {}
    totals: dict = {}
    per_pos: dict[int, float] = {}
    for name, key in SPEC_COUNTERS.items():
        for series in (metrics.get(name) or {}).get("series") or []:
            totals[key] = totals.get(key, 0.0) + float((series.get("stats") or {}).get("total") or 0.0)
    for series in (metrics.get(PER_POS) or {}).get("series") or []:
        pos = int((series.get("labels") or {}).get("position", -1))
        if pos >= 0:
            per_pos[pos] = per_pos.get(pos, 0.0) + float((series.get("stats") or {}).get("total") or 0.0)
    if not totals:
        return None
    out = {k: round(totals.get(k, 0.0)) for k in SPEC_COUNTERS.values()}
    out["accepted_per_pos"] = [round(per_pos.get(k, 0.0)) for k in range(max(per_pos) + 1)] if per_pos else []
    return out


def delta(before: dict | None, after: dict | None) -> dict | None:
    """What the counters grew by between two reads (whole numbers: they count tokens and steps)."""
    if before is None or after is None:
        return None
    out = {k: round(after.get(k, 0.0) - before.get(k, 0.0)) for k in SPEC_COUNTERS.values()}
    width = max(len(before["accepted_per_pos"]), len(after["accepted_per_pos"]))
    pad = lambda xs: list(xs) + [0.0] * (width - len(xs))  # noqa: E731
    out["accepted_per_pos"] = [round(a - b) for a, b in zip(pad(after["accepted_per_pos"]),
                                                            pad(before["accepted_per_pos"]))]
    return out

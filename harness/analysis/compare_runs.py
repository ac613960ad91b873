"""Two runs side by side (`report A B`): which of their settings differ, and for each system x
temperature both ran, how B's speedup, acceptance length and TPOT moved against A's. Reading the
deltas without the settings diff misleads (8 prompts at T = 0, 1 against 4 at T = 0 is not the same
experiment), so both come together. Imports neither torch nor rich: the notebooks use it too."""

from __future__ import annotations

import json

SHORT = ("experiment_sha256",)  # long values shown by their first 12 characters


def value_text(value) -> str:
    """A setting's value as a reader wants it: numbers without trailing zeros, lists in brackets,
    None as `-`."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(value_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


def settings_diff(manifest_a: dict, manifest_b: dict) -> list[tuple[str, str, str]]:
    """(setting, A's value, B's value) for each setting of the manifests' `settings` (and the thread
    count the run used) that differs, in A's order, then B's settings A lacks."""
    def flat(manifest: dict) -> dict:
        settings = dict(manifest.get("settings") or {})
        if (manifest.get("threads") or {}).get("count") is not None:
            settings["threads"] = manifest["threads"]["count"]
        return settings

    a, b = flat(manifest_a), flat(manifest_b)
    out = []
    for key in list(a) + [k for k in b if k not in a]:
        if a.get(key) != b.get(key):
            va, vb = value_text(a.get(key)), value_text(b.get(key))
            if key in SHORT:
                va, vb = va[:12], vb[:12]
            out.append((key, va, vb))
    return out


def settings_line(diff: list[tuple[str, str, str]], names: tuple[str, str] = ("A", "B")) -> str:
    """One line: `settings differ (A vs B): num_prompts 8 vs 4; temperatures [0, 1] vs [0]`."""
    if not diff:
        return f"settings equal ({names[0]} and {names[1]})"
    return f"settings differ ({names[0]} vs {names[1]}): " + "; ".join(f"{k} {a} vs {b}" for k, a, b in diff)


def _key(row: dict) -> tuple:
    return row["system"], float(row["temperature"]), row.get("max_concurrency", 1)


def deltas(summary_a: dict, summary_b: dict, category: str = "overall") -> dict:
    """{"rows": one per system x temperature x concurrency of `category` in both summaries, in A's order,
    "only_in": [A's keys missing from B, B's missing from A]}. A row holds each figure as [A, B] and
    its change: speedup and acceptance length B - A, TPOT B / A (above 1: B is slower), and whether
    the two speedups' 95 % intervals overlap (None where either has none; `speedup_ci95_reason` says
    why: too few prompts for an interval)."""
    rows = [{_key(r): r for r in s["rows"] if r["category"] == category} for s in (summary_a, summary_b)]
    out = []
    for key, a in rows[0].items():
        b = rows[1].get(key)
        if b is None:
            continue
        ca, cb = a.get("speedup_ci95"), b.get("speedup_ci95")
        sa, sb = a.get("speedup"), b.get("speedup")
        la, lb = a.get("spec_decode_acceptance_length"), b.get("spec_decode_acceptance_length")
        ta, tb = a.get("mean_tpot_ms"), b.get("mean_tpot_ms")
        out.append({
            "system": key[0], "temperature": key[1], "max_concurrency": key[2],
            "speedup": [sa, sb], "speedup_diff": sb - sa if sa is not None and sb is not None else None,
            "speedup_ci95": [ca, cb], "intervals_overlap": bool(ca[0] <= cb[1] and cb[0] <= ca[1]) if ca and cb
            else None, "speedup_pairs": [a.get("speedup_pairs"), b.get("speedup_pairs")],
            "speedup_ci95_reason": [a.get("speedup_ci95_reason"), b.get("speedup_ci95_reason")],
            "acceptance_length": [la, lb], "acceptance_length_diff": lb - la if la is not None and lb is not None
            else None,
            "tpot_ms": [ta, tb], "tpot_ratio": tb / ta if ta and tb is not None else None})
    return {"rows": out, "only_in": [[k for k in rows[0] if k not in rows[1]], [k for k in rows[1] if k not in rows[0]]]}

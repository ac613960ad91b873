"""What a proposal-length policy would buy, replayed on recorded rounds against a cost table.

Rounds recorded with every draft verified (`confidence = "off"`) hold each slot's confidence and how
many drafts were accepted. A policy picks l drafts from the confidences alone (never from the drafts,
so the first l accept decisions are the ones the full round made, exactly at T = 0 and in
distribution at T > 0); the round then yields min(accepted, l) + 1 tokens and costs cost[l]. Summed
over rounds this gives tokens per unit of cost for each policy at any machine's costs, e.g.
`engine-bench`'s `round_by_verified_ms` at Qwen3-8B shapes. A replay treats rounds as independent: a
real run under the policy would see other contexts after a cut (the scheduler's own runs measure that).

The choices mirror `dspark.schedule` (tested equal to it); no torch here.
"""

from __future__ import annotations

import numpy as np

from harness.analysis.calibration import Rounds, sigmoid


def threshold_lengths(logits: np.ndarray, threshold: float) -> np.ndarray:
    """[rounds] DeepSpec's cut: the first slot whose confidence is under `threshold` (N when none is)."""
    below = sigmoid(logits) < threshold
    return np.where(below.any(axis=1), below.argmax(axis=1), logits.shape[1])


def scheduled_lengths(logits: np.ndarray, costs: np.ndarray, temperatures: np.ndarray | None = None) -> np.ndarray:
    """[rounds] the prefix scheduler's l: argmax over 0..N of (1 + sum_{j<l} a_j) / costs[l]."""
    scaled = logits if temperatures is None else logits / np.asarray(temperatures)
    survival = np.cumprod(sigmoid(scaled), axis=1)
    expected = 1 + np.concatenate((np.zeros((len(logits), 1)), np.cumsum(survival, axis=1)), axis=1)
    return np.argmax(expected / np.asarray(costs)[None], axis=1)


def replay(r: Rounds, lengths: np.ndarray, costs: np.ndarray) -> dict:
    """Tokens, drafts verified and cost of the recorded rounds had they verified `lengths` drafts. Only
    rounds that verified the whole block are replayed (a shorter one says nothing about the slots it cut)."""
    full = r.proposed == r.logits.shape[1]
    lengths, accepted = np.asarray(lengths)[full], r.accepted[full]
    tokens = np.minimum(accepted, lengths) + 1
    cost = np.asarray(costs)[lengths]
    return {"rounds": int(full.sum()), "tokens": int(tokens.sum()), "acceptance_length": float(tokens.mean()),
            "verified_per_round": float(lengths.mean()), "cost": float(cost.sum()),
            "tokens_per_cost": float(tokens.sum() / cost.sum())}


def compare(r: Rounds, costs: list[float], thresholds: tuple[float, ...] = (0.1, 0.3, 0.5),
            temperatures: list[float] | None = None) -> list[dict]:
    """Every policy replayed on `r` at `costs`: all drafts, each threshold, the scheduler (with the STS
    temperatures too when given); `vs_full` is tokens per cost over the full block's."""
    costs_a = np.asarray(costs, dtype=float)
    n = r.logits.shape[1]
    rows = [("all drafts", np.full(len(r.proposed), n))]
    rows += [(f"threshold:{t:g}", threshold_lengths(r.logits, t)) for t in thresholds]
    rows.append(("schedule", scheduled_lengths(r.logits, costs_a)))
    if temperatures is not None:
        rows.append(("schedule + STS", scheduled_lengths(r.logits, costs_a, np.asarray(temperatures))))
    out = [{"policy": name, **replay(r, lengths, costs_a)} for name, lengths in rows]
    for row in out:
        row["vs_full"] = row["tokens_per_cost"] / out[0]["tokens_per_cost"]
    return out

"""Is the draft's confidence head calibrated, and what does Sequential Temperature Scaling (STS) change?

The head gives, per slot k of a proposal, c_k: sigmoid(c_k) estimates P(slot k accepted | slots before
it accepted). Its prediction for "the first j + 1 drafts are all accepted" is the prefix survival
a_j = prod_{i <= j} sigmoid(c_i / T_i) (T = 1 before scaling). The realised outcome is `accepted > j`,
known for every slot the round verified (j < proposed). Calibration is judged on those pairs, per
position and over all of them: the reliability diagram (equal-width bins), the expected calibration
error (ECE: the bins' |mean prediction - realised rate| weighted by their counts) and the Brier score.

STS (the DSpark paper) fits one temperature per position, left to right: T_0 on position 0, then T_1
with T_0 fixed, and so on, each the value on a log grid that minimises that position's ECE of the
prefix survival on the fitting prompts; among values within `TOLERANCE` of the best, the one nearest 1
(deep positions, whose survivals are all near 0, otherwise run to the grid's end on noise). Prompts are split into fitting and held-out halves by a hash
of their question id, so a fit is judged on prompts it never saw.

Reads the `rounds` frame of `frames.load_runs` (runs record `draft_confidences`); needs neither torch
nor rich.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

BINS = 10
GRID = np.geomspace(0.1, 10.0, 161)  # candidate temperatures: 0.1 to 10, 2.9 % apart
EPS = 1e-7  # sigmoid outputs are kept to 7 digits: logits are recovered within this clip
TOLERANCE = 1e-3  # ECEs closer than this are equal: the fit then keeps the temperature nearest 1


@dataclass
class Rounds:
    """One system at one temperature: per verified round, each slot's confidence logit, the number of
    slots verified and the number accepted."""

    logits: np.ndarray  # [rounds, N]
    proposed: np.ndarray  # [rounds]
    accepted: np.ndarray  # [rounds]
    prompts: list[str]  # the question id of each round

    def subset(self, keep: np.ndarray) -> Rounds:
        return Rounds(self.logits[keep], self.proposed[keep], self.accepted[keep],
                      [p for p, k in zip(self.prompts, keep) if k])

    def survival(self, temperatures: list[float] | None = None) -> np.ndarray:
        """[rounds, N] a_j = prod_{i <= j} sigmoid(c_i / T_i)."""
        t = np.ones(self.logits.shape[1]) if temperatures is None else np.asarray(temperatures, dtype=float)
        return np.cumprod(sigmoid(self.logits / t), axis=1)

    def outcomes(self) -> tuple[np.ndarray, np.ndarray]:
        """[rounds, N] whether slot j was verified (j < proposed), and whether the first j + 1 were accepted."""
        j = np.arange(self.logits.shape[1])[None]
        return j < self.proposed[:, None], j < self.accepted[:, None]


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, EPS, 1.0 - EPS)
    return np.log(p) - np.log1p(-p)


def groups(rounds: pd.DataFrame) -> dict[tuple[str, str, float], Rounds]:
    """(run, system, temperature) -> its rounds that recorded confidences and verified at least one slot."""
    have = rounds[rounds["confidences"].notna() & (rounds["proposed"] > 0) & ~rounds["failed"].astype(bool)]
    out = {}
    for (run, system, temp), g in have.groupby(["run", "system", "temperature"], sort=False):
        conf = np.array(g["confidences"].tolist(), dtype=float)
        out[(run, system, float(temp))] = Rounds(_logit(conf), g["proposed"].to_numpy(int),
                                                 g["accepted"].to_numpy(int), g["question_id"].astype(str).tolist())
    return out


def ece(predicted: np.ndarray, realised: np.ndarray, bins: int = BINS) -> float:
    """Expected calibration error over equal-width bins of the prediction."""
    if len(predicted) == 0:
        return math.nan
    which = np.minimum((predicted * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        inside = which == b
        if inside.any():
            total += inside.sum() * abs(predicted[inside].mean() - realised[inside].mean())
    return float(total / len(predicted))


def brier(predicted: np.ndarray, realised: np.ndarray) -> float:
    return float(np.mean((predicted - realised) ** 2)) if len(predicted) else math.nan


def reliability(predicted: np.ndarray, realised: np.ndarray, bins: int = BINS) -> pd.DataFrame:
    """Per bin of the prediction: how many pairs, their mean prediction and the realised rate."""
    which = np.minimum((predicted * bins).astype(int), bins - 1)
    rows = [{"bin": b, "low": b / bins, "high": (b + 1) / bins, "pairs": int((which == b).sum()),
             "predicted": float(predicted[which == b].mean()) if (which == b).any() else math.nan,
             "realised": float(realised[which == b].mean()) if (which == b).any() else math.nan}
            for b in range(bins)]
    return pd.DataFrame(rows)


def table(r: Rounds, temperatures: list[float] | None = None) -> pd.DataFrame:
    """Per position (and "all"): verified pairs, mean predicted survival, realised accepted-prefix rate,
    ECE and Brier score of the prefix survival."""
    survival = r.survival(temperatures)
    verified, accepted = r.outcomes()
    rows = []
    for j in range(survival.shape[1]):
        m = verified[:, j]
        p, y = survival[m, j], accepted[m, j].astype(float)
        rows.append({"position": j + 1, "pairs": int(m.sum()), "predicted": float(p.mean()) if m.any() else math.nan,
                     "realised": float(y.mean()) if m.any() else math.nan, "ece": ece(p, y), "brier": brier(p, y)})
    p, y = survival[verified], accepted[verified].astype(float)
    rows.append({"position": "all", "pairs": int(verified.sum()), "predicted": float(p.mean()) if len(p) else math.nan,
                 "realised": float(y.mean()) if len(y) else math.nan, "ece": ece(p, y), "brier": brier(p, y)})
    return pd.DataFrame(rows)


def fit_sts(r: Rounds, grid: np.ndarray = GRID) -> list[float]:
    """Per-position temperatures, fitted left to right, each minimising its position's ECE of the prefix
    survival with the earlier ones fixed (the grid value nearest 1 among those within `TOLERANCE` of the
    best). A position no round verified keeps T = 1."""
    verified, accepted = r.outcomes()
    temperatures: list[float] = []
    before = np.ones(len(r.logits))  # the survival of the earlier positions under the fitted temperatures
    order = np.argsort(np.abs(np.log(grid)))  # ties go to the temperature closest to 1
    for j in range(r.logits.shape[1]):
        m = verified[:, j]
        best = 1.0
        if m.any():
            y = accepted[m, j].astype(float)
            scores = np.array([ece(before[m] * sigmoid(r.logits[m, j] / t), y) for t in grid[order]])
            best = float(grid[order][np.argmax(scores <= scores.min() + TOLERANCE)])
        temperatures.append(best)
        before = before * sigmoid(r.logits[:, j] / best)
    return temperatures


def held_out(prompt: str, fraction: float = 0.5) -> bool:
    """Whether a prompt belongs to the held-out part: a hash of its question id, so every run splits alike."""
    return int(hashlib.sha256(prompt.encode()).hexdigest()[:8], 16) / 2**32 < fraction


@dataclass
class StsFit:
    temperatures: list[float]
    fit_rounds: int
    held_out_rounds: int
    fit_prompts: int
    held_out_prompts: int
    before: pd.DataFrame  # the held-out prompts' table at T = 1
    after: pd.DataFrame  # and with the fitted temperatures
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"temperatures": self.temperatures, "fit_rounds": self.fit_rounds,
                "held_out_rounds": self.held_out_rounds, "fit_prompts": self.fit_prompts,
                "held_out_prompts": self.held_out_prompts, "held_out_before": as_records(self.before),
                "held_out_after": as_records(self.after), "notes": self.notes}


def as_records(frame: pd.DataFrame) -> list[dict]:
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
            for row in frame.to_dict("records")]


def sts(r: Rounds, fraction: float = 0.5) -> StsFit:
    """STS fitted on the prompts outside the held-out part and judged, before and after, on the held-out
    prompts."""
    out = np.array([held_out(p, fraction) for p in r.prompts], dtype=bool)
    fit, test = r.subset(~out), r.subset(out)
    notes = []
    if not len(fit.proposed) or not len(test.proposed):
        notes.append("too few prompts to hold some out: fitted and judged on the same rounds")
        fit = test = r
    temperatures = fit_sts(fit)
    return StsFit(temperatures, len(fit.proposed), len(test.proposed), len(set(fit.prompts)), len(set(test.prompts)),
                  table(test), table(test, temperatures), notes)

"""The draft's confidence head in pictures: reliability diagrams of the prefix survival and ECE per draft
position (`harness.analysis.calibration`), one pair of panels per system and temperature; titled as
the report's other figures are. No torch, no rich."""

from __future__ import annotations

import matplotlib.pyplot as plt  # (the backend is the caller's: inline in a notebook, Agg for files)

from harness.analysis import calibration
from harness.analysis.frames import Runs
from harness.analysis.report_figures import _titled


def reliability_diagrams(runs: Runs, temperatures: dict | None = None):
    """The draft's confidence head: per system and temperature, the prefix survival's reliability diagram
    (mean prediction against the realised accepted-prefix rate per bin, every verified slot) and each
    position's ECE; with `temperatures` ({system: [T_j]}, from `calibrate --fit-sts`) the scaled survival too."""
    found = calibration.groups(runs.rounds)
    if not found:
        return ("the confidence head's calibration: no run recorded draft confidences (a DSpark draft with a "
                "confidence head, native backend)")
    fig, axes = plt.subplots(len(found), 2, figsize=(11, 4 * len(found)), squeeze=False)
    for (left, right), ((run, system, temp), r) in zip(axes, found.items()):
        fitted = (temperatures or {}).get(system)
        verified, accepted = r.outcomes()
        left.plot([0, 1], [0, 1], color="grey", linewidth=0.8, label="calibrated")
        for label, temps in (("unscaled", None), ("STS", fitted)):
            if label == "STS" and temps is None:
                continue
            rel = calibration.reliability(r.survival(temps)[verified], accepted[verified].astype(float))
            rel = rel[rel["pairs"] > 0]
            left.plot(rel["predicted"], rel["realised"], marker="o", label=label)
            per = calibration.table(r, temps)
            per = per[per["position"] != "all"]
            right.plot(per["position"], per["ece"], marker="o", label=label)
        left.set(xlabel="predicted prefix survival", ylabel="realised accepted prefix",
                 title=f"{system} T={temp:g} ({run})", xlim=(0, 1), ylim=(0, 1))
        right.set(xlabel="draft position", ylabel="ECE of the prefix survival", title="ECE per position")
        left.legend(fontsize=7)
        right.legend(fontsize=7)
    return _titled(fig, "the confidence head's calibration", runs.caption())

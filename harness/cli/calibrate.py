"""`dspark-bench calibrate RUN`: is the draft's confidence head calibrated? Per system and temperature
with recorded confidences, the prefix survival against the realised accepted prefix, per draft
position and overall (ECE, Brier score); with `--fit-sts`, Sequential Temperature Scaling fitted on
one half of the prompts and judged on the other, its temperatures saved for the engine
(`confidence = "schedule"` reads them)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import typer

from dspark.errors import DSparkError
from harness.cli import paths
from harness.cli.render import err, grid, out, show


def _fmt(v, digits: int = 3) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def calibrate(
    run_dirs: list[Path] = typer.Argument(..., help="Run folders whose requests recorded draft confidences "
                                          "(native backend, a draft with a confidence head)."),
    system: Optional[str] = typer.Option(None, help="Only this system (default: every system with confidences)."),
    temperature: Optional[float] = typer.Option(None, help="Only this sampling temperature."),
    fit_sts: Optional[Path] = typer.Option(None, "--fit-sts", help="Fit Sequential Temperature Scaling (one "
                                           "system and temperature) and write its temperatures here as JSON."),
    held_out: float = typer.Option(0.5, min=0.05, max=0.95, help="With --fit-sts: the fraction of prompts (by a "
                                   "hash of their question id) held out to judge the fit."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write the reliability diagrams here, in the format its "
                                        "suffix names (.png, .pdf, .svg ...)."),
    as_json: bool = typer.Option(False, "--json", help="Print the tables (and the fit) as JSON."),
):
    """Calibration of the draft's confidence head: reliability, ECE and Brier score per position; STS."""
    for path, flag, example, suffixes in ((fit_sts, "--fit-sts", "sts.json", ()),
                                          (plot, "--plot", "reliability.png", paths.FIGURE_SUFFIXES)):
        if path is not None:
            paths.output_file(path, flag, example, suffixes=suffixes)
    from harness.analysis import calibration
    from harness.analysis.frames import load_runs

    runs = load_runs(run_dirs)
    have_systems = sorted(set(runs.requests["system"])) if "system" in runs.requests else []
    if system is not None and system not in have_systems:  # (else: "no rounds with recorded draft confidences")
        raise DSparkError(f"--system {system}: not in {'these runs' if len(run_dirs) > 1 else 'this run'}; "
                          f"{'they have' if len(run_dirs) > 1 else 'it has'} {', '.join(have_systems) or 'no request'}")
    found = {k: r for k, r in calibration.groups(runs.rounds).items()
             if (system is None or k[1] == system) and (temperature is None or k[2] == temperature)}
    if not found:
        have = sorted({(k[1], k[2]) for k in calibration.groups(runs.rounds)})
        raise DSparkError("no rounds with recorded draft confidences" + (
            f" for that system and temperature; these have them: {', '.join(f'{s} T={t:g}' for s, t in have)}"
            if have else "; run a DSpark draft with a confidence head on the native backend"))
    if fit_sts is not None and len(found) != 1:
        raise DSparkError(f"--fit-sts fits one system at one temperature; {len(found)} have confidences "
                          f"({', '.join(f'{k[1]} T={k[2]:g}' for k in found)}): add --system and --temperature")
    result = {"groups": []}
    fitted = {}
    for (run, name, temp), r in found.items():
        group = {"run": run, "system": name, "temperature": temp, "rounds": len(r.proposed),
                 "prompts": len(set(r.prompts)), "table": calibration.as_records(calibration.table(r))}
        if fit_sts is not None:
            fit = calibration.sts(r, held_out)
            fitted[name] = fit.temperatures
            group["sts"] = fit.to_dict()
            meta = runs.meta[runs.meta["run"] == run].to_dict("records")[0]  # (this group's run, not the first given)
            saved = {"kind": "sequential temperature scaling", "system": name, "temperature": temp,
                     "temperatures": fit.temperatures, "held_out_fraction": held_out,
                     "fit_prompts": fit.fit_prompts, "held_out_prompts": fit.held_out_prompts,
                     "ece_before": fit.before.iloc[-1]["ece"], "ece_after": fit.after.iloc[-1]["ece"],
                     "run": str(meta["path"]), "git": {"commit": meta["git"], "dirty": meta["dirty"]}}
            fit_sts.parent.mkdir(parents=True, exist_ok=True)
            fit_sts.write_text(json.dumps(saved, indent=1) + "\n")
        result["groups"].append(group)
    if plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        from harness.analysis.reliability import reliability_diagrams

        fig = reliability_diagrams(runs, fitted or None)
        plot.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(plot, dpi=110)
    if as_json:
        print(json.dumps(result))
        return
    for g in result["groups"]:
        rows = [(str(r["position"]), str(r["pairs"]), _fmt(r["predicted"]), _fmt(r["realised"]), _fmt(r["ece"]),
                 _fmt(r["brier"])) for r in g["table"]]
        show(out, grid(f"{g['system']} at T={g['temperature']:g} ({g['run']}): {g['rounds']} rounds, {g['prompts']} "
                       "prompts; prefix survival against the accepted prefix",
                       [("position", "pairs", "predicted", "realised", "ECE", "Brier"), *rows]))
        if "sts" in g:
            s = g["sts"]
            rows = [(str(b["position"]), _fmt(temp_j, 2), _fmt(b["ece"]), _fmt(a["ece"]), _fmt(b["brier"]),
                     _fmt(a["brier"])) for temp_j, b, a in zip(s["temperatures"] + [None], s["held_out_before"],
                                                               s["held_out_after"])]
            show(out, grid(f"STS fitted on {s['fit_prompts']} prompts ({s['fit_rounds']} rounds), judged on "
                           f"{s['held_out_prompts']} held-out prompts ({s['held_out_rounds']} rounds)",
                           [("position", "STS temperature", "ECE before", "ECE after", "Brier before", "Brier after"),
                            *rows]))
            for note in s["notes"]:
                err.print(f"note: {note}", highlight=False)
    out.print("ECE: expected calibration error over 10 equal-width bins of the predicted prefix survival "
              "a_j = prod_{i<=j} sigmoid(c_i / T_i), against whether the first j drafts were all accepted, over "
              "every slot the round verified" + (f"; temperatures written to {fit_sts}" if fit_sts else "")
              + (f"; diagrams in {plot}" if plot else ""), highlight=False, soft_wrap=True)

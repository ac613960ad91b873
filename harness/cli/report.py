"""`dspark-bench report`: the comparison tables of saved runs again, recomputed from their requests."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from dspark.errors import DSparkError
from harness.cli.render import out, show, summary_table
from harness.cli.run import print_summary


def report(
    run_dirs: list[Path] = typer.Argument(..., help="Run folders written by `dspark-bench run`."),
    category: str = typer.Option("overall", help="Which category's rows to show (overall: the macro average)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summaries as JSON."),
):
    """Print the comparison tables of saved runs again (recomputed from their requests)."""
    from harness.analysis.summary import summarize_folder

    summaries = {}
    for d in run_dirs:
        if not (d / "manifest.json").is_file() and not (d / "requests.jsonl").is_file():
            raise DSparkError(f"{d}: no manifest.json or requests.jsonl; give a folder written by dspark-bench run")
        summaries[str(d)] = summarize_folder(d)
    present = sorted({r["category"] for s in summaries.values() for r in s["rows"]} - {"overall"})
    if category != "overall" and category not in present:
        raise DSparkError(f"--category {category}: not in {'these runs' if len(summaries) > 1 else 'this run'}; "
                          f"it has overall, {', '.join(present)}" if present else
                          f"--category {category}: the run has no finished request yet")
    if as_json:
        print(json.dumps(summaries))
        return
    for name, summary in summaries.items():
        print_summary(summary, f"{name} ({category})", category)
    if len(summaries) > 1:
        merged = {"rows": [dict(r, system=f"{Path(name).name}/{r['system']}") for name, s in summaries.items()
                           for r in s["rows"]]}
        unfinished = [s for s in summaries.values() if s.get("complete") is False]
        if unfinished:  # the comparison's title says so too
            merged |= {"complete": False, "requests_done": sum(s["requests_done"] for s in unfinished),
                       "requests_expected": sum(s["requests_expected"] for s in unfinished)}
        show(out, summary_table(merged, f"comparison ({category})", category))

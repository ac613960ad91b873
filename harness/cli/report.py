"""`dspark-bench report`: the comparison tables of saved runs again, recomputed from their requests; with
`--html`, the report notebooks executed on them, as one self-contained HTML file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from dspark.errors import DSparkError
from harness.cli.render import out, show, summary_table
from harness.cli.run import print_summary


def report(
    run_dirs: list[Path] = typer.Argument(..., help="Run folders written by `dspark-bench run`."),
    category: str = typer.Option("overall", help="Which category's rows to show (overall: the macro average)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summaries as JSON."),
    html: Optional[Path] = typer.Option(None, "--html", help="Also execute the report notebooks on these runs and "
                                        "write them, figures embedded, as one HTML file here."),
    profile: Optional[list[Path]] = typer.Option(None, "--profile", help="With --html: a profile folder or trace "
                                                 "file for the where-the-time-goes notebook (repeatable)."),
    engine_bench: Optional[Path] = typer.Option(None, "--engine-bench", help="With --html: an `engine-bench --json` "
                                                "file; the speed notebook draws the speedup its round cost predicts."),
):
    """Print the comparison tables of saved runs again (recomputed from their requests); --html writes the
    report notebooks' figures for them."""
    from harness.analysis.summary import summarize_folder

    if (profile or engine_bench) and html is None:
        raise DSparkError("--profile and --engine-bench go into the HTML report; add --html OUT")
    for p in profile or []:
        if not p.exists():
            raise DSparkError(f"--profile {p}: no such folder or file")
    if engine_bench is not None and not engine_bench.is_file():
        raise DSparkError(f"--engine-bench {engine_bench}: no such file (write one with dspark-bench engine-bench --json)")

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
    if html is not None:
        _html(run_dirs, list(profile or []), engine_bench, html)
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


def _html(run_dirs: list[Path], profiles: list[Path], engine_bench: Path | None, html: Path) -> None:
    from harness.analysis.notebooks import inputs, report_html
    from harness.cli.render import err

    env = inputs(run_dirs, profiles, engine_bench, tuple(run_dirs) if len(run_dirs) == 2 else None)
    with err.status("executing the report notebooks") as status:
        names, failures = report_html(env, html, progress=lambda name: status.update(f"executing {name}.ipynb"))
    err.print(f"wrote {html}: the {', '.join(names)} notebooks, figures embedded", highlight=False, soft_wrap=True)
    for failure in failures:  # (each is one line in the report too, where its section is)
        err.print(f"a section could not be drawn: {failure}", highlight=False, soft_wrap=True)

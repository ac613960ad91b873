"""`dspark-bench run`: SPEED-Bench prompts through every system of an experiment, and the comparison."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from dspark.errors import DSparkError
from harness.cli import options, paths
from harness.cli.render import err, out, show, summary_table, sweep_table
from harness.runs.plan import RunOptions


@options.with_run_options
def run(
    ctx: typer.Context,
    run_options: dict,
    out_dir: Optional[str] = typer.Option(None, "--out", help="Run folder (default: results/<experiment>-<split>-<time>)."),
    resume: Optional[str] = typer.Option(None, help="Finish the unfinished run in this folder, with the options it "
                                         "was started with (an option given as well must equal the run's)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Resolve every system (format, fit, method); generate "
                                 "nothing (a flag)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary (or the dry run) as JSON."),
    options_file: Optional[Path] = typer.Option(None, hidden=True, help="Set by `profile`: the run options as JSON."),
    profiled: Optional[str] = typer.Option(None, hidden=True, help="Set by `profile` for its child runs."),
):
    """Run SPEED-Bench prompts through every system of an experiment and compare them."""
    from harness.runs.plan import resume_options
    from harness.runs.runner import run as run_all

    if profiled not in (None, "nsys", "torch"):
        raise DSparkError(f"--profiled {profiled}: nsys or torch")
    if out_dir and resume:
        raise DSparkError("give --out for a new run or --resume for an unfinished one, not both")
    paths.run_folder(out_dir, resume)
    opts = options.run_options_from(run_options, out=out_dir, resume=resume, profiled=profiled)
    given = options.given_fields(ctx)
    if options_file is not None:  # a profile's child: the parent's options, then what its command line sets
        if not options_file.is_file():
            raise DSparkError(f"--options-file {options_file}: no such file (profile writes it for its children)")
        recorded = RunOptions(**json.loads(options_file.read_text()), out=out_dir, resume=resume, profiled=profiled)
        opts = RunOptions(**{f: getattr(opts if f in given else recorded, f) for f in vars(recorded)})
    if resume:
        opts = resume_options(opts, given)
    options.device(opts.device)  # a recorded or handed-over device must be here too
    if dry_run:
        rows = _dry_run(opts, err if as_json else out)
        if as_json:
            print(json.dumps(rows))
        if not all(r["fits_target"] for r in rows):
            raise typer.Exit(1)
        return
    path, summary = run_all(opts, err)
    if as_json:
        print(json.dumps({"run_dir": str(path), **summary}))
        return
    cats = ", ".join(opts.categories) if opts.categories else "all categories"
    print_summary(summary, f"{opts.experiment}: {opts.split} {cats} ({path})")
    out.print(f"wrote {path}: " + ", ".join(Path(f).name for f in summary["files"]), highlight=False, soft_wrap=True)


def print_summary(summary: dict, title: str, category: str = "overall", console: Console = out) -> None:
    """The comparison table, then what a reader must know before trusting it."""
    show(console, summary_table(summary, title, category))
    if summary.get("max_concurrency", [1]) != [1]:
        show(console, sweep_table(summary, "concurrency sweep (overall rows)"))
    for line in summary.get("warnings", []):
        console.print(f"warning: {line}", style="yellow", highlight=False, soft_wrap=True)
    if summary["baseline"] is None and summary["rows"]:
        console.print("no speedup: plain decoding was not among the systems", style="dim")


def _dry_run(opts: RunOptions, console: Console) -> list[dict]:
    """Resolve every system of the experiment against the target's config, reading no weights."""
    from dspark.checkpoint import read_config, resolve_path
    from dspark.config import TargetConfig
    from harness.backends.systems import resolve_system
    from harness.runs.plan import resolve_settings
    from harness.specs.experiments import load_experiment

    exp = load_experiment(opts.experiment)
    settings = resolve_settings(opts, exp)
    target_path = resolve_path(exp.target)
    target_cfg = TargetConfig.from_hf(read_config(target_path), f"target {exp.target}")
    rows = [resolve_system(exp.system(name), target_cfg) for name in settings["systems"]]
    t = Table(title=f"dry run: experiment {exp.name}, target {exp.target} ({target_path})")
    for col in ("system", "draft", "format", "method", "tokens/round", "fits", "problem"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["system"], r["draft"] or "-", r["format"] or "-", r["method"] or "-",
                  str(r.get("num_speculative_tokens", "-")), "yes" if r["fits_target"] else "NO", r["problem"] or "")
    show(console, t)
    return rows

"""`dspark-bench run`: SPEED-Bench prompts through every system of an experiment, and the comparison."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from dspark.errors import DSparkError
from harness.analysis.table_text import swept, synthetic_lines, warning_lines
from harness.cli import options, paths
from harness.cli.render import err, grid, out, show, summary_table, sweep_table
from harness.runs.plan import RunOptions
from harness.specs.experiments import Experiment


@options.with_run_options
def run(
    ctx: typer.Context,
    run_options: dict,
    out_dir: Optional[str] = typer.Option(None, "--out", help="Run folder (default: results/<experiment>-<split>-<time>)."),
    resume: Optional[str] = typer.Option(None, help="Finish the unfinished run in this folder, with the options it "
                                         "was started with (an option given as well must equal the run's)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Resolve every system (format, fit, method), count the "
                                 "run (prompts, requests, output tokens) and estimate its time from earlier "
                                 "measurements on this kind of machine; generate nothing (a flag). Exit 2, naming "
                                 "the systems, where the run would refuse one."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary (or the dry run: systems, size, estimate) "
                                 "as JSON."),
    options_file: Optional[Path] = typer.Option(None, hidden=True, help="Set by `profile`: the run options as JSON."),
    profiled: Optional[str] = typer.Option(None, hidden=True, help="Set by `profile` for its child runs."),
):
    """Run SPEED-Bench prompts through every system of an experiment and compare them."""
    from harness.runs import preflight
    from harness.runs.plan import check_options, resolve_settings, resume_options
    from harness.specs.experiments import load_experiment

    if profiled not in (None, "nsys", "torch"):
        raise DSparkError(f"--profiled {profiled}: nsys or torch")
    if out_dir and resume:
        raise DSparkError("give --out for a new run or --resume for an unfinished one, not both")
    paths.run_folder(out_dir, resume)
    # Option mistakes answer at once: the values parsed and held against the experiment before torch loads (to
    # resolve --device), the rest of the settings before the run's own code loads.
    opts = options.run_options_from(run_options, resolve_device=False, out=out_dir, resume=resume, profiled=profiled)
    given = options.given_fields(ctx)
    new = not resume and options_file is None
    if new:
        experiment = load_experiment(opts.experiment)
        check_options(opts, experiment)
    if options_file is not None:  # a profile's child: the parent's options, then what its command line sets
        if not options_file.is_file():
            raise DSparkError(f"--options-file {options_file}: no such file (profile writes it for its children)")
        recorded = RunOptions(**json.loads(options_file.read_text()), out=out_dir, resume=resume, profiled=profiled)
        opts = RunOptions(**{f: getattr(opts if f in given else recorded, f) for f in vars(recorded)})
    if resume:  # (a --device given is compared resolved; the run's own is recorded resolved)
        opts = resume_options(replace(opts, device=options.device(opts.device)) if "device" in given else opts, given)
    opts = replace(opts, device=options.device(opts.device))  # `auto` resolved; a recorded device must be here too
    if not new:  # the run's own experiment: as recorded (--resume), or as the profile gave it
        experiment = load_experiment(opts.experiment)
    if resume:  # (an edited experiment file named key by key, before its settings are held against the run's)
        from harness.runs.folder import RunFolder

        RunFolder(Path(resume)).check_experiment(experiment)
    settings = resolve_settings(opts, experiment)
    if dry_run:
        plan = _dry_run(opts, experiment, settings, err if as_json else out)
        if as_json:
            print(json.dumps(plan))
        preflight.refuse(plan["systems"])
        return
    data = preflight.check(opts, experiment, settings).data  # what the run would refuse, before the models load
    from harness.runs.runner import run as run_all

    path, summary = run_all(opts, err, data)
    if as_json:
        print(json.dumps({"run_dir": str(path), **summary}))
        return
    cats = ", ".join(opts.categories) if opts.categories else "all categories"
    print_summary(summary, f"{opts.experiment}: {opts.split} {cats} ({path})")
    out.print(f"wrote {path}: " + ", ".join(Path(f).name for f in summary["files"]), highlight=False, soft_wrap=True)


def print_summary(summary: dict, title: str, category: str = "overall", console: Console = out) -> None:
    """The comparison table; for a served run (its requests streamed: inter-token latencies) or a sweep, the
    serving figures per level as `vllm bench serve` reports them; then what a reader must know before
    trusting them."""
    if any(r["category"] == category for r in summary["rows"]):  # (a run with no finished request: no empty table)
        show(console, summary_table(summary, title, category))
    level = swept(summary)
    if level or any(r.get("median_itl_ms") is not None for r in summary["rows"]):
        show(console, sweep_table(summary, "concurrency sweep (overall rows)" if level else "serving (overall rows)"))
    for line in synthetic_lines(summary):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    for warning in summary.get("warnings", []):
        console.print("\n".join(warning_lines(warning)), style="yellow", highlight=False, markup=False, soft_wrap=True)
    if summary["baseline"] is None and summary["rows"]:
        console.print("no speedup: plain decoding was not among the systems", style="dim")


def _dry_run(opts: RunOptions, exp: Experiment, settings: dict, console: Console) -> dict:
    """The prompts selected (a mistake there answers before anything is printed); every system of the
    experiment resolved against the target's config, reading no weights; then the run's size (prompts,
    requests, output tokens) and an estimate of its time (`harness.runs.estimate`): {systems, size,
    estimate}."""
    from dspark.checkpoint import pick_dtype
    from harness.backends.registry import backend_class
    from harness.runs import estimate, preflight, threads
    from harness.runs.plan import plan_jobs

    found = preflight.prompts(opts, exp, settings, hub_optional=True)  # (what the run would refuse, refused here too)
    prompts, turns_of, unread = found.rows, found.turns_of, found.unread
    target_path, target_cfg, rows = preflight.systems(exp, settings, opts.device)
    from harness.analysis.synthetic_check import label

    named = label(settings)
    cols = ("system", "draft", "format", "method", "tokens/round", "fits", "problem")
    cells = [(r["system"], r["draft"] or "-", r["format"] or "-", (r["method"] or "-") + (
                  f" (markov_topk {r['markov_topk']})" if r.get("markov_topk") else ""),
              str(r.get("num_speculative_tokens", "-")), "yes" if r["fits_target"] else "NO", r["problem"] or "")
             for r in rows]
    show(console, grid(escape(f"dry run: experiment {exp.name}, target {exp.target} ({target_path})"
                              + (f" [{named}]" if named else "")), [cols, *cells], cols))
    jobs = None if prompts is None else plan_jobs(settings, prompts, turns_of,
                                                  backend_class(settings["backend"]).capabilities.interleaves)
    size = estimate.run_size(settings, jobs, None if prompts is None else len(prompts)) | {"dataset_unread": unread}
    dtype = str(pick_dtype(opts.dtype, opts.device)).removeprefix("torch.")
    count = threads.choose(opts.threads, opts.device, target_path)[0]  # (the run's own count, as it would choose)
    guess = None if jobs is None else estimate.estimate(settings, jobs, rows, target_cfg,
                                                        estimate.machine_of(opts.device), dtype, count)
    for line in _size_lines(size) + _estimate_lines(guess, settings, opts.device):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    return {"systems": rows, "size": size, "estimate": guess}


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _size_lines(size: dict) -> list[str]:
    """The dry run's size: prompts x temperatures x systems (x levels) = requests, and the output tokens."""
    per = [_count(size["temperatures"], "temperature"), _count(size["systems"], "system")] + (
        [_count(size["concurrency_levels"], "concurrency level")] if size["concurrency_levels"] > 1 else [])
    each = (f"{size['output_len']:,} a request" + ("" if size["output_tokens_exact"] else
                                                    ", fewer where a reply ends sooner"))
    bound = "" if size["output_tokens_exact"] else "at most "
    if size["requests"] is None:
        return [f"size: prompts not known ({size['dataset_unread']}); per prompt: "
                f"{' x '.join(per)} = {_count(size['requests_per_prompt_turn'], 'request')} a turn, {bound}"
                f"{size['requests_per_prompt_turn'] * size['output_len']:,} output tokens ({each})"]
    turns = "" if size["user_turns"] == size["prompts"] else f" ({_count(size['user_turns'], 'user turn')})"
    return [f"size: {' x '.join([_count(size['prompts'], 'prompt') + turns] + per)} = "
            f"{_count(size['requests'], 'request')}; {bound}{size['output_tokens']:,} output tokens ({each})"]


def _estimate_lines(guess: dict | None, settings: dict, device: str) -> list[str]:
    """The dry run's time estimate, where it came from and how rough it is; or why there is none."""
    from harness.runs.progress import duration

    if guess is None:
        return ["time: no estimate without the prompts"]
    machine = ", ".join(f"{v} cores" if k == "cores" else str(v) for k, v in guess["machine"].items())
    if guess["seconds"] is None:
        return [f"time: no estimate: no earlier run of {settings['target']} on {settings['backend']} ({device}, "
                f"{settings['dtype']}) on a machine like this one ({machine}) in results/ or benchmarks/"
                + (", and no engine-bench measurement of its shape here" if settings["backend"] == "native" else "")
                + "; a short run (--num-prompts 2) makes one"]
    low, high = guess["seconds"]
    figure = f"about {duration(low)}" if high <= 1.05 * low else f"between {duration(low)} and {duration(high)}"
    part = "" if guess["requests"] == guess["of"] else f" for {guess['requests']:,} of the {guess['of']:,} requests"
    lines = [f"time: {figure}{part}, from {' and '.join(guess['ways'])} on a machine like this one ({machine}):"]
    lines += [f"  {_shown(s['path'])} (measured {s['measured_utc'][:10] or 'at an unrecorded time'})" + (
        f": scaled from the closest settings of {_count(guess['earlier_runs'], 'earlier run')}, "
        + (f"differs in {', '.join(s['differs'])}" if s["differs"] else "the same settings")
        if s["way"] == "earlier runs" else "") for s in guess["sources"]]
    if guess["missing"]:
        lines.append(f"  no figure for {', '.join(guess['missing'])}: not measured here before")
    lines.append(f"  rough: {'; '.join(guess['caveats'])}")
    return lines


def _shown(path: str) -> str:
    """A path as short as it reads: relative to the working folder where it lies under it."""
    p = Path(path)
    return str(p.relative_to(Path.cwd())) if p.is_relative_to(Path.cwd()) else str(p)

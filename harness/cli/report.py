"""`dspark-bench report`: the comparison tables of saved runs again, recomputed from their requests; with
`--html`, the report notebooks executed on them, as one self-contained HTML file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from dspark.errors import DSparkError
from harness.analysis.records import not_a_run, read_manifest
from harness.analysis.table_text import warning_lines
from harness.cli import paths
from harness.cli.render import deltas_table, out, show
from harness.cli.run import print_summary


def report(
    run_dirs: list[Path] = typer.Argument(..., help="Run folders written by `dspark-bench run` (with --aiperf: two "
                                          "AIPerf artifact folders, plain decoding's first)."),
    category: str = typer.Option("overall", help="Which category's rows to show (overall: the macro average)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summaries as JSON."),
    together: bool = typer.Option(False, "--together", help="One table of every run's systems (rows run x "
                                  "system, each against its own run's plain decoding, acceptance by one definition "
                                  "for every engine) instead of a table per run and B against A."),
    html: Optional[Path] = typer.Option(None, "--html", help="Execute the report notebooks on these runs and "
                                        "write them, figures embedded, as one HTML file here (instead of the tables)."),
    profile: Optional[list[Path]] = typer.Option(None, "--profile", help="With --html: a profile folder or trace "
                                                 "file for the where-the-time-goes notebook (repeatable); one not "
                                                 "timed as the runs were gets a note naming both."),
    engine_bench: Optional[Path] = typer.Option(None, "--engine-bench", help="With --html: an `engine-bench --json` "
                                                "file; the speed notebook draws, per system of a method it timed, the speedup "
                                                "its own round cost predicts."),
    aiperf: bool = typer.Option(False, "--aiperf", help="The two folders are `aiperf profile` artifact folders "
                                "made without dspark-bench, a plain server's then a speculative one's, of the same "
                                "prompts: read as one run of two systems (paired by conversation and prompt)."),
):
    """Print the comparison tables of saved runs again (recomputed from their requests); --html writes the
    report notebooks' figures for them."""
    _each_once(run_dirs, "AIPerf folder" if aiperf else "run folder")
    if aiperf:
        _aiperf_pair(run_dirs, category, as_json, html, together or bool(profile) or engine_bench is not None)
        return
    if together and html is not None:
        raise DSparkError("--together is the terminal's (and --json's) one table; the HTML report keeps its own "
                          "(each engine's AL as it counts it): drop --together or --html")
    if (profile or engine_bench) and html is None:
        raise DSparkError("--profile and --engine-bench go into the HTML report; add --html OUT")
    if html is not None:
        paths.output_file(html, "--html", "report.html", suffixes=paths.HTML_SUFFIXES)
    from harness.analysis.summary import summarize_folder

    for p in profile or []:
        if not p.exists():
            raise DSparkError(f"--profile {p}: no such folder or file")
    if engine_bench is not None and not engine_bench.is_file():
        raise DSparkError(f"--engine-bench {engine_bench}: no such file (write one with dspark-bench engine-bench --json)")
    if engine_bench is not None:
        _check_engine_bench(engine_bench)

    summaries = {}
    for d in run_dirs:
        if not (d / "manifest.json").is_file() and not (d / "requests.jsonl").is_file():
            if (d / "profile_export_aiperf.json").is_file():
                raise DSparkError(f"{d}: an AIPerf artifact folder, not a run folder; give two with --aiperf "
                                  "(plain decoding's first): dspark-bench report --aiperf PLAIN_DIR SPEC_DIR")
            raise DSparkError(f"{d}: {not_a_run(d)}; give a folder written by dspark-bench run")
        summaries[str(d)] = summarize_folder(d)
    present = sorted({r["category"] for s in summaries.values() for r in s["rows"]} - {"overall"})
    if category != "overall" and category not in present:
        raise DSparkError(f"--category {category}: not in {'these runs' if len(summaries) > 1 else 'this run'}; "
                          f"it has overall, {', '.join(present)}" if present else
                          f"--category {category}: the run has no finished request yet")
    if html is not None:
        _html(run_dirs, list(profile or []), engine_bench, html)
        if not as_json:  # the tables are in the page: the console gets only the path written
            return
    names = run_labels(len(summaries))
    if together:
        _together(run_dirs, names, summaries, category, as_json)
        return
    if as_json:
        print(json.dumps(summaries))
        return
    for label, (name, summary) in zip(names, summaries.items()):
        print_summary(summary, f"{label + ': ' if len(summaries) > 1 else ''}{name} ({category})", category)
    for label, d in zip(names[1:], run_dirs[1:]):
        print_deltas(run_dirs[0], d, summaries[str(run_dirs[0])], summaries[str(d)], (names[0], label), category)


def _aiperf_pair(dirs: list[Path], category: str, as_json: bool, html: Path | None, others: bool) -> None:
    """Two AIPerf folders as one run of ours (`runs.aiperf_import`, in a folder that goes when the report is
    done): the settings that differ, the requests that did not pair, then the run's tables (or its HTML)."""
    import tempfile

    from harness.analysis.compare_runs import settings_line
    from harness.analysis.summary import summarize_folder
    from harness.runs import aiperf_import

    if len(dirs) != 2:
        raise DSparkError(f"--aiperf reads two AIPerf folders, plain decoding's then the speculative run's; got "
                          f"{len(dirs)}")
    if others:
        raise DSparkError("--aiperf reads one pair of AIPerf folders: drop --together, --profile and --engine-bench")
    if html is not None:
        paths.output_file(html, "--html", "report.html", suffixes=paths.HTML_SUFFIXES)
    plain, spec = (aiperf_import.read_folder(d) for d in dirs)
    with tempfile.TemporaryDirectory(prefix="dspark-aiperf-") as tmp:
        run_dir = Path(tmp) / f"aiperf {dirs[0].resolve().name} vs {dirs[1].resolve().name}"  # (the HTML's title)
        unpaired = aiperf_import.write_run(plain, spec, run_dir)
        summary = summarize_folder(run_dir)
        present = sorted({r["category"] for r in summary["rows"]} - {"overall"})
        if category != "overall" and category not in present:
            raise DSparkError(f"--category {category}: not in these AIPerf runs; they have overall, {', '.join(present)}")
        diff = aiperf_import.settings_differ(plain, spec)
        if html is not None:
            _html([run_dir], [], None, html)
        elif as_json:
            print(json.dumps(summary | {"run_dir": [str(d.resolve()) for d in dirs],  # (not the report's temp folder)
                                        "aiperf": {"folders": [str(d) for d in dirs], "unpaired": unpaired,
                                                   "settings_differ": diff}}))
        else:
            line = settings_line(diff, ("plain", "speculative"))
            out.print(f"AIPerf {plain.version} runs: {dirs[0]} (plain), {dirs[1]} (speculative); {line}",
                      highlight=False, markup=False, soft_wrap=True)
            for said in unpaired:
                out.print(f"not paired: {said}", style="yellow", highlight=False, markup=False, soft_wrap=True)
            print_summary(summary, f"{dirs[1]} against {dirs[0]} ({category})", category)


def run_labels(n: int) -> list[str]:
    """A, B, C ...: the short names the runs go by in a comparison (their folders are in the tables' titles)."""
    return [chr(ord("A") + i) if i < 26 else f"R{i + 1}" for i in range(n)]


def print_deltas(dir_a: Path, dir_b: Path, summary_a: dict, summary_b: dict, names: tuple[str, str],
                 category: str) -> None:
    """What differs between two runs' settings, then B's figures against A's, and the rows only one has."""
    from harness.analysis.compare_runs import deltas, settings_diff, settings_line

    manifests = [read_manifest(d) or {} for d in (dir_a, dir_b)]
    diff = settings_line(settings_diff(*manifests), names)
    out.print(diff, style="yellow" if diff.startswith("settings differ") else None, highlight=False, markup=False,
              soft_wrap=True)
    result = deltas(summary_a, summary_b, category)
    if result["rows"]:
        show(out, deltas_table(result, names, f"{names[1]} against {names[0]} ({category})"))
    else:
        out.print(f"{names[0]} and {names[1]} have no system and temperature in common: nothing to compare",
                  highlight=False)
    for label, missing in zip(names, result["only_in"]):
        if missing:
            rows = ", ".join(f"{system} T={temp:g}" + ("" if conc == 1 else f" c={conc}") for system, temp, conc in missing)
            out.print(f"only in {label}: {rows}", style="dim", highlight=False, markup=False, soft_wrap=True)


def _together(run_dirs: list[Path], names: list[str], summaries: dict, category: str, as_json: bool) -> None:
    """Every run's systems in one table (`analysis.together`), each run's folder and title marks under it."""
    from harness.analysis.together import together
    from harness.cli.render import together_table

    result = together([(name, summaries[str(d)], read_manifest(d) or {}) for name, d in zip(names, run_dirs)], category)
    if as_json:
        print(json.dumps(result | {"runs": {name: str(d) for name, d in zip(names, run_dirs)}}))
        return
    show(out, together_table(result, f"{len(run_dirs)} runs together ({category})", category))
    for name, d in zip(names, run_dirs):
        said = result["marks"].get(name)
        out.print(f"{name}: {d}" + (f" [{'; '.join(said)}]" if said else ""), highlight=False, markup=False,
                  soft_wrap=True)
        for warning in summaries[str(d)].get("warnings", []):
            out.print("\n".join(warning_lines(warning, f"{name} warning: ")), style="yellow", highlight=False,
                      markup=False, soft_wrap=True)


STEP_COSTS = ("decode_ms", "round_ms")  # what the speed notebook reads of an engine-bench file, in ms


def _check_engine_bench(path: Path) -> None:
    """Refuse a file that is not `engine-bench --json`'s output before the notebooks run: one was drawn as
    "a section could not be drawn: JSONDecodeError" in a report that exited 0. The speed notebook reads a
    plain step's and a round's cost (`decode_ms`, `round_ms`), which every engine-bench run records."""
    try:
        bench = json.loads(path.read_bytes())
    except (OSError, ValueError):  # (not JSON, not UTF-8: both ValueErrors)
        bench = None
    costs = bench if isinstance(bench, dict) else {}
    missing = [k for k in STEP_COSTS if type(costs.get(k)) not in (int, float) or not costs[k] > 0]  # (nan: not > 0)
    if missing:
        raise DSparkError(f"--engine-bench {path}: not the output of dspark-bench engine-bench --json (no "
                          f"{' or '.join(missing)}); write one with dspark-bench engine-bench --json > FILE")


def _each_once(run_dirs: list[Path], what: str = "run folder") -> None:
    """Refuse a run folder given twice (by any path to it): `report R R` printed one table and no note, its
    second copy silently dropped, as if the comparison asked for had been made."""
    seen: dict[Path, Path] = {}
    for d in run_dirs:
        if d.resolve() in seen:
            raise DSparkError(f"{d}: given twice (also as {seen[d.resolve()]}); give each {what} once")
        seen[d.resolve()] = d


def _html(run_dirs: list[Path], profiles: list[Path], engine_bench: Path | None, html: Path) -> None:
    from harness.analysis.frames import profile_files
    from harness.analysis.notebooks import inputs, report_html
    from harness.cli.render import err

    for p in profiles:  # (refused in one line before a kernel starts)
        profile_files(p)
    env = inputs(run_dirs, profiles, engine_bench, tuple(run_dirs) if len(run_dirs) == 2 else None)
    with err.status("executing the report notebooks") as status:
        names, failures = report_html(env, html, progress=lambda name: status.update(f"executing {name}.ipynb"))
    err.print(f"wrote {html}: the {', '.join(names)} notebooks, figures embedded", highlight=False, soft_wrap=True)
    for failure in failures:  # (each is one line in the report too, where its section is)
        err.print(f"a section could not be drawn: {failure}", highlight=False, soft_wrap=True)

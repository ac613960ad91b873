"""`dspark-bench trace`: our reader of Nsight Systems exports (and PyTorch profiler traces)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from dspark.errors import DSparkError
from harness.cli import paths
from harness.cli.render import error_line, print_comparison, print_operators, print_trace_summary
from harness.specs.experiments import METHODS

SPECULATIVE = [m for m in METHODS if m != "plain"]  # the methods whose draft leaves a <method>_propose range

trace_app = typer.Typer(help="Read Nsight Systems exports (and PyTorch profiler traces) with our own parser.",
                        no_args_is_help=True, rich_markup_mode=None)


@trace_app.command("summarize")
def trace_summarize(
    file: Path = typer.Argument(..., help="A .sqlite export, a .nsys-rep (exported first) or a PyTorch .json trace."),
    expect_method: Optional[str] = typer.Option(None, help="A speculative method whose <method>_propose range "
                                                f"must appear ({', '.join(SPECULATIVE)}): the summary is "
                                                "printed, and the command exits 1 when the range is missing."),
    as_json: bool = typer.Option(False, "--json", help="Print the whole summary as JSON."),
):
    """NVTX ranges, kernels, categories, API calls, GPU projection, launches, processes and a diagnosis;
    for a PyTorch trace, its host operators by self time."""
    from harness.profiling.compare import summarize_any
    from harness.profiling.traces import missing_propose

    check_exports([file])
    if expect_method is not None and expect_method not in SPECULATIVE:
        raise DSparkError(f"--expect-method {expect_method} is not a speculative method; give one of "
                          f"{', '.join(SPECULATIVE)}")
    s = summarize_any(file, expect_method)
    if as_json:
        print(json.dumps(s))
    else:
        print_trace_summary(s, file.name)
        if (s.get("host") or {}).get("operators"):
            print_operators({"rows": [{"name": file.name, "operators": s["host"]["operators"][:25]}]})
    missing = missing_propose(s, expect_method) if expect_method else None
    if missing:
        error_line(f"{file.name}: {missing[0].lower()}{missing[1:]}")
        raise typer.Exit(1)


@trace_app.command("compare")
def trace_compare(
    inputs: list[Path] = typer.Argument(..., help="Trace files, or folders written by dspark-bench profile."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
):
    """Kernel-category shares and counts, step ranges and, for profile folders, launches and GPU time per
    token; for PyTorch traces the top host operators, and with a profile's requests the host time per
    decoded token and the profiler's overhead. Inputs of the same name are told apart by their folders."""
    from harness.profiling.compare import compare, load_inputs

    check_exports(inputs)
    result = compare(load_inputs(inputs))
    if as_json:
        print(json.dumps(result))
    else:
        print_comparison(result, "comparison")
        print_operators(result)


def check_exports(files: list[Path]) -> None:
    """A .nsys-rep is read through its SQLite export, written beside it first: refused at once when that
    file cannot be written, not after nsys has exported for minutes."""
    from harness.profiling.compare import export_due
    from harness.profiling.nsys import sqlite_export

    for f in files:
        if f.suffix == ".nsys-rep" and f.is_file() and export_due(f):
            paths.output_file(sqlite_export(f), f"{f.name}'s export", fix="copy the .nsys-rep into a folder where "
                              "files can be created and read it there")

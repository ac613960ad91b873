"""`dspark-bench trace`: our reader of Nsight Systems exports (and PyTorch profiler traces)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from harness.cli.render import print_comparison, print_operators, print_trace_summary

trace_app = typer.Typer(help="Read Nsight Systems exports (and PyTorch profiler traces) with our own parser.",
                        no_args_is_help=True, rich_markup_mode=None)


@trace_app.command("summarize")
def trace_summarize(
    file: Path = typer.Argument(..., help="A .sqlite export, a .nsys-rep (exported first) or a PyTorch .json trace."),
    expect_method: Optional[str] = typer.Option(None, help="A speculative method whose <method>_propose range "
                                                "must appear (dspark, dflash, ngram)."),
    as_json: bool = typer.Option(False, "--json", help="Print the whole summary as JSON."),
):
    """NVTX ranges, kernels, categories, API calls, GPU projection, launches, processes and a diagnosis;
    for a PyTorch trace, its host operators by self time."""
    from harness.profiling.compare import summarize_any

    s = summarize_any(file, expect_method)
    if as_json:
        print(json.dumps(s))
        return
    print_trace_summary(s, file.name)
    if (s.get("host") or {}).get("operators"):
        print_operators({"rows": [{"name": file.name, "operators": s["host"]["operators"][:25]}]})


@trace_app.command("compare")
def trace_compare(
    inputs: list[Path] = typer.Argument(..., help="Trace files, or folders written by dspark-bench profile."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
):
    """Kernel-category shares and counts, step ranges and, for profile folders, launches and GPU time per
    token; for PyTorch traces the top host operators, and with a profile's requests the host time per
    decoded token and the profiler's overhead. Inputs of the same name are told apart by their folders."""
    from harness.profiling.compare import compare, load_inputs

    result = compare(load_inputs(inputs))
    if as_json:
        print(json.dumps(result))
    else:
        print_comparison(result, "comparison")
        print_operators(result)

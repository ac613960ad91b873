"""`dspark-bench profile`: every system of a run in its own child run under nsys or the PyTorch
profiler, the steady state only, then where the time goes side by side. The child runs are given
the run options as data (the recorded options, as `--resume` reads them), never as rebuilt flags.
Unless told otherwise a profile takes a few prompts at one temperature (`harness.runs.selection`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from dspark.errors import DSparkError
from harness.backends.capture import megabytes
from harness.cli import options, paths
from harness.cli.render import err, out, print_comparison, print_operators
from harness.profiling.child import STALL_S


@options.with_run_options
def profile(
    ctx: typer.Context,
    run_options: dict,
    nsys: bool = typer.Option(False, "--nsys", help="Trace each system under Nsight Systems."),
    torch_profiler: bool = typer.Option(False, "--torch", help="Use the PyTorch profiler instead (CPU or GPU)."),
    preset: Optional[str] = typer.Option(None, help="default: -t cuda,nvtx,osrt,cudnn,cublas, Python and CUDA "
                                         "backtraces, fork tracing, graph nodes (our engine's default); lean: -t "
                                         "cuda,nvtx, no CPU sampling (vLLM's default: under the other its DSpark "
                                         "engine hung)."),
    nsys_path: Optional[str] = typer.Option(None, help="The nsys to use (else $NSYS, the PATH, standard folders)."),
    nsys_arg: list[str] = typer.Option([], "--nsys-arg", help="Extra flag for nsys profile (repeatable). "
                                       "--trace-fork=... is read as --trace-fork-before-exec=..., the flag "
                                       "that makes nsys follow a forked engine process."),
    out_dir: Optional[str] = typer.Option(None, "--out", help="Profile folder (default: results/<experiment>-<split>-"
                                          "<time>-profile)."),
    max_trace_mb: float = typer.Option(500, "--max-trace-mb", help="The most megabytes of JSON one PyTorch trace "
                                       "may hold, estimated from its events before it is written (it is written "
                                       "gzipped, about 12 times smaller); above it the profile stops. 0: no limit."),
    overhead: Optional[bool] = typer.Option(None, "--overhead/--no-overhead", help="First time the same requests "
                                            "unprofiled (every system in one child run), to measure the profiler's "
                                            "overhead (default: on for the native backend; vLLM would start its "
                                            "engines once more)."),
    stall_timeout: float = typer.Option(STALL_S, "--stall-timeout", help="Seconds a child may go without a "
                                        "line, a request or a file growing before it is ended as stalled (0: "
                                        "wait for ever)."),
    resume: Optional[str] = typer.Option(None, "--resume", help="Finish the profile in this folder, as it was "
                                         "started: the systems profiled are kept, a finished child's trace is "
                                         "summarised, the rest are profiled again (no run option may be given)."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
):
    """Profile every system of a run (one trace each, steady state only) and compare where the time goes.
    Without --num-prompts and --temperature: 2 prompts at the experiment's first temperature."""
    from harness.backends.registry import CLASSES, backend_class
    from harness.backends.served.client import ServedBackend
    from harness.profiling.orchestrate import profile_run, resume_profile
    from harness.runs import preflight
    from harness.runs.plan import default_out, recorded_options, resolve_settings
    from harness.runs.selection import choose
    from harness.specs.experiments import load_experiment

    if stall_timeout < 0:
        raise DSparkError(f"--stall-timeout {stall_timeout:g}: give seconds, at least 0 (0: wait for ever)")
    if resume:
        given = sorted(options.given_fields(ctx)) + ["--out"] * bool(out_dir)
        if given:
            raise DSparkError(f"--resume {resume} finishes the profile with the options it was started with; leave out "
                              f"{', '.join(given)}")
        folder = Path(resume)
        _show(resume_profile(folder, err, stall_timeout), folder, None, as_json)
        return
    if nsys == torch_profiler:
        raise DSparkError("choose one of --nsys or --torch")
    kind = "nsys" if nsys else "torch"
    nsys_only = [flag for flag, value in (("--preset", preset), ("--nsys-path", nsys_path), ("--nsys-arg", nsys_arg))
                 if value]
    if kind == "torch" and nsys_only:  # (the PyTorch profiler would run without them, as if they had been applied)
        raise DSparkError(f"{', '.join(nsys_only)}: for --nsys only; leave {'it' if len(nsys_only) == 1 else 'them'} "
                          "out with --torch")
    opts = options.run_options_from(run_options)
    if kind == "nsys" and not opts.device.startswith("cuda"):
        raise DSparkError("profile --nsys needs a CUDA device; use --torch on the CPU")
    if max_trace_mb < 0:
        raise DSparkError(f"--max-trace-mb {max_trace_mb:g}: give megabytes, at least 0 (0: no limit)")
    paths.out_folder(out_dir)
    exp = load_experiment(opts.experiment)
    backend = opts.backend or exp.backend
    if backend in CLASSES and issubclass(backend_class(backend), ServedBackend):  # (its child refused, a folder made)
        where = "vllm serve" if backend_class(backend).capabilities.serves_here else "a server someone else runs"
        raise DSparkError(f"--backend {backend}: a served run is not profiled (its engine runs in {where}); profile "
                          "with --backend vllm (vLLM's engine in the run's own process) or native")
    selection = choose(opts, exp)
    opts = selection.opts
    settings = resolve_settings(opts, exp)
    preflight.check(opts, exp, settings)  # what the child runs would refuse, before the folder is made
    if out_dir:
        folder = Path(out_dir)
    else:
        default = default_out(settings)
        folder = default.with_name(default.name + "-profile")
    timed_unprofiled = settings["backend"] == "native" if overhead is None else overhead
    names = [n for n in opts.systems or [] if n in settings["systems"]]  # in the order typed, as `run` shows them
    names += [n for n in settings["systems"] if n not in names]
    result = profile_run([], [(n, exp.system(n).method) for n in names], kind, folder, err,
                         preset, nsys_path, nsys_arg,
                         run_options=recorded_options(opts) | {"backend": settings["backend"]},  # (as resolved)
                         overhead=timed_unprofiled,
                         max_trace_mb=max_trace_mb if kind == "torch" else 0,
                         requests_per_system=selection.requests_per_system, note=selection.note,
                         stall_s=stall_timeout)
    _show(result, folder, selection.question_ids, as_json)


def _show(result: dict, folder: Path, question_ids: list[str] | None, as_json: bool) -> None:
    """The comparison (or its JSON), the operators and what was written; titled with the runs' label where
    their weights are random or their acceptance synthetic (the child runs' manifests say it)."""
    labels = {json.loads(m.read_text()).get("label") for m in sorted(folder.glob("*/manifest.json"))} - {None}
    named = {"label": "; ".join(sorted(labels))} if labels else {}
    if as_json:
        print(json.dumps({"profile_dir": str(folder), "question_ids": question_ids, **result, **named}))
        return
    print_comparison(result, f"profile ({result['kind']}): {folder}" + (f" [{named['label']}]" if named else ""))
    print_operators(result)
    traces = result["traces"].values()
    json_bytes = [t["json_bytes"] for t in traces if t["json_bytes"]]
    unprofiled = ", the unprofiled run" if (folder / "unprofiled").is_dir() else ""
    out.print(f"wrote: {folder}/ (profile.json, run-options.json{unprofiled}; per system: its run folder, trace, "
              f"summary and log); traces: {megabytes(sum(t['bytes'] or 0 for t in traces))}"
              + (f" ({megabytes(sum(json_bytes))} of JSON)" if json_bytes else ""), highlight=False, soft_wrap=True)

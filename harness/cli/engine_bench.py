"""`dspark-bench engine-bench`: step costs at real shapes against the memory-bandwidth limit (GPU, or the
CPU at the demo pair's shapes)."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from dspark.errors import DSparkError
from harness.cli.render import out, show
from harness.runs.provenance import provenance


def engine_bench(
    target: Optional[str] = typer.Option(None, help="Target preset (qwen3-8b, qwen3-4b), demo, or a config.json / "
                                         "folder (default: qwen3-8b on a GPU, demo on a CPU)."),
    draft: Optional[str] = typer.Option(None, help="Draft preset, demo-dspark, demo-dflash, or a draft config.json / "
                                        "folder (default: dspark-qwen3-8b-block7 on a GPU, demo-dspark on a CPU)."),
    context_len: Optional[int] = typer.Option(None, min=1, help="Tokens of context in the KV cache (default: 1024 "
                                              "on a GPU, 128 on a CPU, about a demo request's)."),
    dtype: str = typer.Option("auto", help="auto (bfloat16 on a GPU, float32 on a CPU, as a run), bfloat16, float16 "
                              "or float32."),
    repeats: Optional[int] = typer.Option(None, min=5, help="Timed repeats per figure, in 5 alternated passes "
                                          "(decode, verify, draft, round, then again): each figure the median of "
                                          "its passes' medians, their range beside it (default: 50)."),
    device: str = typer.Option("auto", help="auto (a GPU when one is visible, else the CPU), cpu, cuda, cuda:N."),
    skip_hf: bool = typer.Option(False, "--skip-hf", help="Skip the transformers generate peer."),
    compile: bool = typer.Option(False, "--compile", help="On a CPU: the steps compiled with torch.compile, as "
                                 "run --compile runs them (each step's first call, compiling included, in the "
                                 "output)."),
    eagle3: Optional[str] = typer.Option(None, help="An EAGLE-3 draft timed beside the block draft, alternated with "
                                         "it: preset (eagle3-qwen3-8b), demo-eagle3, or a config.json / folder; none "
                                         "to skip (default: eagle3-qwen3-8b on a GPU, none on a CPU)."),
    sweep_context: str = typer.Option("", help="Also these context lengths, comma-separated (e.g. 1024,4096,16384): "
                                      "decode against its limit, verify, draft and round against decode, and the draft "
                                      "step against its floor, at each."),
    against: Optional[str] = typer.Option(None, help="vllm: also run vLLM (dummy weights, the same target and draft "
                                          "configs) beside our engine, alternated, both timed the same way: a long "
                                          "request ignoring end-of-sequence minus a short one, per step and per round."),
    concurrency: str = typer.Option("", help="With --against vllm: vLLM's batch sizes too, comma-separated (e.g. "
                                    "1,4,16,32): step and round cost, output rate against the bandwidth limit, and "
                                    "the speedup a published acceptance length would give, per level."),
    peer_repeats: int = typer.Option(3, min=1, help="With --against vllm: alternated repeats of each engine and system."),
    acceptance: Optional[list[str]] = typer.Option(None, help="An acceptance profile (a name, a mean acceptance length "
                                                   "or per-slot rates, as run's --acceptance; repeatable): the "
                                                   "speedup these step costs derive at its mean length (AL x decode "
                                                   "/ round), per draft and, against vLLM, per level."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
):
    """Step costs of the native engine at real shapes (random weights) against the bandwidth limit.

    Needs a CUDA GPU for the published shapes (the default there: device kernels timed against the
    GPU's own copy bandwidth). On a CPU it times the demo pair's shapes, eagerly (or compiled) with the wall clock,
    against the CPU's copy bandwidth, on the threads a CPU run of them would use (seconds); its
    round cost (and EAGLE-3's, where timed) draws the speed notebook's predicted-speedup line of each system of
    those methods in a CPU run."""
    from dspark.dtypes import dtype_name
    from harness.cli.options import device as resolve_device
    from harness.cli.options import number_list
    from harness.microbench.engine import (CPU_DEFAULTS, GPU_DEFAULTS, SWEEP, BenchArgs, bench_configs, dumps,
                                           eagle3_rows, model_folder, run_engine_bench, sweep_rows, table_rows)
    from harness.microbench.vllm_peer import peer_tables
    from harness.runs import threads

    from dspark.acceptance import check_spec, resolve
    from harness.analysis.study import derived_from_bench

    for spec in acceptance or []:
        check_spec(spec)  # (refused before any model loads; against the draft's proposal length once it is known)
    device = resolve_device(device)
    dtype_name(dtype, "--dtype")
    contexts = tuple(number_list(sweep_context or None, "--sweep-context", int, "whole numbers", "context length",
                                 "1024,4096,16384", least=1) or ())
    if against not in (None, "vllm"):
        raise DSparkError(f"--against {against}: the only peer engine is vllm")
    levels = tuple(number_list(concurrency or None, "--concurrency", int, "whole numbers", "level", "1,4,16,32",
                               least=1) or ())
    if levels and against is None:
        raise DSparkError("--concurrency sets vLLM's batch sizes; add --against vllm")
    defaults = GPU_DEFAULTS if device.startswith("cuda") else CPU_DEFAULTS
    given = {"target": target, "draft": draft, "context_len": context_len, "repeats": repeats,
             "eagle3": None if eagle3 == "none" else eagle3}
    if eagle3 == "none":
        defaults = {k: v for k, v in defaults.items() if k != "eagle3"}
    args = BenchArgs(**defaults | {k: v for k, v in given.items() if v is not None}, dtype=dtype, skip_hf=skip_hf,
                     sweep_context=contexts, device=device, against=against, concurrency=levels,
                     peer_repeats=peer_repeats, compile=compile)
    if compile and device.startswith("cuda"):
        raise DSparkError("--compile compiles the CPU's steps (CUDA graphs accelerate the GPU's); use --device cpu")
    bench_configs(args, tuple(k for k in ("draft", "eagle3") if given[k] is None))  # (before any model is built)
    folder = model_folder(args.target)  # (a preset has no folder: its size is not known, every core is used)
    n_threads, threads_by = threads.choose(None, device, folder if folder.is_dir() else None)
    threads.apply(n_threads)
    result = run_engine_bench(args)
    result["threads"] = {"count": n_threads, "chosen_by": threads_by}
    result["provenance"] = provenance(device) | {"arguments": vars(args), "weights": "random normal(0, 0.02)"}
    if acceptance:
        k = result["shapes"]["draft"]["num_drafts"]
        result["derived"] = derived_from_bench(result, [resolve(spec, k).to_dict() for spec in acceptance])
    if as_json:
        print(dumps(result))
        return
    where = result["device_name"] + (f", {n_threads} thread(s)" if result["is_cpu"] else "")
    show(out, _figures(f"engine-bench {args.target} + {args.draft}, {args.context_len}-token context, "
                       f"{result['shapes']['dtype']}, {result['device']} ({where})", table_rows(result)))
    if result.get("eagle3"):
        e = result["eagle3"]
        show(out, _figures(f"EAGLE-3 {e['name']} ({e['num_tokens']} tokens, draft vocabulary "
                           f"{e['draft_vocab_size']:,}), alternated with {args.draft}", eagle3_rows(result)))
    if result.get("against_vllm"):
        for title, rows in peer_tables(result["against_vllm"]):
            peer = Table(title=title)
            for header in rows[0]:
                peer.add_column(header, justify="right")
            for row in rows[1:]:
                peer.add_row(*row)
            show(out, peer)
    if result.get("derived"):
        show(out, _derived(result["derived"]))
    if result.get("sweep"):
        sweep = Table(title="by context length (ratios against that context's decode step)")
        for header, _, _ in SWEEP:
            sweep.add_column(header, justify="right")
        for row in sweep_rows(result):
            sweep.add_row(*row)
        show(out, sweep)


def _derived(rows: list[dict]) -> Table:
    """The speedups the step costs derive at each profile's mean acceptance length."""
    levels = sorted({c for r in rows for c in r["vllm_dspark"]})
    table = Table(title="derived speedups at each profile's mean acceptance length (AL x plain step / round; "
                        "synthetic acceptance: a profile, not a draft's quality)")
    for header in ["profile", "AL", "DSpark (ours)", "EAGLE-3 (ours)", *(f"vLLM DSpark c={c}" for c in levels)]:
        table.add_column(header, justify="left" if header == "profile" else "right")
    for r in rows:
        table.add_row(r["profile"], f"{r['mean_length']:.2f}", *(f"{v:.2f}" if v else "-" for v in (
            r["dspark"], r["eagle3"], *(r["vllm_dspark"][c] for c in levels))))
    return table


def _figures(title: str, rows: list[tuple[str, str]]) -> Table:
    """A two-column table of named figures."""
    table = Table(title=title)
    table.add_column("figure")
    table.add_column("value", justify="right")
    for name, value in rows:
        table.add_row(name, value)
    return table

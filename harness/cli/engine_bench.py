"""`dspark-bench engine-bench`: step costs at real shapes against the memory-bandwidth limit (GPU, or the
CPU at the demo pair's shapes)."""

from __future__ import annotations

from typing import Optional

import typer

from dspark.errors import DSparkError
from harness.cli.render import derived_table, grid, out, show
from harness.runs.provenance import provenance


def engine_bench(
    target: Optional[str] = typer.Option(None, help="Target preset (qwen3-8b, qwen3-4b, qwen3-0.6b), demo, or a "
                                         "config.json / folder (default: qwen3-8b on a GPU, demo on a CPU)."),
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
    draft_model: Optional[str] = typer.Option(None, "--draft-model", help="A draft model (draft_model: a smaller Qwen3 "
                                              "of the target's vocabulary) timed beside the block draft, alternated "
                                              "with it, at random weights of its shape: preset (qwen3-0.6b, for "
                                              "qwen3-8b), demo-draft-model (for the demo target), or a Qwen3 folder / "
                                              "config.json (default: none)."),
    draft_model_tokens: int = typer.Option(3, min=1, help="With --draft-model: its tokens a round."),
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
    args = _checked(target, draft, context_len, dtype, repeats, device, skip_hf, compile, eagle3, sweep_context,
                    against, concurrency, peer_repeats, acceptance, draft_model, draft_model_tokens)
    _print(_measure(args, acceptance), args, as_json)


def _checked(target: str | None, draft: str | None, context_len: int | None, dtype: str, repeats: int | None,
             device: str, skip_hf: bool, compile: bool, eagle3: str | None, sweep_context: str, against: str | None,
             concurrency: str, peer_repeats: int, acceptance: list[str] | None, draft_model: str | None = None,
             draft_model_tokens: int = 3):
    """The bench's arguments (`BenchArgs`, the device's defaults where an option is left out), every
    mistake in the options refused in one line before any model is built."""
    from dspark.dtypes import dtype_name
    from dspark.synthetic.acceptance import check_spec
    from harness.cli.options import device as resolve_device
    from harness.cli.options import number_list
    from harness.engine_bench.native import CPU_DEFAULTS, GPU_DEFAULTS, BenchArgs, bench_configs

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
                     peer_repeats=peer_repeats, compile=compile, draft_model=draft_model,
                     draft_model_tokens=draft_model_tokens)
    if compile and device.startswith("cuda"):
        raise DSparkError("--compile compiles the CPU's steps (CUDA graphs accelerate the GPU's); use --device cpu")
    bench_configs(args, tuple(k for k in ("draft", "eagle3") if given[k] is None))  # (before any model is built)
    return args


def _measure(args, acceptance: list[str] | None) -> dict:
    """The bench's result on the threads a run of these models would use, with its provenance and, per
    acceptance profile, the speedups its step costs derive."""
    from dspark.synthetic.acceptance import resolve
    from harness.analysis.study import derived_from_bench
    from harness.engine_bench.native import model_folder, run_engine_bench
    from harness.runs import threads

    folder = model_folder(args.target)  # (a preset has no folder: its size is not known, every core is used)
    n_threads, threads_by = threads.choose(None, args.device, folder if folder.is_dir() else None)
    threads.apply(n_threads)
    result = run_engine_bench(args)
    result["threads"] = {"count": n_threads, "chosen_by": threads_by}
    result["provenance"] = provenance(args.device) | {"arguments": vars(args), "weights": "random normal(0, 0.02)"}
    if acceptance:
        k = result["shapes"]["draft"]["num_drafts"]
        result["derived"] = derived_from_bench(result, [resolve(spec, k).to_dict() for spec in acceptance])
    return result


def _print(result: dict, args, as_json: bool) -> None:
    """The result as one JSON object, or its tables: the block draft's figures, EAGLE-3's, vLLM's beside
    ours, the derived speedups and the context sweep, each where it was measured."""
    from harness.engine_bench.native import SWEEP, dumps, eagle3_rows, sweep_rows, table_rows
    from harness.engine_bench.vllm_peer import peer_tables

    if as_json:
        print(dumps(result))
        return
    where = result["device_name"] + (f", {result['threads']['count']} thread(s)" if result["is_cpu"] else "")
    show(out, grid(f"engine-bench {args.target} + {args.draft}, {args.context_len}-token context, {result['shapes']['dtype']}, "
                   f"{result['device']} ({where})", [("figure", "value"), *table_rows(result)], ("figure",)))
    if result.get("eagle3"):
        e = result["eagle3"]
        show(out, grid(f"EAGLE-3 {e['name']} ({e['num_tokens']} tokens, draft vocabulary {e['draft_vocab_size']:,}), "
                       f"alternated with {args.draft}", [("figure", "value"), *eagle3_rows(result)], ("figure",)))
    if result.get("draft_model"):
        d = result["draft_model"]
        show(out, grid(f"draft model {d['name']} ({d['num_tokens']} tokens a round, {d['num_layers']} layers of "
                       f"{d['hidden_size']}), alternated with {args.draft}",
                       [("figure", "value"), *eagle3_rows(result, "draft_model")], ("figure",)))
    for title, rows in peer_tables(result["against_vllm"]) if result.get("against_vllm") else ():
        show(out, grid(title, rows))
    if result.get("derived"):
        show(out, derived_table(result["derived"]))
    if result.get("sweep"):
        show(out, grid("by context length (ratios against that context's decode step)",
                       [[header for header, _, _ in SWEEP], *sweep_rows(result)]))

"""`dspark-bench`: the command line. Bad input exits 2 with one line; results go to stdout."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from dspark.errors import DSparkError
from harness.console import show
from harness.provenance import provenance
from harness.threads import apply as apply_threads
from harness.threads import choose as choose_threads

# typer re-exports BadParameter; its base is the usage error, of click or of the copy of click that newer typer ships.
UsageError = typer.BadParameter.__mro__[1]

# Plain (click) help: flags read as `--ngram` or `--ignore-eos / --no-ignore-eos`, and it reads in a log.
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Measure how much DSpark speculative decoding speeds up a model, and where GPU time goes.")
out = Console()
err = Console(stderr=True)


def _device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise DSparkError(f"--device {device}: no CUDA device is visible; use --device cpu")
    return device


def _parse_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise DSparkError(f"--prompt-ids must be comma-separated integers, got '{text}'") from None
    if not ids:
        raise DSparkError("--prompt-ids is empty; give at least one token id")
    return ids


THREADS_HELP = ("Intra-op CPU threads (default: OMP_NUM_THREADS when set; else on the CPU 1 for a target of at "
                "most 200 MB of weights, as the demo, every core for a larger one).")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def _load_tokenizer(path: Path, needed: bool):
    from transformers import AutoTokenizer

    try:
        # transformers 5 builds an empty tokenizer from a folder with none, rather than failing.
        if not any((path / name).is_file() for name in TOKENIZER_FILES):
            raise FileNotFoundError(f"none of {', '.join(TOKENIZER_FILES)}")
        return AutoTokenizer.from_pretrained(path)
    except Exception as exc:
        if needed:
            raise DSparkError(f"{path}: no usable tokenizer ({type(exc).__name__}); give --prompt-ids instead") from None
        return None


@app.command()
def generate(
    target: str = typer.Option(..., help="Target model: local folder or hub id (Qwen3)."),
    draft: Optional[str] = typer.Option(None, help="Draft model (DeepSpec, speculators or z-lab format)."),
    ngram: bool = typer.Option(False, "--ngram", help="Draft with n-gram prompt lookup instead of a model."),
    no_draft: bool = typer.Option(False, "--no-draft", help="Plain autoregressive decoding (the baseline)."),
    prompt: Optional[str] = typer.Option(None, help="Prompt text, tokenized with the target's tokenizer."),
    prompt_ids: Optional[str] = typer.Option(None, help="Prompt token ids '1,2,3', used exactly as given."),
    chat: bool = typer.Option(False, "--chat", help="Wrap --prompt in the target's chat template (thinking off)."),
    max_new_tokens: int = typer.Option(128, min=1, help="Tokens to generate, the prefill token included."),
    temperature: float = typer.Option(0.0, min=0.0, help="0 is greedy; applied to target and draft alike."),
    seed: int = typer.Option(0, help="Seeds the independent draft, acceptance and target random streams."),
    confidence_threshold: float = typer.Option(
        0.0, min=0.0, max=1.0, help="Cut each proposal at the first slot whose confidence is below this."),
    num_speculative_tokens: int = typer.Option(7, min=1, help="Tokens an n-gram proposal may hold."),
    ignore_eos: bool = typer.Option(False, "--ignore-eos", help="Do not stop at the target's stop tokens."),
    device: str = typer.Option("auto", help="auto, cpu, cuda, cuda:N."),
    dtype: str = typer.Option("auto", help="auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16."),
    no_cuda_graphs: bool = typer.Option(False, "--no-cuda-graphs", help="Run every step eagerly (the reference)."),
    threads: Optional[int] = typer.Option(None, help=THREADS_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of text."),
):
    """Generate from one prompt, plainly or speculatively, and report the rounds."""
    from dspark.checkpoint import load_draft, load_target
    from dspark.drafters import BlockDrafter, NgramDrafter
    from dspark.engine import Engine, GenerationConfig

    if sum([draft is not None, ngram, no_draft]) != 1:
        raise DSparkError("choose exactly one of --draft D, --ngram, --no-draft")
    if (prompt is None) == (prompt_ids is None):
        raise DSparkError("give exactly one of --prompt TEXT or --prompt-ids 1,2,3")
    if chat and prompt is None:
        raise DSparkError("--chat applies to --prompt text; --prompt-ids are used exactly as given")
    dev = _device(device)
    loaded = load_target(target, dev, dtype)
    n_threads, _ = choose_threads(threads, dev, loaded.path)
    apply_threads(n_threads)
    tokenizer = _load_tokenizer(loaded.path, needed=prompt is not None)
    if prompt_ids is not None:
        ids = _parse_ids(prompt_ids)
        vocab = loaded.model.config.backbone.vocab_size
        if max(ids) >= vocab or min(ids) < 0:
            raise DSparkError(f"--prompt-ids holds an id outside the target vocabulary (0..{vocab - 1})")
    elif chat:
        if not getattr(tokenizer, "chat_template", None):
            raise DSparkError(f"{target}: the tokenizer has no chat template; drop --chat")
        ids = list(tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                 enable_thinking=False, tokenize=True, return_dict=False))
    else:
        ids = tokenizer.encode(prompt, add_special_tokens=False)
    if ngram:
        drafter, method = NgramDrafter(num_speculative_tokens), "ngram"
    elif draft is not None:
        d = load_draft(draft, loaded.model)
        drafter, method = BlockDrafter(d.model), d.config.method
    else:
        drafter, method = None, "plain"
    cfg = GenerationConfig(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                           stop_token_ids=() if ignore_eos else loaded.stop_token_ids,
                           confidence_threshold=confidence_threshold)
    use_graphs = False if no_cuda_graphs else None  # None: graphs on CUDA, eager on CPU
    result = Engine(loaded.model, drafter, use_graphs=use_graphs).generate(ids, cfg)
    text = tokenizer.decode(result.tokens) if tokenizer is not None else None
    if as_json:
        print(json.dumps({"method": method, "prompt_tokens": len(ids), "text": text, **result.to_dict(),
                          "settings": {"target": target, "draft": draft, "ngram": ngram, "temperature": temperature,
                                       "seed": seed, "max_new_tokens": max_new_tokens, "device": dev,
                                       "dtype": str(loaded.model.lm_head.weight.dtype).removeprefix("torch."),
                                       "confidence_threshold": confidence_threshold, "ignore_eos": ignore_eos,
                                       "threads": n_threads,
                                       "cuda_graphs": dev.startswith("cuda") and not no_cuda_graphs},
                          "provenance": provenance(dev)}))
        return
    # Plain print: Rich would wrap long output at the console width and expand tabs.
    print(text if text is not None else ",".join(map(str, result.tokens)))
    seconds = result.prefill_s + result.decode_s
    summary = f"{method}: {len(result.tokens)} tokens in {seconds:.2f} s ({len(result.tokens) / seconds:.1f} tok/s)"
    if result.num_rounds:
        summary += f", {result.num_rounds} rounds, acceptance length {result.acceptance_length:.2f}"
    err.print(summary + f", stop: {result.stop_reason}", highlight=False, soft_wrap=True)


@app.command()
def inspect(
    draft: str = typer.Argument(..., help="Draft model: local folder or hub id."),
    target: Optional[str] = typer.Option(None, help="Check the draft against this target (config and shapes)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
):
    """Show a draft's format, normalised configuration, parameter counts, fit and vLLM method."""
    from dspark.checkpoint import check_draft, load_draft_config, read_config, resolve_path
    from dspark.config import TargetConfig

    path, cfg = load_draft_config(draft)
    where = f"draft {draft}"
    target_cfg = TargetConfig.from_hf(read_config(resolve_path(target)), f"target {target}") if target else None
    try:
        found = check_draft(path, cfg, where, target_cfg)
        fits, problem = True, ""
    except DSparkError as exc:
        if target_cfg is None:
            raise
        fits, problem, found = False, str(exc), None
    info = {"path": str(path), "format": cfg.format, **cfg.to_dict()}
    info.pop("extra", None)
    if found is not None:
        info["parameters"] = _param_counts(found)
        info["ships_embeddings"] = "embed_tokens.weight" in found
    if target_cfg is not None:
        info["fits_target"] = fits
        info["target"] = target
        if problem:
            info["problem"] = problem
    if as_json:
        print(json.dumps(info, default=str))
    else:
        table = Table(title=f"{draft}", show_header=False)
        for k, v in info.items():
            table.add_row(k, json.dumps(v, default=str) if isinstance(v, (dict, list, tuple)) else str(v))
        out.print(table)
    if target_cfg is not None and not fits:
        raise typer.Exit(1)


@app.command("engine-bench")
def engine_bench(
    target: str = typer.Option("qwen3-8b", help="Target preset (qwen3-8b, qwen3-4b) or a config.json / folder."),
    draft: str = typer.Option("dspark-qwen3-8b-block7", help="Draft preset or a draft config.json / folder."),
    context_len: int = typer.Option(1024, min=1, help="Tokens of context in the KV cache."),
    dtype: str = typer.Option("bfloat16", help="bfloat16, float16 or float32."),
    repeats: int = typer.Option(50, min=5, help="Timed repeats per figure (the median is reported)."),
    skip_hf: bool = typer.Option(False, "--skip-hf", help="Skip the transformers generate peer."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
):
    """Step costs of the native engine at real shapes (random weights) against the bandwidth limit.

    Needs a CUDA GPU (it times device kernels against the GPU's own copy bandwidth); exits 2 without one."""
    from harness.engine_bench import BenchArgs, dumps, run_engine_bench, table_rows

    args = BenchArgs(target=target, draft=draft, context_len=context_len, dtype=dtype, repeats=repeats,
                     skip_hf=skip_hf)
    result = run_engine_bench(args)
    result["provenance"] = provenance("cuda") | {"arguments": vars(args), "weights": "random normal(0, 0.02)"}
    if as_json:
        print(dumps(result))
        return
    table = Table(title=f"engine-bench {target} + {draft}, {context_len}-token context, {dtype}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for name, value in table_rows(result):
        table.add_row(name, value)
    out.print(table)


def _param_counts(found: dict[str, tuple]) -> dict[str, int]:
    groups = {"embed_tokens": 0, "lm_head": 0, "layers": 0, "fc+norms": 0, "markov_head": 0, "confidence_head": 0}
    for key, shape in found.items():
        n = 1
        for s in shape:
            n *= s
        group = key.split(".")[0]
        if group in ("d2t", "t2d"):
            continue
        groups[group if group in groups else "fc+norms"] += n
    groups["total"] = sum(groups.values())
    groups["total_without_embeddings"] = groups["total"] - groups["embed_tokens"] - groups["lm_head"]
    return groups


@app.command("train-draft")
def train_draft(
    target: str = typer.Option(..., help="Target model: local folder or hub id (Qwen3)."),
    data: Path = typer.Option(..., help="JSONL: prompt_ids/response_ids rows, or chat rows with messages."),
    out_dir: Path = typer.Option(..., "--out", help="Folder for checkpoints and the final draft (DeepSpec format)."),
    mode: str = typer.Option("dspark", help="dspark (Markov head, confidence head) or dflash (cross-entropy only)."),
    layers: int = typer.Option(1, min=1, help="Draft decoder layers."),
    block_size: int = typer.Option(7, min=2, help="Tokens drafted per block (anchor-first)."),
    markov_rank: int = typer.Option(64, min=1, help="Rank of the Markov head (dspark mode)."),
    taps: Optional[str] = typer.Option(None, help="Tapped target layers, e.g. 1,3,5 (default: 5 evenly spaced)."),
    mask_token_id: Optional[int] = typer.Option(None, help="Mask token (default: the first id the tokenizer leaves free)."),
    steps: int = typer.Option(1000, min=1, help="Optimizer steps to train for (the total, resumed steps included)."),
    batch: int = typer.Option(8, min=1, help="Sequences per optimizer step."),
    lr: float = typer.Option(6e-4, min=0.0, help="Peak learning rate of AdamW (linear warm-up over 4 % of the steps, then cosine decay)."),
    num_anchors: int = typer.Option(64, min=1, help="Blocks drawn per sequence."),
    checkpoint_every: int = typer.Option(200, min=1, help="Save a resumable checkpoint every this many steps."),
    seed: int = typer.Option(0, help="Seeds the draft's initial weights and each step's batch and blocks."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last checkpoint in --out."),
    time_limit: Optional[float] = typer.Option(
        None, min=0.0, help="Stop after this many seconds of training, on a checkpointed step (exit code 3; "
        "continue with --resume). Ctrl-C or SIGTERM does the same."),
    device: str = typer.Option("auto", help="auto, cpu, cuda, cuda:N."),
):
    """Train a DSpark (or DFlash-mode) draft for a Qwen3 target with DeepSpec's objective."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from dspark.checkpoint import load_target, save_draft
    from dspark.presets import evenly_spaced_taps
    from dspark.tiny import random_draft, tiny_draft_config
    from dspark.train import LossConfig, TrainArgs, TrainingStopped, load_checkpoint, read_examples, stop_requested, train

    if mode not in ("dspark", "dflash"):
        raise DSparkError(f"--mode '{mode}' is unknown; use dspark or dflash")
    dev = _device(device)
    loaded = load_target(target, dev, "float32")
    tcfg = loaded.model.config
    tokenizer = _load_tokenizer(loaded.path, needed=False)
    examples = read_examples(data, tokenizer)
    n_layers = tcfg.backbone.num_layers
    tap_ids = tuple(_parse_ids(taps)) if taps else evenly_spaced_taps(n_layers)
    if mask_token_id is None:
        mask_token_id = len(tokenizer) if tokenizer is not None else tcfg.backbone.vocab_size - 1
    dcfg = tiny_draft_config(tcfg, layers=layers, block_size=block_size, taps=tap_ids,
                             markov_rank=markov_rank if mode == "dspark" else 0, confidence=mode == "dspark",
                             mask_token_id=mask_token_id)
    dcfg.validate("train-draft")
    dcfg.check_target(tcfg, "train-draft")
    args = TrainArgs(steps=steps, batch=batch, lr=lr, seed=seed, checkpoint_every=checkpoint_every,
                     loss=LossConfig(num_anchors=num_anchors))
    start, opt_state = 0, None
    resumed = load_checkpoint(out_dir, loaded.model) if resume else None
    if resumed is not None:
        draft, start, opt_state = resumed
    else:
        if (out_dir / "checkpoint").exists() and not resume:
            raise DSparkError(f"{out_dir} already holds a checkpoint; pass --resume or choose another --out")
        draft = random_draft(dcfg, loaded.model, seed)
    columns = [TextColumn("[progress.description]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TextColumn("{task.fields[stats]}"), TimeRemainingColumn()]
    with stop_requested(time_limit) as stop, Progress(*columns, console=err) as progress:
        task = progress.add_task("training", total=steps, completed=start, stats="")

        def on_step(step, stats):
            if (step + 1) % 10 and step + 1 != steps:  # reading the figures waits for the device: not every step
                progress.update(task, completed=step + 1)
                return
            n = len(stats)
            progress.update(task, completed=step + 1, stats=(
                f"loss {sum(float(s.loss.detach()) for s in stats) / n:.3f}  tau~{sum(float(s.tau) for s in stats) / n:.2f}"))

        try:
            draft = train(loaded.model, draft, examples, args, out_dir=out_dir, start_step=start,
                          optimizer_state=opt_state, on_step=on_step, stop=stop)
        except TrainingStopped as exc:
            progress.stop()
            err.print(f"stopped after step {exc.step} of {steps}; the checkpoint is in {out_dir}: continue with "
                      "--resume", highlight=False, soft_wrap=True)
            raise typer.Exit(3) from None
    save_draft(draft, out_dir, "deepspec", tcfg)
    out.print(f"draft saved to {out_dir} (DeepSpec format, {mode}, {steps} steps)", highlight=False, soft_wrap=True)


@app.command("make-tiny")
def make_tiny_cmd(
    out_dir: Path = typer.Argument(..., help="Folder to write the tiny target and drafts into."),
    seed: int = typer.Option(0, help="Seed of the random weights."),
):
    """Save a small random-weight Qwen3 target and drafts in every real format (smoke tests, timing)."""
    from dspark.tiny import make_tiny

    paths = make_tiny(out_dir, seed)
    for name, path in paths.items():
        out.print(f"{name:20s} {path}", highlight=False, soft_wrap=True)


@app.command()
def run(
    ctx: typer.Context,
    split: str = typer.Option("qualitative", help="SPEED-Bench config: qualitative, throughput_1k ... throughput_32k."),
    category: Optional[str] = typer.Option(None, help="Categories to run, comma-separated (default: all)."),
    experiment: str = typer.Option("demo", help="A shipped experiment (demo, qwen3-8b) or a TOML file."),
    dataset_path: Optional[str] = typer.Option(None, help="Local SPEED-Bench data: a file, or a folder holding "
                                               "<split>.jsonl or <split>/*.parquet (hub, specdec_bench, NeMo-Skills)."),
    dataset_revision: Optional[str] = typer.Option(None, help="Pin the hub dataset's revision (commit or tag)."),
    systems: Optional[str] = typer.Option(None, help="Run only these systems of the experiment, comma-separated."),
    backend: Optional[str] = typer.Option(None, help="native (default: the experiment's)."),
    num_prompts: Optional[int] = typer.Option(None, help="Prompts to run (default: the experiment's, else all). "
                                              "More than the selection holds runs all of them, with a notice."),
    disable_shuffle: bool = typer.Option(False, "--disable-shuffle", help="Take prompts in file order (a flag)."),
    seed: Optional[int] = typer.Option(None, help="Shuffle and sampling seed (default: the experiment's)."),
    output_len: Optional[int] = typer.Option(None, help="Most tokens generated per request, at least 1 (default: "
                                             "the experiment's)."),
    temperature: Optional[str] = typer.Option(None, help="Temperatures, comma-separated (default: the experiment's)."),
    turns: Optional[str] = typer.Option(None, help="first: each row's first turn; all: every turn, with the "
                                        "model's own replies as history (default: the experiment's)."),
    ignore_eos: bool = typer.Option(False, "--ignore-eos", help="Generate output-len tokens whatever the stop "
                                    "tokens (a flag)."),
    concurrency: int = typer.Option(1, help="Requests in flight (the native backend serves one at a time)."),
    device: str = typer.Option("auto", help="auto, cpu, cuda, cuda:N."),
    dtype: str = typer.Option("auto", help="auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16."),
    threads: Optional[int] = typer.Option(None, help=THREADS_HELP),
    out_dir: Optional[str] = typer.Option(None, "--out", help="Run folder (default: results/<experiment>-<split>-<time>)."),
    resume: Optional[str] = typer.Option(None, help="Finish the unfinished run in this folder, with the options it "
                                         "was started with (an option given as well must equal the run's)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Resolve every system (format, fit, method); generate "
                                 "nothing (a flag)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary (or the dry run) as JSON."),
    profiled: Optional[str] = typer.Option(None, hidden=True, help="Set by `profile` for its child runs."),
):
    """Run SPEED-Bench prompts through every system of an experiment and compare them."""
    from harness.run import RunOptions, print_tables, resume_options
    from harness.run import dry_run as resolve_all
    from harness.run import run as run_all

    if turns not in (None, "first", "all"):
        raise DSparkError(f"--turns {turns}: use first or all")
    opts = RunOptions(split=split, categories=_names(category), experiment=experiment, dataset_path=dataset_path,
                      dataset_revision=dataset_revision, systems=_names(systems), backend=backend,
                      num_prompts=num_prompts, output_len=output_len, temperatures=_temperatures(temperature),
                      turns=turns, ignore_eos=ignore_eos, concurrency=concurrency, seed=seed,
                      disable_shuffle=disable_shuffle, device=_device(device), dtype=dtype, threads=threads,
                      out=out_dir, resume=resume, profiled=profiled)
    if profiled not in (None, "nsys", "torch"):
        raise DSparkError(f"--profiled {profiled}: nsys or torch")
    if out_dir and resume:
        raise DSparkError("give --out for a new run or --resume for an unfinished one, not both")
    if resume:
        opts = resume_options(opts, {RUN_FIELDS.get(n, n) for n, v in ctx.params.items()
                                     if ctx.get_parameter_source(n).name != "DEFAULT"})
    if dry_run:
        rows = resolve_all(opts, err if as_json else out)
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
    print_tables(summary, out, f"{opts.experiment}: {opts.split} {cats} ({path})")
    out.print(f"wrote {path}: " + ", ".join(Path(f).name for f in summary["files"]), highlight=False, soft_wrap=True)


RUN_FIELDS = {"category": "categories", "temperature": "temperatures", "out_dir": "out"}  # CLI name -> RunOptions


def _names(text: str | None) -> list[str] | None:
    return [c.strip() for c in text.split(",") if c.strip()] if text else None


def _temperatures(text: str | None) -> list[float] | None:
    try:
        return None if text is None else [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise DSparkError(f"--temperature must be numbers separated by commas, got '{text}'") from None


@app.command()
def report(
    run_dirs: list[Path] = typer.Argument(..., help="Run folders written by `dspark-bench run`."),
    category: str = typer.Option("overall", help="Which category's rows to show (overall: the macro average)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summaries as JSON."),
):
    """Print the comparison tables of saved runs again (recomputed from their requests)."""
    from harness.report import summarize_folder, table, warnings

    summaries = {}
    for d in run_dirs:
        if not (d / "requests.jsonl").is_file():
            raise DSparkError(f"{d}: no requests.jsonl; give a folder written by dspark-bench run")
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
        show(out, table(summary, f"{name} ({category})", category))
        for line in warnings(summary):
            out.print(f"warning: {name}: {line}", style="yellow", highlight=False, soft_wrap=True)
    if len(summaries) > 1:
        merged = {"rows": [dict(r, system=f"{Path(name).name}/{r['system']}") for name, s in summaries.items()
                           for r in s["rows"]]}
        show(out, table(merged, f"comparison ({category})", category))


@app.command()
def profile(
    nsys: bool = typer.Option(False, "--nsys", help="Trace each system under Nsight Systems."),
    torch_profiler: bool = typer.Option(False, "--torch", help="Use the PyTorch profiler instead (CPU or GPU)."),
    preset: str = typer.Option("default", help="default: -t cuda,nvtx,osrt,cudnn,cublas, Python and CUDA "
                               "backtraces, fork tracing, graph nodes; lean: -t cuda,nvtx, no CPU sampling."),
    nsys_path: Optional[str] = typer.Option(None, help="The nsys to use (else $NSYS, the PATH, standard folders)."),
    nsys_arg: list[str] = typer.Option([], "--nsys-arg", help="Extra flag for nsys profile (repeatable). "
                                       "--trace-fork=... is read as --trace-fork-before-exec=..., the flag "
                                       "that makes nsys follow a forked engine process."),
    split: str = typer.Option("qualitative", help="As for run."),
    category: Optional[str] = typer.Option(None, help="As for run."),
    experiment: str = typer.Option("demo", help="As for run."),
    dataset_path: Optional[str] = typer.Option(None, help="As for run."),
    systems: Optional[str] = typer.Option(None, help="As for run."),
    num_prompts: Optional[int] = typer.Option(None, help="As for run."),
    output_len: Optional[int] = typer.Option(None, help="As for run."),
    temperature: Optional[str] = typer.Option(None, help="As for run."),
    turns: Optional[str] = typer.Option(None, help="As for run."),
    ignore_eos: bool = typer.Option(False, "--ignore-eos", help="As for run."),
    disable_shuffle: bool = typer.Option(False, "--disable-shuffle", help="As for run."),
    seed: Optional[int] = typer.Option(None, help="As for run."),
    device: str = typer.Option("auto", help="As for run."),
    dtype: str = typer.Option("auto", help="As for run."),
    threads: Optional[int] = typer.Option(None, help="As for run."),
    out_dir: Optional[str] = typer.Option(None, "--out", help="Profile folder (default: results/<experiment>-<split>-"
                                          "<time>-profile)."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
):
    """Profile every system of a run (one trace each, steady state only) and compare where the time goes."""
    from harness.experiments import load_experiment
    from harness.profile import profile_run
    from harness.run import RunOptions, default_out, resolve_settings

    if nsys == torch_profiler:
        raise DSparkError("choose one of --nsys or --torch")
    kind = "nsys" if nsys else "torch"
    dev = _device(device)
    if kind == "nsys" and not dev.startswith("cuda"):
        raise DSparkError("profile --nsys needs a CUDA device; use --torch on the CPU")
    exp = load_experiment(experiment)
    opts = RunOptions(split=split, categories=[c.strip() for c in category.split(",")] if category else None,
                      experiment=experiment, systems=[s.strip() for s in systems.split(",")] if systems else None,
                      device=dev)
    settings = resolve_settings(opts, exp)
    run_args = ["--split", split, "--experiment", experiment, "--device", dev, "--dtype", dtype]
    for flag, value in (("--category", category), ("--dataset-path", dataset_path), ("--num-prompts", num_prompts),
                        ("--output-len", output_len), ("--temperature", temperature), ("--turns", turns),
                        ("--seed", seed), ("--threads", threads)):
        if value is not None:
            run_args += [flag, str(value)]
    run_args += ["--ignore-eos"] * ignore_eos + ["--disable-shuffle"] * disable_shuffle
    if out_dir:
        folder = Path(out_dir)
    else:
        default = default_out(settings)
        folder = default.with_name(default.name + "-profile")
    result = profile_run(run_args, [(n, exp.system(n).method) for n in settings["systems"]], kind, folder, err,
                         preset, nsys_path, nsys_arg)
    if as_json:
        print(json.dumps({"profile_dir": str(folder), **result}))
    else:
        _print_comparison(result, f"profile ({kind}): {folder}")
        out.print(f"wrote: {folder}/ (profile.json; per system: its run folder, trace, summary and log)",
                  highlight=False, soft_wrap=True)


def _print_comparison(result: dict, title: str) -> None:
    """One column per system. Times in ms: each step range's total over the timed requests, its calls,
    per call and per generated token; per-token launch and GPU figures where the trace has kernels."""
    rows = result["rows"]
    cats = sorted({c for r in rows for c in r["categories"]})
    ranges = list(dict.fromkeys(k for r in rows for k in r["ranges_ns"]))
    t = Table(title=title, caption="total: summed over the timed requests; per call: total / calls; per token: total / "
              "output tokens; absent: the system has no such step", caption_justify="left")
    t.add_column("figure")
    for r in rows:
        t.add_column(r["name"], justify="right")

    def add(label: str, cell) -> None:
        cells = [cell(r) for r in rows]
        if any(c not in ("-", "absent") for c in cells):
            t.add_row(label, *cells)

    for c in cats:
        add(f"{c}: share of GPU time", lambda r: f"{100 * r['categories'][c]['share']:.1f}%" if c in r["categories"]
            else "-")
        add(f"{c}: kernels", lambda r: str(r["categories"][c]["instances"]) if c in r["categories"] else "-")
    for name in ranges:
        def ms(r, per: str = ""):
            total, calls = r["ranges_ns"].get(name), r["ranges_calls"].get(name)
            if total is None:
                return "absent"
            divisor = {"": 1, "call": calls, "token": r["output_tokens"]}[per]
            return f"{total / divisor / 1e6:.3f}" if divisor else "-"
        add(f"{name}: total ms", ms)
        add(f"{name}: calls", lambda r: "absent" if r["ranges_calls"].get(name) is None else str(r["ranges_calls"][name]))
        add(f"{name}: ms per call", lambda r: ms(r, "call"))
        add(f"{name}: ms per token", lambda r: ms(r, "token"))
    for key, label, digits in (("output_tokens", "output tokens", 0), ("kernels_per_token", "kernels per token", 1),
                               ("graph_launches_per_token", "graph launches per token", 2),
                               ("gpu_us_per_token", "GPU time per token, us", 1)):
        add(label, lambda r: "-" if r[key] is None else f"{r[key]:.{digits}f}")
    show(out, t)
    for r in rows:
        for d in r["diagnosis"]:
            out.print(f"{r['name']}: {d}", style="yellow", highlight=False, soft_wrap=True)


trace_app = typer.Typer(help="Read Nsight Systems exports (and PyTorch profiler traces) with our own parser.",
                        no_args_is_help=True)
app.add_typer(trace_app, name="trace")


@trace_app.command("summarize")
def trace_summarize(
    file: Path = typer.Argument(..., help="A .sqlite export, a .nsys-rep (exported first) or a PyTorch .json trace."),
    expect_method: Optional[str] = typer.Option(None, help="A speculative method whose <method>_propose range "
                                                "must appear (dspark, dflash, ngram)."),
    as_json: bool = typer.Option(False, "--json", help="Print the whole summary as JSON."),
):
    """NVTX ranges, kernels, categories, API calls, GPU projection, launches, processes and a diagnosis."""
    from harness.trace import summarize_any

    s = summarize_any(file, expect_method)
    if as_json:
        print(json.dumps(s))
        return
    for key, cols in SUMMARY_TABLES:
        if not s[key]:
            out.print(f"{key}: {'not in this trace' if s[key] is None else 'no rows'}", style="dim", highlight=False)
            continue
        t = Table(title=f"{key} ({file.name}){', the 25 largest' if len(s[key]) > 25 else ''}")
        for header, _, _ in cols:
            t.add_column(header, justify="left" if header in ("range", "kernel", "category") else "right",
                         overflow="ellipsis", max_width=60 if header == "kernel" else None)
        for row in s[key][:25]:
            t.add_row(*[fmt(row[field]) for _, field, fmt in cols])
        show(out, t)
    launches = s["launches"]
    graphs = launches["kernels_from_graphs_share"]
    if s["kernels"] is None:
        out.print("launches: no GPU kernels in this trace (a CPU run)", highlight=False)
    else:
        out.print(f"launches: {launches['kernels']} kernels, {launches['graph_launches']} graph launches"
                  + ("" if graphs is None else f", {100 * graphs:.1f}% of kernels run from graphs"), highlight=False)
    out.print(f"exported by: Nsight Systems {s['nsys_version']}" if s.get("nsys_version") else
              f"format: {s['schema'].get('format', '?')}", highlight=False)
    if s.get("unavailable"):
        out.print(f"not in this kind of trace: {', '.join(s['unavailable'])}", style="dim", highlight=False)
    for d in s["diagnosis"]:
        out.print(f"diagnosis: {d}", style="yellow", highlight=False, soft_wrap=True)


def _ms(ns) -> str:
    return "-" if ns is None else f"{ns / 1e6:.3f}"


def _text(v) -> str:
    return "-" if v is None else str(v)


# (header, summary field, formatter) per table of `trace summarize`; times in ms
SUMMARY_TABLES = (
    ("nvtx", (("range", "range", _text), ("calls", "instances", _text), ("total ms", "total_ns", _ms),
              ("per call ms", "avg_ns", _ms), ("median ms", "med_ns", _ms))),
    ("kernels", (("kernel", "name", _text), ("category", "category", _text), ("calls", "instances", _text),
                 ("total ms", "total_ns", _ms), ("per call ms", "avg_ns", _ms), ("median ms", "med_ns", _ms))),
    ("categories", (("category", "category", _text), ("kernels", "instances", _text), ("total ms", "total_ns", _ms),
                    ("share", "share", lambda v: "-" if v is None else f"{100 * v:.1f}%"))),
    ("projection", (("range", "range", _text), ("calls", "range_instances", _text),
                    ("GPU total ms", "proj_total_ns", _ms), ("GPU ops", "gpu_ops", _text))),
)


@trace_app.command("compare")
def trace_compare(
    inputs: list[Path] = typer.Argument(..., help="Trace files, or folders written by dspark-bench profile."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
):
    """Kernel-category shares and counts, step ranges and, for profile folders, launches and GPU time per token."""
    from harness.trace import compare, load_inputs

    result = compare(load_inputs(inputs))
    if as_json:
        print(json.dumps(result))
    else:
        _print_comparison(result, "comparison")


def main() -> None:
    """Every refusal is one line on stderr and exit code 2: our own (DSparkError) and click's usage errors
    (a bad value, an unknown option), which click would print as three."""
    try:
        code = app(standalone_mode=False, prog_name="dspark-bench")
    except DSparkError as exc:
        _refuse(str(exc))
    except UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # a bare command: its help, as click shows it
            exc.show()
            sys.exit(exc.exit_code)
        command = exc.ctx.command_path if exc.ctx is not None else "dspark-bench"
        hint = ""
        if "unexpected extra argument" in exc.format_message() and re.search(r"\((true|false|yes|no|1|0)\b",
                                                                           exc.format_message(), re.I):
            hint = "; a flag takes no value (write --ignore-eos, not --ignore-eos true)"
        _refuse(f"{exc.format_message()}{hint} (see {command} --help)")
    except (KeyboardInterrupt, typer.Abort):
        err.print("interrupted", highlight=False)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


def _refuse(message: str) -> None:
    err.print(f"error: {' '.join(message.split())}", highlight=False, markup=False, soft_wrap=True)
    sys.exit(2)


if __name__ == "__main__":
    main()

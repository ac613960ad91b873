"""`dspark-bench train-draft`: a DSpark or DFlash-mode draft (DeepSpec's block objective), a DFlash 2 draft (the
block objective in z-lab's fill-in layout plus its candidate selector's loss), an EAGLE-3 draft (training-time test)
or a classic draft model (next-token cross-entropy) for a Qwen3 target."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dspark.errors import DSparkError
from harness.cli import options, paths
from harness.cli.render import err, out

METHODS = ("dspark", "dflash", "dflash2", "eagle3", "draft_model")
# DFlash 2's own options and their defaults (vllm-project/speculators' for a DFlash 2 it trains)
DFLASH2_OPTIONS = {"--conv-kernel-size": 2, "--conv-group-size": 16, "--selector-rank": 256, "--selector-top-k": 16}
# each method-specific option and the methods that read it: given with another method it is refused, not ignored
# (so each defaults to None, its value resolved where a method reads it)
OPTION_METHODS = {"--block-size": ("dspark", "dflash", "dflash2", "eagle3"), "--markov-rank": ("dspark",),
                  "--num-anchors": ("dspark", "dflash", "dflash2"), "--taps": ("dspark", "dflash", "dflash2", "eagle3"),
                  "--mask-token-id": ("dspark", "dflash", "dflash2"), "--ttt-length": ("eagle3",),
                  "--draft-vocab-size": ("eagle3",), **{flag: ("dflash2",) for flag in DFLASH2_OPTIONS}}
BLOCK_SIZE, MARKOV_RANK, NUM_ANCHORS = 7, 64, 64  # the defaults of the three, for the methods that read them
DEMO_DATA = "chats.jsonl"  # `--data demo`, beside the demo models (made by experiments/demo/chats.py)


def train_draft(
    target: str = typer.Option(..., help="Target model: local folder or hub id (Qwen3)."),
    data: Path = typer.Option(..., help="JSONL: prompt_ids/response_ids rows, or chat rows with messages; demo: "
                              "64 of the demo target's own answers to its instructions (for --target demo)."),
    out_dir: Path = typer.Option(..., "--out", help="Folder for checkpoints and the final draft (DeepSpec format; "
                                 "dflash2: z-lab's layout, the one its DFlash2DraftModel loads; EAGLE-3: the EAGLE "
                                 "authors' layout, the one vLLM loads; draft_model: a Hugging Face Qwen3 folder)."),
    method: str = typer.Option("dspark", "--method", "--mode", help="dspark (Markov head, confidence head), dflash "
                               "(cross-entropy only), dflash2 (z-lab's DFlash 2: fill-in blocks, convolutions in each "
                               "layer, a candidate selector trained with its cross-entropy over the head's top-k), eagle3 (one layer chained token by token, training-time test) or "
                               "draft_model (a smaller Qwen3 of the target's tokenizer and width, its own embedding "
                               "started from the target's, next-token cross-entropy on the data's answers)."),
    layers: int = typer.Option(1, min=1, help="Draft decoder layers (EAGLE-3: 1)."),
    block_size: Optional[int] = typer.Option(None, min=2, help="Tokens drafted per block (anchor-first); dflash2: the "
                                             "block's rows, the anchor's included (it drafts one fewer); EAGLE-3: the "
                                             "chain length its config suggests; not draft_model (default 7)."),
    markov_rank: Optional[int] = typer.Option(None, min=1, help="dspark: rank of the Markov head (default 64)."),
    taps: Optional[str] = typer.Option(None, help="Tapped target layers, e.g. 1,3,5, counted from 0, each one's output "
                                       "(default: 5 evenly spaced; EAGLE-3: vLLM's default, its (2, L//2, L-3) in "
                                       "its count of layer inputs)."),
    mask_token_id: Optional[int] = typer.Option(None, help="dspark, dflash, dflash2: mask token (default: the first id "
                                                "the tokenizer leaves free)."),
    ttt_length: Optional[int] = typer.Option(None, help="EAGLE-3: training-time-test steps per batch (default 7), "
                                             "each weighted 0.8 times the one before."),
    draft_vocab_size: Optional[int] = typer.Option(None, help="EAGLE-3: the draft's vocabulary, the target tokens the "
                                                   "data scores most (default: the whole target vocabulary)."),
    conv_kernel_size: Optional[int] = typer.Option(None, help="dflash2: taps of each convolution, over a block's "
                                                   "rows (default 2)."),
    conv_group_size: Optional[int] = typer.Option(None, help="dflash2: channels per group of the convolutions' dynamic "
                                                  "weights; must divide the target's hidden size (default 16)."),
    selector_rank: Optional[int] = typer.Option(None, help="dflash2: rank of the candidate selector's codebooks "
                                                "(default 256)."),
    selector_top_k: Optional[int] = typer.Option(None, help="dflash2: candidates per slot the selector re-scores, the "
                                                 "head's top-k (default 16)."),
    steps: int = typer.Option(1000, min=1, help="Optimizer steps to train for (the total, resumed steps included)."),
    batch: int = typer.Option(8, min=1, help="Sequences per optimizer step."),
    lr: float = typer.Option(6e-4, min=0.0, help="Peak learning rate of AdamW (linear warm-up over 4 % of the steps, then cosine decay)."),
    num_anchors: Optional[int] = typer.Option(None, min=1, help="dspark, dflash, dflash2: blocks drawn per sequence "
                                              "(default 64)."),
    checkpoint_every: int = typer.Option(200, min=1, help="Save a resumable checkpoint every this many steps."),
    seed: int = typer.Option(0, help="Seeds the draft's initial weights and each step's batch and blocks."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last checkpoint in --out."),
    time_limit: Optional[float] = typer.Option(
        None, min=0.0, help="Stop after this many seconds of training, on a checkpointed step (exit code 3; "
        "continue with --resume). Ctrl-C or SIGTERM does the same."),
    device: str = typer.Option("auto", help="auto, cpu, cuda, cuda:N."),
):
    """Train a DSpark, DFlash, DFlash 2, EAGLE-3 or draft model.

    For a Qwen3 target. DSpark, DFlash-mode and DFlash 2 drafts learn DeepSpec's block objective (DFlash 2's
    selector its cross-entropy beside it); an EAGLE-3 draft, its training-time test; a draft model (draft_model),
    next-token cross-entropy."""
    from dspark.training.loop import TrainArgs

    dflash2 = {"--conv-kernel-size": conv_kernel_size, "--conv-group-size": conv_group_size,
               "--selector-rank": selector_rank, "--selector-top-k": selector_top_k}
    tcfg, dcfg, loss, examples, dev = _checked(target, data, out_dir, method, layers, block_size, markov_rank, taps,
                                               mask_token_id, ttt_length, draft_vocab_size, steps, num_anchors,
                                               resume, device, dflash2)
    args = TrainArgs(steps=steps, batch=batch, lr=lr, seed=seed, checkpoint_every=checkpoint_every, loss=loss)
    _train(target, tcfg, dcfg, examples, args, out_dir, method, resume, dev, time_limit)


def _checked(target: str, data: Path, out_dir: Path, method: str, layers: int, block_size: int | None,
             markov_rank: int | None, taps: str | None, mask_token_id: int | None, ttt_length: int | None,
             draft_vocab_size: int | None, steps: int, num_anchors: int | None, resume: bool, device: str, dflash2: dict[str, int | None]):
    """(target config, draft config, objective, examples, device) of the options, every mistake in them
    refused in one line before any weights load: a training that starts is not stopped by its options."""
    from dataclasses import replace

    from dspark.checkpoint import DEMO_DIR, read_config, resolve_path
    from dspark.models.config import TargetConfig
    from dspark.training.loop import LossConfig, checkpoint_path, checkpoint_step, read_examples

    if method not in METHODS:
        raise DSparkError(f"--method '{method}' is unknown; use {', '.join(METHODS)}")
    eagle3 = method == "eagle3"
    given = {"--block-size": block_size, "--markov-rank": markov_rank, "--num-anchors": num_anchors, "--taps": taps,
             "--mask-token-id": mask_token_id, "--ttt-length": ttt_length, "--draft-vocab-size": draft_vocab_size,
             **dflash2}
    for flag, value in given.items():
        readers = OPTION_METHODS[flag]
        if value is not None and method not in readers:
            names = readers[0] if len(readers) == 1 else f"{', '.join(readers[:-1])} or {readers[-1]}"
            raise DSparkError(f"{flag} is for --method {names}; leave it out for {method}")
    for flag, value in dflash2.items():
        if value is not None and value < 1:
            raise DSparkError(f"{flag} {value}: give at least 1")
    block_size = BLOCK_SIZE if block_size is None else block_size
    if eagle3 and layers != 1:
        raise DSparkError(f"--layers {layers}: an EAGLE-3 draft has one layer (every published one does); leave it out")
    if ttt_length is not None and ttt_length < 1:
        raise DSparkError(f"--ttt-length {ttt_length}: give at least 1 step")
    paths.output_folder(out_dir, "--out")
    paths.own_folder(out_dir, "--out", "an earlier train-draft's checkpoint and draft", _trained_here,
                     "/tmp/my-draft")
    if resume and checkpoint_path(out_dir) is None:
        raise DSparkError(f"--resume: {out_dir} holds no checkpoint (checkpoint/trainer_state.pt) to continue from; "
                          "leave out --resume to start training there")
    if not resume and ((out_dir / "checkpoint").exists() or checkpoint_path(out_dir) is not None):
        raise DSparkError(f"{out_dir} already holds a checkpoint; pass --resume or choose another --out")
    done = checkpoint_step(out_dir) if resume else None
    if done is not None and done > steps:  # (training would do nothing, and the draft say it had `steps`)
        raise DSparkError(f"--resume: the checkpoint in {out_dir} has {done} steps, more than --steps {steps}; pass "
                          f"--steps {done} or more, or a new --out")
    if str(data) == "demo":
        data = DEMO_DIR / DEMO_DATA
    if data.is_dir():  # (read_examples would call it missing)
        raise DSparkError(f"--data {data}: a folder, not a data file; give the JSONL file of training rows")
    dev = options.device(device)
    # the target's config and tokenizer, the data and the draft's config, each checked before the weights load
    target_path = resolve_path(target)
    tcfg = TargetConfig.from_hf(read_config(target_path), str(target))
    tokenizer = options.load_tokenizer(target_path, needed=False)
    examples = read_examples(data, tokenizer)
    highest = max(int(ids.max()) for ids, _ in examples)
    if highest >= tcfg.backbone.vocab_size:  # (an embedding lookup would fail with a traceback mid-training)
        raise DSparkError(f"{data}: token id {highest} is outside the target's vocabulary "
                          f"(0..{tcfg.backbone.vocab_size - 1}); give ids of this target's tokenizer")
    tap_ids = tuple(options.token_ids(taps, "--taps")) if taps else None
    if method == "draft_model":  # the target's shape (vocabulary, width, heads, tied head) with `layers` layers
        if layers >= tcfg.backbone.num_layers:
            raise DSparkError(f"--layers {layers}: a draft model is a smaller model than the target, which has "
                              f"{tcfg.backbone.num_layers} layers; give fewer")
        return tcfg, replace(tcfg, backbone=replace(tcfg.backbone, num_layers=layers)), None, examples, dev
    if eagle3:
        dcfg, loss = _eagle3_config(tcfg, tap_ids, block_size, ttt_length, draft_vocab_size)
    else:
        from dspark.synthetic.presets import evenly_spaced_taps
        from dspark.synthetic.tiny import tiny_draft_config

        if mask_token_id is None:
            mask_token_id = len(tokenizer) if tokenizer is not None else tcfg.backbone.vocab_size - 1
        dcfg = tiny_draft_config(tcfg, layers=layers, block_size=block_size,
                                 taps=tap_ids or evenly_spaced_taps(tcfg.backbone.num_layers),
                                 markov_rank=(markov_rank or MARKOV_RANK) if method == "dspark" else 0, confidence=method == "dspark",
                                 mask_token_id=mask_token_id)
        if method == "dflash2":
            dcfg = _dflash2_config(dcfg, {flag: dflash2[flag] or default for flag, default in DFLASH2_OPTIONS.items()})
        loss = LossConfig(num_anchors=num_anchors or NUM_ANCHORS)
    dcfg.validate("train-draft")
    dcfg.check_target(tcfg, "train-draft")
    return tcfg, dcfg, loss, examples, dev


def _train(target: str, tcfg, dcfg, examples, args, out_dir: Path, method: str, resume: bool, dev: str,
           time_limit: float | None) -> None:
    """Load the target, start a fresh draft or resume the checkpoint, train with a progress bar (stopped
    on a checkpointed step by the time limit, Ctrl-C or SIGTERM: exit code 3), and save the draft."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from dspark.checkpoint import load_target
    from dspark.models.target import Qwen3Target
    from dspark.training.loop import (TrainingStopped, checkpoint_format, load_checkpoint, save_trained,
                                      stop_requested, train)

    loaded = load_target(target, dev, "float32")
    start, opt_state = 0, None
    resumed = load_checkpoint(out_dir, loaded.model) if resume else None
    if resumed is not None:
        draft, start, opt_state = resumed
        made = "draft_model" if isinstance(draft, Qwen3Target) else draft.config.method
        if made != method:
            raise DSparkError(f"--method {method}: the checkpoint in {out_dir} is of method {made}; "
                              f"resume it with --method {made}")
    else:
        draft = _random_draft(dcfg, loaded.model, examples, args.seed)
    columns = [TextColumn("[progress.description]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TextColumn("{task.fields[stats]}"), TimeRemainingColumn()]
    with stop_requested(time_limit) as stop, Progress(*columns, console=err) as progress:
        task = progress.add_task("training", total=args.steps, completed=start, stats="")

        def on_step(step, stats):
            if (step + 1) % 10 and step + 1 != args.steps:  # reading the figures waits for the device: not each
                progress.update(task, completed=step + 1)
                return
            n = len(stats)
            shown = f"loss {sum(float(s.loss.detach()) for s in stats) / n:.3f}"
            if method == "draft_model":  # its arg-max's agreement with the data's next token
                shown += f"  acc {sum(float(s.accuracy) for s in stats) / n:.2f}"
            else:
                shown += f"  tau~{sum(float(s.tau) for s in stats) / n:.2f}"
            if method == "dflash2":  # the candidate selector's cross-entropy (part of the loss)
                shown += f"  selector {sum(float(s.selector) for s in stats) / n:.3f}"
            if method == "eagle3":  # each TTT step's accuracy (draft arg-max = target arg-max), step 0 first
                shown += "  acc " + " ".join(f"{float(a):.2f}" for a in sum(s.accuracy for s in stats) / n)
            progress.update(task, completed=step + 1, stats=shown)

        try:
            draft = train(loaded.model, draft, examples, args, out_dir=out_dir, start_step=start,
                          optimizer_state=opt_state, on_step=on_step, stop=stop)
        except TrainingStopped as exc:
            progress.stop()
            err.print(f"stopped after step {exc.step} of {args.steps}; the checkpoint is in {out_dir}: continue with "
                      "--resume", highlight=False, soft_wrap=True)
            raise typer.Exit(3) from None
    fmt = checkpoint_format(draft)
    save_trained(draft, out_dir, tcfg)
    trained = f"{args.steps} steps" + (f", {args.steps - start} of them now, resumed at step {start}" if resumed else "")
    out.print(f"draft saved to {out_dir} ({fmt} format, {method}, {trained})", highlight=False, soft_wrap=True)


def _trained_here(folder: Path) -> bool:
    """Whether `folder` is an earlier train-draft's: it holds a checkpoint (or one cut off while saving),
    beside which the draft itself is written. Only such a folder may hold files (`paths.own_folder`)."""
    return any((folder / name).exists() for name in ("checkpoint", "checkpoint.old", "checkpoint.tmp"))


def _eagle3_config(tcfg, taps: tuple[int, ...] | None, num_tokens: int, ttt_length: int | None,
                   draft_vocab_size: int | None):
    """The EAGLE-3 draft's config (one Llama-style layer of the target's shape, vLLM's default taps unless
    given) and its objective."""
    from dspark.synthetic.presets import vllm_default_eagle3_taps
    from dspark.synthetic.tiny import tiny_eagle3_config
    from dspark.training.eagle3_objective import TTTConfig

    vocab = tcfg.backbone.vocab_size
    if draft_vocab_size is not None and not 0 < draft_vocab_size <= vocab:
        raise DSparkError(f"--draft-vocab-size {draft_vocab_size}: give 1 to the target's vocabulary, {vocab}")
    dcfg = tiny_eagle3_config(tcfg, taps=taps or vllm_default_eagle3_taps(tcfg.backbone.num_layers),
                              num_tokens=num_tokens, draft_vocab_size=None if draft_vocab_size == vocab else draft_vocab_size)
    return dcfg, TTTConfig() if ttt_length is None else TTTConfig(ttt_length=ttt_length)


def _dflash2_config(dcfg, options: dict[str, int]):
    """z-lab's DFlash 2 of `dcfg`'s backbone: fill-in blocks in its layout, convolutions and a selector as
    `options` say, refused in one line where z-lab's modules could not be built of them."""
    from dataclasses import replace

    hidden, vocab = dcfg.backbone.hidden_size, dcfg.backbone.vocab_size
    if hidden % options["--conv-group-size"]:
        raise DSparkError(f"--conv-group-size {options['--conv-group-size']} does not divide the target's hidden size "
                          f"{hidden}; give a divisor of it")
    if options["--selector-top-k"] > vocab:
        raise DSparkError(f"--selector-top-k {options['--selector-top-k']} is more than the vocabulary ({vocab}); "
                          "give fewer")
    return replace(dcfg, format="zlab", sample_from_anchor=False, conv_kernel_size=options["--conv-kernel-size"],
                   conv_group_size=options["--conv-group-size"], selector_rank=options["--selector-rank"],
                   selector_top_k=options["--selector-top-k"])


def _random_draft(dcfg, target, examples, seed: int):
    """A fresh draft of `dcfg` for `target` (a DFlash 2 one's convolutions the identity); an EAGLE-3 draft over a
    reduced vocabulary gets the target tokens the data scores most (`draft_vocabulary`); a draft model starts from
    the target's embedding (`random_draft_model`)."""
    from dspark.models.config import Eagle3Config, TargetConfig
    from dspark.models.dflash2 import identity_convolutions
    from dspark.synthetic.tiny import random_draft, random_draft_model, random_eagle3
    from dspark.training.eagle3_objective import draft_vocabulary

    if isinstance(dcfg, TargetConfig):
        return random_draft_model(target, dcfg.backbone.num_layers, seed)
    if not isinstance(dcfg, Eagle3Config):
        draft = random_draft(dcfg, target, seed)
        identity_convolutions(draft)  # a DFlash 2 draft starts as a plain DFlash one (speculators' start)
        return draft
    d2t = draft_vocabulary(examples, dcfg.vocab_size, dcfg.backbone.vocab_size) if dcfg.reduced_vocab else None
    return random_eagle3(dcfg, target, seed, d2t=d2t)

"""`dspark-bench train-draft`: a DSpark or DFlash-mode draft for a Qwen3 target, DeepSpec's objective."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dspark.errors import DSparkError
from harness.cli import options
from harness.cli.render import err, out


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
    dev = options.device(device)
    loaded = load_target(target, dev, "float32")
    tcfg = loaded.model.config
    tokenizer = options.load_tokenizer(loaded.path, needed=False)
    examples = read_examples(data, tokenizer)
    n_layers = tcfg.backbone.num_layers
    tap_ids = tuple(options.token_ids(taps)) if taps else evenly_spaced_taps(n_layers)
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

"""The loop that trains every draft for a Qwen3 target: seeded batches of the target's own features, checkpoints
it resumes from exactly, a stop between steps; only the loss of a batch differs (DeepSpec's block objective in
`block_objective`, EAGLE-3's training-time test in `eagle3_objective`, a classic draft model's next-token
cross-entropy on the target's own tokens in `lm_parts`). Also the target's own LM training, which the demo's
confidence target uses.
"""


from __future__ import annotations

import json
import math
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from dspark.checkpoint import load_draft, load_target, read_config, save_draft, save_target
from dspark.errors import DSparkError
from dspark.models.block_draft import DraftModel
from dspark.models.eagle3_draft import Eagle3Draft
from dspark.models.target import Qwen3Target
from dspark.tokenizer import chat_prompt_ids
from dspark.training.block_objective import LossConfig, draft_loss, pad_anchors, sample_anchors
from dspark.training.eagle3_objective import TTTConfig, ttt_loss


def pad_batch(examples: list[tuple[Tensor, Tensor]], device) -> tuple[Tensor, Tensor]:
    """Right-padded ids and loss masks [B, S]: causal attention never lets a real token see the padding."""
    s = max(ids.shape[0] for ids, _ in examples)
    ids = torch.zeros(len(examples), s, dtype=torch.long)
    mask = torch.zeros(len(examples), s, dtype=torch.bool)
    for row, (i, m) in enumerate(examples):
        ids[row, : i.shape[0]], mask[row, : m.shape[0]] = i, m
    return ids.to(device), mask.to(device)


@torch.no_grad()
def target_features(target: Qwen3Target, ids: Tensor, taps: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """Tapped features [..., S, T*H] and the target's logits [..., S, V] for one sequence [S] or a
    right-padded batch [B, S] (causal attention keeps the padding out of every real row)."""
    batched = ids.dim() == 2
    ids = ids if batched else ids[None]
    nb, n = ids.shape
    cache = target.new_cache(n, batch=nb)
    hidden, feats = target(ids, None, cache, n, taps)  # a prefill from position 0
    logits = target.logits(hidden)
    return (feats, logits) if batched else (feats[0], logits[0])


def to_device(t: Tensor, device: torch.device) -> Tensor:
    """A CPU batch tensor on `device`; to a GPU from pinned memory, so the copy does not wait for the
    work already queued (the step's host code runs ahead of the device)."""
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)


# What the loop trains: a block draft, an EAGLE-3 draft, or a classic draft model (`draft_model`: a smaller Qwen3
# of the target's tokenizer, a model of the target's own kind)
Trainable = DraftModel | Eagle3Draft | Qwen3Target


def trainable_parameters(draft: Trainable) -> list[torch.nn.Parameter]:
    """Everything but the frozen, target-shared embedding and, of a block draft, the target's LM head
    (an EAGLE-3 draft's head is its own, over its vocabulary, and trained; a draft model shares nothing
    with the target at run time, so it trains its own embedding and head too)."""
    if isinstance(draft, Qwen3Target):
        return list(draft.parameters())
    shared = (draft.embed_tokens,) if isinstance(draft, Eagle3Draft) else (draft.embed_tokens, draft.lm_head)
    frozen = {id(p) for m in shared if m is not None for p in m.parameters()}
    return [p for p in draft.parameters() if id(p) not in frozen]


def cosine_lr(step: int, total: int, base: float, warmup_frac: float = 0.04) -> float:
    warmup = max(1, int(total * warmup_frac))
    if step < warmup:
        return base * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return base * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


# ---- the training loop ---------------------------------------------------------------------------

@dataclass(frozen=True)
class TrainArgs:
    steps: int = 1000
    batch: int = 8  # sequences per optimizer step (one right-padded batch)
    lr: float = 6e-4
    warmup_frac: float = 0.04
    grad_clip: float = 1.0
    seed: int = 0
    checkpoint_every: int = 200
    max_len: int = 1024  # tokens of a sequence trained on (the first ones)
    loss: LossConfig | TTTConfig | None = None  # None: the draft's objective with its defaults


def read_examples(path, tokenizer=None, max_len: int = 1024) -> list[tuple[Tensor, Tensor]]:
    """(ids, loss_mask) per JSONL row: `{"prompt_ids", "response_ids"}`, or chat `{"messages"}` whose
    last message is the assistant's (tokenized with the target's chat template, thinking off).
    The loss covers the response and its end-of-turn token."""
    if not Path(path).is_file():
        raise DSparkError(f"{path}: no such data file; give a JSONL file of training rows")
    out = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DSparkError(f"{path}: not UTF-8 text (byte {exc.start}); give a JSONL file of training rows") from None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DSparkError(f"{path}:{n}: not JSON ({exc.msg}); one JSON object per line") from None
        if not isinstance(row, dict):
            raise DSparkError(f"{path}:{n}: a {type(row).__name__}, not a JSON object; one object per line")
        if "prompt_ids" in row:
            prompt, response = row["prompt_ids"], row.get("response_ids")
            if not all(isinstance(ids, list) and all(type(i) is int and i >= 0 for i in ids)
                       for ids in (prompt, response)):
                raise DSparkError(f"{path}:{n}: prompt_ids and response_ids must be lists of token ids "
                                  "(whole numbers, at least 0)")
        elif "messages" in row:
            if tokenizer is None:
                raise DSparkError(f"{path}:{n}: chat rows need the target's tokenizer")
            msgs = row["messages"]
            prompt = chat_prompt_ids(tokenizer, msgs[:-1])
            response = tokenizer.encode(msgs[-1]["content"], add_special_tokens=False) + [tokenizer.eos_token_id]
        else:
            raise DSparkError(f"{path}:{n}: a row needs prompt_ids/response_ids or messages")
        ids = (prompt + response)[:max_len]
        mask = ([False] * len(prompt) + [True] * len(response))[:max_len]
        if sum(mask) >= 2:
            out.append((torch.tensor(ids), torch.tensor(mask)))
    if not out:
        raise DSparkError(f"{path}: no usable rows (each needs at least 2 response tokens)")
    return out


class TrainingStopped(Exception):
    """`train` was asked to stop between two steps; `step` steps are done and, with an `out_dir`,
    checkpointed there."""

    def __init__(self, step: int):
        super().__init__(f"training stopped after step {step}")
        self.step = step


@contextmanager
def stop_requested(time_limit_s: float | None = None) -> Iterator[Callable[[], bool]]:
    """A predicate for `train(stop=...)`: true once SIGINT or SIGTERM has arrived, or `time_limit_s` seconds have
    passed; the step in flight then finishes, checkpointed (a second signal interrupts it, through the first one's
    own handler; later ones are ignored). Handlers restored after; main thread only; an ignored signal stays ignored."""
    seen: list[int] = []
    deadline = None if time_limit_s is None else time.monotonic() + time_limit_s

    def note(signum, frame):
        seen.append(signum)
        if len(seen) == 2:  # (the program's own handler takes it as its first signal: the exit code is the first's)
            (previous[seen[0]] if callable(previous[seen[0]]) else signal.default_int_handler)(seen[0], frame)

    main_thread = threading.current_thread() is threading.main_thread()  # only there can signals be caught
    signals = [sig for sig in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(sig) is not signal.SIG_IGN]
    previous = {sig: signal.signal(sig, note) for sig in signals} if main_thread else {}
    try:
        yield lambda: bool(seen) or (deadline is not None and time.monotonic() >= deadline)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: a handler set from C


def loss_config(draft: Trainable, args: TrainArgs) -> LossConfig | TTTConfig | None:
    """The objective `args` asks for, checked against the draft it trains: TTT for an EAGLE-3 draft,
    the block objective for a DSpark or DFlash one, None for a draft model (its objective has no
    settings: next-token cross-entropy, `lm_parts`)."""
    if isinstance(draft, Qwen3Target):
        if args.loss is not None:
            raise DSparkError(f"{type(args.loss).__name__} is a block or EAGLE-3 objective, and this draft is a draft "
                              "model (next-token cross-entropy); leave the loss out")
        return None
    eagle3 = isinstance(draft, Eagle3Draft)
    cfg = args.loss if args.loss is not None else TTTConfig() if eagle3 else LossConfig()
    if eagle3 != isinstance(cfg, TTTConfig):
        raise DSparkError(f"{type(cfg).__name__} is the {'block' if eagle3 else 'EAGLE-3'} objective, and this draft "
                          f"is {draft.config.method}; pass {'TTTConfig' if eagle3 else 'LossConfig'} as the loss")
    return cfg


def train(target: Qwen3Target, draft: Trainable, examples: list[tuple[Tensor, Tensor]],
          args: TrainArgs, out_dir=None, start_step: int = 0, optimizer_state: dict | None = None, on_step=None,
          stop: Callable[[], bool] | None = None) -> Trainable:
    """AdamW with warm-up and cosine decay, gradient clipping, the frozen shared embedding (and a block
    draft's head); the loss of each batch is the draft's objective (`loss_config`).

    Step s draws its sequences (and a block draft's anchors) from a generator seeded by (seed, s), so a
    run resumed at any checkpoint takes the same steps as an uninterrupted one. `stop` is asked after
    every step: when it is true before the last, the step is checkpointed and `TrainingStopped` raised.
    """
    cfg = loss_config(draft, args)
    device = target.lm_head.weight.device
    params = trainable_parameters(draft)
    for p in draft.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    draft.train()
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    if optimizer_state is not None:
        opt.load_state_dict(optimizer_state)
    for step in range(start_step, args.steps):
        gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, args.steps, args.lr, args.warmup_frac)
        opt.zero_grad(set_to_none=True)
        picks = torch.randint(0, len(examples), (args.batch,), generator=gen).tolist()
        ids, mask = pad_batch([(examples[i][0][: args.max_len], examples[i][1][: args.max_len]) for i in picks],
                              "cpu")  # anchors are drawn on the CPU: no device syncs
        if cfg is None:  # a draft model reads the tokens alone, never the target's states
            parts = lm_parts(draft, to_device(ids, device), to_device(mask, device))
        elif isinstance(cfg, TTTConfig):
            ids, mask = to_device(ids, device), to_device(mask, device)
            parts = ttt_loss(draft, *target_features(target, ids, draft.config.target_layer_ids), ids, mask, cfg)
        else:
            anchors = pad_anchors([sample_anchors(mask[row], cfg.num_anchors, gen) for row in range(len(picks))])
            ids, mask, anchors = (to_device(t, device) for t in (ids, mask, anchors))
            parts = draft_loss(draft, *target_features(target, ids, draft.config.target_layer_ids), ids, mask,
                               anchors, cfg)
        parts.loss.backward()
        stats = [parts]
        torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
        opt.step()
        if on_step is not None:
            on_step(step, stats)
        saved = (step + 1) % args.checkpoint_every == 0 or step + 1 == args.steps
        if out_dir is not None and saved:
            save_checkpoint(draft, opt, step + 1, out_dir, target)
        if stop is not None and step + 1 < args.steps and stop():
            if out_dir is not None and not saved:
                save_checkpoint(draft, opt, step + 1, out_dir, target)
            raise TrainingStopped(step + 1)
    draft.eval().requires_grad_(False)
    return draft


def checkpoint_format(draft: Trainable) -> str:
    """The format the trainer writes a draft in: DeepSpec's for an anchor-first block draft, z-lab's for a
    fill-in one (a DFlash 2 draft: what z-lab's DFlash2DraftModel loads), the EAGLE authors' (the layout vLLM
    loads) for an EAGLE-3 draft, a Hugging Face Qwen3 folder (what vLLM's draft_model loads) for a draft model."""
    if isinstance(draft, (Qwen3Target, Eagle3Draft)):
        return "qwen3" if isinstance(draft, Qwen3Target) else "eagle"
    return "deepspec" if draft.config.sample_from_anchor else "zlab"


def save_trained(draft: Trainable, out: Path, target_config, with_embeddings: bool = True) -> None:
    """A draft in its format (`checkpoint_format`). `with_embeddings=False` leaves a block or EAGLE-3
    draft's copies of the target's embedding out (`save_draft`); a draft model always keeps its own."""
    if isinstance(draft, Qwen3Target):
        save_target(draft, Path(out))
    else:
        save_draft(draft, Path(out), checkpoint_format(draft), target_config, with_embeddings=with_embeddings)


def save_checkpoint(draft: Trainable, opt: torch.optim.Optimizer, step: int, out_dir,
                    target: Qwen3Target) -> None:
    """The draft in its format (`checkpoint_format`: loadable anywhere the published drafts load), and
    the optimizer state beside it, written to temporary names first so an interruption never leaves half
    a checkpoint."""
    out = Path(out_dir)
    tmp = out / "checkpoint.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_trained(draft, tmp, target.config)
    torch.save({"step": step, "optimizer": opt.state_dict()}, tmp / "trainer_state.pt")
    final = out / "checkpoint"
    if final.exists():
        shutil.rmtree(out / "checkpoint.old", ignore_errors=True)
        os.replace(final, out / "checkpoint.old")
    os.replace(tmp, final)
    shutil.rmtree(out / "checkpoint.old", ignore_errors=True)


def checkpoint_path(out_dir) -> Path | None:
    """The folder of the last complete checkpoint under `out_dir`, or None. A save cut off between its
    two renames leaves only the previous checkpoint, as checkpoint.old: that one is it."""
    return next((p for p in (Path(out_dir) / "checkpoint", Path(out_dir) / "checkpoint.old")
                 if (p / "trainer_state.pt").is_file()), None)


def checkpoint_step(out_dir) -> int | None:
    """The steps the last checkpoint under `out_dir` has trained (None without one), read without the
    target: a resume is checked against `--steps` before any model loads. (Memory-mapped: the optimizer
    state beside it is not read.)"""
    path = checkpoint_path(out_dir)
    if path is None:
        return None
    return int(torch.load(path / "trainer_state.pt", weights_only=True, map_location="cpu", mmap=True)["step"])


def load_checkpoint(out_dir, target: Qwen3Target) -> tuple[Trainable, int, dict] | None:
    """(draft, step, optimizer state) of the last checkpoint under `out_dir` (`checkpoint_path`), or None;
    a draft model's (a Qwen3 folder) in the target's dtype, on its device."""
    path = checkpoint_path(out_dir)
    if path is None:
        return None
    weight = target.lm_head.weight
    state = torch.load(path / "trainer_state.pt", weights_only=True, map_location=weight.device)
    if read_config(path).get("architectures") == ["Qwen3ForCausalLM"]:
        draft = load_target(path, weight.device, weight.dtype).model
    else:
        draft = load_draft(path, target).model
    return draft, state["step"], state["optimizer"]


# ---- the target (demo models): next-token cross-entropy on the masked tokens ------------------------

@dataclass
class LMParts:
    """A batch's next-token figures: the loss, and the share of the loss's tokens the model's arg-max
    predicts (teacher-forced; for a draft model on the target's greedy answers, its first draft's
    acceptance rate at T = 0)."""
    loss: Tensor
    accuracy: Tensor


def lm_parts(target: Qwen3Target, ids: Tensor, loss_mask: Tensor) -> LMParts:
    """Mean next-token cross-entropy over positions whose *next* token is in the loss mask, and its
    accuracy. `ids` and `loss_mask` are one sequence [S] or a right-padded batch [B, S] (see `pad_batch`)."""
    if ids.dim() == 1:
        ids, loss_mask = ids[None], loss_mask[None]
    b, n = ids.shape
    cache = target.new_cache(n, batch=b)
    hidden, _ = target(ids, None, cache, n)  # a prefill from position 0
    logits = target.logits(hidden[:, :-1]).flatten(0, 1)
    weight, labels = loss_mask[:, 1:].flatten().float(), ids[:, 1:].flatten()
    ce = F.cross_entropy(logits, labels, reduction="none")
    count = weight.sum().clamp_min(1)
    hits = (logits.detach().argmax(-1) == labels).float()
    return LMParts((ce * weight).sum() / count, (hits * weight).sum() / count)


def lm_loss(target: Qwen3Target, ids: Tensor, loss_mask: Tensor) -> Tensor:
    """`lm_parts`'s loss."""
    return lm_parts(target, ids, loss_mask).loss


def train_target(target: Qwen3Target, examples: list[tuple[Tensor, Tensor]], args: TrainArgs, on_step=None) -> None:
    """Pretrain/finetune a (small) target in place: AdamW, warm-up and cosine decay, clipping,
    step s drawing its batch (one padded forward) from a generator seeded by (seed, s)."""
    device = target.lm_head.weight.device
    params = list({id(p): p for p in target.parameters()}.values())
    for p in params:
        p.requires_grad_(True)
    target.train()
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01, betas=(0.9, 0.95))
    for step in range(args.steps):
        gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, args.steps, args.lr, args.warmup_frac)
        opt.zero_grad(set_to_none=True)
        picks = torch.randint(0, len(examples), (args.batch,), generator=gen).tolist()
        loss = lm_loss(target, *pad_batch([examples[i] for i in picks], device))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
        opt.step()
        if on_step is not None:
            on_step(step, loss)
    target.eval().requires_grad_(False)

"""Rebuild the demo pair from nothing: corpus -> tokenizer -> target -> self-distillation -> drafts -> figures.

    python experiments/demo/build.py --out build/demo [--device cuda] [--seed 0] [--jobs 2] [--install]
    python experiments/demo/build.py --out /tmp/demo --size medium  # a CPU rehearsal in minutes
    python experiments/demo/build.py --out /tmp/demo --smoke        # every stage at toy sizes, in seconds

Stages (each seeded): the pinned standard-library corpus (`corpus.py`); a byte-level BPE tokenizer
trained on it; a small Qwen3 target pretrained on the library's source, then instruction-tuned on the
chat-formatted pairs (loss on the answers); the target's own answers to the training instructions,
greedy and sampled (self-distillation, as DeepSpec does); a DSpark draft, a DFlash-mode draft, an
EAGLE-3 draft, a classic draft model (a two-layer Qwen3 of the target's tokenizer, next-token
cross-entropy) and a DFlash 2 draft (z-lab's layout, trained on a 2-core CPU in minutes) trained on those;
acceptance on the held-out coding prompts.
Writes target/, dspark/, dflash/, eagle3/, draft_model/, dflash2/ and figures.json under --out; a stage whose output is already
there is reused (an interrupted build goes on where it stopped). The models are stored in bfloat16
(what ships), and every later stage uses the stored weights, so the figures are those of the shipped
models. `--install` copies the models into the package, and the figures and the target's
distillation (reused by a rebuild from the same target, see `pack_distilled`) beside this script.

The corpus is pinned to one Python version (corpus.py). On a machine with another version, write the
corpus on the pinned interpreter (`corpus.py --out corpus.json`) and pass it with `--corpus`.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import multiprocessing
import os
import re
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor, wait
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus as corpus_mod  # noqa: E402

from dspark.checkpoint import DEMO_DIR, load_draft, load_target, save_target  # noqa: E402
from dspark.drafters import NgramDrafter  # noqa: E402
from dspark.engine import Engine, GenerationConfig  # noqa: E402
from dspark.models.config import BackboneConfig, TargetConfig  # noqa: E402
from dspark.models.dflash2 import identity_convolutions  # noqa: E402
from dspark.models.target import Qwen3Target  # noqa: E402
from dspark.synthetic.presets import evenly_spaced_taps, vllm_default_eagle3_taps  # noqa: E402
from dspark.synthetic.tiny import (  # noqa: E402
    random_draft,
    random_draft_model,
    random_eagle3,
    random_target,
    tiny_draft_config,
    tiny_eagle3_config,
)
from dspark.tokenizer import SPECIALS, build_tokenizer, chat_prompt_ids, conversation, save_tokenizer  # noqa: E402
from dspark.training import distill as distill_mod
from dspark.training.eagle3_objective import TTTConfig, draft_vocabulary  # noqa: E402
from dspark.training.loop import (  # noqa: E402
    LossConfig,
    TrainArgs,
    TrainingStopped,
    load_checkpoint,
    save_trained,
    stop_requested,
    train,
    train_target,
)
from harness.backends.systems import make_drafter
from harness.specs.datasets import file_sha256
from harness.specs.datasets import load as load_suite

# pretrain: steps of LM training on windows of the library's source; target_steps: instruction tuning.
FULL = dict(vocab=2048, hidden=256, layers=8, heads=4, kv_heads=2, head_dim=64, intermediate=768, window=512,
            pretrain_steps=3000, target_steps=1500, batch=16, max_answer=256, samples=12, continuations=5353,
            rephrasings=6, draft_layers=3, draft_intermediate=640, draft_steps=7500, draft_batch=64, anchors=128,
            draft_source=True, eagle3_vocab=1024, eagle3_steps=900, eagle3_batch=8, eagle3_lr=1e-3,
            eagle3_max_len=256, draft_model_layers=2, draft_model_steps=6000, draft_model_batch=64,
            draft_model_lr=2e-3, draft_model_max_len=512, draft_model_tokens=3, dflash2_steps=200,
            dflash2_batch=8, dflash2_anchors=32, dflash2_lr=2e-3, dflash2_max_len=192, dflash2_block_size=8,
            dflash2_conv_kernel_size=2, dflash2_conv_group_size=16, dflash2_selector_rank=32, dflash2_selector_top_k=8)
MEDIUM = dict(vocab=1024, hidden=128, layers=4, heads=4, kv_heads=2, head_dim=32, intermediate=384, window=256,
              pretrain_steps=300, target_steps=200, draft_steps=200, batch=8, max_answer=96, draft_layers=1,
              samples=1, files=60, pairs=400, draft_source=True, anchors=32, continuations=0, rephrasings=0,
              eagle3_vocab=512)
SMOKE = dict(vocab=300, hidden=32, layers=4, heads=4, kv_heads=2, head_dim=8, intermediate=64, window=64,
             pretrain_steps=10, target_steps=20, draft_steps=10, batch=2, max_answer=24, draft_layers=1, samples=1,
             files=3, pairs=12, prompts=2, draft_source=True, anchors=8, continuations=4, rephrasings=1, eagle3_vocab=128)
# The EAGLE-3 draft's own figures (one Llama-style layer, the target's width unless eagle3_intermediate;
# a reduced vocabulary of eagle3_vocab ids); steps, batch and learning rate default to the block drafts'.
# The shipped one trained on a 2-core CPU: the first eagle3_max_len tokens of each sequence (256 keep 89 %
# of the distilled answers' tokens; TTT's attention grows with the square of the length).
# The classic draft model's (draft_model): draft_model_layers layers of the target's width and MLP, its own
# embedding and head (tied, as the target's), trained on the first draft_model_max_len tokens of each distilled
# sequence; it drafts draft_model_tokens a round in the figures (the demo experiment's num_speculative_tokens).
# Steps, batch and learning rate default to the block drafts'.
# The DFlash 2 draft's (z-lab's layout: fill-in blocks of dflash2_block_size rows, the anchor's included, so as many
# drafts a round as the DFlash draft's 7; convolutions and a candidate selector as the dflash2_conv_* and
# dflash2_selector_* say) starts from the DFlash draft just built (its layers, taps and weights; the convolutions the
# identity, the selector random) and fine-tunes on a CPU budget, unlike the others' (GPU): dflash2_steps steps of
# dflash2_batch sequences cut to their first dflash2_max_len tokens, dflash2_anchors blocks each. Steps, batch,
# learning rate and anchors default to the block drafts' where a size does not set them.
DRAFTS = ("dspark", "dflash", "eagle3", "draft_model", "dflash2")
EAGLE3_OVERRIDES = {"draft_steps": "eagle3_steps", "draft_batch": "eagle3_batch", "draft_lr": "eagle3_lr",
                    "draft_intermediate": "eagle3_intermediate"}  # the draft flags set the EAGLE-3 draft's too
DRAFT_MODEL_OVERRIDES = {"draft_steps": "draft_model_steps", "draft_batch": "draft_model_batch",
                         "draft_lr": "draft_model_lr"}  # and the draft model's
DFLASH2_OVERRIDES = {"draft_steps": "dflash2_steps", "draft_batch": "dflash2_batch", "draft_lr": "dflash2_lr",
                     "anchors": "dflash2_anchors"}  # and the DFlash 2 draft's


def chat_example(tokenizer, instruction: str, answer_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    prompt = chat_prompt_ids(tokenizer, conversation([instruction]))
    ids = prompt + answer_ids
    return torch.tensor(ids), torch.tensor([False] * len(prompt) + [True] * len(answer_ids))


def tuning_example(tokenizer, instruction: str, answer: str, max_answer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An instruction-tuning row: the corpus answer, cut to `max_answer` tokens, then the end of turn."""
    return chat_example(tokenizer, instruction, tokenizer.encode(answer, add_special_tokens=False)[:max_answer] + [end])


INSTRUCTION = re.compile(r"Write (?:the method `(?P<msig>[^`]+)` of class `(?P<owner>[^`]+)`"
                         r"|a Python function `(?P<fsig>[^`]+)`)\. (?P<summary>.*)", re.S)
# Other ways people ask for code (the held-out prompts' style, none taken from them): the corpus'
# instructions reworded, so the drafts also see the target answer requests it was not tuned on.
REPHRASINGS = ("Write a Python function `{sig}` that {summary}",
               "Implement `{sig}` in Python. It should {summary}",
               "Write a function `{sig}`: {summary} Keep it short.",
               "I need a Python function `{sig}` to {summary}",
               "Here is the task: {summary} Write it as a Python function `{sig}`.",
               "Create `{sig}` in Python, a function which should {summary} Add a docstring.",
               "Implement a class `{owner}` in Python with a method `{sig}` that {summary}")
FUNCTION_REPHRASINGS = REPHRASINGS[:-1]  # the last template needs a class


def rephrase(instruction: str, k: int) -> str:
    """The `k`-th rewording of a corpus instruction (methods get the class template too)."""
    m = INSTRUCTION.match(instruction)
    if not m:
        return instruction
    sig, owner, summary = m["msig"] or m["fsig"], m["owner"], m["summary"].strip()
    templates = REPHRASINGS if owner else FUNCTION_REPHRASINGS
    summary = summary[:1].lower() + summary[1:] if summary[1:2].islower() else summary
    return templates[k % len(templates)].format(sig=sig, owner=owner, summary=summary)


def distinct_4gram_ratio(tokens: list[int]) -> float:
    grams = [tuple(tokens[i : i + 4]) for i in range(len(tokens) - 3)]
    return len(set(grams)) / len(grams) if grams else 1.0


def _load_target(out: Path, device: str) -> Qwen3Target:
    return load_target(out / "target", device=device, dtype="float32").model


def _record(out: Path, stage: str, settings: dict) -> None:
    """What a stage ran with, written when it runs: the figures of a resumed build report the settings
    that made each stored model, not those of the resuming command."""
    (out / f"{stage}.settings.json").write_text(json.dumps(settings, indent=1))


def windows(tokenizer, texts: list[str], size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Pretraining rows: each text tokenized and cut into windows of `size` tokens, all in the loss."""
    out = []
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        out += [(torch.tensor(ids[i : i + size]), torch.ones(len(ids[i : i + size]), dtype=torch.bool))
                for i in range(0, len(ids) - 1, size) if len(ids[i : i + size]) > 1]
    return out


def source_windows(out: Path, tokenizer, texts: list[str], size: dict) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`windows` of the library's source, tokenized once per build and kept in out/windows.pt."""
    path = out / "windows.pt"
    if path.is_file():
        return torch.load(path, weights_only=True)
    source = windows(tokenizer, texts, size["window"])
    torch.save(source, path)
    return source


def build_target(out: Path, corpus: dict, size: dict, seed: int, device: str):
    """Tokenizer and target; returns (tokenizer, target). Reuses out/target when it is complete.
    The target is pretrained on the library's source, then instruction-tuned on the pairs."""
    from transformers import AutoTokenizer

    if not (out / "target" / "model.safetensors").is_file():
        texts, pairs = list(corpus["files"].values()), corpus["pairs"]
        tok = build_tokenizer(texts + [p["instruction"] for p in pairs], vocab_size=size["vocab"])
        save_tokenizer(tok, out / "target")
        tokenizer = AutoTokenizer.from_pretrained(out / "target")
        vocab = len(tokenizer) + 1  # the first free row: the drafts' mask token
        eos = (tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids(SPECIALS[0]))
        backbone = BackboneConfig(hidden_size=size["hidden"], intermediate_size=size["intermediate"],
                                  num_layers=size["layers"], num_heads=size["heads"], num_kv_heads=size["kv_heads"],
                                  head_dim=size["head_dim"], rms_norm_eps=1e-6, rope_theta=10000.0, vocab_size=vocab)
        tcfg = TargetConfig(backbone=backbone, tie_word_embeddings=True, max_position_embeddings=2048,
                            eos_token_ids=eos)
        target = random_target(tcfg, seed).to(device)
        source = source_windows(out, tokenizer, texts, size)
        print(f"[target] {len(source)} pretraining windows, {len(pairs)} instruction pairs", flush=True)
        log = _progress("pretrain", size["pretrain_steps"], lambda loss: f"loss {float(loss):.3f}")
        train_target(target, source, TrainArgs(steps=size["pretrain_steps"], batch=size["batch"], lr=1e-3, seed=seed),
                     on_step=log)
        examples = [tuning_example(tokenizer, p["instruction"], p["answer"], size["max_answer"], eos[0]) for p in pairs]
        log = _progress("target", size["target_steps"], lambda loss: f"loss {float(loss):.3f}")
        train_target(target, examples, TrainArgs(steps=size["target_steps"], batch=size["batch"], lr=5e-4,
                                                 seed=seed + 1), on_step=log)
        save_target(target.to(torch.bfloat16), out / "target")
        _record(out, "target", {k: size[k] for k in ("vocab", "hidden", "layers", "heads", "kv_heads", "head_dim",
                                                    "intermediate", "window", "pretrain_steps", "target_steps",
                                                    "batch", "max_answer")}
                | {"files": len(texts), "pairs": len(pairs), "windows": len(source), "seed": seed, "device": device})
    return AutoTokenizer.from_pretrained(out / "target"), _load_target(out, device)


def _progress(stage: str, total: int, describe):
    t0 = time.perf_counter()

    def on_step(step: int, value) -> None:
        if (step + 1) % max(1, total // 10) == 0 or step + 1 == total:
            print(f"[{stage}] step {step + 1}/{total} {describe(value)} {time.perf_counter() - t0:.1f}s", flush=True)
    return on_step


def distill(out: Path, tokenizer, target: Qwen3Target, pairs: list[dict], texts: list[str], size: dict,
            seed: int, recipe: dict) -> list:
    """The target's own answers to the training instructions (greedy, plus `samples` at temperature 1),
    and its sampled continuations of `continuations` source windows (contexts it has not memorised).
    `recipe` (see `distill_recipe`) is recorded with them."""
    path = out / "distilled.pt"
    if path.is_file() or unpack_distilled(out, recipe):
        return load_rows(path)
    prompts = [chat_example(tokenizer, p["instruction"], [])[0].tolist() for p in pairs]
    # Prompts decoded together: a speed setting, not part of the recipe (like the device, it changes
    # which samples are drawn, not what they are samples of).
    batch = size.get("distill_batch", 256)
    rows = []
    for s in range(1 + size["samples"]):
        outputs = distill_mod.answers(target, prompts, size["max_answer"], 0.0 if s == 0 else 1.0,
                                      target.config.eos_token_ids, seed * 1000 + s, batch)
        rows += distill_mod.examples(prompts, outputs)
    reworded = [chat_example(tokenizer, rephrase(p["instruction"], i * size["rephrasings"] + r), [])[0].tolist()
                for r in range(size["rephrasings"]) for i, p in enumerate(pairs)]
    for s, temperature in enumerate((0.0, 1.0) if reworded else ()):  # greedy and one sample each
        outputs = distill_mod.answers(target, reworded, size["max_answer"], temperature,
                                      target.config.eos_token_ids, seed * 1000 + 500 + s, batch)
        rows += distill_mod.examples(reworded, outputs)
    starts = []
    if size["continuations"]:
        gen = torch.Generator().manual_seed(seed + 17)
        source = source_windows(out, tokenizer, texts, size)
        picks = torch.randperm(len(source), generator=gen)[: size["continuations"]].tolist()
        starts = [source[i][0][: size["window"] // 4].tolist() for i in picks]
        outputs = distill_mod.answers(target, starts, size["max_answer"], 1.0, target.config.eos_token_ids,
                                      seed * 1000 + 999, batch)
        rows += distill_mod.examples(starts, outputs)
    save_rows(rows, path)
    _record(out, "distill", {"instructions": len(prompts), "greedy": 1, "samples_t1": size["samples"],
                             "reworded_instructions": len(reworded), "continuations_t1": len(starts),
                             "max_answer": size["max_answer"], "batch": batch,
                             "sequences": len(rows), "seed": seed, "recipe": recipe})
    return rows


SHIPPED_DISTILLED = Path(__file__).with_name("distilled.pt.xz")


def distill_recipe(size: dict, seed: int, corpus_sha256: str) -> dict:
    """Everything besides the target's weights that decides what the distilled rows are samples of
    (the device and the decoding batch change only which samples are drawn), the rewording templates
    included: editing them makes earlier rows stale."""
    return ({k: size.get(k) for k in ("samples", "rephrasings", "continuations", "max_answer", "window", "files",
                                      "pairs")} | {"seed": seed, "corpus_sha256": corpus_sha256,
                                                   "rewordings": list(REPHRASINGS)})


def pack_distilled(out: Path, dest: Path = SHIPPED_DISTILLED) -> None:
    """The distillation of the shipped target, lzma-compressed beside this script (4.2 MB instead of
    37): a rebuild of the drafts then skips the 4 GPU minutes of generation. It names the target's
    weights (sha256) and the settings (with the recipe) recorded when the rows were made, and is used
    only for exactly that target and recipe."""
    path = out / "distill.settings.json"
    settings = path.read_text() if path.is_file() else "{}"
    if "recipe" not in json.loads(settings) or not (out / "distilled.pt").is_file():
        raise SystemExit(f"build.py: {out} has no distillation with its recipe recorded (distilled.pt and "
                         "distill.settings.json); run the distill stage there first")
    payload = {"target_sha256": file_sha256(out / "target" / "model.safetensors"), "settings": settings,
               "rows": torch.load(out / "distilled.pt", weights_only=True)}
    buf = io.BytesIO()
    torch.save(payload, buf)
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.write_bytes(lzma.compress(buf.getvalue(), preset=9))
    os.replace(tmp, dest)


def unpack_distilled(out: Path, recipe: dict, src: Path = SHIPPED_DISTILLED) -> bool:
    """Write out/distilled.pt from the shipped distillation when it was made from this very target with
    this recipe; False (and nothing written) otherwise."""
    if not src.is_file():
        return False
    try:
        payload = torch.load(io.BytesIO(lzma.decompress(src.read_bytes())), weights_only=True)
        made_for = (payload["target_sha256"], json.loads(payload["settings"])["recipe"])
    except (lzma.LZMAError, EOFError, RuntimeError, KeyError, TypeError, ValueError) as exc:
        print(f"[distill] {src} is unreadable ({type(exc).__name__}); distilling instead", flush=True)
        return False
    if made_for != (file_sha256(out / "target" / "model.safetensors"), recipe):
        return False
    (out / "distill.settings.json").write_text(payload["settings"])
    torch.save(payload["rows"], out / "distilled.pt.tmp")
    os.replace(out / "distilled.pt.tmp", out / "distilled.pt")  # last: its presence marks the stage done
    print(f"[distill] the target's distillation from {src.name} (the same weights and recipe)", flush=True)
    return True


def save_rows(rows: list[tuple[torch.Tensor, torch.Tensor]], path: Path) -> None:
    """Training rows as one flat int16 tensor of ids, one of loss-mask flags and the row lengths
    (a quarter of the size of a list of int64 tensors; the demo vocabulary fits in int16)."""
    torch.save({"ids": torch.cat([r[0] for r in rows]).to(torch.int16), "mask": torch.cat([r[1] for r in rows]),
                "lengths": torch.tensor([len(r[0]) for r in rows])}, path)


def load_rows(path: Path) -> list[tuple[torch.Tensor, torch.Tensor]]:
    flat = torch.load(path, weights_only=True)
    lengths = flat["lengths"].tolist()
    return list(zip(flat["ids"].long().split(lengths), flat["mask"].split(lengths)))


_PARENT_STOP = None  # in a --jobs worker: the parent's stop request, for a signal sent to the parent alone


def _init_worker(event) -> None:
    global _PARENT_STOP
    _PARENT_STOP = event


def build_draft(out: str, name: str, rank: int, size: dict, seed: int, device: str,
                deadline: float | None = None) -> str | None:
    """Train one draft on the distilled answers (and the library's source windows, scored against the
    target's distributions) and store it (a process of its own with --jobs). At the wall-clock
    `deadline` (time.time()), on SIGINT / SIGTERM (one that arrives while it loads stops it after its
    first step) or when the parent asks, it checkpoints and returns None instead."""
    with stop_requested(None if deadline is None else deadline - time.time()) as own:
        stop = own if _PARENT_STOP is None else (lambda: own() or _PARENT_STOP.is_set())
        return _build_draft(Path(out), name, rank, size, seed, device, stop)


def _new_draft(name: str, rank: int, size: dict, target: Qwen3Target, examples: list, seed: int, base=None):
    """A fresh draft of the kind `name` and its training settings: (draft, TrainArgs, what to record, how
    to describe a step's figures). The EAGLE-3 draft: one Llama-style layer tapping vLLM's default states,
    its vocabulary the `eagle3_vocab` target ids the training data scores most; the draft model: a Qwen3 of the
    target's tokenizer (`random_draft_model`), next-token cross-entropy; the block drafts: DeepSpec's (DFlash 2's
    in z-lab's fill-in layout, started from `base`, the DFlash draft, its convolutions the identity, its selector's
    cross-entropy added)."""
    tcfg = target.config
    vocab = tcfg.backbone.vocab_size
    if name == "draft_model":
        draft = random_draft_model(target, size.get("draft_model_layers", 1), seed + 1)
        args = TrainArgs(steps=size["draft_model_steps"], batch=size["draft_model_batch"], lr=size["draft_model_lr"],
                         seed=seed, checkpoint_every=100, max_len=size.get("draft_model_max_len", 1024))
        settings = {"num_speculative_tokens": size.get("draft_model_tokens", 3), "max_len": args.max_len,
                    "tied_embeddings": draft.config.tie_word_embeddings}
        return draft, args, settings, lambda parts: f"loss {float(parts[0].loss.detach()):.3f} acc {float(parts[0].accuracy):.2f}"
    if name == "eagle3":
        taps = tuple(size.get("draft_taps") or vllm_default_eagle3_taps(tcfg.backbone.num_layers))
        dcfg = tiny_eagle3_config(tcfg, taps=taps, num_tokens=7, draft_vocab_size=size["eagle3_vocab"],
                                  intermediate_size=size.get("eagle3_intermediate"))
        draft = random_eagle3(dcfg, target, seed + 1, d2t=draft_vocabulary(examples, size["eagle3_vocab"], vocab))
        args = TrainArgs(steps=size["eagle3_steps"], batch=size["eagle3_batch"], lr=size["eagle3_lr"], seed=seed,
                         checkpoint_every=100, max_len=size.get("eagle3_max_len", 1024), loss=TTTConfig())
        settings = {"draft_vocab": dcfg.vocab_size, "ttt_length": args.loss.ttt_length,
                    "num_speculative_tokens": dcfg.num_speculative_tokens, "max_len": args.max_len}
        return draft, args, settings, lambda parts: (f"tau {parts[0].tau:.2f} acc "
                                                     + " ".join(f"{a:.2f}" for a in parts[0].accuracy.tolist()))
    taps = tuple(size.get("draft_taps") or evenly_spaced_taps(tcfg.backbone.num_layers))  # the stored target's
    if name == "dflash2":
        block = size.get("dflash2_block_size", 8)
        dcfg = replace(base.config, format="zlab", sample_from_anchor=False, block_size=block, architecture="",
                       **{key: size.get(f"dflash2_{key}", default) for key, default in
                          (("conv_kernel_size", 2), ("conv_group_size", 16), ("selector_rank", 32),
                           ("selector_top_k", 8))})
        draft = random_draft(dcfg, target, seed + 1)
        draft.load_state_dict({k: v for k, v in base.state_dict().items() if not k.startswith(("embed_tokens", "lm_head"))},
                              strict=False)  # the DFlash draft's backbone; the convolutions and selector are new
        identity_convolutions(draft.fuse())
        args = TrainArgs(steps=size["dflash2_steps"], batch=size["dflash2_batch"], lr=size["dflash2_lr"], seed=seed,
                         checkpoint_every=50, max_len=size.get("dflash2_max_len", 1024),
                         loss=LossConfig(num_anchors=size["dflash2_anchors"]))
        settings = {"block_size": block, "anchors": size["dflash2_anchors"], "max_len": args.max_len, "from": "dflash",
                    **{key: getattr(dcfg, key) for key in ("conv_kernel_size", "conv_group_size", "selector_rank",
                                                           "selector_top_k")}}
        return draft, args, settings, lambda parts: (f"tau {parts[0].tau:.2f} ce {parts[0].ce:.3f} "
                                                     f"selector {parts[0].selector:.3f}")
    dcfg = tiny_draft_config(tcfg, layers=size["draft_layers"], block_size=7, taps=taps,
                             markov_rank=rank, confidence=rank > 0, mask_token_id=vocab - 1,
                             intermediate_size=size.get("draft_intermediate"))
    args = TrainArgs(steps=size["draft_steps"], batch=size["draft_batch"], lr=size.get("draft_lr", 1e-3), seed=seed,
                     checkpoint_every=250, loss=LossConfig(num_anchors=size["anchors"]))
    return (random_draft(dcfg, target, seed + 1), args, {"markov_rank": rank, "block_size": 7, "anchors": size["anchors"]},
            lambda parts: f"tau {parts[0].tau:.2f} ce {parts[0].ce:.3f}")


def _build_draft(out: Path, name: str, rank: int, size: dict, seed: int, device: str, stop) -> str | None:
    if (out / name / "model.safetensors").is_file():
        return name
    target = _load_target(out, device)
    distilled = load_rows(out / "distilled.pt")
    # the library's source too, for the drafts scored against the target's distributions; a draft model learns the
    # tokens themselves, so only the target's own (the distillation)
    source = torch.load(out / "windows.pt", weights_only=True) if size["draft_source"] and name != "draft_model" else []
    examples = distilled + source
    base = load_draft(out / "dflash", target).model if name == "dflash2" else None  # what DFlash 2 starts from
    draft, args, settings, describe = _new_draft(name, rank, size, target.cpu(), examples, seed, base)
    draft = draft.to(device)
    target.to(device)
    ckpt, start, opt_state = out / f"{name}.train", 0, None
    if (resumed := load_checkpoint(ckpt, target)) is not None:  # an interrupted build goes on from here
        draft, start, opt_state = resumed
    log = _progress(name, args.steps, describe)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True  # TF32 tensor cores for the training matmuls (GPU only)
    try:
        train(target, draft, examples, args, out_dir=ckpt, start_step=start, optimizer_state=opt_state, on_step=log,
              stop=stop)
    except TrainingStopped as exc:
        print(f"[{name}] stopped after step {exc.step} of {args.steps} (checkpointed)", flush=True)
        return None
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    made = draft.config.backbone  # a resumed run's own shape, whatever this command asked for
    _record(out, name, {"layers": made.num_layers, "intermediate": made.intermediate_size} | settings
            | {"taps": list(getattr(draft.config, "target_layer_ids", ())), "steps": args.steps, "batch": args.batch, "lr": args.lr,
               "tf32_matmul": device.startswith("cuda"), "distilled_sequences": len(distilled),
               "source_windows": len(source), "seed": seed, "device": device})
    save_trained(draft.to(torch.bfloat16), out / name, target.config, with_embeddings=False)
    shutil.rmtree(ckpt, ignore_errors=True)
    return name


def evaluate(out: Path, tokenizer, size: dict, device: str, smoke: bool, drafts: list[str]) -> dict:
    """Acceptance on the held-out coding prompts (never seen in training), with the stored models:
    the `drafts` built, and the n-gram drafter on the same prompts."""
    target = _load_target(out, device)
    eos = target.config.eos_token_ids
    rows = [r for r in load_suite("qualitative", source="demo").rows if r.category == "coding"][: size.get("prompts")]
    prompts = [chat_example(tokenizer, r.turns[0], [])[0].tolist() for r in rows]
    tokens = {"draft_model": size.get("draft_model_tokens", 3)}  # the others propose their checkpoint's block or chain
    systems = {"plain": None} | {name: make_drafter(name, str(out / name), target, tokens.get(name))[0] for name in drafts}
    systems["ngram"] = NgramDrafter()
    figures = {"prompts": len(prompts)}
    for temperature in (0.0, 1.0):
        cfg = GenerationConfig(max_new_tokens=16 if smoke else 128, temperature=temperature, stop_token_ids=eos)
        outputs = {}
        for name, drafter in systems.items():
            engine = Engine(target, drafter)
            outputs[name] = [engine.generate(p, replace(cfg, seed=i)) for i, p in enumerate(prompts)]
        t = f"T{temperature:g}"
        for name in [*drafts, "ngram"]:
            lengths = [n for r in outputs[name] for n in r.acceptance_lengths]
            figures[f"{name}_{t}_acceptance_length"] = sum(lengths) / max(1, len(lengths))
        plain = outputs["plain"]
        figures[f"target_{t}_distinct_4gram"] = sum(distinct_4gram_ratio(r.tokens) for r in plain) / len(plain)
        figures[f"target_{t}_mean_output_tokens"] = sum(len(r.tokens) for r in plain) / len(plain)
        if temperature == 0.0:
            figures["greedy_outputs_equal_plain"] = all(
                a.tokens == b.tokens for name in [*drafts, "ngram"] for a, b in zip(outputs[name], plain))
    return figures


def install(out: Path) -> None:
    """The models into the package; the figures and the target's distillation beside this script."""
    pack_distilled(out)  # first: it refuses a folder without a recorded distillation, before anything is replaced
    for name in ("target", *DRAFTS):
        shutil.rmtree(DEMO_DIR / name, ignore_errors=True)
        shutil.copytree(out / name, DEMO_DIR / name)
    shutil.copy(out / "figures.json", Path(__file__).with_name("figures.json"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", choices=("full", "medium", "smoke"), default="full",
                    help="full: the shipped pair (GPU); medium: a CPU rehearsal (minutes); smoke: every stage in seconds")
    ap.add_argument("--smoke", action="store_true", help="the same as --size smoke")
    ap.add_argument("--pretrain-steps", type=int, help="override the size's target pretraining steps")
    ap.add_argument("--target-steps", type=int, help="override the size's target instruction-tuning steps")
    ap.add_argument("--target-layers", type=int, help="override the size's target layers (at least 2)")
    ap.add_argument("--target-intermediate", type=int, help="override the size's target MLP width")
    ap.add_argument("--target-batch", type=int, help="override the sequences per target pretraining and tuning step")
    ap.add_argument("--draft-steps", type=int, help="override the size's draft training steps")
    ap.add_argument("--draft-layers", type=int, help="override the size's block-draft layers (EAGLE-3 has one)")
    ap.add_argument("--draft-model-layers", type=int, help="override the size's draft-model layers (fewer than the "
                    "target's)")
    ap.add_argument("--draft-intermediate", type=int, help="override the drafts' MLP width (default: the target's)")
    ap.add_argument("--draft-batch", type=int, help="override the sequences per draft training step")
    ap.add_argument("--draft-lr", type=float, help="override the drafts' peak learning rate")
    ap.add_argument("--draft-taps", help="the target layers the drafts tap, comma-separated, from 0 (default: "
                    "DeepSpec's evenly spaced rule, 1,2,3,4,5 for 8 layers)")
    ap.add_argument("--drafts", default=",".join(DRAFTS), help="which drafts to build and evaluate (comma-separated, "
                    f"of {','.join(DRAFTS)})")
    ap.add_argument("--anchors", type=int, help="override the anchors (blocks) drawn per training sequence")
    ap.add_argument("--samples", type=int, help="override the temperature-1 answers distilled per instruction")
    ap.add_argument("--continuations", type=int, help="override the source windows the target continues (T = 1)")
    ap.add_argument("--rephrasings", type=int, help="override the reworded copies of each instruction distilled")
    ap.add_argument("--distill-batch", type=int, help="prompts the distillation decodes together (default 256)")
    ap.add_argument("--corpus", type=Path, help="the corpus written by corpus.py on the pinned Python (default: build it)")
    ap.add_argument("--jobs", type=int, default=1, help="train the drafts in this many processes "
                    "(on one H200 two at once take 0.155 s a step each, one alone 0.072: no faster)")
    ap.add_argument("--time-limit", type=float, help="stop the drafts' training this many seconds after it starts, "
                    "on checkpointed steps (exit code 3; the same command resumes)")
    ap.add_argument("--until", choices=("target", "distill", "drafts"),
                    help="stop after this stage (to run the stages on different machines)")
    ap.add_argument("--install", action="store_true", help="copy the models into the package, the figures here")
    args = ap.parse_args(argv)
    if args.smoke:
        args.size = "smoke"
    drafts = [name for name in DRAFTS if name in args.drafts.split(",")]
    if not drafts or set(args.drafts.split(",")) - set(drafts):
        ap.error(f"--drafts {args.drafts!r}: give some of {','.join(DRAFTS)}, comma-separated")
    if "dflash2" in drafts and "dflash" not in drafts and not (args.out / "dflash" / "model.safetensors").is_file():
        ap.error(f"--drafts {args.drafts}: the DFlash 2 draft starts from the DFlash draft, which {args.out} lacks; "
                 "build dflash too")
    if args.install and len(drafts) < len(DRAFTS):
        ap.error("--install ships every draft: leave --drafts at its default")
    size = dict({"full": FULL, "medium": MEDIUM, "smoke": SMOKE}[args.size])
    if args.rephrasings is not None and args.rephrasings > len(FUNCTION_REPHRASINGS):
        ap.error(f"--rephrasings {args.rephrasings}: there are {len(FUNCTION_REPHRASINGS)} rewording templates for "
                 "functions (REPHRASINGS), so more would repeat them; give at most that or add templates")
    if args.target_layers is not None and args.target_layers < 2:
        ap.error(f"--target-layers {args.target_layers}: give at least 2 (the drafts tap a layer below the last)")
    if args.target_intermediate is not None and args.target_intermediate < 1:
        ap.error(f"--target-intermediate {args.target_intermediate}: give a positive MLP width")
    size["layers"] = args.target_layers or size["layers"]
    size["intermediate"] = args.target_intermediate or size["intermediate"]
    if args.target_batch is not None and args.target_batch < 1:
        ap.error(f"--target-batch {args.target_batch}: give at least 1 sequence per step")
    size.setdefault("draft_batch", size["batch"])  # the drafts keep the size's batch
    for key, block in (("eagle3_steps", "draft_steps"), ("eagle3_batch", "draft_batch"), ("eagle3_lr", "draft_lr"),
                       ("draft_model_steps", "draft_steps"), ("draft_model_batch", "draft_batch"),
                       ("draft_model_lr", "draft_lr"), ("dflash2_steps", "draft_steps"),
                       ("dflash2_batch", "draft_batch"), ("dflash2_lr", "draft_lr"), ("dflash2_anchors", "anchors")):
        size.setdefault(key, size.get(block, 1e-3))
    size["batch"] = args.target_batch or size["batch"]
    stored = args.out / "target" / "config.json"
    if stored.is_file() and (args.out / "target" / "model.safetensors").is_file():  # a build that goes on
        made = json.loads(stored.read_text())
        settings = args.out / "target.settings.json"  # absent where the shipped target was copied in
        recorded = json.loads(settings.read_text()) if settings.is_file() else {}
        for flag, value, was in (("--target-layers", args.target_layers, made["num_hidden_layers"]),
                                 ("--target-intermediate", args.target_intermediate, made["intermediate_size"]),
                                 ("--target-batch", args.target_batch, recorded.get("batch")),
                                 ("--pretrain-steps", args.pretrain_steps, recorded.get("pretrain_steps")),
                                 ("--target-steps", args.target_steps, recorded.get("target_steps"))):
            if value is not None and was is not None and value != was:
                ap.error(f"{flag} {value}: {stored.parent} already holds a target made with {was}; "
                         "give another --out or leave the flag out")
        size["layers"] = made["num_hidden_layers"]  # the drafts tap the stored target
    if args.draft_taps is not None:
        try:
            args.draft_taps = [int(t) for t in args.draft_taps.split(",")]
        except ValueError:
            ap.error(f"--draft-taps {args.draft_taps!r}: give layer numbers separated by commas, such as 2,3,4,5,6")
        layers = size["layers"]
        if args.draft_taps != sorted(set(args.draft_taps)) or not 0 <= args.draft_taps[0] <= args.draft_taps[-1] < layers - 1:
            ap.error(f"--draft-taps {args.draft_taps}: give increasing layers from 0 to {layers - 2} (below the "
                     f"target's last layer, {layers - 1})")
    if args.draft_model_layers is not None and not 0 < args.draft_model_layers < size["layers"]:
        ap.error(f"--draft-model-layers {args.draft_model_layers}: give 1 to {size['layers'] - 1} (a draft model is "
                 "smaller than the target)")
    for key in ("pretrain_steps", "target_steps", "draft_steps", "draft_layers", "draft_model_layers",
                "draft_intermediate", "draft_batch",
                "draft_lr", "draft_taps", "anchors", "samples", "continuations", "rephrasings", "distill_batch"):
        if getattr(args, key) is not None:
            size[key] = getattr(args, key)
            if key in EAGLE3_OVERRIDES:  # the draft flags set the EAGLE-3 draft's own figures too
                size[EAGLE3_OVERRIDES[key]] = size[key]
            if key in DRAFT_MODEL_OVERRIDES:  # and the draft model's
                size[DRAFT_MODEL_OVERRIDES[key]] = size[key]
            if key in DFLASH2_OVERRIDES:  # and the DFlash 2 draft's
                size[DFLASH2_OVERRIDES[key]] = size[key]
    out, device, t0 = args.out, args.device, time.perf_counter()
    if args.corpus:  # corpus.json, or corpus.json.gz (a quarter of the size, to carry to a GPU machine)
        corpus, text = corpus_mod.load_or_refuse(ap, args.corpus)
    else:
        corpus = corpus_mod.build(json.loads(corpus_mod.PIN.read_text()), corpus_mod.stdlib_dir())
        text = json.dumps(corpus)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    files = sorted(corpus["files"])[: size.get("files")]
    corpus = {"files": {f: corpus["files"][f] for f in files}, "pairs": corpus["pairs"][: size.get("pairs")]}
    pairs = corpus["pairs"]
    tokenizer, target = build_target(out, corpus, size, args.seed, device)
    print(f"[target] ready {time.perf_counter() - t0:.0f}s", flush=True)
    if args.until == "target":
        return 0
    corpus_sha256 = hashlib.sha256(text.encode()).hexdigest()
    distill(out, tokenizer, target, pairs, list(corpus["files"].values()), size, args.seed,
            distill_recipe(size, args.seed, corpus_sha256))
    if size["draft_source"]:
        source_windows(out, tokenizer, list(corpus["files"].values()), size)  # the drafts read out/windows.pt
    print(f"[distill] ready {time.perf_counter() - t0:.0f}s", flush=True)
    if args.until == "distill":
        return 0
    del target
    ranks = {"dspark": 8 if args.size == "smoke" else 64, "dflash": 0, "eagle3": 0, "draft_model": 0, "dflash2": 0}
    deadline = None if args.time_limit is None else time.time() + args.time_limit
    jobs = [(str(out), name, ranks[name], size, args.seed, device, deadline) for name in drafts if name != "dflash2"]
    later = [(str(out), "dflash2", 0, size, args.seed, device, deadline)] if "dflash2" in drafts else []
    if not jobs:  # (DFlash 2 alone, from a folder whose DFlash draft is built: checked above)
        built = []
    elif args.jobs > 1:
        # Ctrl-C reaches the workers too; a signal sent to this process alone is passed on to them.
        ctx = multiprocessing.get_context("spawn")
        parent_stop = ctx.Event()
        with stop_requested() as stop, ProcessPoolExecutor(args.jobs, mp_context=ctx, initializer=_init_worker,
                                                           initargs=(parent_stop,)) as pool:
            futures = [pool.submit(build_draft, *job) for job in jobs]
            while wait(futures, timeout=1).not_done:
                if stop():
                    parent_stop.set()
            built = [f.result() for f in futures]
    else:
        built = []
        for job in jobs:
            built.append(build_draft(*job))
            if built[-1] is None:  # stopped: the next draft does not start
                break
    if None not in built and later:  # DFlash 2 starts from the DFlash draft: after it, whatever the jobs
        built.append(build_draft(*later[0]))
    if None in built:
        print("build.py: stopped before the drafts were trained (time limit or signal); run the same command again "
              "to resume from their checkpoints", file=sys.stderr, flush=True)
        return 3
    print(f"[drafts] ready {time.perf_counter() - t0:.0f}s", flush=True)
    if args.until == "drafts":
        return 0

    figures = {"size": args.size, "corpus_sha256": corpus_sha256,
               "evaluated_on": device, "torch": torch.__version__,
               "build": {stage: json.loads(f.read_text()) if (f := out / f"{stage}.settings.json").is_file() else None
                         for stage in ("target", "distill", *drafts)}}  # None: a stage this folder did not run
    figures |= evaluate(out, tokenizer, size, device, args.size == "smoke", drafts)
    figures["seconds"] = round(time.perf_counter() - t0, 1)
    (out / "figures.json").write_text(json.dumps(figures, indent=2))
    print(json.dumps(figures, indent=2))
    if args.install:
        install(out)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("build.py: interrupted; the same command resumes from the last finished stage or checkpoint",
              file=sys.stderr)
        sys.exit(130)

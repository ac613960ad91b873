"""Rebuild the demo pair from nothing: corpus -> tokenizer -> target -> self-distillation -> drafts -> figures.

    python experiments/demo/build.py --out build/demo [--device cuda] [--seed 0]
    python experiments/demo/build.py --out /tmp/demo --size medium  # a CPU rehearsal in minutes
    python experiments/demo/build.py --out /tmp/demo --smoke        # every stage at toy sizes, in seconds

Stages (each seeded): the pinned standard-library corpus (`corpus.py`); a byte-level BPE tokenizer
trained on it; a small Qwen3 target trained on the chat-formatted pairs (loss on the answers); the
target's own greedy answers to the training instructions (self-distillation, as DeepSpec does);
a DSpark draft and a DFlash-mode draft trained on those; acceptance on the held-out coding prompts.
Writes target/, dspark/, dflash/ and figures.json under --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from importlib import resources
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus as corpus_mod  # noqa: E402

from dspark.checkpoint import save_draft, save_target  # noqa: E402
from dspark.config import BackboneConfig, TargetConfig  # noqa: E402
from dspark.drafters import BlockDrafter, NgramDrafter  # noqa: E402
from dspark.engine import Engine, GenerationConfig  # noqa: E402
from dspark.presets import evenly_spaced_taps  # noqa: E402
from dspark.tiny import random_draft, random_target, tiny_draft_config  # noqa: E402
from dspark.tokenizer import SPECIALS, build_tokenizer, save_tokenizer  # noqa: E402
from dspark.train import LossConfig, TrainArgs, train, train_target  # noqa: E402

FULL = dict(vocab=2048, hidden=256, layers=8, heads=4, kv_heads=2, head_dim=64, intermediate=768,
            target_steps=3000, draft_steps=2000, batch=16, max_answer=256, draft_layers=1)
MEDIUM = dict(vocab=1024, hidden=128, layers=4, heads=4, kv_heads=2, head_dim=32, intermediate=384,
              target_steps=300, draft_steps=150, batch=8, max_answer=96, draft_layers=1)
SMOKE = dict(vocab=300, hidden=32, layers=4, heads=4, kv_heads=2, head_dim=8, intermediate=64,
             target_steps=20, draft_steps=10, batch=2, max_answer=24, draft_layers=1, pairs=12, prompts=2)


def chat_example(tokenizer, instruction: str, answer_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": instruction}], add_generation_prompt=True,
                                           enable_thinking=False, tokenize=True, return_dict=False)
    ids = list(prompt) + answer_ids
    return torch.tensor(ids), torch.tensor([False] * len(prompt) + [True] * len(answer_ids))


def distinct_4gram_ratio(tokens: list[int]) -> float:
    grams = [tuple(tokens[i : i + 4]) for i in range(len(tokens) - 3)]
    return len(set(grams)) / len(grams) if grams else 1.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", choices=("full", "medium", "smoke"), default="full",
                    help="full: the shipped pair (GPU); medium: a CPU rehearsal (minutes); smoke: every stage in seconds")
    ap.add_argument("--smoke", action="store_true", help="the same as --size smoke")
    ap.add_argument("--target-steps", type=int, help="override the size's target training steps")
    ap.add_argument("--draft-steps", type=int, help="override the size's draft training steps")
    args = ap.parse_args(argv)
    if args.smoke:
        args.size = "smoke"
    size = dict({"full": FULL, "medium": MEDIUM, "smoke": SMOKE}[args.size])
    for key in ("target_steps", "draft_steps"):
        if getattr(args, key) is not None:
            size[key] = getattr(args, key)
    out, device, t0 = args.out, args.device, time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)

    pairs = corpus_mod.build(json.loads(corpus_mod.PIN.read_text()), corpus_mod.stdlib_dir())
    pairs = pairs[: size.get("pairs", len(pairs))]
    tok = build_tokenizer((p["instruction"] + "\n" + p["answer"] for p in pairs), vocab_size=size["vocab"])
    save_tokenizer(tok, out / "target")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out / "target")
    mask_id = len(tokenizer)  # the first free row: the drafts' mask token
    vocab = mask_id + 1
    eos = (tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids(SPECIALS[0]))
    backbone = BackboneConfig(hidden_size=size["hidden"], intermediate_size=size["intermediate"],
                              num_layers=size["layers"], num_heads=size["heads"], num_kv_heads=size["kv_heads"],
                              head_dim=size["head_dim"], rms_norm_eps=1e-6, rope_theta=10000.0, vocab_size=vocab)
    tcfg = TargetConfig(backbone=backbone, tie_word_embeddings=True, max_position_embeddings=2048, eos_token_ids=eos)
    target = random_target(tcfg, args.seed).to(device)
    examples = [chat_example(tokenizer, p["instruction"],
                             tokenizer.encode(p["answer"], add_special_tokens=False)[: size["max_answer"]] + [eos[0]])
                for p in pairs]
    train_target(target, examples, TrainArgs(steps=size["target_steps"], batch=size["batch"], lr=1e-3, seed=args.seed))
    save_target(target, out / "target")

    # Self-distillation: the drafts learn the target's own answers to the training instructions.
    engine = Engine(target)
    cfg = GenerationConfig(max_new_tokens=size["max_answer"], temperature=0.0, stop_token_ids=eos)
    distilled = []
    for p in pairs:
        prompt, _ = chat_example(tokenizer, p["instruction"], [])
        distilled.append(chat_example(tokenizer, p["instruction"], engine.generate(prompt.tolist(), cfg).tokens))

    figures = {"pairs": len(pairs), "vocab": vocab, "target_params": sum(p.numel() for p in target.parameters())}
    taps = evenly_spaced_taps(size["layers"])
    drafts = {}
    for name, rank in (("dspark", 8 if args.size == "smoke" else 64), ("dflash", 0)):
        dcfg = replace(tiny_draft_config(tcfg, layers=size["draft_layers"], block_size=7, taps=taps, markov_rank=rank,
                                         confidence=rank > 0, mask_token_id=mask_id))
        draft = random_draft(dcfg, target.cpu(), args.seed + 1).to(device)
        target.to(device)
        train(target, draft, distilled, TrainArgs(steps=size["draft_steps"], batch=size["batch"], lr=1e-3,
                                                  seed=args.seed, loss=LossConfig(num_anchors=32)))
        save_draft(draft, out / name, "deepspec", tcfg)
        drafts[name] = draft

    # Acceptance on the held-out coding prompts (never seen in training).
    rows = [json.loads(line) for line in resources.files("harness").joinpath("data/demo_coding.jsonl")
            .read_text().splitlines() if line.strip()][: size.get("prompts")]
    prompts = [chat_example(tokenizer, r["turns"][0], [])[0].tolist() for r in rows]
    for temperature in (0.0, 1.0):
        cfg = GenerationConfig(max_new_tokens=16 if args.size == "smoke" else 128, temperature=temperature,
                               stop_token_ids=eos)
        systems = {"dspark": BlockDrafter(drafts["dspark"]), "dflash": BlockDrafter(drafts["dflash"]),
                   "ngram": NgramDrafter()}
        for name, drafter in systems.items():
            rounds = [Engine(target, drafter).generate(p, replace(cfg, seed=i)) for i, p in enumerate(prompts)]
            lengths = [n for r in rounds for n in r.acceptance_lengths]
            figures[f"{name}_T{temperature:g}_acceptance_length"] = sum(lengths) / max(1, len(lengths))
            if name == "dspark":
                figures[f"target_T{temperature:g}_distinct_4gram"] = sum(
                    distinct_4gram_ratio(r.tokens) for r in rounds) / len(rounds)
    figures["seconds"] = time.perf_counter() - t0
    (out / "figures.json").write_text(json.dumps(figures, indent=2))
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How sure the demo target is of its own greedy answers, on the prompt sets of generalization.py.

At T = 0 a drafted token is accepted when it is the target's argmax, so where the target hesitates
between near-equal tokens a draft must reproduce a close call. Per prompt set (`seen`,
`unseen_same_style`, `held_out`; 128 new tokens, CPU float32) this prints:
- the mean top-1 probability along the target's greedy answers;
- the share of answer tokens whose top-1 probability is under 0.5;
- the answers' distinct 4-gram ratio (1 = no repetition).
With `--tune-steps N` the target is first instruction-tuned N steps more, to see whether a target
that knows its data better is surer of prompts it never saw; with `--tune-rewordings` those steps
also draw the instructions reworded by the build's templates (the answers unchanged).

    python experiments/demo/target_confidence.py --corpus corpus.json.gz [--tune-steps 400 [--tune-rewordings]]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generalization import prompt_sets  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

import build  # noqa: E402
from dspark.checkpoint import load_target  # noqa: E402
from dspark.engine import Engine, GenerationConfig  # noqa: E402
from dspark.target import Qwen3Target  # noqa: E402
from dspark.train import TrainArgs, train_target  # noqa: E402
from harness.provenance import provenance  # noqa: E402


@torch.inference_mode()
def confidence(target: Qwen3Target, prompts: list[list[int]], stop: tuple[int, ...]) -> dict:
    top1, ratios = [], []
    cfg = GenerationConfig(max_new_tokens=128, temperature=0.0, stop_token_ids=stop)
    for p in prompts:
        answer = Engine(target).generate(p, cfg).tokens
        ids = torch.tensor([p + answer])
        hidden, _ = target(ids, None, target.new_cache(ids.shape[1]), ids.shape[1])
        top1 += target.logits(hidden[0, len(p) - 1 : -1]).softmax(-1).amax(-1).tolist()
        ratios.append(build.distinct_4gram_ratio(answer))
    return {"mean_top1": round(sum(top1) / len(top1), 3),
            "share_top1_under_half": round(sum(x < 0.5 for x in top1) / len(top1), 3),
            "distinct_4gram": round(sum(ratios) / len(ratios), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, help="a build folder holding target/ (default: the shipped target)")
    ap.add_argument("--corpus", type=Path, required=True, help="corpus.json or corpus.json.gz from corpus.py")
    ap.add_argument("--tune-steps", type=int, default=0, help="instruction-tune the target this many steps more first")
    ap.add_argument("--tune-lr", type=float, default=3e-4)
    ap.add_argument("--tune-rewordings", action="store_true", help="tune on the reworded instructions too")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    loaded = load_target(str(args.models / "target") if args.models else "demo", device="cpu", dtype="float32")
    target, tok = loaded.model, AutoTokenizer.from_pretrained(loaded.path)
    stop = tuple(target.config.eos_token_ids)
    sets = prompt_sets(tok, args.corpus)
    figures = {"models": str(args.models or "shipped"), "tune_steps": args.tune_steps,
               "tune_rewordings": args.tune_rewordings}
    if args.tune_steps:
        raw = args.corpus.read_bytes()
        pairs = json.loads(gzip.decompress(raw) if args.corpus.suffix == ".gz" else raw)["pairs"]
        # the build's instruction-tuning rows and batch (build_target), at a lower learning rate
        asks = [(p["instruction"], p["answer"]) for p in pairs]
        if args.tune_rewordings:
            asks += sorted({(build.rephrase(p["instruction"], k), p["answer"])
                            for p in pairs for k in range(len(build.REPHRASINGS))} - set(asks))
        rows = [build.chat_example(tok, ask, tok.encode(answer, add_special_tokens=False)[: build.FULL["max_answer"]]
                                   + [stop[0]]) for ask, answer in asks]
        figures["tune_rows"] = len(rows)
        losses = []
        train_target(target, rows, TrainArgs(steps=args.tune_steps, batch=build.FULL["batch"], lr=args.tune_lr,
                                             seed=args.seed), on_step=lambda step, loss: losses.append(loss.detach().item()))
        figures["tune_loss_last_50"] = round(sum(losses[-50:]) / len(losses[-50:]), 4)
    for name, prompts in sets.items():
        figures[name] = confidence(target, prompts, stop)
    figures["provenance"] = provenance("cpu")
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()

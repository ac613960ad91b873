"""How sure the demo target is of its own greedy answers, on the prompt sets of generalization.py.

At T = 0 a drafted token is accepted when it is the target's argmax, so where the target hesitates
between near-equal tokens a draft must reproduce a close call. Per prompt set (`seen`,
`unseen_same_style`, `held_out`; 128 new tokens, CPU float32) this prints:
- the mean top-1 probability along the target's greedy answers;
- the share of answer tokens whose top-1 probability is under 0.5;
- the answers' distinct 4-gram ratio (1 = no repetition);
- both per answer, so that confidence bought by looping answers shows.
With `--draft` (a draft folder or short name, such as demo-dspark) it also gives the draft's
acceptance length per set at T = 0, the share of rounds whose first drafted token is rejected, how
the acceptance correlates with the target's confidence, prompt by prompt (Pearson and Spearman), and
how often the first drafted token is accepted at each level of the target's top-1 probability for
that token: equal rates on every set mean the draft generalises, and only the target's confidence
differs between the sets.
With `--tune-steps N` the target is first instruction-tuned N steps more, to see whether a target
that knows its data better is surer of prompts it never saw; with `--tune-rewordings` those steps
also draw the instructions reworded by the build's templates (the answers unchanged).

    python experiments/demo/target_confidence.py --corpus corpus.json.gz [--draft demo-dspark]
    python experiments/demo/target_confidence.py --corpus corpus.json.gz --tune-steps 400 [--tune-rewordings]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build  # noqa: E402
import corpus as corpus_mod  # noqa: E402
from generalization import prompt_sets  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from dspark.checkpoint import load_draft, load_target  # noqa: E402
from dspark.drafters import BlockDrafter  # noqa: E402
from dspark.engine import Engine, GenerationConfig  # noqa: E402
from dspark.training.loop import TrainArgs, train_target  # noqa: E402
from harness.runs.provenance import provenance  # noqa: E402

TOP1_LEVELS = (0.5, 0.8, 0.95)  # the bounds of the top-1 probability levels (under 0.5, 0.5 to 0.8, ...)


@dataclass
class Answer:
    """A greedy answer with what the probes need of it: per token, how sure the target was; per
    speculative round, what the engine emitted and accepted."""
    tokens: list[int]  # the greedy answer, the prefill token first
    top1: list[float]  # the target's top-1 probability for each answer token
    rounds: list[int]  # tokens emitted per round (none for plain decoding)
    accepted: list[int]  # drafted tokens accepted per round


def level(top1: float, bounds: tuple[float, ...] = TOP1_LEVELS) -> int:
    """The index of the level a top-1 probability falls in: 0 under bounds[0], len(bounds) from bounds[-1]."""
    return sum(top1 >= bound for bound in bounds)


def round_starts(answer: Answer) -> Iterator[tuple[int, int]]:
    """(answer position the round's first draft guesses, drafts accepted) for each round whose first
    draft guesses a token of the answer. Round 1 guesses token 1 (token 0 comes from the prefill);
    each round moves on by the tokens it emitted."""
    position = 1
    for emitted, accepted in zip(answer.rounds, answer.accepted):
        if position >= len(answer.top1):
            return
        yield position, accepted
        position += emitted


@torch.inference_mode()
def answer_confidence(engine: Engine, prompt: list[int], stop: tuple[int, ...]) -> Answer:
    """The target's greedy answer (plain, or speculative with the same tokens), its top-1 probability
    at each answer token, and the engine's rounds (none for plain decoding)."""
    result = engine.generate(prompt, GenerationConfig(max_new_tokens=128, temperature=0.0, stop_token_ids=stop))
    target, ids = engine.target, torch.tensor([prompt + result.tokens])
    hidden, _ = target(ids, None, target.new_cache(ids.shape[1]), ids.shape[1])
    probs = target.logits(hidden[0, len(prompt) - 1 : -1]).softmax(-1).amax(-1).tolist()
    return Answer(result.tokens, probs, result.acceptance_lengths, result.accepted_counts)


def summary(answers: list[Answer]) -> dict:
    top1 = [p for a in answers for p in a.top1]
    return {"mean_top1": round(sum(top1) / len(top1), 3),
            "share_top1_under_half": round(sum(x < 0.5 for x in top1) / len(top1), 3),
            "distinct_4gram": round(sum(build.distinct_4gram_ratio(a.tokens) for a in answers) / len(answers), 3),
            # per answer (mean top-1, distinct 4-gram ratio): where the confidence comes from loops
            "per_answer": [(round(sum(a.top1) / len(a.top1), 3), round(build.distinct_4gram_ratio(a.tokens), 3))
                           for a in answers]}


def first_draft_by_confidence(answers: list[Answer]) -> list[dict]:
    """Per level of the target's top-1 probability for the token a round's first draft guesses
    (the token after the round's anchor): the rounds, and the share whose first draft is accepted."""
    counts = [[0, 0] for _ in range(len(TOP1_LEVELS) + 1)]
    for a in answers:
        for position, accepted in round_starts(a):
            counts[level(a.top1[position])][0] += 1
            counts[level(a.top1[position])][1] += accepted > 0
    return [{"top1_from": low, "rounds": n, "first_draft_accepted": round(ok / n, 3) if n else None}
            for low, (n, ok) in zip((0.0, *TOP1_LEVELS), counts)]


def ranks(v: torch.Tensor) -> torch.Tensor:
    """1-based ranks, ties sharing their average rank (as Spearman's coefficient needs)."""
    below, equal = (v[None, :] < v[:, None]).sum(1), (v[None, :] == v[:, None]).sum(1)
    return below + (equal + 1) / 2


def correlations(x: list[float], y: list[float]) -> dict:
    """Pearson's and Spearman's coefficients (None where a variable is constant)."""
    def pearson(a: torch.Tensor, b: torch.Tensor) -> float | None:
        a, b = a - a.mean(), b - b.mean()
        return round(float((a * b).sum() / (a.norm() * b.norm())), 3) if a.norm() and b.norm() else None

    x, y = torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)
    return {"pearson": pearson(x, y), "spearman": pearson(ranks(x), ranks(y))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, help="a build folder holding target/ (default: the shipped target)")
    ap.add_argument("--corpus", type=Path, required=True, help="corpus.json or corpus.json.gz from corpus.py")
    ap.add_argument("--draft", help="a draft folder or short name: its T = 0 acceptance beside the confidence")
    ap.add_argument("--tune-steps", type=int, default=0, help="instruction-tune the target this many steps more first")
    ap.add_argument("--tune-lr", type=float, default=3e-4)
    ap.add_argument("--tune-rewordings", action="store_true", help="tune on the reworded instructions too")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.tune_steps < 0:
        ap.error(f"--tune-steps {args.tune_steps}: give 0 or more steps")
    if args.draft and args.tune_steps:
        ap.error("--draft with --tune-steps: a draft uses its target's embedding and LM head, which tuning changes; "
                 "measure the tuned target alone")
    pairs = corpus_mod.load_or_refuse(ap, args.corpus)[0]["pairs"]
    loaded = load_target(str(args.models / "target") if args.models else "demo", device="cpu", dtype="float32")
    target, tok = loaded.model, AutoTokenizer.from_pretrained(loaded.path)
    stop = tuple(target.config.eos_token_ids)
    sets = prompt_sets(tok, pairs)
    figures = {"models": str(args.models or "shipped"), "draft": args.draft, "tune_steps": args.tune_steps,
               "tune_rewordings": args.tune_rewordings}
    if args.tune_steps:
        # the full build's instruction-tuning rows and batch (build_target), at a lower learning rate
        asks = [(p["instruction"], p["answer"]) for p in pairs]
        if args.tune_rewordings:
            asks += sorted({(build.rephrase(p["instruction"], k), p["answer"])
                            for p in pairs for k in range(len(build.REPHRASINGS))} - set(asks))
        rows = [build.tuning_example(tok, ask, answer, build.FULL["max_answer"], stop[0]) for ask, answer in asks]
        figures["tune_rows"] = len(rows)
        losses = []
        train_target(target, rows, TrainArgs(steps=args.tune_steps, batch=build.FULL["batch"], lr=args.tune_lr,
                                             seed=args.seed), on_step=lambda step, loss: losses.append(loss.detach().item()))
        figures["tune_loss_last_50"] = round(sum(losses[-50:]) / len(losses[-50:]), 4)
    # greedy speculative decoding gives the plain tokens, so one run yields both answer and acceptance
    engine = Engine(target, BlockDrafter(load_draft(args.draft, target).model) if args.draft else None)
    pooled: list[tuple[float, float]] = []
    for name, prompts in sets.items():
        answers = [answer_confidence(engine, p, stop) for p in prompts]
        figures[name] = summary(answers)
        if args.draft:
            per_prompt = [(sum(a.top1) / len(a.top1), sum(a.rounds) / len(a.rounds)) for a in answers]
            rounds = [n for a in answers for n in a.rounds]
            accepted = [n for a in answers for n in a.accepted]
            figures[name]["draft_T0_acceptance_length"] = round(sum(rounds) / len(rounds), 3)
            figures[name]["share_rounds_first_draft_rejected"] = round(sum(n == 0 for n in accepted) / len(accepted), 3)
            figures[name]["first_draft_by_target_top1"] = first_draft_by_confidence(answers)
            figures[name]["per_prompt"] = correlations(*zip(*per_prompt))
            pooled += per_prompt
    if pooled:
        figures["per_prompt_all_sets"] = correlations(*zip(*pooled))
    figures["provenance"] = provenance("cpu")
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()

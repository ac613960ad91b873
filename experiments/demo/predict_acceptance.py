"""What a DSpark draft like the shipped one would accept behind another target, predicted from that
target's own confidence, before any draft is trained for it (drafts cost 20 GPU minutes, a target 4).

At T = 0 a drafted token is accepted when it is the target's argmax, and `target_confidence.py`
shows the shipped draft guesses a token at least as well on prompts it never saw as on its training
data, level by level of the target's top-1 probability for that token. So the model here is:
1. fit, on the shipped pair's greedy rounds over one prompt set (`--fit-set`, by default the unseen
   instructions of the training style, the validation set), the chance that the drafted token at depth
   d (1 to the draft's drafts per round: 7 for the anchor-first block of 7) is accepted, given its
   predecessors were, per depth and level of the target's top-1 probability for that token;
2. check it: predict the pair's own acceptance length on the other sets from the target's top-1
   probabilities alone, beside the measured figure;
3. ask how good the draft would have to be: the pair's held-out acceptance length predicted if every
   draft were accepted whose token the target gives at least 0.99, 0.95, 0.8 or 0.5 (the other
   rates as fitted);
4. predict, for each `--targets` folder, the held-out acceptance length from that target's greedy
   answers.
The prediction is exact for the model (a recursion over answer positions, not sampling): the expected
rounds to cover each answer, pooled over the prompts as the engine's acceptance length is. It counts
the answer's own tokens; the engine also counts what a last round emits past the 128-token limit
(0.01 to 0.02 more on these sets).

    python experiments/demo/predict_acceptance.py --corpus corpus.json.gz --targets build/t_long build/t_tests
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus as corpus_mod  # noqa: E402
from generalization import held_out_prompts, prompt_sets  # noqa: E402
from target_confidence import TOP1_LEVELS, Answer, answer_confidence, level, round_starts  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from dspark.checkpoint import load_draft, load_target  # noqa: E402
from dspark.drafters import BlockDrafter  # noqa: E402
from dspark.engine import Engine  # noqa: E402
from harness.runs.provenance import provenance  # noqa: E402

LEVELS = (*TOP1_LEVELS, 0.99)  # finer at the top, where most tokens are


def fit_rates(answers: list[Answer], depths: int) -> list[list[float | None]]:
    """rates[d - 1][level]: the share of drafted tokens at depth d accepted when every earlier one of
    their round was (None where no such token was drafted). Every round drafts `depths` tokens (no
    confidence threshold), so a round accepting more is refused: `depths` is not the draft's."""
    tried = [[0] * (len(LEVELS) + 1) for _ in range(depths)]
    taken = [[0] * (len(LEVELS) + 1) for _ in range(depths)]
    for a in answers:
        for position, accepted in round_starts(a):
            if accepted > depths:
                raise ValueError(f"a round accepted {accepted} drafts, more than the {depths} depths fitted")
            for d in range(1, min(depths, accepted + 1) + 1):  # the accepted ones and the first rejected
                if position + d - 1 >= len(a.top1):
                    break
                lv = level(a.top1[position + d - 1], LEVELS)
                tried[d - 1][lv] += 1
                taken[d - 1][lv] += d <= accepted
    return [[ok / n if n else None for ok, n in zip(t, c)] for t, c in zip(taken, tried)]


def expected_rounds(top1: list[float], rates: list[list[float | None]], fallback: list[float]) -> float:
    """The expected number of rounds to produce the answer after its prefill token, when each drafted
    token is accepted with rates[depth - 1][level of its top-1] (fallback[level] where the fit saw none).
    A round at position p with a drafts accepted emits a + 1 tokens, cut at the answer's end."""
    n, depths = len(top1), len(rates)
    rounds = [0.0] * (n + 1)  # rounds[p]: the expected rounds still needed once tokens 0..p-1 are made
    for p in range(n - 1, 0, -1):
        m = min(depths, n - p)  # drafts that have a token of the answer to be compared with
        reach, total = 1.0, 0.0  # reach: the chance that every draft so far was accepted
        for a in range(m):  # a drafts accepted, draft a + 1 (at answer position p + a) rejected
            lv = level(top1[p + a], LEVELS)
            rate = fallback[lv] if rates[a][lv] is None else rates[a][lv]
            total += reach * (1 - rate) * rounds[p + a + 1]
            reach *= rate
        rounds[p] = 1 + total + reach * rounds[min(n, p + m + 1)]
    return rounds[1]


def predicted_acceptance(answers: list[Answer], rates: list[list[float | None]]) -> float:
    """Tokens per round pooled over the prompts: the answers' tokens after the prefill one, over the
    expected rounds. A depth the fit never saw at some level takes the rate of the shallowest depth
    that did (the fitted rates change little with depth), or 0 where none did."""
    fallback = [next((r[lv] for r in rates if r[lv] is not None), 0.0) for lv in range(len(LEVELS) + 1)]
    tokens = sum(len(a.top1) - 1 for a in answers)
    return round(tokens / sum(expected_rounds(a.top1, rates, fallback) for a in answers), 3)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, required=True, help="corpus.json or corpus.json.gz from corpus.py")
    ap.add_argument("--models", type=Path, help="a build folder holding target/ and dspark/ (default: the shipped pair)")
    ap.add_argument("--fit-set", default="unseen_same_style", choices=("seen", "unseen_same_style", "held_out"))
    ap.add_argument("--targets", type=Path, nargs="*", default=[], help="build folders holding target/ to predict")
    args = ap.parse_args(argv)
    needs = [(args.models, "target"), (args.models, "dspark")] if args.models else []
    for folder, part in needs + [(t, "target") for t in args.targets]:
        if not (folder / part / "model.safetensors").is_file():
            ap.error(f"{folder}: no {part}/model.safetensors there; give a build folder made by build.py")
    pairs = corpus_mod.load_or_refuse(ap, args.corpus)[0]["pairs"]

    loaded = load_target(str(args.models / "target") if args.models else "demo", device="cpu", dtype="float32")
    target, stop = loaded.model, tuple(loaded.model.config.eos_token_ids)
    draft = load_draft(str(args.models / "dspark") if args.models else "demo-dspark", target).model
    engine = Engine(target, BlockDrafter(draft))
    sets = prompt_sets(AutoTokenizer.from_pretrained(loaded.path), pairs)
    answers = {name: [answer_confidence(engine, p, stop) for p in prompts] for name, prompts in sets.items()}
    rates = fit_rates(answers[args.fit_set], draft.config.num_drafts)
    figures = {"models": str(args.models or "shipped"), "fit_set": args.fit_set, "levels_from": [0.0, *LEVELS],
               "rates": [[None if r is None else round(r, 3) for r in row] for row in rates], "check": {}}
    for name, got in answers.items():
        rounds = [n for a in got for n in a.rounds]
        figures["check"][name] = {"measured": round(sum(rounds) / len(rounds), 3),
                                  "predicted": predicted_acceptance(got, rates)}
    figures["held_out_if_never_missed_from"] = {
        str(bound): predicted_acceptance(answers["held_out"], [[1.0 if lv > i else r for lv, r in enumerate(row)]
                                                               for row in rates])
        for i, bound in reversed(list(enumerate(LEVELS)))}
    figures["targets"] = {}
    for folder in args.targets:
        other = load_target(str(folder / "target"), device="cpu", dtype="float32")
        held_out = held_out_prompts(AutoTokenizer.from_pretrained(other.path))
        plain = Engine(other.model, None)
        got = [answer_confidence(plain, p, tuple(other.model.config.eos_token_ids)) for p in held_out]
        top1 = [x for a in got for x in a.top1]
        figures["targets"][str(folder)] = {"held_out_mean_top1": round(sum(top1) / len(top1), 3),
                                           "held_out_predicted": predicted_acceptance(got, rates)}
    figures["provenance"] = provenance("cpu")
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How far a demo draft's acceptance carries beyond its training data.

DSpark's acceptance length (block 7, 128 new tokens, CPU float32) on three prompt sets of 18:
- `seen`: instructions the draft was trained on (every 139th corpus pair): its training answers;
- `unseen_same_style`: instructions made the same way from library functions the corpus leaves out
  (`idlelib`, `tkinter`), so neither the target nor the draft saw them;
- `held_out`: the demo suite's coding prompts (the issue's figures), at T = 1 over `--seed-sets`
  sampling seed sets.
A gap between the first two is memorisation; between the last two, the prompts' different style.

    python experiments/demo/generalization.py [--models build/demo] --corpus corpus.json.gz
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus as corpus_mod  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

import build  # noqa: E402
from dspark.checkpoint import load_draft, load_target  # noqa: E402
from dspark.drafters import BlockDrafter  # noqa: E402
from dspark.engine import Engine, GenerationConfig  # noqa: E402
from harness.specs.datasets import load as load_suite  # noqa: E402
from harness.runs.provenance import provenance  # noqa: E402

PROMPTS = 18


def acceptance(engine: Engine, prompts: list[list[int]], temperature: float, stop: tuple[int, ...],
               seed_base: int = 0) -> float:
    cfg = GenerationConfig(max_new_tokens=128, temperature=temperature, stop_token_ids=stop)
    lengths = [n for i, p in enumerate(prompts)
               for n in engine.generate(p, replace(cfg, seed=seed_base + i)).acceptance_lengths]
    return round(sum(lengths) / len(lengths), 3)


def _chat(tok, instructions: list[str]) -> list[list[int]]:
    return [build.chat_example(tok, text, [])[0].tolist() for text in instructions]


def held_out_prompts(tok) -> list[list[int]]:
    """The demo suite's coding prompts (the issue's figures), chat-formatted token ids."""
    return _chat(tok, [r.turns[0] for r in load_suite("qualitative", source="demo").rows if r.category == "coding"])


def prompt_sets(tok, pairs: list[dict]) -> dict[str, list[list[int]]]:
    """The three prompt sets (chat-formatted token ids): `seen` (from the corpus' `pairs`),
    `unseen_same_style`, `held_out`."""
    root = corpus_mod.stdlib_dir()
    left_out = [pair for f in sorted((root / "idlelib").glob("*.py")) + sorted((root / "tkinter").glob("*.py"))
                for pair in corpus_mod.function_pairs(f.read_text(encoding="utf-8"), f.stem)]
    unseen = left_out[:: max(1, len(left_out) // PROMPTS)][:PROMPTS]
    return {"seen": _chat(tok, [p["instruction"] for p in pairs[::139][:PROMPTS]]),
            "unseen_same_style": _chat(tok, [p["instruction"] for p in unseen]),
            "held_out": held_out_prompts(tok)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, help="a build folder holding target/ and dspark/ (default: the shipped pair)")
    ap.add_argument("--corpus", type=Path, required=True, help="corpus.json or corpus.json.gz from corpus.py")
    ap.add_argument("--seed-sets", type=int, default=4, help="sampling seed sets for the held-out prompts at T = 1")
    args = ap.parse_args()
    pairs = corpus_mod.load_or_refuse(ap, args.corpus)[0]["pairs"]
    target = load_target(str(args.models / "target") if args.models else "demo", device="cpu", dtype="float32")
    draft = load_draft(str(args.models / "dspark") if args.models else "demo-dspark", target.model).model
    tok, stop = AutoTokenizer.from_pretrained(target.path), tuple(target.model.config.eos_token_ids)
    engine = Engine(target.model, BlockDrafter(draft))

    sets = prompt_sets(tok, pairs)
    figures = {"models": str(args.models or "shipped")}
    for name, prompts in sets.items():
        figures[f"{name}_T0"] = acceptance(engine, prompts, 0.0, stop)
        figures[f"{name}_T1"] = acceptance(engine, prompts, 1.0, stop)
    figures["held_out_T1_seed_sets"] = [acceptance(engine, sets["held_out"], 1.0, stop, 1000 * k)
                                        for k in range(args.seed_sets)]
    figures["provenance"] = provenance("cpu")
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()

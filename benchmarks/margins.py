"""What recording the draft's greedy top-2 margins (for `parity`) costs the native engine: the demo
pair at T = 0, the same prompts with margins off and on, interleaved, on the CPU or a GPU (graphs).
Tokens and rounds must be equal; prints ms per round of each and the difference.

    python benchmarks/margins.py [--device cuda] [--prompts 8] [--tokens 128] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from dspark.checkpoint import load_draft, load_target
from dspark.drafters import BlockDrafter
from dspark.engine import Engine, GenerationConfig
from dspark.tokenizer import chat_prompt_ids, conversation
from harness.specs.datasets import load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    target = load_target("demo", args.device)
    draft = load_draft("demo-dspark", target.model)
    tok = AutoTokenizer.from_pretrained(target.path)
    rows = [r for r in load("qualitative", source="demo").rows if r.category == "coding"][: args.prompts]
    prompts = [chat_prompt_ids(tok, conversation([r.turns[0]])) for r in rows]
    cfg = GenerationConfig(max_new_tokens=args.tokens, temperature=0.0, stop_token_ids=target.stop_token_ids)
    engines = {on: Engine(target.model, BlockDrafter(draft.model, margins=on)) for on in (False, True)}
    per_round = {False: [], True: []}
    outputs = {False: [], True: []}
    for on in (False, True):  # warm-up: caches, graphs
        engines[on].generate(prompts[0], cfg)
    for _ in range(args.repeats):
        for p in prompts:
            for on in (False, True):
                r = engines[on].generate(p, cfg)
                per_round[on].append(1e3 * r.decode_s / r.num_rounds)
                outputs[on].append((r.tokens, r.accepted_counts))
    off, on = statistics.median(per_round[False]), statistics.median(per_round[True])
    print(json.dumps({"device": str(target.model.lm_head.weight.device), "prompts": len(prompts),
                      "repeats": args.repeats, "same_tokens_and_rounds": outputs[False] == outputs[True],
                      "round_ms_margins_off": round(off, 4), "round_ms_margins_on": round(on, 4),
                      "overhead_pct": round(100 * (on / off - 1), 2), "torch": torch.__version__}))


if __name__ == "__main__":
    main()

"""What recording per-round draft data costs the native engine: the greedy top-2 margins (for `parity`)
or each slot's confidence (`--what confidences`, for `calibrate`). The demo pair at T = 0, the same
prompts with recording off and on, interleaved, on the CPU or a GPU (graphs). Tokens and rounds must
be equal; prints ms per round of each and the difference.

    python benchmarks/margins.py [--what margins|confidences] [--device cuda] [--prompts 8] [--tokens 128] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace

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
    ap.add_argument("--what", choices=("margins", "confidences"), default="margins")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    target = load_target("demo", args.device)
    draft = load_draft("demo-dspark", target.model)
    tok = AutoTokenizer.from_pretrained(target.path)
    rows = [r for r in load("qualitative", source="demo").rows if r.category == "coding"][: args.prompts]
    prompts = [chat_prompt_ids(tok, conversation([r.turns[0]])) for r in rows]
    base = GenerationConfig(max_new_tokens=args.tokens, temperature=0.0, stop_token_ids=target.stop_token_ids)
    margins = args.what == "margins"
    engines = {on: Engine(target.model, BlockDrafter(draft.model, margins=on and margins)) for on in (False, True)}
    cfgs = {on: replace(base, record_confidences=on or margins) for on in (False, True)}
    per_round = {False: [], True: []}
    outputs = {False: [], True: []}
    for on in (False, True):  # warm-up: caches, graphs
        engines[on].generate(prompts[0], cfgs[on])
    for _ in range(args.repeats):
        for p in prompts:
            for on in (False, True):
                r = engines[on].generate(p, cfgs[on])
                per_round[on].append(1e3 * r.decode_s / r.num_rounds)
                outputs[on].append((r.tokens, r.accepted_counts))
    off, on = statistics.median(per_round[False]), statistics.median(per_round[True])
    print(json.dumps({"device": str(target.model.lm_head.weight.device), "prompts": len(prompts),
                      "repeats": args.repeats, "same_tokens_and_rounds": outputs[False] == outputs[True],
                      "recorded": args.what, f"round_ms_{args.what}_off": round(off, 4),
                      f"round_ms_{args.what}_on": round(on, 4),
                      "overhead_pct": round(100 * (on / off - 1), 2), "torch": torch.__version__}))


if __name__ == "__main__":
    main()

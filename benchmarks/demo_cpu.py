"""Wall time of the demo target + DSpark on the CPU: load both, then 8 held-out coding prompts x 128
new tokens through the chat template (the demo pair's target: under 60 s on 2 cores, loading included).

    python benchmarks/demo_cpu.py [--threads 1] [--draft demo-dspark] [--prompts 8] [--tokens 128]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from dspark.checkpoint import load_draft, load_target
from dspark.drafters import BlockDrafter
from dspark.engine import Engine, GenerationConfig
from dspark.tokenizer import chat_prompt_ids, conversation
from harness.specs.datasets import load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--draft", default="demo-dspark")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    from transformers import AutoTokenizer

    target = load_target("demo")
    draft = load_draft(args.draft, target.model)
    tok = AutoTokenizer.from_pretrained(target.path)
    loaded = time.perf_counter() - t0
    rows = [r for r in load("qualitative", source="demo").rows if r.category == "coding"][: args.prompts]
    engine = Engine(target.model, BlockDrafter(draft.model))
    cfg = GenerationConfig(max_new_tokens=args.tokens, temperature=0.0, stop_token_ids=target.stop_token_ids)
    tokens, rounds = 0, []
    for r in rows:
        ids = chat_prompt_ids(tok, conversation([r.turns[0]]))
        out = engine.generate(ids, cfg)
        tokens += len(out.tokens)
        rounds += out.acceptance_lengths
    total = time.perf_counter() - t0
    print(json.dumps({"threads": args.threads, "draft": args.draft, "prompts": len(rows), "max_new_tokens": args.tokens,
                      "output_tokens": tokens, "load_s": round(loaded, 2), "total_s": round(total, 2),
                      "acceptance_length": round(sum(rounds) / len(rounds), 3), "torch": torch.__version__}))


if __name__ == "__main__":
    main()

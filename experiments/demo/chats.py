"""The demo's ready training file for `dspark-bench train-draft --target demo --data demo`: chat rows
(`{"messages": [user, assistant]}`) taken from the demo target's own greedy answers to its training
instructions (the self-distillation shipped beside this script, `distilled.pt.xz`), so that a draft
trained on it learns what the target says. A small sample, to train in seconds on a CPU; the demo
drafts themselves were trained on all 67,778 rows (`build.py`).

    python experiments/demo/chats.py                 # writes dspark/data/demo/chats.jsonl
    python experiments/demo/chats.py --rows 64 --max-answer 96 --out FILE
"""

from __future__ import annotations

import argparse
import io
import json
import lzma
import os
import random
from pathlib import Path

import torch
from transformers import AutoTokenizer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DEFAULT_OUT = ROOT / "dspark" / "data" / "demo" / "chats.jsonl"
USER, ASSISTANT, END = "<|im_start|>user\n", "<|im_start|>assistant\n<think>\n\n</think>\n\n", "<|im_end|>"


def chat_rows(distilled: Path, tokenizer, rows: int, max_answer: int, seed: int) -> list[dict]:
    """`rows` single-turn chats, each the first (greedy) answer recorded for a distinct instruction, of at
    most `max_answer` tokens and finished (it ends the turn), drawn with `seed` from all such."""
    payload = torch.load(io.BytesIO(lzma.decompress(distilled.read_bytes())), weights_only=True)["rows"]
    lengths = payload["lengths"].tolist()
    found, seen = [], set()
    for ids, mask in zip(payload["ids"].long().split(lengths), payload["mask"].split(lengths)):
        prompt, answer = tokenizer.decode(ids[~mask]), tokenizer.decode(ids[mask])
        if not (prompt.startswith(USER) and prompt.endswith(ASSISTANT) and answer.endswith(END)):
            continue  # (a continuation of source text, or an answer cut at the length limit)
        question = prompt.removeprefix(USER).removesuffix(ASSISTANT).removesuffix("\n").removesuffix(END)
        if question in seen or int(mask.sum()) > max_answer:
            seen.add(question)
            continue
        seen.add(question)
        found.append({"messages": [{"role": "user", "content": question},
                                   {"role": "assistant", "content": answer.removesuffix(END)}]})
    return random.Random(seed).sample(found, min(rows, len(found)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--max-answer", type=int, default=96, help="most answer tokens (its end-of-turn included)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(ROOT / "dspark" / "data" / "demo" / "target")
    rows = chat_rows(HERE / "distilled.pt.xz", tokenizer, args.rows, args.max_answer, args.seed)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    os.replace(tmp, args.out)
    print(f"wrote {args.out}: {len(rows)} chats")


if __name__ == "__main__":
    main()

"""Prompts shaped like SPEED-Bench's for a random-weight target that has no tokenizer here.

A `random:qwen3-8b` target takes Qwen3's tokenizer from the local hub cache when it is there, else from
`dspark-bench fetch-tokenizer qwen3`'s verified copy (`dspark.qwen3_tokenizer`); on a machine with neither,
the prompt's *content* cannot matter (random weights read no meaning) but its
*length* does (the prefill, and attention's cost per step). So each prompt becomes as many token ids as
the real prompt would have: a `throughput_<N>k` row is cut or padded to N x 1000 tokens (the split's
own rule, in o200k tokens, close to Qwen3's for English text); any other turn counts one token per
`BYTES_PER_TOKEN` UTF-8 bytes (Qwen3's tokenizer averages about 4 bytes a token on English prose and
code); Qwen3's chat template, thinking off, adds its fixed tokens around each message. The ids are
drawn from a generator seeded by the text, below the target's special tokens, so a prompt is the same
ids in every run and engine. Every run made this way records it (`record`).
"""

from __future__ import annotations

import hashlib
import math
import random
from pathlib import Path

from dspark.errors import DSparkError

BYTES_PER_TOKEN = 4.0
MESSAGE_WRAP = 5  # <|im_start|> role \n ... <|im_end|> \n
GENERATION_PROMPT = 7  # <|im_start|> assistant \n <think> \n\n </think> \n\n
QWEN3_SPECIALS_FROM = 151643  # Qwen3's first special token id: the ids drawn stay below it


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")
FETCH = "dspark-bench fetch-tokenizer qwen3"
_hinted: set[str] = set()  # the targets this process has given the fetch hint for (a line once, not per run)


def fetch_hint(target: str, tokenizer) -> str | None:
    """The console's one line where a `random:qwen3-*` preset fell back to shaped prompts (the hub's Qwen3
    tokenizer not cached, no fetched copy): the shapes are lengths only, and one command gives the real
    tokenizer, whose counts and chat template the 1k/8k buckets and the real-shape experiment are meant to
    use. None elsewhere, and for a target already told in this process (a profile opens several runs)."""
    from dspark.qwen3_tokenizer import HUB_IDS
    from dspark.synthetic.presets import TOKENIZERS

    preset = target.removeprefix("random:") if target.startswith("random:") else None
    if not isinstance(tokenizer, ShapedTokenizer) or TOKENIZERS.get(preset) not in HUB_IDS or target in _hinted:
        return None
    _hinted.add(target)
    return (f"notice: {target}: no Qwen3 tokenizer here (the hub's is not cached, none fetched), so its prompts are "
            f"shaped to lengths, not Qwen3's tokens and chat template; `{FETCH}` gives the real tokenizer")


def run_tokenizer(path: Path, target: str, split: str):
    """The target's own tokenizer, which must have a chat template; a random-weight target without any
    tokenizer gets a `ShapedTokenizer` for the run's split."""
    from dspark.checkpoint import random_weights, read_config  # (torch: loaded by the run already)

    if not any((path / f).is_file() for f in TOKENIZER_FILES) and random_weights(path):
        return ShapedTokenizer(split, int(read_config(path)["vocab_size"]))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if not getattr(tokenizer, "chat_template", None):
        raise DSparkError(f"{target}: the tokenizer has no chat template; SPEED-Bench prompts need one")
    return tokenizer


class ShapedTokenizer:
    """What the run needs of a tokenizer (`chat_prompt_ids`, `decode`), giving lengths instead of meaning."""

    chat_template = "shaped: Qwen3's chat template lengths, thinking off"

    def __init__(self, split: str, vocab_size: int):
        self.split = split
        self.vocab = min(vocab_size, QWEN3_SPECIALS_FROM)
        self.fixed = int(split.removeprefix("throughput_").removesuffix("k")) * 1000 if split.startswith(
            "throughput_") else None

    def turn_tokens(self, text: str, role: str) -> int:
        """A message's own tokens: the split's fixed input length for a user turn of a throughput split."""
        if role == "user" and self.fixed is not None:
            return self.fixed
        return max(1, math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN))

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **_) -> list[int]:
        ids: list[int] = []
        for m in messages:
            rng = random.Random(hashlib.sha256(m["content"].encode("utf-8")).digest())
            ids += [rng.randrange(self.vocab) for _ in range(MESSAGE_WRAP + self.turn_tokens(m["content"], m["role"]))]
        if add_generation_prompt:
            ids += [0] * GENERATION_PROMPT
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """No text (random weights write none worth reading; the record keeps the ids), but a stand-in as long
        as the reply: a later turn's history then counts it at its own length (`turn_tokens`)."""
        return " ".join(["tok"] * len(ids))

    def record(self) -> dict:
        return {"shaped": {"split": self.split, "bytes_per_token": BYTES_PER_TOKEN,
                           "throughput_input_tokens": self.fixed, "message_wrap": MESSAGE_WRAP,
                           "generation_prompt": GENERATION_PROMPT,
                           "why": "random-weight target with no tokenizer here: prompt lengths as the split's, "
                                  "ids drawn from the text's hash"}}

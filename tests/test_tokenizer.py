"""Our byte-level BPE tokenizers: byte ids in order, learned merges, specials, chat template, free mask row."""

from __future__ import annotations

import pytest

from dspark.tokenizer import SPECIALS, build_tokenizer, save_tokenizer

transformers = pytest.importorskip("transformers")

CODE = [
    "def add(a, b):\n    return a + b\n",
    "def scale(values, factor=2):\n    return [v * factor for v in values]\n",
    "class Box:\n    def size(self):\n        return len(self.items)\n",
] * 50


def test_byte_tokenizer_maps_bytes_in_order():
    tok = build_tokenizer()
    assert tok.get_vocab_size() == 256 + len(SPECIALS)
    assert tok.encode("A").ids == [65] and tok.encode("é").ids == list("é".encode())
    assert [tok.token_to_id(s) for s in SPECIALS] == list(range(256, 256 + len(SPECIALS)))


def test_trained_tokenizer_round_trips_and_renders_the_chat_template(tmp_path):
    tok = build_tokenizer(CODE, vocab_size=320)
    assert tok.get_vocab_size() <= 320 and tok.get_vocab_size() > 256 + len(SPECIALS)  # merges were learned
    text = "def add(a, b):\n    return a + b  # ünïcode ✓\n"
    assert tok.decode(tok.encode(text).ids) == text
    assert len(tok.encode(CODE[0]).ids) < len(CODE[0].encode())  # merges compress code
    save_tokenizer(tok, tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    ids = hf.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                 enable_thinking=False, tokenize=True, return_dict=False)
    rendered = hf.decode(ids)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert hf.convert_tokens_to_ids("<|im_end|>") == hf.eos_token_id
    assert max(hf.get_vocab().values()) == tok.get_vocab_size() - 1  # the next id is free for the mask

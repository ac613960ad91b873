"""Qwen-style tokenizers for our own small models: byte-level BPE, special tokens, chat template.

The vocabulary is bytes (+ learned merges) + the special tokens; the first id after them is free,
and our drafts use it as the mask token (as Qwen3's drafts use the first unused padded row).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


def _bytes_to_unicode() -> list[int]:
    """GPT-2's printable stand-in for every byte, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = [], 0
    for b in range(256):
        if b in keep:
            out.append(b)
        else:
            out.append(256 + extra)
            extra += 1
    return out


def build_tokenizer(texts: Iterable[str] | None = None, vocab_size: int = 256 + len(SPECIALS)):
    """Byte-level BPE: the 256 bytes in byte order (ids 0..255), merges learned from `texts` until the
    vocabulary holds `vocab_size` entries with the specials, then the specials. No texts: no merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    byte_chars = [chr(c) for c in _bytes_to_unicode()]
    if texts is None:
        tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(byte_chars)}, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(SPECIALS), initial_alphabet=byte_chars,
                                      show_progress=False, min_frequency=2)
        tok.train_from_iterator(texts, trainer)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    return tok


def save_tokenizer(tok, out: Path, model_max_length: int = 4096) -> None:
    """Save as a Hugging Face fast tokenizer folder (AutoTokenizer loads it) with the chat template."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   model_max_length=model_max_length)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def chat_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The ids of `messages` through the tokenizer's chat template, ready for the assistant's reply,
    thinking off (Qwen3's switch; templates without it ignore it). Every prompt we generate from goes
    through here, so runs, training data and the demo build see one template call."""
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=False,
                                              tokenize=True, return_dict=False))


def conversation(turns: list[str], replies: list[str] = ()) -> list[dict]:
    """User turns interleaved with the assistant's replies so far (one fewer than the turns, or none)."""
    messages = []
    for i, text in enumerate(turns):
        messages.append({"role": "user", "content": text})
        if i < len(replies):
            messages.append({"role": "assistant", "content": replies[i]})
    return messages

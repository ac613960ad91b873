"""Self-distillation data: the target's own answers to many prompts, generated in batches.

Drafts learn the target's behaviour from its own outputs (as DeepSpec trains). The engine serves one
request at a time; data generation instead decodes a batch of prompts together: the prompts are
left-aligned and prefilled as one right-padded causal forward, then every row decodes at its own
position, writing its cache slot before reading, so a row never sees another's padding.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dspark.models.target import Qwen3Target
from dspark.sampling import probs, sample
from dspark.training.loop import pad_batch


@torch.inference_mode()
def generate_batch(target: Qwen3Target, prompts: list[list[int]], max_new_tokens: int, temperature: float = 0.0,
                   stop_token_ids: tuple[int, ...] = (), generator: torch.Generator | None = None) -> list[list[int]]:
    """New tokens for each prompt (each list ends at its first stop token, which it keeps)."""
    device = target.lm_head.weight.device
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    ids, _ = pad_batch([(torch.tensor(p), torch.ones(len(p), dtype=torch.bool)) for p in prompts], device)
    nb, s = ids.shape
    cache = target.new_cache(s + max_new_tokens, batch=nb)
    hidden, _ = target(ids, None, cache, s)  # a prefill from position 0
    rows = torch.arange(nb, device=device)
    logits = target.logits(hidden[rows, lengths - 1])
    out = torch.empty(nb, max_new_tokens, dtype=torch.long, device=device)
    done = torch.zeros(nb, dtype=torch.bool, device=device)
    stops = torch.tensor(stop_token_ids or (-1,), device=device)
    positions = lengths.clone()
    for i in range(max_new_tokens):
        token = sample(probs(logits, temperature), generator)
        out[:, i] = token
        done |= torch.isin(token, stops)
        if i + 1 == max_new_tokens or (i % 16 == 15 and bool(done.all())):
            break
        hidden, _ = target(token[:, None], positions[:, None], cache, int(positions.max()) + 1)
        logits = target.logits(hidden[:, 0])
        positions += 1
    return [_until_stop(row, stop_token_ids) for row in out[:, : i + 1].tolist()]


def _until_stop(tokens: list[int], stop: tuple[int, ...]) -> list[int]:
    for i, tok in enumerate(tokens):
        if tok in stop:
            return tokens[: i + 1]
    return tokens


def answers(target: Qwen3Target, prompts: list[list[int]], max_new_tokens: int, temperature: float,
            stop_token_ids: tuple[int, ...], seed: int, batch_size: int = 256) -> list[list[int]]:
    """`generate_batch` over prompts in batches (sorted by length, so little padding), in prompt order."""
    device = target.lm_head.weight.device
    generator = torch.Generator(device=device).manual_seed(seed)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[list[int]] = [[] for _ in prompts]
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        for i, tokens in zip(chunk, generate_batch(target, [prompts[i] for i in chunk], max_new_tokens, temperature,
                                                   stop_token_ids, generator)):
            out[i] = tokens
    return out


def examples(prompts: list[list[int]], outputs: list[list[int]]) -> list[tuple[Tensor, Tensor]]:
    """(ids, loss mask) training rows: the loss covers the answer."""
    return [(torch.tensor(p + o), torch.tensor([False] * len(p) + [True] * len(o))) for p, o in zip(prompts, outputs)]

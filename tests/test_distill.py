"""Batched self-distillation generation decodes each prompt as the engine does alone."""

from __future__ import annotations

import torch
from pairs import random_pair

from dspark.engine import Engine, GenerationConfig
from dspark.training.distill import answers, generate_batch


def test_batched_greedy_answers_equal_the_engine_one_prompt_at_a_time():
    target, _ = random_pair(dtype=torch.float64, std=0.3)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 63, (n,), generator=g).tolist() for n in (3, 11, 7, 20)]
    stop = (int(torch.tensor(prompts[1][-1])),)
    got = generate_batch(target, prompts, 12, 0.0, stop)
    engine = Engine(target)
    for prompt, tokens in zip(prompts, got):
        want = engine.generate(prompt, GenerationConfig(max_new_tokens=12, stop_token_ids=stop)).tokens
        assert tokens == want
    assert answers(target, prompts, 12, 0.0, stop, seed=0, batch_size=3) == got  # batching and order do not matter


def test_sampled_answers_are_seeded_and_vary():
    target, _ = random_pair(dtype=torch.float32, std=0.3)
    prompts = [[1, 2, 3], [4, 5, 6, 7]] * 4
    a = answers(target, prompts, 10, 1.0, (), seed=1)
    assert a == answers(target, prompts, 10, 1.0, (), seed=1)
    assert len({tuple(x) for x in a}) > 2  # different samples for repeated prompts

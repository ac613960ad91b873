"""The same engine on a GPU: greedy equality with plain decoding and an unbiased acceptance rule there."""

from __future__ import annotations

import pytest
import torch
from pairs import bigram_pair, random_pair
from test_lossless import _rule_distribution, chi_square_p

from dspark.drafters import BlockDrafter, NgramDrafter
from dspark.engine import Engine, GenerationConfig
from dspark.sampling import rejection_sample

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("make", [bigram_pair, random_pair])
def test_greedy_speculative_equals_plain_on_gpu(make):
    target, draft = make(dtype=torch.float32)
    target, draft = target.cuda(), draft.cuda()
    prompt = torch.randint(0, 63, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    cfg = GenerationConfig(max_new_tokens=80, temperature=0.0)
    plain = Engine(target).generate(prompt, cfg)
    for drafter in (BlockDrafter(draft), NgramDrafter()):
        spec = Engine(target, drafter).generate(prompt, cfg)
        assert spec.tokens == plain.tokens


def test_sampled_run_on_gpu_is_reproducible():
    target, draft = bigram_pair(dtype=torch.bfloat16)
    target, draft = target.cuda(), draft.cuda()
    cfg = GenerationConfig(max_new_tokens=64, temperature=1.0, seed=3)
    a = Engine(target, BlockDrafter(draft)).generate(list(range(20)), cfg)
    b = Engine(target, BlockDrafter(draft)).generate(list(range(20)), cfg)
    assert a.tokens == b.tokens and a.acceptance_length > 1.5


def test_acceptance_rule_on_gpu():
    counts, p0, _ = _rule_distribution(rejection_sample, device="cuda")
    assert chi_square_p(counts.cpu(), p0.cpu()) > 1e-3

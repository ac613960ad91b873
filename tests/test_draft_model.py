"""The classic draft model (`draft_model`, as vLLM names it) in our engine: a smaller Qwen3 of the target's
tokenizer decodes k tokens autoregressively with its own KV cache and the target verifies them.

Greedy output equals plain decoding's (the demo target drafting for itself accepts every draft: AL = k + 1;
a random Qwen3 and a perturbed copy of the target accept less, and every round's catch-up is exercised);
at T > 0 the joint of the next tokens is the target's (chi-square, as `test_lossless` holds the other
drafters); the system's checks refuse a draft of another vocabulary before any model loads.
"""

from __future__ import annotations

import pytest
import torch
from test_lossless import PASS_P, PROMPT, VOCAB, chi_square_p, exact_joint, sampled_joint

from dspark.checkpoint import DEMO_DIR, load_target
from dspark.drafters.draft_model import DraftModelDrafter
from dspark.engine import Engine, GenerationConfig
from dspark.synthetic.tiny import random_target, tiny_target_config

DEMO = (DEMO_DIR / "target" / "model.safetensors").is_file()
needs_demo = pytest.mark.skipif(not DEMO, reason="the demo models are not built (experiments/demo/build.py)")
K = 3
DEMO_PROMPTS = [list(range(300, 340)), [5, 900, 17, 1200, 44, 1999, 3, 250], [1000]]


@pytest.fixture(scope="module")
def demo_target():
    if not DEMO:
        pytest.skip("the demo models are not built (experiments/demo/build.py)")
    return load_target("demo", dtype="float32").model


def _perturbed(model, scale: float, seed: int):
    """A copy of `model` whose every matrix has noise of `scale` times its own spread added: a draft that
    agrees with it often, not always."""
    copy = random_target(model.config, seed, dtype=model.lm_head.weight.dtype)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for (_, mine), (_, theirs) in zip(copy.named_parameters(), model.named_parameters()):
            noise = torch.randn(theirs.shape, generator=g, dtype=theirs.dtype) * theirs.std() * scale
            mine.copy_(theirs + noise if theirs.dim() > 1 else theirs)
    return copy.fuse()


def _greedy(target, drafter, prompt, n: int = 48):
    return Engine(target, drafter).generate(prompt, GenerationConfig(max_new_tokens=n))


@needs_demo
def test_the_demo_target_drafting_for_itself_accepts_every_draft(demo_target):
    draft = load_target("demo", dtype="float32").model  # its own copy: its own cache, the same numbers
    for prompt in DEMO_PROMPTS:
        plain = _greedy(demo_target, None, prompt)
        ran = _greedy(demo_target, DraftModelDrafter(draft, K), prompt)
        assert ran.tokens == plain.tokens
        assert set(ran.acceptance_lengths[:-1]) == {K + 1} and ran.proposal_lengths[0] == K


@needs_demo
@pytest.mark.parametrize("kind", ["random", "perturbed"])
def test_greedy_output_equals_plain_decoding_with_another_draft(demo_target, kind):
    """A small random Qwen3 of the demo's vocabulary (accepts little) and a perturbed copy of the demo target
    (accepts some rounds whole, rejects in others: the next round's catch-up row is then an accepted draft,
    the old anchor or, after a whole block, the draft the chain never fed)."""
    if kind == "random":
        cfg = tiny_target_config(vocab_size=demo_target.config.backbone.vocab_size, hidden=64, layers=2)
        draft = random_target(cfg, seed=3)
    else:
        draft = _perturbed(demo_target, 0.4, seed=7)
    lengths = []
    for prompt in DEMO_PROMPTS:
        plain = _greedy(demo_target, None, prompt)
        ran = _greedy(demo_target, DraftModelDrafter(draft, K), prompt)
        assert ran.tokens == plain.tokens
        lengths += ran.acceptance_lengths
    if kind == "perturbed":
        assert {1, K + 1} <= set(lengths) and len(set(lengths)) >= 3, lengths
    else:
        assert sum(lengths) / len(lengths) < 2.0


def _tiny_pair(kind: str):
    cfg = tiny_target_config(vocab_size=VOCAB, hidden=32, layers=3, heads=4, kv_heads=2, head_dim=8,
                             intermediate=64, eos=())
    target = random_target(cfg, 0, std=0.3, dtype=torch.float64)
    if kind == "far":  # independent and peaky: most drafts rejected
        return target, random_target(tiny_target_config(vocab_size=VOCAB, hidden=16, layers=2, heads=2, kv_heads=1,
                                                        head_dim=8, intermediate=32, eos=()), 5, std=1.0,
                                     dtype=torch.float64)
    return target, _perturbed(target, 0.2, seed=11)  # close: most drafts accepted


@pytest.mark.parametrize("kind", ["near", "far"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_engine_with_a_draft_model_samples_the_target_distribution(kind, temperature):
    target, draft = _tiny_pair(kind)
    engine = Engine(target, DraftModelDrafter(draft, 2))
    counts, lengths, proposed = sampled_joint(engine, temperature, 0.0, 600)
    assert chi_square_p(counts, exact_joint(target, PROMPT, temperature)) > PASS_P
    assert set(proposed) == {2}
    mean = sum(lengths) / len(lengths)
    assert (mean > 2.0) if kind == "near" else (mean < 1.9), mean

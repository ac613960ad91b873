"""The same engine on a GPU: greedy equality with plain decoding and an unbiased acceptance rule there."""

from __future__ import annotations

import pytest
import torch
from pairs import bigram_pair, eagle3_close_pair, eagle3_pair, random_pair
from test_lossless import _rule_distribution, chi_square_p

from dspark.drafters import BlockDrafter, NgramDrafter, drafter_for
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
    for drafter in (BlockDrafter(draft), BlockDrafter(draft, markov_topk=8), NgramDrafter()):
        spec = Engine(target, drafter).generate(prompt, cfg)  # (graphs: the top-k head captured too)
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


# ---- CUDA graphs: an acceleration of the same steps, checked equal to the eager reference ------------

def _cuda_cases():
    def fill_in():
        return random_pair(markov_rank=0, confidence=False, sample_from_anchor=False, block_size=8,
                           dtype=torch.bfloat16)

    return {
        "dspark": lambda: bigram_pair(dtype=torch.bfloat16),
        "dspark-random": lambda: random_pair(dtype=torch.bfloat16),
        "dflash-fill-in": fill_in,
        "eagle3": lambda: eagle3_close_pair(dtype=torch.bfloat16),
        "eagle3-qwen3-reduced": lambda: eagle3_pair(vocab=64, qk_norm=True, draft_vocab=48, dtype=torch.bfloat16),
    }


SCHEDULE = {"confidence_schedule": (1.0, 1.3, 1.6, 1.9, 2.2, 2.5)}  # the pairs' 5 slots: cuts some rounds


@pytest.mark.parametrize("case,policy", [(c, {}) for c in ("dspark", "dspark-random", "dflash-fill-in", "eagle3",
                                                            "eagle3-qwen3-reduced", "ngram", "plain")]
                         + [("dspark", {"confidence_threshold": 0.5}), ("dspark-random", {"confidence_threshold": 0.5}),
                            ("dspark-random", SCHEDULE), ("dspark", {"synthetic_rates": (0.9, 0.8, 0.7, 0.5, 0.3)})])
def test_graph_path_equals_eager_path(case, policy):
    target, draft = _cuda_cases().get(case, lambda: bigram_pair(dtype=torch.bfloat16))()
    target, draft = target.cuda(), draft.cuda()
    vocab = target.config.backbone.vocab_size  # 64, or 16 for the EAGLE-3 pair
    prompt = (torch.randint(0, vocab - 1, (12,), generator=torch.Generator().manual_seed(0)).tolist() * 3)[:40]
    cfg = GenerationConfig(max_new_tokens=96, temperature=0.0, **policy)
    runs = []
    for graphs in (False, True):
        drafter = NgramDrafter() if case == "ngram" else None if case == "plain" else drafter_for(draft, margins=True)
        engine = Engine(target, drafter, use_graphs=graphs)
        assert bool(engine.runner.graphs) is False
        runs.append(engine.generate(prompt, cfg))
        assert bool(engine.runner.graphs) is graphs  # the graph path really replayed graphs
    eager, graphed = runs
    assert graphed.tokens == eager.tokens
    assert graphed.acceptance_lengths == eager.acceptance_lengths
    assert graphed.proposal_lengths == eager.proposal_lengths
    assert graphed.draft_margins == eager.draft_margins  # (recorded inside the draft's graph)
    assert graphed.draft_confidences == eager.draft_confidences
    if "confidence_schedule" in policy:  # the scheduler really cut: verify ran over fewer rows, from their graphs
        assert len(set(eager.proposal_lengths)) > 1


def test_a_schedule_replayed_under_an_equal_new_config_reads_its_own_tables():
    """The scheduler's cost table lives on the device and its graph reads it where it was captured: a request
    under an equal config given as a new object (as every run's requests are) replays that graph, so the
    table must still be there, not freed and overwritten."""
    target, draft = random_pair(dtype=torch.bfloat16)
    target, draft = target.cuda(), draft.cuda()
    prompt = (torch.randint(0, 63, (12,), generator=torch.Generator().manual_seed(1)).tolist() * 3)[:40]
    graphed, eager = (Engine(target, drafter_for(draft), use_graphs=g) for g in (True, False))
    graphed.generate(prompt, GenerationConfig(max_new_tokens=64, **SCHEDULE))
    junk = [torch.full((64,), -1.0, device="cuda") for _ in range(512)]  # (the freed blocks reused)
    got = graphed.generate(prompt, GenerationConfig(max_new_tokens=64, **SCHEDULE))
    want = eager.generate(prompt, GenerationConfig(max_new_tokens=64, **SCHEDULE))
    assert got.proposal_lengths == want.proposal_lengths and got.tokens == want.tokens and len(junk) == 512


def test_graph_path_is_lossless():
    """The core's distribution test, rerun with every step replayed from a CUDA graph (DSpark close and
    far, DSpark close with the top-k Markov head, EAGLE-3)."""
    from test_lossless import N_SAMPLES, PROMPT, _pair, chi_square_p, exact_joint, sampled_joint

    pairs = [(*_pair("close"), 0), (*_pair("far"), 0), (*_pair("close"), 2),
             (*eagle3_pair(vocab=4, std=1.0, num_tokens=2), 0)]
    for target, draft, topk in pairs:  # float64 on the CPU: the exact distribution comes from these
        expected = exact_joint(target, PROMPT, 1.0)
        engine = Engine(target.float().cuda(), drafter_for(draft.float().cuda(), markov_topk=topk), use_graphs=True)
        counts, lengths, _ = sampled_joint(engine, 1.0, 0.0, N_SAMPLES)
        assert engine.runner.graphs
        assert chi_square_p(counts, expected) > 1e-3


def test_engine_bench_runs_on_a_tiny_pair(tiny_dir):
    from harness.engine_bench.native import BenchArgs, run_engine_bench

    out = run_engine_bench(BenchArgs(target=str(tiny_dir / "target"), draft=str(tiny_dir / "dspark"), context_len=64,
                                     repeats=5, copy_gib=0.25, hf_new_tokens=4, dtype="float32",
                                     sweep_context=(32, 128)))
    for key in ("copy_tbps", "step_bytes", "limit_tok_s", "decode_ms", "decode_tok_s", "decode_fraction_of_limit",
                "verify8_ms", "verify16_ms", "verify8_over_decode", "draft_ms", "draft_over_decode", "round_ms",
                "round_over_decode", "hf_generate_tok_s", "graphs_off_decode_ms", "nvtx_overhead_pct",
                "draft_step_bytes", "draft_floor_ms", "draft_fraction_of_floor"):
        assert out[key] is not None and out[key] == out[key], key
    assert [row["context_len"] for row in out["sweep"]] == [32, 128]
    assert out["sweep"][1]["step_bytes"] > out["sweep"][0]["step_bytes"]  # more KV to read
    for row in out["sweep"]:
        assert all(row[k] > 0 for k in ("decode_ms", "decode_fraction_of_limit", "verify8_over_decode",
                                        "draft_over_decode", "round_over_decode", "draft_fraction_of_floor"))
    assert out["copy_tbps"] > 0.1 and out["step_bytes"] > 0


@pytest.mark.parametrize("speculative", [False, True])
def test_a_longer_request_reallocates_and_recaptures(speculative):
    """A request longer than the caches grows them: the old graphs and their memory pool are dropped
    and new ones captured (capturing into the freed pool once crashed the allocator)."""
    target, draft = bigram_pair(dtype=torch.float32)
    target, draft = target.cuda(), draft.cuda()
    engine = Engine(target, BlockDrafter(draft) if speculative else None)
    eager = Engine(target, BlockDrafter(draft) if speculative else None, use_graphs=False)
    g = torch.Generator().manual_seed(1)
    for n, new in ((8, 16), (300, 200), (20, 600)):
        prompt = torch.randint(0, 63, (n,), generator=g).tolist()
        cfg = GenerationConfig(max_new_tokens=new, temperature=0.0)
        assert engine.generate(prompt, cfg).tokens == eager.generate(prompt, cfg).tokens
    assert engine.max_len >= 620 and engine.runner.graphs


def test_engines_sharing_a_target_keep_their_graphs_valid():
    """The harness alternates systems on one target: plain decoding's graphs, captured first, must stay
    right after a DSpark engine's longer cache grows the RoPE table they read. Freed, the old table's
    block goes to the next tensor of its size: here NaN-filled ones (on the H200 the demo's plain
    decoding ran every prompt to its length limit so). The random pair's attention decides its tokens (the
    bigram pair's barely: with it the old code passed, the table's block taken by the DSpark run's tensors)."""
    from dspark.models import layers

    target, draft = random_pair(dtype=torch.float32)
    target, draft = target.cuda(), draft.cuda()
    backbone = target.config.backbone
    key = (backbone.head_dim, backbone.rope_theta, torch.float32, torch.device("cuda", 0))
    layers._ROPE_TABLES.pop(key, None)  # tables of earlier tests: their engines are gone
    prompt = torch.randint(0, 63, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    short = GenerationConfig(max_new_tokens=16, temperature=0.0)
    plain = Engine(target)
    first = plain.generate(prompt, short).tokens
    blocks = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in layers.rope_table(1, *key)}
    Engine(target, BlockDrafter(draft)).generate(prompt, GenerationConfig(max_new_tokens=100, temperature=0.0))
    assert layers.rope_table(1, *key)[0].untyped_storage().data_ptr() not in blocks  # the table grew
    junk = [torch.full((nbytes // 4,), float("nan"), device="cuda") for nbytes in blocks.values() for _ in range(16)]
    assert plain.generate(prompt, short).tokens == first and junk


@pytest.mark.parametrize("kind", ["near", "far"])
def test_a_draft_model_graph_path_equals_its_eager_path(kind):
    """The classic draft model's round (catch-up and anchor rows, then one row a draft) captured as one graph:
    the same tokens, rounds and margins as eagerly; a perturbed draft (rounds whole and rejected, every
    catch-up row exercised) and an independent one."""
    from test_draft_model import _tiny_pair

    from dspark.drafters.draft_model import DraftModelDrafter

    target, draft = (m.to(torch.bfloat16).cuda() for m in _tiny_pair(kind))
    prompt = torch.randint(0, 4, (30,), generator=torch.Generator().manual_seed(4)).tolist()
    cfg = GenerationConfig(max_new_tokens=80, temperature=0.0)
    runs = []
    for graphs in (False, True):
        engine = Engine(target, DraftModelDrafter(draft, 3, margins=True), use_graphs=graphs)
        runs.append(engine.generate(prompt, cfg))
        assert bool(engine.runner.graphs) is graphs
    eager, graphed = runs
    assert graphed.tokens == eager.tokens == Engine(target, use_graphs=False).generate(prompt, cfg).tokens
    assert graphed.acceptance_lengths == eager.acceptance_lengths and graphed.draft_margins == eager.draft_margins
    if kind == "near":
        assert len(set(eager.acceptance_lengths)) >= 2, eager.acceptance_lengths


def test_a_draft_model_graph_path_is_lossless():
    from test_draft_model import _tiny_pair
    from test_lossless import PROMPT, chi_square_p, exact_joint, sampled_joint

    from dspark.drafters.draft_model import DraftModelDrafter

    target, draft = _tiny_pair("near")
    expected = exact_joint(target, PROMPT, 1.0)
    engine = Engine(target.float().cuda(), DraftModelDrafter(draft.float().cuda(), 2), use_graphs=True)
    counts, _, _ = sampled_joint(engine, 1.0, 0.0, 600)
    assert engine.runner.graphs
    assert chi_square_p(counts, expected) > 1e-3

"""The classic draft model (`draft_model`, as vLLM names it) in our engine: a smaller Qwen3 of the target's
tokenizer decodes k tokens autoregressively with its own KV cache and the target verifies them.

Greedy output equals plain decoding's (the demo target drafting for itself accepts every draft: AL = k + 1;
a random Qwen3 and a perturbed copy of the target accept less, and every round's catch-up is exercised);
at T > 0 the joint of the next tokens is the target's (chi-square, as `test_lossless` holds the other
drafters); the system's checks refuse a draft of another vocabulary before any model loads.
"""

from __future__ import annotations

import json
from pathlib import Path

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


# ---- the system in an experiment: refused before any model loads, run natively ----------------------------

HEAD = ('name = "dm"\ntarget = "demo"\ndataset = "demo"\nbackend = "{backend}"\n[sampling]\ntemperatures = [0.0]\n'
        'output_len = 24\nnum_prompts = 2\nshuffle = false\n[[systems]]\nname = "plain"\nmethod = "plain"\n'
        '[[systems]]\nname = "dm"\nmethod = "draft_model"\ndraft = "{draft}"\n{k}')


def _experiment(tmp_path, draft: str, k: str = "num_speculative_tokens = 3\n", backend: str = "native"):
    path = tmp_path / f"dm-{backend}.toml"
    path.write_text(HEAD.format(backend=backend, draft=draft, k=k))
    return path


def _copy_of_demo(tmp_path, name: str, config=None, tokenizer=None):
    """A draft folder beside the demo target's config and tokenizer (edited by `config` and `tokenizer`)."""
    import json
    import shutil

    out = tmp_path / name
    out.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEMO_DIR / "target" / f, out / f)
    for f, edit in (("config.json", config), ("tokenizer.json", tokenizer)):
        if edit is not None:
            data = json.loads((out / f).read_text())
            edit(data)
            (out / f).write_text(json.dumps(data))
    return out


def _swap_two_tokens(tok: dict) -> None:
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]


@needs_demo
@pytest.mark.parametrize("backend", ["native", "vllm"])
@pytest.mark.parametrize("mistake", ["vocabulary", "tokenizer", "no k"])
def test_a_draft_model_that_cannot_draft_for_the_target_is_refused_before_any_model_loads(
        tmp_path, monkeypatch, capfd, no_models, mistake, backend):
    from cli_runner import run_cli

    if backend == "vllm":
        pytest.importorskip("vllm")
    k = "num_speculative_tokens = 3\n"
    if mistake == "vocabulary":
        draft = _copy_of_demo(tmp_path, "small", config=lambda c: c.update(vocab_size=4096))
        says = "draft model {d} scores 4096 tokens and the target 2049: a draft model must have the target's vocabulary"
    elif mistake == "tokenizer":
        draft = _copy_of_demo(tmp_path, "other-tok", tokenizer=_swap_two_tokens)
        says = "draft model {d} has another tokenizer than the target (tokenizer.json differs)"
    else:
        draft, k = _copy_of_demo(tmp_path, "no-k"), ""
        says = "method draft_model drafts num_speculative_tokens tokens a round; give num_speculative_tokens"
    exp = _experiment(tmp_path, draft, k, backend)
    for extra in (["--dry-run"], ["--out", tmp_path / "r"]):
        code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", exp, "--device", "cpu", *extra)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert "system dm: " + says.format(d=draft) in err, err
    assert not (tmp_path / "r").exists()


@needs_demo
def test_a_native_run_of_a_draft_model_system_gives_plain_decodings_output(tmp_path, monkeypatch, capfd):
    """The demo target drafting for itself through the whole harness: the method recorded, every round whole."""
    from cli_runner import run_cli

    from harness.analysis.records import read_requests

    exp = _experiment(tmp_path, "demo")
    code, out, err = run_cli(monkeypatch, capfd, "run", "--experiment", exp, "--device", "cpu", "--out", tmp_path / "r")
    assert code == 0, err[-2000:]
    records = read_requests(tmp_path / "r")
    plain = {r["question_id"]: r["output_ids"] for r in records if r["system"] == "plain"}
    ran = [r for r in records if r["system"] == "dm"]
    assert len(ran) == 2 and all(r["method"] == "draft_model" for r in ran)
    for r in ran:
        assert r["output_ids"] == plain[r["question_id"]]
        assert set(r["accepted_counts"][:-1]) == {3} and set(r["proposal_lengths"]) == {3}


# ---- round by round against vLLM's draft_model on its CPU build -------------------------------------------

PARITY_PROMPTS = 3


@pytest.fixture(scope="module")
def parity_runs(tmp_path_factory):
    """A perturbed copy of the demo target (the demo's tokenizer; it accepts some rounds whole and rejects in
    others) as the draft model of one system, run natively (with plain decoding, margins recorded) and on
    vLLM's CPU build, on the first coding prompts."""
    import os
    import shutil
    import subprocess
    import sys

    from dspark.checkpoint import save_target

    pytest.importorskip("vllm")
    if not DEMO:
        pytest.skip("the demo models are not built (experiments/demo/build.py)")
    script = Path(sys.executable).with_name("dspark-bench")
    if not script.is_file():
        pytest.skip("the dspark-bench console script is not installed next to this Python")
    root = tmp_path_factory.mktemp("dm-parity")
    draft = root / "small-draft"
    save_target(_perturbed(load_target("demo", dtype="float32").model, 0.4, seed=7), draft)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEMO_DIR / "target" / f, draft / f)
    exp = _experiment(root, draft)
    common = ["run", "--experiment", exp, "--category", "coding", "--num-prompts", PARITY_PROMPTS, "--device", "cpu",
              "--output-len", "24", "--temperature", "0", "--disable-shuffle"]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "TRITON_INTERPRET")}
    out = {}
    for name, args in (("native", ["--backend", "native", "--record-margins"]),
                       ("vllm", ["--backend", "vllm", "--systems", "dm"])):
        proc = subprocess.run([str(script), *map(str, common), *args, "--out", root / name], capture_output=True,
                              text=True, timeout=900, check=False, cwd=root,
                              env=env | {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_USE_V2_MODEL_RUNNER": "0"})
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        out[name] = root / name
    return out


@needs_demo
def test_our_draft_model_equals_vllms_round_by_round(parity_runs):
    from harness.analysis.parity import parity
    from harness.analysis.records import read_requests

    def by_prompt(run, system):
        return {r["question_id"]: r for r in read_requests(parity_runs[run]) if r["system"] == system}

    plain, ours, theirs = by_prompt("native", "plain"), by_prompt("native", "dm"), by_prompt("vllm", "dm")
    assert len(theirs) == len(ours) == PARITY_PROMPTS
    for qid, r in theirs.items():
        assert r["method"] == "draft_model" and r["output_ids"] == ours[qid]["output_ids"] == plain[qid]["output_ids"]
        assert set(r["proposal_lengths"]) == {3}
        assert r["accepted_counts"] == ours[qid]["accepted_counts"], qid  # round by round
    counts = [a for r in ours.values() for a in r["accepted_counts"]]
    assert 0 in counts and 3 in counts  # rounds rejected and rounds taken whole: every catch-up case
    (group,) = parity(parity_runs["native"], parity_runs["vllm"])["groups"]
    assert (group["system"], group["outputs_equal"]) == ("dm", PARITY_PROMPTS)
    assert group["divergences"] == [] and group["pooled"][0]["rounds"] == group["pooled"][1]["rounds"]
    engine = json.loads((parity_runs["vllm"] / "manifest.json").read_text())["backend"]["engines"]["dm"]
    assert engine["method"] == "draft_model" and engine["speculative_config"]["num_speculative_tokens"] == 3


def test_qwen3_0_6b_shapes_a_random_draft_model_for_qwen3_8b(tmp_path, monkeypatch, capfd, no_models):
    """`random:qwen3-0.6b` (Qwen3-0.6B's shape) drafts for `random:qwen3-8b` in the dry run: configs alone,
    no weights drawn."""
    from cli_runner import run_cli

    from dspark.synthetic.presets import QWEN3_0_6B, QWEN3_8B

    b = QWEN3_0_6B.backbone
    assert (b.hidden_size, b.intermediate_size, b.num_layers, b.num_heads, b.num_kv_heads, b.head_dim) == \
        (1024, 3072, 28, 16, 8, 128) and QWEN3_0_6B.tie_word_embeddings
    assert b.vocab_size == QWEN3_8B.backbone.vocab_size
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path / "cache"))
    exp = _experiment(tmp_path, "random:qwen3-0.6b")
    exp.write_text(exp.read_text().replace('target = "demo"', 'target = "random:qwen3-8b"'))
    code, out, err = run_cli(monkeypatch, capfd, "run", "--experiment", exp, "--device", "cpu", "--dry-run", "--json")
    assert code == 0, err
    rows = {r["system"]: r for r in json.loads(out)["systems"]}
    assert rows["dm"]["method"] == "draft_model" and rows["dm"]["fits_target"] and \
        rows["dm"]["num_speculative_tokens"] == 3


def test_engine_bench_times_a_draft_model_beside_the_block_draft(monkeypatch, capfd, tmp_path):
    """`--draft-model`: random weights at a Qwen3 shape of the target's vocabulary (here the demo target's own),
    its propose step and round alternated with the block draft's; its floor k of its decode steps; a draft model of
    another vocabulary is one line before any model is built."""
    from cli_runner import run_cli

    from harness.engine_bench.native import CPU_DEFAULTS, step_bytes

    if not DEMO:
        pytest.skip("the demo models are not built (experiments/demo/build.py)")
    monkeypatch.setitem(CPU_DEFAULTS, "copy_gib", 0.02)
    code, out, err = run_cli(monkeypatch, capfd, "engine-bench", "--device", "cpu", "--json", "--skip-hf",
                             "--repeats", "5", "--context-len", "32", "--draft-model", "demo",
                             "--draft-model-tokens", "4")
    assert code == 0, err
    result = json.loads(out)
    d = result["draft_model"]
    assert (d["name"], d["num_tokens"], d["num_layers"]) == ("demo", 4, 8)
    assert [who for who, _ in d["passes"]] == ["block", "draft_model", "block", "draft_model"]
    assert d["round_over_decode"] == d["round_ms"] / result["decode_ms"]
    assert d["round_over_block_round"] == d["round_ms"] / d["block_round_ms"]
    assert d["draft_step_bytes"] == 4 * step_bytes(load_target("demo", dtype="float32").model, 32)
    small = _copy_of_demo(tmp_path, "small", config=lambda c: c.update(vocab_size=4096))
    code, _, err = run_cli(monkeypatch, capfd, "engine-bench", "--device", "cpu", "--draft-model", small)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"--draft-model {small} scores 4096 tokens and the target 2049" in err

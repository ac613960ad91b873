"""The CPU path: its small operations in their CPU forms, its products' weights laid out at load, and its steps
compiled on request; each held to the eager reference (`kernels.references()`), exactly."""

from __future__ import annotations

import pytest
import torch
from cli_runner import run_cli

from dspark import kernels as K
from dspark.checkpoint import DEMO_DIR, load_draft, load_target
from dspark.drafters import NgramDrafter, drafter_for
from dspark.engine import Engine, GenerationConfig, graphs
from dspark.engine.compile import choose_cache_dir
from dspark.models.layers import device_layout, rope_cos_sin
from harness.specs.datasets import load

DEMO = (DEMO_DIR / "target" / "model.safetensors").is_file()
needs_demo = pytest.mark.skipif(not DEMO, reason="the demo models are not built (experiments/demo/build.py)")


@pytest.fixture(params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def dtype(request):
    return request.param


def test_the_cpu_forms_compute_what_the_references_do_bit_for_bit(dtype):
    torch.manual_seed(0)
    b, t, hq, hkv, d, s = 1, 8, 4, 2, 64, 300
    x, w = torch.randn(b, t, 256, dtype=dtype), torch.rand(256, dtype=dtype) + 0.5
    qkv = torch.randn(b, t, (hq + 2 * hkv) * d, dtype=dtype)
    qn, kn = torch.rand(d, dtype=dtype) + 0.5, torch.rand(d, dtype=dtype) + 0.5
    pos = (100 + torch.arange(t))[None]
    cos, sin = rope_cos_sin(pos, d, 1e6, dtype)
    with torch.inference_mode():
        caches = [[torch.zeros(b, hkv, s, d, dtype=dtype) for _ in range(2)] for _ in range(2)]
        got = (K.rms_norm(x, w, 1e-6), K.qk_norm_rope_cache(qkv, hq, hkv, qn, kn, 1e-6, cos, sin, pos, *caches[0]))
        with K.references():
            want = (K.rms_norm(x, w, 1e-6), K.qk_norm_rope_cache(qkv, hq, hkv, qn, kn, 1e-6, cos, sin, pos, *caches[1]))
        for a, r in zip(got + tuple(caches[0]), want + tuple(caches[1])):
            assert torch.equal(a, r)
        q = got[1]
        limits = pos.clone()
        out = K.attention(q, *caches[0], limits, s - 1)
        with K.references():
            ref = K.attention(q, *caches[0], limits, s - 1)
    # SDPA over the grouped heads in place of copies of K and V: the same sums (float32 measured bit-equal)
    assert torch.equal(out, ref) if dtype == torch.float32 else torch.allclose(out.float(), ref.float(), atol=1e-2)


def test_references_are_what_runs_inside_references_and_the_forms_outside():
    assert K.kernels_on()
    with K.references():
        assert not K.kernels_on()
    assert K.kernels_on()


def test_a_cpu_model_s_products_are_column_major_with_their_numbers_and_names_kept(tiny_dir):
    plain = torch.nn.Linear(64, 96).weight.detach()
    laid = device_layout(plain)
    assert laid.shape == plain.shape and laid.t().is_contiguous() and torch.equal(laid, plain)
    target = load_target(str(tiny_dir / "target")).model
    layer = target.model.layers[0]
    for weight in (layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight, target.lm_head.weight,
                   layer.self_attn.fused[0], layer.mlp.fused[0]):
        assert weight.t().is_contiguous()
    # the fused projections' parts are still views of the fused weight (the check every forward makes)
    assert layer.self_attn.q_proj.weight.data_ptr() == layer.self_attn.fused[0].data_ptr()
    draft = load_draft(str(tiny_dir / "dspark"), target).model
    assert draft.context_kv[0].t().is_contiguous() and draft.fc.weight.t().is_contiguous()


def test_a_tied_head_stays_one_tensor_with_the_embedding(tiny_dir):
    target = load_target(str(tiny_dir / "target")).model
    with torch.inference_mode():  # (a model loaded there gets new parameters, not new data)
        target.lm_head.weight = target.model.embed_tokens.weight
        target.fuse()
    assert target.lm_head.weight is target.model.embed_tokens.weight
    assert target.lm_head.weight.t().is_contiguous()


def test_saving_a_cpu_model_writes_the_same_numbers_it_loaded(tiny_dir, tmp_path):
    from safetensors.torch import load_file

    from dspark.formats.common import save_safetensors

    target = load_target(str(tiny_dir / "target")).model
    save_safetensors(dict(target.state_dict()), tmp_path / "m.safetensors")
    back = load_file(tmp_path / "m.safetensors")
    assert all(torch.equal(back[k], v) for k, v in target.state_dict().items())


def test_an_unwritable_compile_cache_becomes_a_fresh_temporary_one(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    folder, why = choose_cache_dir(None, blocker / "cache")
    assert folder.is_dir() and "not writable" in why
    folder, why = choose_cache_dir(None, tmp_path / "cache")
    assert folder == tmp_path / "cache" / "inductor" and folder.is_dir()
    folder, why = choose_cache_dir(str(tmp_path / "given"), tmp_path / "cache")
    assert folder == tmp_path / "given" and why == "TORCHINDUCTOR_CACHE_DIR"


@pytest.fixture(scope="module")
def demo():
    transformers = pytest.importorskip("transformers")
    if not DEMO:
        pytest.skip("the demo models are not built (experiments/demo/build.py)")
    target = load_target("demo")
    tok = transformers.AutoTokenizer.from_pretrained(target.path)
    rows = [r for r in load("qualitative", source="demo").rows if r.category == "coding"]
    prompts = [tok.apply_chat_template([{"role": "user", "content": r.turns[0]}], add_generation_prompt=True,
                                       enable_thinking=False, tokenize=True, return_dict=False) for r in rows[:3]]
    drafters = {"plain": None, "ngram": NgramDrafter(7)}
    for name in ("dspark", "dflash", "eagle3"):
        drafters[name] = drafter_for(load_draft(f"demo-{name}", target.model).model)
    return target, prompts, drafters


def _runs(engine: Engine, prompts, temperature: float) -> list[tuple]:
    cfg = GenerationConfig(max_new_tokens=40, temperature=temperature, seed=5)
    return [(r.tokens, r.acceptance_lengths) for r in (engine.generate(p, cfg) for p in prompts)]


@needs_demo
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_cpu_path_equals_the_eager_reference_token_for_token_and_round_for_round(demo, temperature):
    target, prompts, drafters = demo
    for name, drafter in drafters.items():
        fast = _runs(Engine(target.model, drafter), prompts, temperature)
        with K.references():
            ref = _runs(Engine(target.model, drafter), prompts, temperature)
        assert fast == ref, name


@needs_demo
def test_compiled_steps_equal_the_eager_ones_token_for_token_and_round_for_round(demo, tmp_path, monkeypatch):
    """Compiled with inductor (its cache in a fresh folder: every step compiles), plain decoding greedy and DSpark
    sampled (its draws through the same generators): the same tokens and rounds as the eager steps, and no step
    left eager or recompiled after its capture (a guard on state a request changes would silently run it
    eagerly in a run). (Four steps compile, about 40 s on 2 cores; the CPU forms are held to the references above for
    every drafter at both temperatures.)"""
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path))  # (read when the process first compiles)
    monkeypatch.setattr(graphs, "AFTER_CAPTURE", "fail_on_recompile")  # a step recompiling after capture fails here
    target, prompts, drafters = demo
    for name, temperature in (("plain", 0.0), ("dspark", 1.0)):
        compiled = Engine(target.model, drafters[name], compile=True)
        eager = Engine(target.model, drafters[name])
        assert _runs(compiled, prompts[:2], temperature) == _runs(eager, prompts[:2], temperature), name
        assert len(compiled.runner.compiled) == len(compiled.steps) and not compiled.runner.failed
        assert compiled.runner.compile_settings["cache_dir"]


def test_compile_on_another_backend_is_refused_in_one_line(monkeypatch, capfd):
    code, out, err = run_cli(monkeypatch, capfd, "run", "--split", "qualitative", "--backend", "vllm", "--compile")
    assert code == 2 and "--compile" in err and len(err.strip().splitlines()) == 1

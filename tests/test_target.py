"""Our Qwen3 forward against transformers' Qwen3ForCausalLM, from a standard Hugging Face folder."""

from __future__ import annotations

import json

import pytest
import torch

from dspark.checkpoint import load_target

transformers = pytest.importorskip("transformers")


def _hf_model(tmp_path, tie: bool, rope_key: str):
    cfg = transformers.Qwen3Config(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=5, num_attention_heads=4,
        num_key_value_heads=2, head_dim=24, tie_word_embeddings=tie, rope_parameters={"rope_type": "default",
                                                                                       "rope_theta": 50000.0},
        max_position_embeddings=512, rms_norm_eps=1e-6,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # wider than the 0.02 init so the comparison is not of near-zeros
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.15)
            else:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(tmp_path)
    if rope_key == "rope_theta":  # the pre-5.0 spelling, as older Qwen3 checkpoints have it
        hf = json.loads((tmp_path / "config.json").read_text())
        hf["rope_theta"] = hf.pop("rope_parameters")["rope_theta"]
        hf["rope_scaling"] = None
        (tmp_path / "config.json").write_text(json.dumps(hf))
    return model


def _rel(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("tie,rope_key", [(False, "rope_parameters"), (True, "rope_theta")])
def test_matches_transformers(tmp_path, tie, rope_key):
    hf = _hf_model(tmp_path, tie, rope_key)
    ours = load_target(tmp_path, dtype="float32").model
    assert ours.config.tie_word_embeddings == tie
    assert ours.config.backbone.rope_theta == 50000.0
    ids = torch.randint(0, 300, (1, 37), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True)
    taps = (-1, 0, 2, 3)
    cache = ours.new_cache(64)
    hidden, feats = ours(ids, torch.arange(37)[None], cache, 37, taps)
    assert _rel(ours.logits(hidden), ref.logits) <= 1e-4
    for i, layer in enumerate(taps):  # DeepSpec convention: hidden_states[id + 1] is layer id's output
        tap = feats[..., i * 64 : (i + 1) * 64]
        assert _rel(tap, ref.hidden_states[layer + 1]) <= 1e-4


def test_cached_decoding_matches_full_forward(tmp_path):
    """Prefill then one token at a time through the KV cache gives the full forward's logits."""
    _hf_model(tmp_path, False, "rope_parameters")
    model = load_target(tmp_path, dtype="float64").model
    ids = torch.randint(0, 300, (1, 20), generator=torch.Generator().manual_seed(2))
    full, _ = model(ids, torch.arange(20)[None], model.new_cache(32), 20)
    cache = model.new_cache(32)
    model(ids[:, :12], torch.arange(12)[None], cache, 12)
    # A stale write past the committed length (a rejected verify row) must not leak into later steps.
    model(torch.tensor([[7, 8, 9]]), torch.arange(12, 15)[None], cache, 15)
    steps = [model(ids[:, t : t + 1], torch.tensor([[t]]), cache, t + 1)[0] for t in range(12, 20)]
    torch.testing.assert_close(model.logits(torch.cat(steps, 1)), model.logits(full[:, 12:]), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_prefill_without_positions_is_the_causal_forward(tmp_path, dtype):
    """positions=None (a prefill from 0) runs half precision through SDPA's causal kernel, with no mask:
    the same hidden states, taps and cache as the masked forward at explicit positions 0..T-1."""
    _hf_model(tmp_path, False, "rope_parameters")
    model = load_target(tmp_path, dtype=dtype).model
    ids = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(3))
    caches = [model.new_cache(48, batch=2) for _ in range(2)]
    with torch.no_grad():
        h_none, f_none = model(ids, None, caches[0], 40, (0, 3))
        h_pos, f_pos = model(ids, torch.arange(40)[None].expand(2, 40), caches[1], 40, (0, 3))
    tol = 1e-6 if dtype == "float32" else 2e-2
    assert _rel(h_none.float(), h_pos.float()) <= tol and _rel(f_none.float(), f_pos.float()) <= tol
    assert _rel(caches[0].k[4].float(), caches[1].k[4].float()) <= tol
    with pytest.raises(ValueError, match="sees its own 40 keys"):
        model(ids, None, caches[0], 41)


def test_rope_table_rows_equal_rope_cos_sin():
    """The RoPE table a forward gathers from holds exactly the rows `rope_cos_sin` computes, and grows
    (keeping them) when a longer cache asks."""
    from dspark.models.layers import rope_cos_sin, rope_table

    positions = torch.tensor([[0, 5, 99, 1023]])
    for dtype in (torch.float32, torch.bfloat16):
        cos, sin = rope_table(1024, 64, 1e6, dtype, torch.device("cpu"))
        want = rope_cos_sin(positions, 64, 1e6, dtype)
        assert torch.equal(cos[positions], want[0]) and torch.equal(sin[positions], want[1])
        longer = rope_table(3000, 64, 1e6, dtype, torch.device("cpu"))
        assert longer[0].shape[0] >= 3000 and torch.equal(longer[0][:1024], cos[:1024])


def test_a_grown_rope_table_keeps_the_one_it_replaced_alive():
    """A CUDA graph captured by one engine holds the address of the table it read; when another engine's
    longer cache grows the table, the old one must not be freed (its memory would be reused under that graph)."""
    import gc
    import weakref

    from dspark.models.layers import rope_table

    cos, _ = rope_table(100, 32, 1234.5, torch.float32, torch.device("cpu"))  # a shape no other test uses
    old = weakref.ref(cos)
    del cos
    rope_table(10_000, 32, 1234.5, torch.float32, torch.device("cpu"))
    gc.collect()
    assert old() is not None

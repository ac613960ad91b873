"""DFlash 2 (method `dflash2`) in our engine, against z-lab's own code (the `dflash` package from PyPI, 0.1.0).

Shared random weights: a transformers Qwen3 target and z-lab's `DFlash2DraftModel` (`tests/zlab_models.py`), saved
as z-lab's releases store it (codebooks without `.weight`) and as its `save_pretrained` writes it (with), loaded by
our z-lab loader. At T = 0 (float32, both sides) our engine decodes token- and round-exact against z-lab's
`dflash_generate`, every proposal alike up to z-lab's shortened last blocks, on weights whose selector changes the head's arg-max on some slots (asserted, so a plain head cannot
pass). At T > 0 the engine with a DFlash 2 drafter (the selector's q in rejection sampling) samples the target's
own joint distribution of the first tokens (chi-square, as tests/test_lossless.py), and the same test fails when
the q given is uniform over the candidates rather than the selector's. The config is read as z-lab reads it (dflash_config first), what
cannot be a DFlash 2 draft or does not match its method is refused in one line before any model loads, and a
draft saved by us loads in z-lab's `from_pretrained` and decodes the same tokens there.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from cli_runner import run_cli
from pairs import random_pair
from safetensors.torch import load_file, save_file
from test_lossless import PASS_P, PROMPT, chi_square_p, exact_joint, sampled_joint

from dspark.checkpoint import load_draft, load_draft_config, load_target, save_draft
from dspark.drafters import DFlash2Drafter
from dspark.engine import Engine, GenerationConfig
from dspark.errors import DSparkError
from dspark.synthetic.tiny import random_draft

zlab = pytest.importorskip("dflash.model")  # z-lab's reference: `pip install --no-deps dflash==0.1.0` (.ci/run)
from zlab_models import (
    MASK,
    TARGET_LAYERS,
    build_target,
    cpu_clock,
    dry_run,
    lean,
    our_run,
    qwen3,
    spread,
    zlab_run,
)

DFLASH2 = {"block_size": 6, "mask_token_id": MASK, "target_layer_ids": [0, 2], "conv_kernel_size": 3,
           "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 4}
CODEBOOK_SCALE = 2.0  # the selector's bias then competes with the head's logits: it changes some slots' arg-max


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """(transformers' target, ours) with the same weights."""
    folder = tmp_path_factory.mktemp("dflash2-target")
    return build_target(folder), load_target(folder, dtype="float32").model


@pytest.fixture(autouse=True)
def zlab_clock(monkeypatch):
    cpu_clock(monkeypatch)


def _zlab_draft(folder, seed: int = 1, bare: bool = True, **top):
    """z-lab's DFlash2DraftModel (2 layers, taps 0 and 2), random weights, saved by its save_pretrained; `bare`:
    its codebooks then renamed without `.weight`, as z-lab's released checkpoints store them."""
    cfg = qwen3(num_hidden_layers=2)
    cfg.num_target_layers, cfg.architectures, cfg.dflash_config = TARGET_LAYERS, ["DFlash2DraftModel"], dict(DFLASH2)
    for key, value in top.items():
        setattr(cfg, key, value)
    torch.manual_seed(seed)
    model = zlab.DFlash2DraftModel(cfg).eval()
    spread(model, seed)
    lean(model)
    with torch.no_grad():
        for book in (model.candidate_selector.predecessor_codebook, model.candidate_selector.successor_codebook):
            book.weight.mul_(CODEBOOK_SCALE)
    model.save_pretrained(folder)
    if bare:
        state = load_file(folder / "model.safetensors")
        save_file({k.removesuffix(".weight") if "codebook" in k else k: v for k, v in state.items()},
                  folder / "model.safetensors", metadata={"format": "pt"})
    return model


def _head_argmaxes(draft) -> list[list[int]]:
    """Record the plain head's arg-max of every slot z-lab's loop proposes for (what DFlash would draft)."""
    seen, logits_of = [], draft.compute_logits

    def recorded(hidden, head):
        logits = logits_of(hidden, head)
        seen.append(logits.argmax(-1)[0].tolist())
        return logits

    draft.compute_logits = recorded
    return seen


@pytest.mark.parametrize("bare", [True, False], ids=["released-keys", "save-pretrained-keys"])
def test_decodes_token_and_round_exact_against_zlab(tmp_path, target, bare):
    hf_target, ours = target
    draft = _zlab_draft(tmp_path, bare=bare)
    stored = load_file(tmp_path / "model.safetensors")
    assert ("candidate_selector.predecessor_codebook" in stored) == bare
    loaded = load_draft(tmp_path, ours)
    assert loaded.config.method == "dflash2" and loaded.config.format == "zlab"
    assert torch.equal(loaded.model.candidate_selector.successor_codebook.weight,
                       draft.candidate_selector.successor_codebook.weight)
    head = _head_argmaxes(draft)
    tokens, rounds, proposals = zlab_run(draft, hf_target)
    our_tokens, our_rounds, our_proposals = our_run(ours, loaded.model)
    assert our_tokens == tokens
    full = [i for i, p in enumerate(proposals) if len(p) == DFLASH2["block_size"] - 1]  # (as test_zlab_layouts)
    assert full == list(range(len(full))) and len(full) >= len(rounds) - (DFLASH2["block_size"] - 1)
    assert our_rounds[: len(full)] == rounds[: len(full)]
    assert our_proposals[: len(full)] == proposals[: len(full)]
    assert max(rounds[: len(full)]) > 1  # drafts accepted: the rounds carry information
    changed = sum(a != b for p, h in zip(proposals, head) for a, b in zip(p, h))
    assert changed > 0, "the selector never changed the head's arg-max: the test would pass with a plain head"


def _lossless_pair(uniform: bool = False):
    """A tiny target of test_lossless's vocabulary and a random DFlash 2 draft for it: 2 candidates of 4 per slot,
    so residuals carry mass off the candidates. `uniform`: a drafter that gives its q as uniform over the candidates
    (the control: a q that is not the one its tokens were drawn from, so not lossless)."""
    target, draft = random_pair(vocab=4, block_size=3, markov_rank=0, sample_from_anchor=False, confidence=False)
    cfg = replace(draft.config, format="zlab", conv_kernel_size=2, conv_group_size=8, selector_rank=4,
                  selector_top_k=2)
    draft = random_draft(cfg, target, seed=2, std=0.3)

    class Uniform(DFlash2Drafter):
        def propose(self, state, *args):
            super().propose(state, *args)
            candidates = (state.draft_probs[0] > 0).float()
            state.draft_probs[0].copy_(candidates / candidates.sum(-1, keepdim=True))

    return target, (Uniform if uniform else DFlash2Drafter)(draft)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_engine_with_a_dflash2_draft_samples_the_target_distribution(temperature):
    target, drafter = _lossless_pair()
    counts, lengths, _ = sampled_joint(Engine(target, drafter), temperature, 0.0, 600)
    assert chi_square_p(counts, exact_joint(target, PROMPT, temperature)) > PASS_P
    assert 1 < sum(lengths) / len(lengths) < 3  # both accepted and rejected drafts


def test_the_lossless_test_catches_a_wrong_q():
    target, drafter = _lossless_pair(uniform=True)
    counts, _, _ = sampled_joint(Engine(target, drafter), 1.0, 0.0, 600)
    assert chi_square_p(counts, exact_joint(target, PROMPT, 1.0)) < PASS_P


def _config(tmp_path, **fields):
    cfg = qwen3(num_hidden_layers=2).to_dict() | {"architectures": ["DFlash2DraftModel"], "dflash_config": DFLASH2}
    folder = tmp_path / "draft"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg | fields))
    return folder


def test_fields_read_from_dflash_config_first(tmp_path):
    """z-lab's order: dflash_config, then the top level (a top-level value under a dflash_config one is not read)."""
    inner = {k: v for k, v in DFLASH2.items() if k not in ("selector_top_k", "conv_kernel_size")}
    cfg = load_draft_config(_config(tmp_path, dflash_config=inner | {"selector_rank": 6}, selector_rank=99,
                                    selector_top_k=3, conv_kernel_size=2))[1]
    assert (cfg.selector_rank, cfg.selector_top_k, cfg.conv_kernel_size, cfg.conv_group_size) == (6, 3, 2, 16)
    assert cfg.method == "dflash2" and cfg.num_drafts == DFLASH2["block_size"] - 1


@pytest.mark.parametrize("fields,words", [
    ({"dflash_config": {k: v for k, v in DFLASH2.items() if k != "selector_top_k"}},
     "sets 'selector_top_k' neither in dflash_config nor at the top level"),
    ({"dflash_config": DFLASH2 | {"conv_group_size": 24}}, "conv_group_size 24 does not divide hidden_size 64"),
    ({"dflash_config": DFLASH2 | {"selector_top_k": 13}}, "selector_top_k 13 is more than the vocabulary (12)"),
    ({"dflash_config": DFLASH2 | {"conv_kernel_size": 0}}, "conv_kernel_size 0 must be at least 1"),
    ({"architectures": ["DFlashDraftModel"]}, "sets DFlash 2's 'selector_rank' under architecture DFlashDraftModel"),
    ({"dflash_config": DFLASH2 | {"projector_type": "dspark"}}, "projector_type dspark (a Markov head)"),
])
def test_refused_fields_name_themselves_before_any_model_loads(tmp_path, fields, words):
    with pytest.raises(DSparkError) as err:
        load_draft_config(_config(tmp_path, **fields))  # the config alone: no tensor file exists
    assert "\n" not in str(err.value) and words in str(err.value), str(err.value)


def _tiny_dflash2(tiny_dir, folder):
    """A random DFlash 2 draft of make-tiny's z-lab draft's shape for its target, saved by our z-lab saver in `folder`;
    returns the target."""
    tiny = load_target(tiny_dir / "target").model
    dcfg = replace(load_draft_config(tiny_dir / "dflash-zlab")[1], conv_kernel_size=3, conv_group_size=8,
                   selector_rank=8, selector_top_k=5)
    save_draft(random_draft(dcfg, tiny, std=0.3), folder, "zlab", tiny.config)
    return tiny


@pytest.mark.parametrize("method,draft", [("dflash", "dflash2"), ("dflash2", "dflash")])
def test_a_draft_of_another_method_is_refused_before_any_model_loads(tiny_dir, tmp_path, monkeypatch, capfd, method,
                                                                      draft):
    """The dry run (configs and tensor headers only) names the draft's own method; make-tiny's target and z-lab
    DFlash draft, and a DFlash 2 draft of that shape saved by our z-lab saver."""
    if draft == "dflash2":
        _tiny_dflash2(tiny_dir, tmp_path / "dflash2")
    folder = tmp_path / "dflash2" if draft == "dflash2" else tiny_dir / "dflash-zlab"
    code, last = dry_run(monkeypatch, capfd, tmp_path, tiny_dir / "target", folder, method)
    assert code == 2 and f"is a {draft} draft, but the experiment says {method}; fix its method" in last, last


def test_the_harness_builds_the_dflash2_drafter_and_its_greedy_output_is_plain_decodings(tiny_dir, tmp_path):
    """`make_drafter` (the native backend's and `generate`'s) runs a DFlash 2 draft as method dflash2, and at T = 0
    its output is the target's own (make-tiny's target, a random DFlash 2 draft saved by our z-lab saver)."""
    from harness.backends.systems import make_drafter

    tiny = _tiny_dflash2(tiny_dir, tmp_path / "dflash2")
    drafter, method, cfg = make_drafter("dflash2", str(tmp_path / "dflash2"), tiny)
    assert isinstance(drafter, DFlash2Drafter) and method == cfg.method == "dflash2"
    prompt, greedy = list(range(40, 70)), GenerationConfig(max_new_tokens=48, temperature=0.0)
    assert Engine(tiny, drafter).generate(prompt, greedy).tokens == Engine(tiny).generate(prompt, greedy).tokens


def test_inspect_shows_a_dflash2_draft_and_its_selector(tiny_dir, tmp_path, monkeypatch, capfd):
    _tiny_dflash2(tiny_dir, tmp_path / "dflash2")
    code, out, err = run_cli(monkeypatch, capfd, "inspect", tmp_path / "dflash2", "--json")
    info = json.loads(out)
    assert code == 0 and info["method"] == "dflash2" and info["architecture"] == "DFlash2DraftModel", err
    hidden, vocab = info["backbone"]["hidden_size"], info["backbone"]["vocab_size"]
    assert info["parameters"]["candidate_selector"] == 2 * vocab * 8 + 8 * hidden  # two codebooks, the projection


def test_a_draft_saved_by_us_loads_in_zlab_and_decodes_the_same(tmp_path, target):
    hf_target, ours = target
    _zlab_draft(tmp_path / "theirs", seed=3)
    loaded = load_draft(tmp_path / "theirs", ours)
    save_draft(loaded.model, tmp_path / "ours", "zlab", ours.config)
    stored = load_file(tmp_path / "ours" / "model.safetensors")
    assert {"candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook"} <= set(stored)
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["architectures"] == ["DFlash2DraftModel"]
    again = zlab.DFlash2DraftModel.from_pretrained(tmp_path / "ours", dtype=torch.float32).eval()
    assert load_draft_config(tmp_path / "ours")[1] == loaded.config
    assert zlab_run(again, hf_target)[0] == our_run(ours, loaded.model)[0]


def test_the_qwen3_8b_preset_drafts_for_qwen3_8b(tmp_path, monkeypatch, capfd, no_models):
    """`random:zlab-dflash2-qwen3-8b-b16` in the dry run (configs alone, no weights drawn): a dflash2 draft that fits
    `random:qwen3-8b`, with the DFlash 2 fields its docstring gives."""
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path / "cache"))
    cfg = load_draft_config("random:zlab-dflash2-qwen3-8b-b16")[1]
    assert (cfg.conv_kernel_size, cfg.conv_group_size, cfg.selector_rank, cfg.selector_top_k) == (2, 16, 256, 16)
    assert (cfg.block_size, cfg.backbone.num_layers, cfg.backbone.hidden_size) == (16, 5, 4096)
    experiment = tmp_path / "preset.toml"
    experiment.write_text('name = "preset"\ntarget = "random:qwen3-8b"\ndataset = "demo"\nbackend = "native"\n'
                          'sampling = {temperatures = [0.0], output_len = 8, num_prompts = 1, turns = "first"}\n'
                          'systems = [{name = "d2", draft = "random:zlab-dflash2-qwen3-8b-b16", method = "dflash2"}]\n')
    code, out, err = run_cli(monkeypatch, capfd, "run", "--experiment", experiment, "--device", "cpu", "--dry-run",
                             "--json")
    assert code == 0, err
    row = next(r for r in json.loads(out)["systems"] if r["system"] == "d2")
    assert row["method"] == "dflash2" and row["fits_target"] and row["num_speculative_tokens"] == 15


@pytest.mark.cuda
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_graph_path_equals_the_eager_path_on_a_gpu(temperature):
    """The DFlash 2 propose step (convolutions, selector loop, q scattered) captured as one CUDA graph: the same
    tokens, rounds and margins as eagerly, greedy and sampled (one seed, the same streams)."""
    target, drafter = _lossless_pair()
    target, draft = target.to(torch.bfloat16).cuda(), drafter.model.to(torch.bfloat16).cuda()
    prompt = torch.randint(0, 4, (30,), generator=torch.Generator().manual_seed(4)).tolist()
    cfg = GenerationConfig(max_new_tokens=80, temperature=temperature, seed=5)
    runs = []
    for graphs in (False, True):
        engine = Engine(target, DFlash2Drafter(draft, margins=True), use_graphs=graphs)
        runs.append(engine.generate(prompt, cfg))
        assert bool(engine.runner.graphs) is graphs
    eager, graphed = runs
    assert graphed.tokens == eager.tokens and graphed.acceptance_lengths == eager.acceptance_lengths
    assert graphed.draft_margins == eager.draft_margins
    if temperature == 0.0:
        assert eager.tokens == Engine(target, use_graphs=False).generate(prompt, cfg).tokens
    assert max(eager.acceptance_lengths) > 1


@pytest.mark.cuda
def test_the_graph_path_is_lossless_on_a_gpu():
    target, drafter = _lossless_pair()
    expected = exact_joint(target, PROMPT, 1.0)
    engine = Engine(target.float().cuda(), DFlash2Drafter(drafter.model.float().cuda()), use_graphs=True)
    counts, _, _ = sampled_joint(engine, 1.0, 0.0, 600)
    assert engine.runner.graphs and chi_square_p(counts, expected) > PASS_P

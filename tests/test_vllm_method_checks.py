"""What holds a vLLM method system to what ran (issue 54's review):

- a server's method is read back from its own output (a resumed run appends to the log: an earlier server's
  config line is not this one's); a log with no config line (vLLM's INFO lines off) leaves the method
  unknown, recorded and warned (as the run goes, and in its summary's warnings), never refused as "ran
  'None'"; one that names another method is refused;
- medusa, mlp_speculator and an MTP method, with the demo's weights (it has none of theirs), reach vLLM's own
  config validation with the speculative config the harness builds, no weights loaded: mlp_speculator and
  the MTP method are refused there, and a run says so in one line; medusa's config passes it;
- `parity` refuses a system that ran with another `speculative_config` table in the other run.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from test_vllm_methods import needs_demo, needs_vllm

from dspark.errors import DSparkError
from harness.specs.experiments import parse

LINE = ("INFO 12-05 09:05:36 core.py:134] Initializing a V1 LLM engine (v0.32.0) with config: model='/m', "
        "speculative_config=SpeculativeConfig(method='{}', model=None, num_spec_tokens=4), seed=0\n")


def _server(log: Path, before: str, after: str):
    """A server whose log holds an earlier session's output (`before`) and its own from `start` on."""
    from harness.backends.vllm.process import Server

    log.write_text(before)
    start = log.stat().st_size
    with log.open("a") as f:
        f.write(after)
    return Server(proc=None, port=0, log=log, command=[], start=start)


@needs_vllm
def test_a_servers_method_is_read_from_its_own_output_and_unknown_where_it_says_none(tmp_path):
    """At main the whole appended log was read: a resumed run passed on the earlier server's line, and a server
    logging no config line (VLLM_LOGGING_LEVEL=WARNING) was refused: "ran speculative method 'None'"."""
    from harness.backends.vllm.server import MethodUnread, read_back

    log = tmp_path / "server-sfx.log"
    assert read_back("sfx", "suffix", _server(log, LINE.format("ngram"), LINE.format("suffix")), "0.32.0",
                     None) == {"method": "suffix"}
    with pytest.warns(MethodUnread) as said:  # this server said nothing of its method; the earlier one did
        got = read_back("sfx", "suffix", _server(log, LINE.format("suffix"), "WARNING no config line\n"), "0.32.0",
                        None)
    assert got["method"] is None and got["method_unknown"] == str(said[0].message)
    assert "system 'sfx': the method vLLM ran could not be read back" in got["method_unknown"]
    assert "VLLM_LOGGING_LEVEL" in got["method_unknown"] and "labelled 'suffix', the method asked for" in \
        got["method_unknown"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no warning where the line is there)
        with pytest.raises(DSparkError, match="system 'dm': vLLM 0.32.0 ran speculative method 'dspark' where the "
                                              "experiment asks for 'draft_model'"):
            read_back("dm", "draft_model", _server(log, "", LINE.format("dspark")), "0.32.0", "demo")


def test_a_method_no_servers_log_named_is_a_warning_of_the_runs_summary(tmp_path):
    """The run's one-line warning is gone once it ends: the summary (`report`, summary.md) says it again."""
    from run_folders import native, write

    from harness.analysis.summary import summarize_folder

    run = write(tmp_path / "r", [native(s, q, 5.0) for s in ("plain", "ngram") for q in ("q1", "q2")],
                systems=["plain", "ngram"], backend="vllm-server")
    manifest = json.loads((run / "manifest.json").read_text())
    note = "system 'ngram': the method vLLM ran could not be read back (...); its figures are labelled 'ngram'"
    manifest["backend"] = {"servers": {"plain": {"model_runner": "V1"}, "ngram": {"method": None,
                                                                                 "method_unknown": note}}}
    (run / "manifest.json").write_text(json.dumps(manifest))
    assert note in summarize_folder(run)["warnings"]
    manifest["backend"]["servers"]["ngram"] = {"method": "ngram"}
    (run / "manifest.json").write_text(json.dumps(manifest))
    assert not any("could not be read back" in w for w in summarize_folder(run)["warnings"])


@pytest.fixture(scope="module")
def vllm_configs(tmp_path_factory) -> tuple:
    """The offline backend and each system's prepared speculative config, as a run builds them (no engine)."""
    from harness.backends.vllm.offline import VllmBackend

    exp = parse({"name": "x", "target": "demo", "systems": [
        {"name": "medusa", "method": "medusa", "draft": "demo", "num_speculative_tokens": 2},
        {"name": "mlp", "method": "mlp_speculator", "draft": "demo"},
        {"name": "mtp", "method": "qwen3_next_mtp", "num_speculative_tokens": 1}]}, "x.toml")
    backend = VllmBackend("demo", "cpu", "auto", run_dir=tmp_path_factory.mktemp("methods"))
    return backend, {s.name: backend.prepare(s) for s in exp.systems}


def _validated(backend, sc: dict):
    """vLLM's own validation of the target with `sc`: its EngineArgs made into the engine's config (the
    draft's config read, nothing loaded)."""
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=str(backend.path), speculative_config=sc, max_model_len=256,
                      enforce_eager=True).create_engine_config()


@needs_vllm
@needs_demo
@pytest.mark.parametrize("system, method", [("mlp", "mlp_speculator"), ("mtp", "mtp")])
def test_a_method_the_demo_has_no_weights_for_is_refused_by_vllms_config_validation_in_one_line(vllm_configs,
                                                                                              system, method):
    """mlp_speculator runs an MLPSpeculator checkpoint, an MTP method a target with MTP layers (vLLM reads the
    method from the draft's model_type): the demo's Qwen3 is neither, and vLLM's config validation says so
    before any weight loads; a run's warm-up gives vLLM's words in one line naming the system."""
    from harness.backends.base import RequestSpec

    backend, prepared = vllm_configs
    sc = prepared[system].handle["speculative_config"]
    with pytest.raises(NotImplementedError, match=f"Unsupported speculative method: '{method}'"):
        _validated(backend, sc)
    with pytest.raises(DSparkError) as exc:
        backend.warmup(prepared[system], 256, RequestSpec(4), [1, 2, 3])
    said = str(exc.value)
    assert "\n" not in said and said.startswith(f"vLLM 0.32.0 could not start system '{system}' (method "
                                                f"{sc['method']}): Unsupported speculative method: '{method}'"), said
    assert prepared[system].handle["engine"] is None and system not in backend.engines  # (nothing started)


@needs_vllm
@needs_demo
def test_medusas_config_passes_vllms_validation_with_the_draft_as_given(vllm_configs):
    """vLLM takes any draft config for medusa (it aligns the vocabulary to the target's): the demo's Qwen3
    passes its validation as method medusa, at the staged path; what fails is loading it (an engine start,
    not run here)."""
    backend, prepared = vllm_configs
    sc = prepared["medusa"].handle["speculative_config"]
    spec = _validated(backend, sc).speculative_config
    assert (spec.method, spec.num_speculative_tokens, spec.draft_model_config.model) == ("medusa", 2, sc["model"])
    assert Path(sc["model"]).name == "medusa"  # (the demo draft at a path naming no method: vllm-drafts/medusa)


def test_parity_refuses_a_system_that_ran_with_another_speculative_config(tmp_path):
    """At main parity compared method, draft, k and markov_topk only: a suffix system at tree depth 16 was held
    against the same system at 24 as if one system."""
    from harness.analysis.parity import check_system

    def manifest(table: dict | None) -> dict:
        system = {"name": "sfx", "method": "suffix", "draft": None, "num_speculative_tokens": 4, "markov_topk": None}
        return {"experiment": {"systems": [system | ({} if table is None else {"speculative_config": table})]}}

    a, b = tmp_path / "a", tmp_path / "b"
    check_system(a, b, manifest({"suffix_decoding_max_tree_depth": 16}),
                 manifest({"suffix_decoding_max_tree_depth": 16}), "sfx")
    check_system(a, b, manifest({}), manifest(None), "sfx")  # (a run from before the table: none given)
    with pytest.raises(DSparkError, match=r"system 'sfx' ran with speculative_config \{'suffix_decoding_max_tree_depth'"
                                          r": 16\} in .* and \{'suffix_decoding_max_tree_depth': 24\} in .*: give the "
                                          "two systems different names"):
        check_system(a, b, manifest({"suffix_decoding_max_tree_depth": 16}),
                     manifest({"suffix_decoding_max_tree_depth": 24}), "sfx")

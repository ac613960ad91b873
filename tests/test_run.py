"""`dspark-bench run` end to end on the demo pair: the README's command, lossless systems matching
plain decoding, a killed run resumed with no request lost or repeated, bad arguments, and a dry run of
the qwen3-8b experiment against stand-ins in every real format."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from cli_runner import run_cli

from dspark.checkpoint import DEMO_DIR, save_draft, save_target
from dspark.config import BackboneConfig, TargetConfig
from dspark.presets import dspark_draft_config
from dspark.tiny import random_draft, random_target
from harness.results import read_requests

needs_demo = pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(),
                                reason="the demo models are not built")
TIMING = {"ttft_ms", "tpot_ms", "e2el_ms", "round_ms", "time_utc", "peak_memory_bytes"}


def _process(args, cwd, env=None, timeout=600):
    script = Path(sys.executable).with_name("dspark-bench")
    if not script.is_file():
        pytest.skip("the dspark-bench console script is not installed next to this Python")
    env = dict(os.environ, COLUMNS="160", **(env or {}))
    return subprocess.run([str(script), *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout)


@needs_demo
def test_readme_main_command(tmp_path):
    """Exactly the README's first command, in a fresh folder: the table, and a complete run folder."""
    proc = _process(["run", "--split", "qualitative", "--category", "coding"], tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    for system in ("plain", "dspark", "dflash", "ngram"):
        assert f"│ {system}" in proc.stdout
    (run_dir,) = (tmp_path / "results").iterdir()
    assert {p.name for p in run_dir.iterdir()} >= {"manifest.json", "requests.jsonl", "summary.json", "summary.csv",
                                                   "summary.md", "summary.png"}
    assert (run_dir / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    records = read_requests(run_dir)
    assert len(records) == 4 * 2 * 8  # systems x temperatures x prompts
    assert {r["category"] for r in records} == {"coding"}
    greedy = [r for r in records if r["temperature"] == 0 and r["system"] != "plain"]
    assert greedy and all(r["matches_baseline"] is True for r in greedy)  # every lossless system equals plain
    summary = json.loads((run_dir / "summary.json").read_text())
    dspark = next(r for r in summary["rows"] if r["system"] == "dspark" and r["temperature"] == 0
                  and r["category"] == "overall")
    assert dspark["spec_decode_acceptance_length"] > 1.5 and dspark["speedup"] > 0
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["provenance"]["git"] and manifest["models"]["target"]["files"]["model.safetensors"]["sha256"]


def _opts(out, **kw):
    from harness.run import RunOptions

    base = dict(split="qualitative", categories=["coding", "math"], experiment="demo", systems=["plain", "dspark"],
                num_prompts=3, output_len=12, temperatures=[0.0, 1.0], turns="all", device="cpu", out=str(out))
    return RunOptions(**(base | kw))


@needs_demo
def test_a_killed_run_resumes_without_losing_or_repeating_requests(tmp_path, monkeypatch):
    from rich.console import Console

    from harness import backends
    from harness.run import run

    console = Console(file=open(os.devnull, "w"))
    whole_dir, _ = run(_opts(tmp_path / "whole"), console)
    whole = read_requests(whole_dir)

    real = backends.NativeBackend.generate
    calls = {"n": 0}

    def dying(self, prepared, prompt, cfg):
        calls["n"] += 1
        if calls["n"] > 5:
            raise KeyboardInterrupt
        return real(self, prepared, prompt, cfg)

    monkeypatch.setattr(backends.NativeBackend, "generate", dying)
    with pytest.raises(KeyboardInterrupt):
        run(_opts(tmp_path / "cut"), console)
    assert len(read_requests(tmp_path / "cut")) == 5
    with (tmp_path / "cut" / "requests.jsonl").open("a") as f:
        f.write('{"system": "plain", "quest')  # the process died mid-write: a torn last line
    monkeypatch.setattr(backends.NativeBackend, "generate", real)
    run(_opts(None, resume=str(tmp_path / "cut")), console)
    resumed = read_requests(tmp_path / "cut")

    def key(r):
        return (r["system"], r["question_id"], r["turn"], r["temperature"])

    assert len(resumed) == len(whole) == len({key(r) for r in resumed})
    assert any(r["turn"] == 1 for r in whole)  # multi-turn rows ran their second turn on the model's reply
    strip = {key(r): {k: v for k, v in r.items() if k not in TIMING} for r in whole}
    assert {key(r): {k: v for k, v in r.items() if k not in TIMING} for r in resumed} == strip


@needs_demo
def test_run_refuses_bad_arguments(tmp_path, monkeypatch, capfd):
    cases = [
        (["--concurrency", "4"], "one request at a time"),
        (["--category", "cooking"], "unknown category 'cooking' for qualitative; valid: coding, humanities"),
        (["--systems", "eagle"], "'eagle' is not in experiment demo"),
        (["--experiment", "nope"], "unknown experiment 'nope'"),
        (["--split", "throughput_32k"], "demo suite has no 'throughput_32k'"),
        (["--turns", "some"], "--turns some"),
    ]
    for extra, message in cases:
        code, _, err = run_cli(monkeypatch, capfd, "run", "--out", tmp_path / "x", *extra)
        assert code == 2 and message in err and "Traceback" not in err, (extra, err)
        assert len(err.strip().splitlines()) == 1
    args = ["run", "--category", "coding", "--systems", "plain", "--num-prompts", "1", "--output-len", "4",
            "--temperature", "0", "--device", "cpu", "--out", tmp_path / "r"]
    assert run_cli(monkeypatch, capfd, *args)[0] == 0
    code, _, err = run_cli(monkeypatch, capfd, "run", "--category", "coding", "--systems", "plain", "--num-prompts",
                           "2", "--output-len", "4", "--temperature", "0", "--device", "cpu", "--resume", tmp_path / "r")
    assert code == 2 and "'num_prompts' was 1, now 2" in err
    code, _, err = run_cli(monkeypatch, capfd, *args)
    assert code == 2 and "already holds a run" in err
    code, out, _ = run_cli(monkeypatch, capfd, "report", tmp_path / "r", "--json")
    assert code == 0 and json.loads(out)[str(tmp_path / "r")]["rows"][0]["system"] == "plain"


def _hub_snapshot(cache: Path, repo: str) -> Path:
    """A folder laid out as the Hugging Face cache holds a downloaded repository."""
    root = cache / f"models--{repo.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef" + f"{abs(hash(repo)) % 10**8:08d}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    return root / "snapshots" / commit


def test_dry_run_of_the_qwen3_8b_experiment_against_stand_ins(tmp_path):
    """Small stand-ins with Qwen3-8B's depth and vocabulary in each real format, served from a hub cache
    offline: every system resolves to its format and method through the real hub-id loading code."""
    small = BackboneConfig(hidden_size=16, intermediate_size=32, num_layers=36, num_heads=2, num_kv_heads=1,
                           head_dim=8, rms_norm_eps=1e-6, rope_theta=1e6, vocab_size=151936)
    tcfg = TargetConfig(backbone=small, tie_word_embeddings=False, max_position_embeddings=40960,
                        eos_token_ids=(151645, 151643))
    cache = tmp_path / "hub"
    target = random_target(tcfg, 0, dtype=torch.bfloat16)
    save_target(target, _hub_snapshot(cache, "Qwen/Qwen3-8B"))
    dspark = dspark_draft_config(tcfg, layers=1, markov_rank=8)
    dflash = dspark_draft_config(tcfg, layers=1, markov_rank=0, confidence=False)
    zlab = replace(dspark_draft_config(tcfg, block_size=16, layers=1, markov_rank=0, confidence=False,
                                       sample_from_anchor=False), format="zlab")
    for repo, cfg, fmt in (("deepseek-ai/dspark_qwen3_8b_block7", dspark, "deepspec"),
                           ("Dogacel/Qwen3-8B-DSpark", replace(dspark, format="speculators"), "speculators"),
                           ("deepseek-ai/dflash_qwen3_8b_block7", dflash, "deepspec"),
                           ("z-lab/Qwen3-8B-DFlash-b16", zlab, "zlab")):
        save_draft(random_draft(cfg, target), _hub_snapshot(cache, repo), fmt, tcfg, verifier="Qwen/Qwen3-8B")
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    proc = _process(["run", "--experiment", "qwen3-8b", "--dry-run", "--json"], tmp_path, env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["system"]: r for r in json.loads(proc.stdout)}
    assert list(rows) == ["plain", "dspark-deepseek", "dspark-dogacel", "dflash-deepseek", "dflash-zlab", "ngram"]
    assert [(rows[s]["format"], rows[s]["method"], rows[s]["num_speculative_tokens"]) for s in rows] == [
        (None, "plain", 0), ("deepspec", "dspark", 7), ("speculators", "dspark", 7), ("deepspec", "dflash", 7),
        ("zlab", "dflash", 15), (None, "ngram", 7)]
    assert all(r["fits_target"] for r in rows.values())
    # a draft that does not fit (another vocabulary) is reported, and the dry run exits 1
    bad = replace(dspark, backbone=replace(small, vocab_size=1000), mask_token_id=999)
    other = random_target(replace(tcfg, backbone=replace(small, vocab_size=1000)), 0)
    path = cache / "models--deepseek-ai--dspark_qwen3_8b_block7" / "snapshots"
    save_draft(random_draft(bad, other), next(path.iterdir()), "deepspec", tcfg)
    proc = _process(["run", "--experiment", "qwen3-8b", "--dry-run"], tmp_path, env)
    assert proc.returncode == 1 and "NO" in proc.stdout


@needs_demo
def test_custom_experiment_baseline_by_method_and_input_checks(tmp_path, monkeypatch, capfd):
    exp = tmp_path / "mine.toml"
    exp.write_text('name = "mine"\ntarget = "demo"\ndataset = "demo"\n[sampling]\ntemperatures = [0.0]\n'
                   'output_len = 10\n[[systems]]\nname = "baseline"\nmethod = "plain"\n'
                   '[[systems]]\nname = "spark"\ndraft = "demo-dspark"\nmethod = "dspark"\n')
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({"question_id": f"q{i}", "category": "coding", "turns": [t]}) + "\n"
                            for i, t in enumerate(["Write a function `add(a, b)`.", "Write `is_even(n)`."])))
    args = ["run", "--experiment", exp, "--dataset-path", data, "--device", "cpu"]
    code, out, err = run_cli(monkeypatch, capfd, *args, "--out", tmp_path / "r", "--json")
    assert code == 0, err
    spark = next(r for r in json.loads(out)["rows"] if r["system"] == "spark" and r["category"] == "overall")
    assert spark["speedup"] is not None and spark["matches_baseline"] == 2  # the plain system, whatever its name
    data.write_text(data.read_text().replace("add(a, b)", "sub(a, b)"))  # the prompts changed under the run
    code, _, err = run_cli(monkeypatch, capfd, *args, "--resume", tmp_path / "r")
    assert code == 2 and "the dataset differ from the run's" in err
    exp.write_text(exp.read_text().replace('method = "dspark"\n', 'method = "dspark"\nnum_speculative_tokens = 5\n'))
    code, _, err = run_cli(monkeypatch, capfd, *args, "--out", tmp_path / "r2")
    assert code == 2 and "proposes 7 tokens per round, but the experiment says 5" in err

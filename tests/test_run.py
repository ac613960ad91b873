"""`dspark-bench run` end to end on the demo pair: the README's command, lossless systems matching
plain decoding, a killed run resumed with no request lost or repeated, bad arguments, and a dry run of
the qwen3-8b experiment against stand-ins in every real format."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from cli_runner import run_cli, run_watched

from dspark.checkpoint import DEMO_DIR, save_draft, save_target
from dspark.models.config import BackboneConfig, TargetConfig
from dspark.synthetic.presets import dspark_draft_config, eagle3_draft_config
from dspark.synthetic.tiny import random_draft, random_eagle3, random_target
from harness.analysis.records import read_requests

needs_demo = pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(),
                                reason="the demo models are not built")
TIMING = {"ttft_ms", "tpot_ms", "e2el_ms", "round_ms", "time_utc", "start_utc", "wave", "peak_memory_bytes",
          "contention"}


def _process(args, cwd, env=None, timeout=600, base_env=None):
    """`dspark-bench ARGS` as a user runs it, its output piped (not a terminal)."""
    script = Path(sys.executable).with_name("dspark-bench")
    if not script.is_file():
        pytest.skip("the dspark-bench console script is not installed next to this Python")
    env = dict(os.environ if base_env is None else base_env, **(env or {}))
    return subprocess.run([str(script), *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout)


BUSY = "import time\nend = time.monotonic() + 330\nwhile time.monotonic() < end:\n    pass\n"


@needs_demo
def test_readme_main_command(tmp_path):
    """Exactly the README's first command, in a fresh folder, beside a competing CPU-bound process (the
    machine of a user with other work running), never silent for 5 minutes: a table with every cell whole in a
    log, progress lines, the files it wrote, and a complete run folder on one chosen thread."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    busy = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        proc = run_watched([Path(sys.executable).with_name("dspark-bench"), "run", "--split", "qualitative",
                            "--category", "coding"], cwd=tmp_path, env=env)  # (hung: silent for 5 min)
    finally:
        busy.kill()
        busy.wait()
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    for system in ("plain", "dspark", "dflash", "eagle3", "draft_model", "dflash2", "ngram"):
        assert f"│ {system}" in proc.stdout
    assert "…" not in proc.stdout and "│ speedup │" in proc.stdout.replace("┃", "│")  # no header or cell cut
    legend = " ".join(proc.stdout.split())  # (the caption wraps at the table's width)
    assert "AL: acceptance length" in legend and "= plain: greedy outputs equal" in legend  # the legend, whole
    (run_dir,) = (tmp_path / "results").iterdir()
    assert f"wrote {run_dir.relative_to(tmp_path)}: manifest.json, requests.jsonl, summary.json" in proc.stdout
    assert "[0/112 requests, 0 s] warm-up plain T=0 (untimed)" in proc.stderr and "[112/112 requests," in proc.stderr
    assert "T=0 coding plain" in proc.stderr  # the timed requests: systems alternate within a temperature
    assert "threads: 1 (auto: target weights 14 MB" in proc.stderr
    assert {p.name for p in run_dir.iterdir()} >= {"manifest.json", "requests.jsonl", "summary.json", "summary.csv",
                                                   "summary.md", "summary.png"}
    assert (run_dir / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    records = read_requests(run_dir)
    assert len(records) == 7 * 2 * 8  # systems x temperatures x prompts
    assert {r["category"] for r in records} == {"coding"}
    assert all(len(r["load_avg"]) == 2 for r in records)
    for r in records:  # each DSpark round's slot confidences, recorded; no other system has a confidence head
        confidences = r.get("draft_confidences")
        assert (len(confidences) == r["num_rounds"] and {len(c) for c in confidences} == {7}) \
            if r["system"] == "dspark" else confidences is None
    greedy = [r for r in records if r["temperature"] == 0 and r["system"] != "plain"]
    assert greedy and all(r["matches_baseline"] is True for r in greedy)  # every lossless system equals plain
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["complete"] is True and summary["requests_done"] == summary["requests_expected"] == 112
    dspark = next(r for r in summary["rows"] if r["system"] == "dspark" and r["temperature"] == 0
                  and r["category"] == "overall")
    assert dspark["spec_decode_acceptance_length"] > 1.5 and dspark["speedup"] > 0
    assert dspark["std_tpot_ms"] > 0 and dspark["load_avg_max"] is not None
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["provenance"]["git"] and manifest["models"]["target"]["files"]["model.safetensors"]["sha256"]
    assert manifest["threads"]["count"] == 1 and manifest["provenance"]["threads"] == 1
    assert manifest["options"]["categories"] == ["coding"] and manifest["prompts_selected"] == 8


@needs_demo
def test_resume_from_the_folder_alone_gives_the_uninterrupted_requests(tmp_path, monkeypatch, capfd):
    """Killed after 5 requests (and a torn last line), then `run --resume DIR` with no other argument:
    the same requests as an uninterrupted run, each once (multi-turn rows included); the interrupted
    run's summary and `report` say it is incomplete; an argument given with --resume must equal the run's."""
    from harness.backends import native as backends

    args = ["run", "--category", "coding,math", "--systems", "plain,dspark", "--num-prompts", "3",
            "--output-len", "10", "--temperature", "0,1", "--turns", "all", "--device", "cpu"]
    code, _, err = run_cli(monkeypatch, capfd, *args, "--out", tmp_path / "whole")
    assert code == 0, err
    whole = read_requests(tmp_path / "whole")
    real, calls = backends.NativeBackend.generate, {"n": 0}

    def dying(self, prepared, prompt, cfg):
        calls["n"] += 1
        if calls["n"] > 5:
            raise KeyboardInterrupt
        return real(self, prepared, prompt, cfg)

    cut = tmp_path / "cut"
    monkeypatch.setattr(backends.NativeBackend, "generate", dying)
    code, _, err = run_cli(monkeypatch, capfd, *args, "--out", cut)
    assert code == 130 and f"continue with: dspark-bench run --resume {cut}" in err
    assert err.count("interrupted") == 1  # said once, with what was kept
    summary = json.loads((cut / "summary.json").read_text())
    assert (summary["complete"], summary["requests_done"], summary["requests_expected"]) == (False, 5, len(whole))
    code, out, _ = run_cli(monkeypatch, capfd, "report", cut)
    assert code == 0 and f"INCOMPLETE: 5 of {len(whole)} requests done" in out and "incomplete run" in out
    monkeypatch.setattr(backends.NativeBackend, "generate", real)
    with (cut / "requests.jsonl").open("a") as f:
        f.write('{"system": "plain", "quest')  # the process died mid-write: a torn last line

    code, _, err = run_cli(monkeypatch, capfd, "run", "--resume", cut, "--output-len", "11")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--output-len was 10 in this run, now 11; drop --output-len" in err
    code, out, err = run_cli(monkeypatch, capfd, "run", "--resume", cut)  # the folder alone
    assert code == 0, err
    assert f"resuming {cut}: 5 of {len(whole)} requests already done" in err
    resumed = read_requests(cut)

    def key(r):
        return (r["system"], r["question_id"], r["turn"], r["temperature"])

    assert len(resumed) == len(whole) == len({key(r) for r in resumed})
    assert any(r["turn"] == 1 for r in whole)  # multi-turn rows ran their second turn on the model's reply
    strip = {key(r): {k: v for k, v in r.items() if k not in TIMING | {"load_avg"}} for r in whole}
    assert {key(r): {k: v for k, v in r.items() if k not in TIMING | {"load_avg"}} for r in resumed} == strip
    assert json.loads((cut / "summary.json").read_text())["complete"] is True
    for again in ([], ["--output-len", "10"], ["--seed", "0"]):  # an option equal to the run's (given or resolved)
        code, _, err = run_cli(monkeypatch, capfd, "run", "--resume", cut, *again)
        assert code == 0 and f"{len(whole)} of {len(whole)} requests already done" in err, err  # nothing repeated
    assert len(read_requests(cut)) == len(whole)


@needs_demo
def test_run_refuses_bad_arguments(tmp_path, monkeypatch, capfd):
    cases = [
        (["--concurrency", "4"], "one request at a time"),
        (["--category", "cooking"], "unknown category 'cooking' for qualitative; valid: coding, humanities"),
        (["--systems", "eagle"], "'eagle' is not in experiment demo"),
        (["--experiment", "nope"], "unknown experiment 'nope'"),
        (["--split", "throughput_32k"], "demo suite has no 'throughput_32k'"),
        (["--turns", "some"], "--turns some"),
        (["--output-len", "0"], "--output-len is 0; give at least 1"),
        (["--output-len", "-5"], "--output-len is -5; give at least 1"),
        (["--num-prompts", "0"], "--num-prompts is 0; give at least 1"),
        (["--num-prompts", "many"], "Invalid value for '--num-prompts'"),
        (["--threads", "0"], "--threads is 0; give at least 1"),
        (["--temperature", "hot"], "--temperature must be numbers"),
        (["--temperature", ","], "--temperature ',' names no temperature"),
        (["--systems", ","], "--systems ',' names nothing"),
        (["--threads", "0", "--dry-run"], "--threads is 0; give at least 1"),
        (["--ignore-eos", "true"], "unexpected extra argument"),
        (["--bogus"], "No such option: --bogus"),
    ]
    for extra, message in cases:
        code, _, err = run_cli(monkeypatch, capfd, "run", "--out", tmp_path / "x", "--device", "cpu", *extra)
        assert code == 2 and message.lower() in err.lower() and "Traceback" not in err, (extra, err)
        assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "x").exists()  # refused before anything was written
    args = ["run", "--category", "coding", "--systems", "plain", "--num-prompts", "100", "--output-len", "2",
            "--temperature", "0", "--device", "cpu", "--out", tmp_path / "r"]
    code, _, err = run_cli(monkeypatch, capfd, *args)
    assert code == 0 and "notice: 100 prompts asked for, but qualitative coding has 18: running 18" in err
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert manifest["settings"]["num_prompts"] == 100 and manifest["prompts_selected"] == 18
    assert len(read_requests(tmp_path / "r")) == 18
    code, _, err = run_cli(monkeypatch, capfd, "run", "--num-prompts", "2", "--resume", tmp_path / "r")
    assert code == 2 and "--num-prompts was 100 in this run, now 2" in err
    code, _, err = run_cli(monkeypatch, capfd, *args)
    assert code == 2 and "already holds a run" in err
    code, out, _ = run_cli(monkeypatch, capfd, "report", tmp_path / "r", "--json")
    assert code == 0 and json.loads(out)[str(tmp_path / "r")]["rows"][0]["system"] == "plain"
    code, _, err = run_cli(monkeypatch, capfd, "report", tmp_path / "r", "--category", "cooking")
    assert code == 2 and err.strip() == "error: --category cooking: not in this run; it has overall, coding"


@needs_demo
def test_selection_and_dtype_mistakes_answer_before_the_table_and_the_models(tmp_path, monkeypatch, capfd):
    """A mistyped category, split, data file or dtype is refused in one line before a dry run prints its
    systems table, and before a run loads its models (the runner's session is never opened)."""
    from harness.runs import runner

    def never(*args, **kwargs):
        raise AssertionError("the run loaded its models before checking the prompts")

    monkeypatch.setattr(runner.Session, "open", never)
    cases = [(["--category", "codng"], "unknown category 'codng' for qualitative; valid: coding, humanities"),
             (["--split", "qualitativ"], "unknown split 'qualitativ'; use one of qualitative, throughput_1k"),
             (["--dataset-path", tmp_path / "nothere.jsonl"], f"--dataset-path {tmp_path / 'nothere.jsonl'}: no such "
                                                              "file or folder"),
             (["--dtype", "fp17"], "--dtype fp17: unknown dtype; use one of auto, float32")]
    for extra, message in cases:
        for mode in (["--dry-run"], ["--out", tmp_path / "run"]):
            code, out, err = run_cli(monkeypatch, capfd, "run", "--device", "cpu", *mode, *extra)
            assert code == 2 and out == "" and err.startswith(f"error: {message}") and len(err.splitlines()) == 1, \
                (extra, mode, out, err)
    assert not (tmp_path / "run").exists()


@needs_demo
def test_resume_names_an_option_the_run_was_not_given_as_such(tmp_path, monkeypatch, capfd):
    """`--resume R --num-prompts 4` where R ran without --num-prompts says the run took the experiment's
    default (not that the option 'was null')."""
    run = tmp_path / "r"
    code, _, err = run_cli(monkeypatch, capfd, "run", "--category", "coding", "--systems", "plain", "--output-len", "2",
                           "--temperature", "0", "--device", "cpu", "--out", run)
    assert code == 0, err
    code, _, err = run_cli(monkeypatch, capfd, "run", "--resume", run, "--num-prompts", "4")
    assert code == 2 and err == (f"error: --resume {run}: --num-prompts was not given (the experiment's default, 8) "
                                 "in this run, now 4; drop --num-prompts to continue the run as it was started\n")


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
    eagle3 = eagle3_draft_config(tcfg, draft_vocab_size=4000)
    for repo, fmt, qk_norm in (("RedHatAI/Qwen3-8B-speculator.eagle3", "speculators-eagle3", False),
                               ("AngelSlim/Qwen3-8B_eagle3", "eagle", False), ("Tengyunw/qwen3_8b_eagle3", "eagle", False),
                               ("deepseek-ai/eagle3_qwen3_8b_ttt7", "deepspec-eagle3", True)):
        cfg = replace(eagle3, format=fmt, qk_norm=qk_norm,
                      draft_vocab_size=None if fmt == "deepspec-eagle3" else eagle3.draft_vocab_size)
        save_draft(random_eagle3(cfg, target), _hub_snapshot(cache, repo), fmt, tcfg, verifier="Qwen/Qwen3-8B",
                   with_embeddings=False)
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    proc = _process(["run", "--experiment", "qwen3-8b", "--dry-run", "--json"], tmp_path, env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["system"]: r for r in json.loads(proc.stdout)["systems"]}
    assert list(rows) == ["plain", "dspark-deepseek", "dspark-dogacel", "dflash-deepseek", "dflash-zlab",
                          "eagle3-redhat", "eagle3-angelslim", "eagle3-tengyunw", "eagle3-deepseek", "ngram"]
    assert [(rows[s]["format"], rows[s]["method"], rows[s]["num_speculative_tokens"]) for s in rows] == [
        (None, "plain", 0), ("deepspec", "dspark", 7), ("speculators", "dspark", 7), ("deepspec", "dflash", 7),
        ("zlab", "dflash", 15), ("speculators-eagle3", "eagle3", 7), ("eagle", "eagle3", 7), ("eagle", "eagle3", 7),
        ("deepspec-eagle3", "eagle3", 7), (None, "ngram", 7)]
    assert rows["eagle3-angelslim"]["taps"] == [1, 17, 32] and rows["eagle3-angelslim"]["vllm_method"] == "eagle3"
    assert all(r["fits_target"] for r in rows.values())
    # the same systems on vLLM: the same drafts, formats and methods resolve
    proc = _process(["run", "--experiment", "qwen3-8b-vllm", "--dry-run", "--json"], tmp_path, env)
    if importlib.util.find_spec("vllm") is None:  # (vLLM missing: the dry run says so, as the run would)
        assert proc.returncode == 2 and "pip install" in proc.stderr, proc.stderr[-2000:]
        return
    # vLLM's CPU build cannot run the deepspec-format DFlash draft, nor dspark (its V2 runner) where Triton has no CPU
    # backend: there the dry run ends as the run would, exit 2
    from harness.backends.vllm.checks import triton_cpu

    refused = [r["system"] for r in json.loads(proc.stdout)["systems"] if not r["fits_target"]]
    expected = [] if torch.cuda.is_available() else (
        ([] if triton_cpu() else ["dspark-deepseek", "dspark-dogacel"]) + ["dflash-deepseek"])
    assert refused == expected and proc.returncode == (2 if refused else 0), proc.stderr[-2000:]
    assert [{k: r[k] for k in ("system", "format", "method")} for r in json.loads(proc.stdout)["systems"]] == \
        [{k: r[k] for k in ("system", "format", "method")} for r in rows.values()]
    # a draft that does not fit (another vocabulary) is reported, and the dry run exits 2 naming it
    bad = replace(dspark, backbone=replace(small, vocab_size=1000), mask_token_id=999)
    other = random_target(replace(tcfg, backbone=replace(small, vocab_size=1000)), 0)
    path = cache / "models--deepseek-ai--dspark_qwen3_8b_block7" / "snapshots"
    save_draft(random_draft(bad, other), next(path.iterdir()), "deepspec", tcfg)
    proc = _process(["run", "--experiment", "qwen3-8b", "--dry-run"], tmp_path, env)
    assert proc.returncode == 2 and "NO" in proc.stdout and "the run would refuse system dspark-deepseek" in proc.stderr


@needs_demo
def test_dry_run_sizes_the_run_and_estimates_its_time_from_an_earlier_run(tmp_path, monkeypatch, capfd):
    """`run --dry-run` says how big the run is (prompts x temperatures x systems = requests; output tokens,
    a bound unless --ignore-eos) and how long its timed part should take: no estimate while nothing like
    it ran on a machine of this kind; after a run in results/, that run's time per output token of each
    system (at the nearest temperature) times this run's tokens, the run named."""
    monkeypatch.chdir(tmp_path)
    exp = tmp_path / "mine.toml"  # the demo pair under a target name no committed run has
    exp.write_text(f'name = "mine"\ntarget = "{DEMO_DIR / "target"}"\ndataset = "demo"\n[sampling]\n'
                   'temperatures = [0.0, 1.0]\noutput_len = 8\n[[systems]]\nname = "baseline"\nmethod = "plain"\n'
                   '[[systems]]\nname = "spark"\ndraft = "demo-dspark"\nmethod = "dspark"\n')
    args = ["run", "--experiment", exp, "--category", "coding", "--device", "cpu"]
    code, out, err = run_cli(monkeypatch, capfd, *args, "--num-prompts", "3", "--dry-run")
    assert code == 0, err
    assert ("size: 3 prompts x 2 temperatures x 2 systems = 12 requests; at most 96 output tokens (8 a request, "
            "fewer where a reply ends sooner)") in out
    assert "time: no estimate: no earlier run of" in out and "a short run (--num-prompts 2) makes one" in out

    code, _, err = run_cli(monkeypatch, capfd, *args, "--num-prompts", "2", "--temperature", "0", "--out",
                           "results/first")
    assert code == 0, err
    code, out, err = run_cli(monkeypatch, capfd, *args, "--num-prompts", "3", "--ignore-eos", "--dry-run", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert [r["system"] for r in plan["systems"]] == ["baseline", "spark"]
    assert {k: plan["size"][k] for k in ("prompts", "user_turns", "requests", "output_tokens", "output_tokens_exact")} \
        == {"prompts": 3, "user_turns": 3, "requests": 12, "output_tokens": 96, "output_tokens_exact": True}
    guess, first = plan["estimate"], (tmp_path / "results" / "first").resolve()
    assert guess["ways"] == ["earlier runs"] and [s["path"] for s in guess["sources"]] == [str(first)]
    assert (guess["requests"], guess["of"], guess["missing"]) == (12, 12, [])
    rows = json.loads((first / "summary.json").read_text())["rows"]
    per_token = {r["system"]: r["duration_s"] / r["output_tokens"] for r in rows if r["category"] == "overall"}
    expected = 2 * 3 * 8 * (per_token["baseline"] + per_token["spark"])  # both temperatures from the run's T = 0
    assert guess["seconds"] == pytest.approx([expected, expected])
    code, out, _ = run_cli(monkeypatch, capfd, *args, "--num-prompts", "3", "--dry-run")
    assert code == 0 and "time: about " in out and "from earlier runs on a machine like this one" in out
    assert "  results/first (measured " in out and "loading, warm-up and a server's start are not counted" in out


def test_a_dry_runs_estimate_from_engine_bench_step_costs():
    """With no earlier run, our engine's time comes from an engine-bench measurement on this GPU of a target
    of the same shape (the committed H200 ones, for Qwen3-8B): plain decoding a decode step per token; a
    draft of the bench's method and block between a round per block + 1 tokens and a round per token; a
    system of another kind gets no figure, and says so."""
    from dspark.synthetic.presets import TARGETS
    from harness.runs.estimate import estimate

    settings = {"backend": "native", "target": "Qwen/Qwen3-8B", "device": "cuda", "dtype": "auto",
                "output_len": 2048, "ignore_eos": False}
    systems = [{"system": "plain", "method": "plain", "num_speculative_tokens": 0},
               {"system": "dspark", "method": "dspark", "num_speculative_tokens": 7},
               {"system": "ngram", "method": "ngram", "num_speculative_tokens": 7}]
    jobs = [(s["system"], 1, 0.0, None, 0) for s in systems for _ in range(2)]  # two prompts each
    guess = estimate(settings, jobs, systems, TARGETS["qwen3-8b"], {"gpu": "NVIDIA H200"}, "bfloat16")
    assert guess["ways"] == ["engine-bench"] and guess["missing"] == ["ngram T=0"]
    assert (guess["requests"], guess["of"]) == (4, 6)
    (source,) = guess["sources"]
    bench = json.loads(Path(source["path"]).read_text())
    assert bench["provenance"]["gpu"] == "NVIDIA H200" and bench["provenance"]["arguments"]["target"] == "qwen3-8b"
    tokens = 2 * 2048
    assert guess["seconds"] == pytest.approx([tokens * (bench["decode_ms"] + bench["round_ms"] / 8) / 1e3,
                                              tokens * (bench["decode_ms"] + bench["round_ms"]) / 1e3])
    assert any("engine-bench times a step alone" in c for c in guess["caveats"])


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

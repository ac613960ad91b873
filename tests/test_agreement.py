"""Issue 56's agreement maths (`harness/analysis/agreement.py`, used by `benchmarks/load_generators.py`):
the paired difference and its t interval over interleaved pairs, the counts that must be equal flagged
pair by pair, chunks read together (a late reader's zero gaps), and the cause named from the readings.
The end-to-end check on a real server (both load generators, two levels) is in tests/test_aiperf.py.
"""

from __future__ import annotations

import pytest

from harness.analysis.agreement import cause, compare, mismatches, paired, run_figures, together


def figures(requests=8, tokens=512, acceptance="128/357", failed=0, tpot=4.0, tput=800.0, chunks=50.0, gaps=0.1):
    return {"requests": requests, "failed": failed, "output_tokens": tokens, "counter_acceptance": acceptance,
            "mean_ttft_ms": 70.0, "median_ttft_ms": 70.0, "p99_ttft_ms": 90.0, "mean_tpot_ms": tpot,
            "median_tpot_ms": tpot, "p99_tpot_ms": tpot, "mean_itl_ms": tpot, "median_itl_ms": tpot,
            "p99_itl_ms": tpot, "output_throughput": tput, "chunks_per_request": chunks, "gaps_together": gaps}


def test_paired_difference_and_its_t_interval():
    out = paired([10.0, 12.0, 11.0], [11.0, 14.0, 12.0])  # differences 1, 2, 1
    assert out["pairs"] == 3 and out["diff"] == pytest.approx(4 / 3) and out["rel"] == pytest.approx((4 / 3) / 11)
    half = 4.302653 * (1 / 3) ** 0.5 / 3 ** 0.5  # t(0.975, 2) x sd / sqrt(n), sd of (1, 2, 1) = sqrt(1/3)
    assert out["ci95"] == pytest.approx([4 / 3 - half, 4 / 3 + half], rel=1e-5)
    assert paired([5.0], [6.0])["ci95"] is None  # one pair: a difference, no interval
    assert paired([None], [None])["pairs"] == 0


def test_counts_that_differ_are_flagged_per_pair():
    assert mismatches([figures()], [figures()]) == []
    said = mismatches([figures(), figures()], [figures(), figures(tokens=500, acceptance="120/357", failed=1)])
    assert said == ["pair 2: output_tokens ours 512 aiperf 500", "pair 2: counter_acceptance ours 128/357 aiperf "
                    "120/357", "pair 2: aiperf failed 1"]


def test_chunks_read_together():
    assert together([0.0, 0.01, 3.0, 4.0]) == 0.5 and together([]) is None


def test_figures_from_a_run():
    row = {"requests": 2, "failed": 0, "output_tokens": 16, "mean_tpot_ms": 3.0, "output_throughput": 100.0}
    waves = [{"spec_counters": {"num_draft_tokens": 10, "num_accepted_draft_tokens": 4}},
             {"spec_counters": {"num_draft_tokens": 5, "num_accepted_draft_tokens": 1}}]
    out = run_figures(row, waves, [{"itl_ms": [0.0, 2.0, 3.0]}, {"itl_ms": [1.0]}, {"failed": True}])
    assert (out["counter_acceptance"], out["chunks_per_request"], out["gaps_together"]) == ("5/15", 3.0, 0.25)
    assert run_figures(row, [{}], [])["counter_acceptance"] is None  # plain decoding: no counters, said as none


def cpu(ours_client, aiperf_client, server):
    return {"ours": {"client_cores": ours_client, "server_cores": server},
            "aiperf": {"client_cores": aiperf_client, "server_cores": server}}


def test_cause_from_the_readings():
    same = compare([figures()] * 2, [figures()] * 2)
    assert cause(same, cpu(0.2, 0.3, 1.0), 16) == "agree within 5 % on TPOT and throughput"
    late = compare([figures()] * 2, [figures(tpot=2.0, tput=600.0, gaps=0.9)] * 2)
    said = cause(late, cpu(0.2, 0.3, 1.7), 2)
    assert said.startswith("late reads (10 % vs 90 %") and "shared cores (server + AIPerf 2.00 of 2)" in said
    busy = compare([figures()] * 2, [figures(tput=700.0, chunks=40.0)] * 2)
    said = cause(busy, cpu(0.2, 1.0, 1.0), 16)
    assert said == "chunking (50.0 vs 40.0 chunks a request); client overhead (AIPerf 1.00 cores, ours 0.20)"
    unknown = compare([figures()] * 2, [figures(tput=700.0)] * 2)
    assert cause(unknown, cpu(0.2, 0.2, 1.0), 16).startswith("not found")


@pytest.mark.parametrize("target, sends_ids", [("random:demo", True), ("demo", False)])
def test_openai_backend_sends_ids_to_a_random_weight_server(target, sends_ids):
    """The agreement at the GPU study's shapes measures a random-weight server the harness started (no
    tokenizer there: skip_tokenizer_init) through `--backend openai`: our client must send completions of
    our prompt ids to it, as AIPerf does and as `vllm-server` does, not chats it cannot template."""
    import http.server
    import json
    import threading

    from harness.backends.served.openai import OpenAIBackend

    class Models(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802  (http.server's name)
            found = self.path == "/v1/models"
            self.send_response(200 if found else 404)
            self.end_headers()
            self.wfile.write(json.dumps({"data": [{"id": "m", "owned_by": "vllm"}]}).encode() if found else b"")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        backend = OpenAIBackend(target, "cpu", "auto", server={"base_url": f"http://127.0.0.1:{server.server_port}"})
    finally:
        server.shutdown()
    assert backend.sends_ids is sends_ids
    assert ("completions of our prompt ids" in backend.record()["engine"]) is sends_ids


def test_the_benchmark_assembles_a_level_and_its_table():
    """`benchmarks/load_generators.py`'s own bookkeeping on readings as its runs give them: AIPerf's worker
    formula, a level's result (its mismatches, mean CPU, cause) and the CSV's rows (AIPerf - ours in %)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "load_generators.py"
    spec = importlib.util.spec_from_file_location("load_generators", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert [bench.aiperf_workers(n) for n in (1, 2, 16, 64)] == [1, 1, 11, 32]
    readings = {"client_cores": 0.2, "server_cores": 1.0, "load_avg": 1.5, "run_cpu_s": 5.0}
    pairs = [{"ours": figures() | {"cpu": readings}, "aiperf": figures(tput=880.0) | {"cpu": readings}}] * 2
    level = bench.level_result(pairs, 16)
    assert level["mismatches"] == [] and level["cpu"]["aiperf"] == readings
    assert level["cause"].startswith("not found")  # throughput 10 % apart, nothing in the readings to say why
    rows = bench.rows({"systems": {"ngram": {"4": level}}})
    tput = next(r for r in rows if r["figure"] == "output_throughput")
    assert (tput["ours"], tput["aiperf"], tput["diff_pct"], tput["pairs"]) == (800.0, 880.0, pytest.approx(10.0), 2)

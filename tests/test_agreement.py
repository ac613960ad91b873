"""Issue 56's agreement maths (`harness/analysis/agreement.py`, used by `benchmarks/load_generators.py`):
the paired difference and its t interval over interleaved pairs, the counts that must be equal flagged
pair by pair, chunks read together (a late reader's zero gaps), the verdict from the whole interval, the
cause named only from readings that hold in every pair; the script's one-line refusals and `--recompute`.
The end-to-end check on a real server (both load generators, two levels) is in tests/test_aiperf.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.analysis.agreement import cause, compare, mismatches, paired, run_figures, together, verdict
from tests.scripts import load_script


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


def cpu(ours_client, aiperf_client, server, load=1.0):
    return {"client_cores": ours_client, "server_cores": server, "load_avg": load}, \
        {"client_cores": aiperf_client, "server_cores": server, "load_avg": load}


def level(ours: list[dict], theirs: list[dict], readings: list[tuple] | None = None) -> tuple[dict, list[dict]]:
    """A level's comparison and its pairs, each run carrying its CPU readings (default: a quiet machine)."""
    readings = readings or [cpu(0.2, 0.3, 1.0)] * len(ours)
    pairs = [{"ours": o | {"cpu": r[0]}, "aiperf": t | {"cpu": r[1]}} for o, t, r in zip(ours, theirs, readings)]
    return compare(ours, theirs), pairs


def test_the_verdict_reads_the_whole_interval_not_the_mean():
    """The H100's c=16 throughput: AIPerf +0.9 % on the mean of two pairs, one of them +5.4 %: its interval
    reaches +-57 % of ours, so no difference is detected, and nothing is said to agree."""
    tput = paired([2018.3, 2079.6], [2126.5, 2006.4])
    assert f"{100 * tput['rel']:+.1f} %" == "+0.9 %"
    assert verdict(tput) == "no difference detected (interval +-57 %)"
    assert verdict(paired([6.75, 6.74], [6.75, 6.74])) == "agree within 5 % (+0.0 to +0.0 %)"
    assert verdict(paired([100.0, 100.0, 100.0], [80.0, 81.0, 79.0])) == "AIPerf -20.0 % (-22.5 to -17.5 %)"
    assert verdict(paired([3055.1], [3663.8])) == "one pair: no verdict"
    wide = level([figures(tput=2018.3), figures(tput=2079.6)], [figures(tput=2126.5), figures(tput=2006.4)])
    assert cause(*wide, 16) == ("TPOT agree within 5 % (+0.0 to +0.0 %); throughput no difference detected "
                                "(interval +-57 %)")
    assert cause(*level([figures()], [figures(tput=1000.0)]), 16) == "one pair: no verdict"


def test_a_cause_holds_in_every_pair():
    """Late reads are named (with the client that read late) only where every pair leans the same way; a
    mean that one pair of three carries names nothing."""
    ours = [figures(tput=t) for t in (800.0, 810.0, 790.0)]
    theirs = [figures(tput=t, gaps=0.9) for t in (600.0, 620.0, 590.0)]
    said = cause(*level(ours, theirs), 16)
    assert said.startswith("TPOT agree within 5 %") and "throughput AIPerf -24.6 % (-26.4 to -22.8 %)" in said
    assert "cause: late reads by AIPerf (90 % of its chunk gaps under 0.05 ms, ours 10 %, higher in 3 of 3" in said
    one = [figures(tput=t, gaps=g) for t, g in ((600.0, 1.0), (620.0, 0.05), (590.0, 0.0))]  # mean +25 points
    said = cause(*level(ours, one), 16)
    assert "late reads" not in said and said.endswith("cause not found in the load, CPU and chunk readings")
    early = cause(*level([figures(gaps=0.9)] * 2, [figures(gaps=0.1, tput=t) for t in (600.0, 610.0)]), 16)
    assert "late reads by ours (90 % of its chunk gaps under 0.05 ms, AIPerf 10 %" in early


def test_cores_load_and_chunks_as_causes():
    """Shared cores only where the server was read; other load from the load average against the cores
    in every wave; AIPerf's overhead in every pair; chunking never a cause of TPOT or throughput."""
    ours, theirs = [figures(), figures(tput=810.0)], [figures(tput=600.0, chunks=40.0), figures(tput=610.0, chunks=40.0)]
    said = cause(*level(ours, theirs, [cpu(0.2, 1.0, 1.0, load=4.0), cpu(0.2, 1.1, 1.0, load=8.0)]), 2)
    assert said.endswith("cause: client overhead (AIPerf 1.05 cores, ours 0.20); shared cores (server 1.00 + "
                         "AIPerf 1.05 of 2 cores); other load on the machine: load average 4.0 to 8.0 on 2 cores; "
                         "ITL note: 50.0 vs 40.0 chunks a request (ITL is per chunk)")
    unread = cause(*level(ours, theirs, [cpu(0.2, 1.9, None, load=1.5)] * 2), 2)
    assert "shared cores" not in unread and "other load" not in unread and "client overhead" in unread
    once = cause(*level(ours, theirs, [cpu(0.2, 1.0, 1.0, load=4.0), cpu(0.2, 0.3, 1.0, load=4.0)]), 2)
    assert "client overhead" not in once and "shared cores" not in once and "other load" in once
    chunked = cause(*level(ours, theirs), 16)
    assert "chunking" not in chunked and "cause not found" in chunked and "ITL note: 50.0 vs 40.0" in chunked


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
    bench = load_script(Path("benchmarks/load_generators.py"))
    assert [bench.aiperf_workers(n) for n in (1, 2, 16, 64)] == [1, 1, 11, 32]
    readings = {"client_cores": 0.2, "server_cores": 1.0, "load_avg": 1.5, "run_cpu_s": 5.0}
    pairs = [{"ours": figures() | {"cpu": readings}, "aiperf": figures(tput=880.0) | {"cpu": readings}}] * 2
    level = bench.level_result(pairs, 16)
    assert level["mismatches"] == [] and level["cpu"]["aiperf"] == readings
    assert level["cause"] == ("TPOT agree within 5 % (+0.0 to +0.0 %); throughput AIPerf +10.0 % (+10.0 to +10.0 %); "
                              "cause not found in the load, CPU and chunk readings")
    rows = bench.rows({"systems": {"ngram": {"4": level}}})
    tput = next(r for r in rows if r["figure"] == "output_throughput")
    assert (tput["ours"], tput["aiperf"], tput["diff_pct"], tput["pairs"]) == (800.0, 880.0, pytest.approx(10.0), 2)


SCRIPT = __import__("pathlib").Path(__file__).resolve().parents[1] / "benchmarks" / "load_generators.py"


@pytest.mark.parametrize("options, said", [
    (["--levels", "a,b"], "--levels 'a,b': give concurrency levels as positive whole numbers"),
    (["--levels", ""], "--levels '': give concurrency levels as positive whole numbers"),
    (["--levels", "-4"], "--levels '-4': give concurrency levels as positive whole numbers"),
    (["--pairs", "0"], "--pairs 0: give at least 1"),
    (["--aiperf", "/nonexistent/aiperf"], "--load-generator aiperf: --aiperf /nonexistent/aiperf: no aiperf executable"),
])
def test_the_script_refuses_bad_options_in_one_line(tmp_path, options, said):
    """Bad options: exit 2 and one `error:` line naming the problem and the fix, before any server, AIPerf
    run or folder (`--pairs 0` once wrote an empty results.json and exited 0)."""
    import subprocess
    import sys

    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(SCRIPT), "--base-url", "http://127.0.0.1:9", "--systems", "plain",
                           "--out", str(out), *options], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"error: {said}") and done.stderr.count("\n") == 1, done.stderr
    assert not out.exists()


def test_the_script_recomputes_a_results_folder(tmp_path):
    """`--recompute DIR` analyses DIR's results.json again from its pairs (a fixed analysis, nothing
    measured again); a folder without one is refused in one line."""
    import json
    import subprocess
    import sys

    readings = {"client_cores": 0.2, "server_cores": 1.0, "load_avg": 1.5, "run_cpu_s": 5.0}
    pairs = [{"ours": figures(tput=t) | {"cpu": readings}, "aiperf": figures(tput=u) | {"cpu": readings}}
             for t, u in ((2018.3, 2126.5), (2079.6, 2006.4))]
    old = {"provenance": {"aiperf": "0.13.0"}, "settings": {"device": "cuda"}, "cores": 16,
           "systems": {"plain": {"16": {"pairs": pairs, "cause": "agree within 5 % on TPOT and throughput"}}}}
    (tmp_path / "results.json").write_text(json.dumps(old))
    done = subprocess.run([sys.executable, str(SCRIPT), "--recompute", str(tmp_path)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    new = json.loads((tmp_path / "results.json").read_text())
    assert new["provenance"] == old["provenance"] and new["systems"]["plain"]["16"]["cause"] == (
        "TPOT agree within 5 % (+0.0 to +0.0 %); throughput no difference detected (interval +-57 %)")
    assert "ours vs AIPerf 0.13.0" in (tmp_path / "table.txt").read_text()
    assert "output_throughput" in (tmp_path / "table.csv").read_text()
    missing = subprocess.run([sys.executable, str(SCRIPT), "--recompute", str(tmp_path / "none")],
                             capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2 and missing.stderr.startswith("error: --recompute") and "no results.json" in missing.stderr

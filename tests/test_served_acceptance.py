"""Served runs take acceptance per request from vLLM's own figures (issue 54, item 2):

- the stream parser on a real wave captured from `vllm serve` (0.32.0, CPU, n-gram, started with
  `--per-request-spec-decode-metrics detailed`; `tests/fixtures/served_acceptance/`): the final usage
  chunk's `metrics.speculative_decoding` becomes the request's per-step lists, histogram and source,
  read exactly as the offline backend reads vLLM's `RequestSpecDecodeMetrics`; the two requests' own
  figures add up to what the server's counters grew by over the wave, and a wave where they do not
  (or cannot be held against them) says so;
- against real servers on this machine (two starts for the whole file): `--backend vllm-server` starts
  `vllm serve` with the flag and every n-gram request's record carries vLLM's per-step counts and
  histogram, the same per request at concurrency 1 and 2, each wave's check agreeing with the
  counters; `--backend openai` against a server started without the flag falls back to the counters
  and says so in the records, the summary and the manifest.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import test_server
from test_server import _cli, needs_demo, needs_server

from harness.analysis.records import read_requests, read_waves
from harness.backends.served.acceptance import COUNTERS, PER_REQUEST, request_acceptance, wave_check
from harness.backends.served.client import ServedBackend
from harness.backends.served.metrics import delta, spec_counters
from harness.backends.served.stream import StreamResult, read_chunk

CAPTURED = Path(__file__).parent / "fixtures" / "served_acceptance"
flagless = test_server.external_server  # an n-gram server started without per-request metrics (module-scoped)
RUN = ["run", "--category", "coding", "--num-prompts", "2", "--output-len", "32", "--ignore-eos", "--temperature",
       "0", "--disable-shuffle", "--systems", "ngram"]


def _events(name: str) -> list[dict]:
    """The JSON events of a captured stream, in order ([DONE] left out)."""
    lines = [line.removeprefix("data:").strip() for line in (CAPTURED / name).read_text().splitlines()
             if line.startswith("data:")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def _streamed(name: str) -> tuple[StreamResult, list[bool]]:
    out = StreamResult()
    return out, [read_chunk(out, chunk) for chunk in _events(name)]


def test_the_parser_reads_vllms_per_request_metrics_from_the_final_usage_chunk():
    out, carried = _streamed("stream.sse")
    assert carried[-1] is False and all(carried[1:-1])  # the role chunk and the usage chunk carry no output
    assert out.error is None and out.finish_reason == "length"
    assert out.output_tokens == len(out.token_ids) == 32 and out.prompt_tokens == len(out.prompt_token_ids) == 32
    assert out.spec_decode == {"mean_acceptance_length": 3.3333333333333335, "draft_acceptance_rate": 0.5384615384615384,
                               "acceptance_histogram": [0, 1, 0, 2, 0, 0, 0, 0], "num_spec_steps": 3,
                               "num_accepted_draft_tokens": 7, "num_draft_tokens": 13, "num_spec_tokens": 7,
                               "per_step_accepted": [1, 3, 3], "per_step_drafted": [7, 3, 3]}
    # the request's record: vLLM's per-step counts and histogram, as the client hands them to the run
    result = ServedBackend()._result(None, out.prompt_token_ids, out)
    assert (result.acceptance_lengths, result.accepted_counts, result.proposal_lengths) == ([2, 4, 4], [1, 3, 3],
                                                                                            [7, 3, 3])
    assert result.acceptance_source == "vllm per-step"
    assert result.acceptance_totals == {"num_spec_steps": 3, "num_draft_tokens": 13, "num_accepted_draft_tokens": 7,
                                        "acceptance_histogram": [0, 1, 0, 2, 0, 0, 0, 0]}
    assert len(result.tokens) == 32 and result.extra["usage_output_tokens"] == 32


def test_offline_and_served_read_vllms_figures_alike():
    """The offline backend reads `CompletionOutput.spec_decode_metrics.to_dict()`; the same steps observed by
    vLLM's own accumulator give the served chunk's payload, and one reading of both."""
    pytest.importorskip("vllm")
    from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

    out, _ = _streamed("stream.sse")
    steps = RequestSpecDecodeMetrics.new(7)
    for drafted, accepted in zip([7, 3, 3], [1, 3, 3]):
        steps.observe(drafted, accepted, detailed=True)
    assert steps.to_dict() == out.spec_decode
    assert request_acceptance(steps.to_dict()) == request_acceptance(out.spec_decode)
    # vLLM's `summary` level: totals and histogram, no per-step lists
    summary = {k: v for k, v in out.spec_decode.items() if not k.startswith("per_step_")}
    assert request_acceptance(summary) == {"acceptance_lengths": [], "accepted_counts": [], "proposal_lengths": [],
                                           "acceptance_source": "vllm totals",
                                           "acceptance_totals": request_acceptance(out.spec_decode)["acceptance_totals"]}
    assert request_acceptance(None) == {"acceptance_source": None}  # no metrics: the counters' turn


def test_a_waves_requests_add_up_to_the_servers_counters():
    counters = delta(*(spec_counters((CAPTURED / f"metrics-{when}.prom").read_text()) for when in ("before", "after")))
    totals = [request_acceptance(_streamed(name)[0].spec_decode)["acceptance_totals"]
              for name in ("stream.sse", "stream-beside.sse")]
    assert wave_check(totals, counters) == {
        "checked": True, "agrees": True,
        "per_request_sums": {"num_spec_steps": 4, "num_draft_tokens": 20, "num_accepted_draft_tokens": 7,
                             "accepted_per_pos": [3, 2, 2, 0, 0, 0, 0]}}
    alone = wave_check(totals[:1], counters)  # one of the two against the counters of both
    assert alone["checked"] and alone["agrees"] is False
    assert alone["differs"] == {"num_spec_steps": [3, 4], "num_draft_tokens": [13, 20]}
    assert "another client" in alone["why"]
    failed = wave_check([totals[0], None], counters)  # a request that failed carries none
    assert failed == {"checked": False, "why": "1 of the wave's 2 requests carry no per-request metrics (failed, or a "
                                               "server that stopped sending them)"}
    assert wave_check(totals, None) == {"checked": False, "why": "the server exposes no speculative counters"}
    assert wave_check([None, None], counters) is None  # the counters are the source: nothing to check


@pytest.fixture(scope="module")
def served(tmp_path_factory, flagless):
    root = tmp_path_factory.mktemp("served-acceptance")
    proc = _cli([*RUN, "--backend", "vllm-server", "--max-concurrency", "1,2", "--out", root / "run", "--json"], root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"dir": root / "run", "summary": json.loads(proc.stdout)}


@pytest.fixture(scope="module")
def fallback(tmp_path_factory, flagless):
    root = tmp_path_factory.mktemp("fallback")
    url = flagless.result().base_url
    proc = _cli([*RUN, "--backend", "openai", "--base-url", url, "--max-concurrency", "2", "--out", root / "run",
                 "--json"], root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"dir": root / "run", "summary": json.loads(proc.stdout)}


@needs_server
@needs_demo
def test_a_served_run_records_vllms_own_acceptance_per_request(served):
    records = read_requests(served["dir"])
    assert len(records) == 4 and not any(r.get("failed") for r in records)
    for r in records:
        totals = r["acceptance_totals"]
        assert r["acceptance_source"] == "vllm per-step"
        assert len(r["proposal_lengths"]) == len(r["accepted_counts"]) == totals["num_spec_steps"] > 0
        assert (sum(r["proposal_lengths"]), sum(r["accepted_counts"])) == (totals["num_draft_tokens"],
                                                                           totals["num_accepted_draft_tokens"])
        assert [Counter(r["accepted_counts"])[j] for j in range(len(totals["acceptance_histogram"]))] == \
            totals["acceptance_histogram"]
        assert r["acceptance_lengths"] == [a + 1 for a in r["accepted_counts"]]
    # per request, not pooled: each request's own figures, the same at concurrency 1 and 2 (T = 0)
    by_level = {c: {r["question_id"]: (r["accepted_counts"], r["proposal_lengths"]) for r in records
                    if r["max_concurrency"] == c} for c in (1, 2)}
    assert by_level[1] == by_level[2]
    overall = {r["max_concurrency"]: r for r in served["summary"]["rows"] if r["category"] == "overall"}
    for c, row in overall.items():
        mine = [r for r in records if r["max_concurrency"] == c]
        assert row["acceptance_from"] == "rounds" and row["num_rounds"] == sum(len(r["accepted_counts"]) for r in mine)
        assert row["pooled_acceptance_length"] == pytest.approx(
            1 + sum(sum(r["accepted_counts"]) for r in mine) / row["num_rounds"])
    # each wave: the requests' own figures add up to what the server's counters grew by
    waves = read_waves(served["dir"])
    assert len(waves) == 3  # two requests one at a time, then both together
    for wave in waves:
        check = wave["acceptance_check"]
        assert check["checked"] and check["agrees"], check
        assert {k: check["per_request_sums"][k] for k in wave["spec_counters"]} == wave["spec_counters"]
    server = json.loads((served["dir"] / "manifest.json").read_text())["backend"]["servers"]["ngram"]
    flag = server["command"].index("--per-request-spec-decode-metrics")
    assert server["command"][flag + 1] == "detailed" and server["acceptance"] == PER_REQUEST
    assert server["method"] == "ngram" and "method_unknown" not in server  # read back from the server's own log


@needs_server
@needs_demo
def test_a_server_without_per_request_metrics_falls_back_to_its_counters_and_says_so(fallback):
    records = read_requests(fallback["dir"])
    assert len(records) == 2
    for r in records:
        assert r["acceptance_source"] == "server counters (wave)" and r["acceptance_totals"] is None
        assert r["accepted_counts"] == r["proposal_lengths"] == []
    (wave,) = read_waves(fallback["dir"])
    assert wave["spec_counters"]["num_spec_steps"] > 0 and "acceptance_check" not in wave  # nothing to hold
    (row,) = [r for r in fallback["summary"]["rows"] if r["category"] == "overall"]
    assert row["acceptance_from"] == "server counters (wave)"
    assert row["num_rounds"] == wave["spec_counters"]["num_spec_steps"]
    acceptance = json.loads((fallback["dir"] / "manifest.json").read_text())["backend"]["acceptance"]
    assert list(acceptance) == ["ngram"]  # per system
    assert acceptance["ngram"].startswith(COUNTERS) and "--per-request-spec-decode-metrics" in acceptance["ngram"]


@needs_server
@needs_demo
def test_the_openai_backend_keeps_each_systems_acceptance_source(tmp_path, flagless):
    """Each warm-up once set one backend-wide `acceptance`: plain decoding's, after n-gram's, said None, and the
    manifest lost where n-gram's acceptance came from. Per system now; plain decoding has none to say."""
    from transformers import AutoTokenizer

    from dspark.tokenizer import chat_prompt_ids
    from harness.backends.base import RequestSpec
    from harness.backends.served.openai import OpenAIBackend
    from harness.specs.experiments import load_experiment

    backend = OpenAIBackend("demo", "cpu", "auto", run_dir=tmp_path, server={"base_url": flagless.result().base_url})
    messages = ({"role": "user", "content": "Write a Python function that adds two numbers."},)
    prompt = chat_prompt_ids(AutoTokenizer.from_pretrained(backend.tokenizer_path), list(messages))
    demo = load_experiment("demo")
    for name in ("ngram", "plain"):
        backend.warmup(backend.prepare(demo.system(name)), 256, RequestSpec(8, messages=messages), prompt)
    acceptance = backend.record()["acceptance"]
    assert list(acceptance) == ["ngram"] and acceptance["ngram"].startswith(COUNTERS), acceptance

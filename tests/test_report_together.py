"""`report --together` (issue 54): every system of several runs in one table, rows run x system, on real run
folders made by the real CLI on the demo pair (a native run of plain, n-gram and DSpark; a vLLM offline run of
plain, n-gram and vLLM's `draft_model` (the target drafting for itself) on vLLM's CPU build, its environment the
tests' Triton interpreter):

- one table naming each row's run and engine, each speedup against its own run's plain decoding (a run
  without plain decoding says so in the cell);
- one acceptance definition for every engine, tokens delivered per verify round: n-gram on our engine and on
  vLLM read alike although vLLM lists only the steps that drafted, and the drafts an engine counts past the
  output's end (vLLM's 35 counted for 31 decoded) are not counted;
- a run timed under Triton's interpreter is recorded and titled so (manifest, table, summary.md, HTML
  headline) and gets no speedup verdict.
"""

from __future__ import annotations

import html
import json

import pytest
from cli_runner import run_cli
from run_folders import native, no_plain, sweep, write
from test_vllm import COMMON, _cli, needs_demo, needs_vllm

from harness.analysis.frames import load_runs
from harness.analysis.records import read_requests
from harness.analysis.report_text import Headline, verdict
from harness.analysis.summary import INTERPRETED, summarize, summarize_folder

PROMPTS = 3  # each run's coding prompts (vLLM's engines start in about 20 s each here)
# the vLLM run's experiment: the demo's plain and n-gram, and vLLM's draft_model with the target drafting for itself
VLLM_EXPERIMENT = """name = "vllm-together"
target = "demo"
dataset = "demo"

[[systems]]
name = "plain"
method = "plain"

[[systems]]
name = "ngram"
method = "ngram"
num_speculative_tokens = 7

[[systems]]
name = "self-draft"
method = "draft_model"
draft = "demo"
num_speculative_tokens = 3
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The native run (its environment without Triton's interpreter) and the vLLM run (with it, as
    tests/test_vllm.py runs vLLM), on the same prompts."""
    root = tmp_path_factory.mktemp("together")
    (root / "vllm.toml").write_text(VLLM_EXPERIMENT)
    out = {}
    for name, experiment, backend in (("native", "demo", "native"), ("vllm", root / "vllm.toml", "vllm")):
        systems = "plain,ngram,dspark" if backend == "native" else "plain,ngram,self-draft"
        done = _cli(["run", *COMMON, "--experiment", experiment, "--num-prompts", PROMPTS, "--systems", systems,
                     "--backend", backend, "--out", root / name, "--json"], root, vllm=backend == "vllm")
        assert done.returncode == 0, done.stderr[-3000:]
        out[name] = root / name
    return out


def _together(monkeypatch, capfd, *runs) -> dict:
    code, out, err = run_cli(monkeypatch, capfd, "report", "--together", "--json", *runs)
    assert code == 0, err
    return json.loads(out)


def _overall(summary: dict, system: str) -> dict:
    return next(r for r in summary["rows"] if r["category"] == "overall" and r["system"] == system)


@needs_vllm
@needs_demo
def test_one_table_holds_every_system_of_both_engines_each_against_its_own_plain(runs, monkeypatch, capfd):
    code, out, err = run_cli(monkeypatch, capfd, "report", "--together", runs["native"], runs["vllm"])
    assert code == 0, err
    said = " ".join(out.split())  # (the legend wrapped at the table's width)
    assert said.count("2 runs together (overall)") == 1 and said.count("AL: tokens delivered per verify round") == 1
    table = [line for line in out.splitlines() if line.startswith("│")]
    assert [line.split("│")[1].strip() for line in table] == ["A"] * 3 + ["B"] * 3  # one row per run x system
    assert all("native on cpu" in line for line in table[:3])
    assert all("vllm 0.32.0 on cpu (Triton interpreter)" in line for line in table[3:])
    assert "self-draft (draft_model)" in table[-1]  # (a system named otherwise than its method: both)
    result = _together(monkeypatch, capfd, runs["native"], runs["vllm"])
    assert [(r["run"], r["system"]) for r in result["rows"]] == [
        ("A", "plain"), ("A", "ngram"), ("A", "dspark"), ("B", "plain"), ("B", "ngram"), ("B", "self-draft")]
    for r in result["rows"]:  # each run's own summary, its speedups against its own plain decoding
        own = _overall(summarize_folder(runs["native" if r["run"] == "A" else "vllm"]), r["system"])
        assert (r["speedup"], r["mean_tpot_ms"]) == (own["speedup"], own["mean_tpot_ms"])


@needs_vllm
@needs_demo
def test_ngram_on_both_engines_reads_alike_by_tokens_delivered_per_round(runs, monkeypatch, capfd):
    """vLLM lists only the steps that drafted, our engine every verify: their own n-gram ALs differ on the
    same outputs; the table's AL counts every decode step of both, by hand from the records."""
    ours, theirs = ([r for r in read_requests(runs[name]) if r["system"] == "ngram"] for name in ("native", "vllm"))
    assert {r["question_id"]: r["output_ids"] for r in ours} == {r["question_id"]: r["output_ids"] for r in theirs}
    tokens = sum(r["output_tokens"] - 1 for r in ours)  # (the first token comes from the prefill)
    assert sum(r["num_rounds"] for r in ours) == tokens - sum(sum(r["accepted_counts"]) for r in ours)  # every step
    listed = sum(r["num_rounds"] for r in theirs)
    unlisted = tokens - sum(sum(r["acceptance_lengths"]) for r in theirs)  # one token a step vLLM does not list
    assert listed and unlisted > 0
    own = [_overall(summarize_folder(runs[name]), "ngram") for name in ("native", "vllm")]
    assert own[0]["spec_decode_acceptance_length"] < own[1]["spec_decode_acceptance_length"]  # each engine's count
    rows = {r["run"]: r for r in _together(monkeypatch, capfd, runs["native"], runs["vllm"])["rows"]
            if r["system"] == "ngram"}
    assert rows["B"]["delivered_rounds"] == listed + unlisted and rows["B"]["unlisted_steps"] == unlisted
    accepted = sum(sum(r["accepted_counts"]) for r in ours)
    for r in rows.values():
        assert r["delivered_tokens"] == tokens and r["delivered_acceptance_length"] == pytest.approx(
            tokens / (tokens - accepted))
    assert rows["A"]["delivered_acceptance_rate"] == rows["B"]["delivered_acceptance_rate"]


@needs_vllm
@needs_demo
def test_vllm_counts_a_last_steps_tokens_past_the_output_and_the_table_does_not(runs, monkeypatch, capfd):
    """The target drafting for itself on vLLM accepts every draft: each request's last step counts tokens past
    the output's end (vLLM's AL 4.00 for k = 3); the table's AL is the output's tokens after the first over the
    steps, by hand from the records."""
    records = [r for r in read_requests(runs["vllm"]) if r["system"] == "self-draft"]
    assert all(r["matches_baseline"] is True and r["acceptance_source"] == "vllm per-step" for r in records)
    tokens = sum(r["output_tokens"] - 1 for r in records)
    counted, steps = sum(sum(r["acceptance_lengths"]) for r in records), sum(r["num_rounds"] for r in records)
    assert counted > tokens and steps  # vLLM's count runs past the outputs
    assert _overall(summarize_folder(runs["vllm"]), "self-draft")["spec_decode_acceptance_length"] == \
        pytest.approx(counted / steps)
    (row,) = [r for r in _together(monkeypatch, capfd, runs["vllm"])["rows"] if r["system"] == "self-draft"]
    assert (row["delivered_rounds"], row["counted_past_output"], row["unlisted_steps"]) == (steps, counted - tokens, 0)
    assert row["delivered_acceptance_length"] == pytest.approx(tokens / steps)


def test_drafts_counted_past_the_output_are_not_delivered():
    """vLLM's record of the target drafting for itself (issue 54): 7 steps accepting 4 drafts each, 35 tokens
    counted for 31 decoded after the first; AL 31 / 7 = 4.43, not vLLM's 5.00. The same from totals alone, and
    from our engine's record of such rounds."""
    steps = {"acceptance_lengths": [5] * 7, "accepted_counts": [4] * 7, "proposal_lengths": [4] * 7}
    record = native("draft", "q1", 4.0, method="draft_model", output_tokens=32, acceptance_source="vllm per-step",
                    **steps)
    totals = record | {k: [] for k in steps} | {"acceptance_source": "vllm totals", "acceptance_totals": {
        "num_spec_steps": 7, "num_draft_tokens": 28, "num_accepted_draft_tokens": 28}}
    # our engine's record of the same rounds (it too keeps the last round's count), as written before records
    # named their acceptance source and accepted drafts
    older = {k: v for k, v in record.items() if k not in ("acceptance_source", "accepted_counts")}
    for r in (record, totals, older):
        row = _overall(summarize([r]), "draft")
        assert row["spec_decode_acceptance_length"] == pytest.approx(5.0)  # vLLM's own count
        assert row["delivered_acceptance_length"] == pytest.approx(31 / 7)
        # the last step delivered 1 of its 5 tokens: 1 of its 4 accepted drafts, no bonus
        assert (row["counted_past_output"], row["delivered_accepted"], row["delivered_rounds"]) == (4, 6 * 4 + 1, 7)


@needs_vllm
@needs_demo
def test_a_run_under_tritons_interpreter_is_titled_so_and_gets_no_verdict(runs):
    native_manifest, manifest = (json.loads((runs[n] / "manifest.json").read_text()) for n in ("native", "vllm"))
    assert manifest["provenance"]["triton_interpreter"] is True and INTERPRETED in manifest["label"]
    assert native_manifest["provenance"]["triton_interpreter"] is False and "label" not in native_manifest
    assert f"[{INTERPRETED}]" in (runs["vllm"] / "summary.md").read_text().splitlines()[0]
    assert INTERPRETED not in (runs["native"] / "summary.md").read_text()
    both = load_runs([runs["native"], runs["vllm"]])
    said = verdict(both)
    assert f"vllm: no speedup verdict, {INTERPRETED}" in said and "ngram" not in said.split("vllm: ")[1]
    assert "native/ngram: too few prompts (3)" in said  # (the other run's verdict as before)
    page = Headline(both)._repr_html_()
    assert f"vllm: {html.escape(INTERPRETED)}" in page and "times and speedups are the interpreter" in page
    assert any(INTERPRETED in w for w in summarize_folder(runs["vllm"])["warnings"])


def test_a_run_without_plain_says_so_in_its_speedup_cells_and_html_is_refused(tmp_path, monkeypatch, capfd):
    alone = no_plain(tmp_path)
    with_plain = write(tmp_path / "with-plain", [native(s, q, t) for q in ("q1", "q2") for s, t in
                                                 (("plain", 5.0), ("dspark", 4.0))], systems=["plain", "dspark"])
    code, out, err = run_cli(monkeypatch, capfd, "report", "--together", with_plain, alone)
    assert code == 0, err
    (row,) = [line for line in out.splitlines() if line.startswith("│ B")]
    assert "none: no plain in B" in row
    code, out, err = run_cli(monkeypatch, capfd, "report", "--together", with_plain, alone, "--html", tmp_path / "r.html")
    assert code == 2 and "--together" in err and "--html" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r.html").exists()


def test_a_served_runs_wave_counters_read_by_the_same_definition(tmp_path, monkeypatch, capfd):
    """A served sweep's acceptance is its waves' server counters (30 steps, 24 accepted drafts, 120 proposed per
    wave of 6 requests of 40 tokens): in the one table, beside a native run, its rounds are the 30 drafting
    steps plus the 6 x 39 - 54 tokens they did not deliver, one a step."""
    served = sweep(tmp_path)
    result = _together(monkeypatch, capfd, no_plain(tmp_path), served)
    assert {r["engine"] for r in result["rows"]} == {"native on cpu", "vllm-server on cuda"}
    row = next(r for r in result["rows"] if (r["run"], r["system"], r["max_concurrency"]) == ("B", "ngram", 1))
    tokens = 6 * 39
    assert (row["delivered_tokens"], row["delivered_rounds"], row["unlisted_steps"]) == (tokens, 30 + tokens - 54,
                                                                                         tokens - 54)
    assert row["delivered_acceptance_length"] == pytest.approx(tokens / (30 + tokens - 54))
    assert row["delivered_acceptance_rate"] == pytest.approx(24 / 120)
    assert ("c", "max_concurrency") in [tuple(c) for c in result["columns"]] and "c: requests in flight" in \
        result["legend"]

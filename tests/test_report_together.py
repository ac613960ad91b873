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
  headline) and gets no speedup verdict;
- from run folders built in Python: a pooled wave's accepted drafts are each request's and marked as upper
  bounds, the overall row's AL pools its categories, each run's rows keep its own table's columns, and a
  wave whose acceptance check failed is a warning under the run's table.
"""

from __future__ import annotations

import html
import json

import pytest
from cli_runner import run_cli
from run_folders import native, no_plain, served, sweep, write
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


def _served_draft(qid: str, concurrency: int, start: float, **acceptance) -> dict:
    """A served draft_model request of 32 tokens (31 after the first) whose last step ran past its end."""
    return served("draft", qid, concurrency, 6.0, start) | {"method": "draft_model", "output_tokens": 32,
                                                            "output_ids": list(range(32))} | acceptance


def test_a_pooled_waves_accepted_drafts_are_each_requests_and_marked_as_a_bound(tmp_path, monkeypatch, capfd):
    """Two requests of 7 steps accepting 4 drafts each, 31 tokens after the first: each request's last step
    counts 4 tokens past its end, its bonus first, so each delivered 25 accepted drafts. Alone (vLLM's own
    per-request totals, c = 1) and pooled in one wave's counters (c = 2) the table says 50, not 49 (the pooled
    count past the end holds two bonuses); the pooled figures are marked as the upper bound they are."""
    own = {"num_spec_steps": 7, "num_draft_tokens": 28, "num_accepted_draft_tokens": 28}
    records = [served("plain", q, c, 10.0, 100.0 + i) for c in (1, 2) for i, q in enumerate(("q1", "q2"))]
    records += [_served_draft(q, 1, 200.0 + i, acceptance_source="vllm totals", acceptance_totals=own)
                for i, q in enumerate(("q1", "q2"))]
    records += [_served_draft(q, 2, 300.0, acceptance_source="server counters (wave)") for q in ("q1", "q2")]
    waves = [{"wave": "draft2", "system": "draft", "max_concurrency": 2, "temperature": 0.0, "turn": 0, "requests": 2,
              "spec_counters": {k: 2 * v for k, v in own.items()} | {"accepted_per_pos": [14, 14, 14, 14]}}]
    run = write(tmp_path / "pooled", records, waves=waves, systems=["plain", "draft"], backend="vllm-server",
                concurrency=(1, 2))
    result = _together(monkeypatch, capfd, run)
    rows = {r["max_concurrency"]: r for r in result["rows"] if r["system"] == "draft"}
    for row in rows.values():
        assert (row["delivered_accepted"], row["delivered_rounds"], row["counted_past_output"]) == (50, 14, 8)
        assert row["delivered_acceptance_rate"] == pytest.approx(50 / 56)
    assert (rows[1]["delivered_upper_bound"], rows[2]["delivered_upper_bound"]) == (False, True)
    assert "<=: an upper bound, from a served wave's counters pooled over its requests" in result["legend"]
    code, out, err = run_cli(monkeypatch, capfd, "report", "--together", run)
    assert code == 0, err
    table = {line.split("│")[5].strip(): line for line in out.splitlines() if "draft_model" in line}
    assert "<=4.43" in table["2"] and "<=89%" in table["2"] and "<=" not in table["1"]  # (62 / 14; 50 / 56)


def test_the_overall_rows_al_pools_every_category_as_its_legend_says(tmp_path, monkeypatch, capfd):
    """Categories of unequal rounds: the overall row's AL is its tokens over its rounds (as its own rounds and
    tokens columns read), not the mean of the categories' ALs."""
    records = [native("plain", q, 5.0, category=c) for q, c in (("q1", "coding"), ("q2", "math"))]
    records += [native("dspark", "q1", 4.0, category="coding", acceptance_lengths=[2] * 19 + [1],
                       accepted_counts=[1] * 19 + [0], proposal_lengths=[7] * 20),
                native("dspark", "q2", 4.0, category="math", rounds=8, acceptance_lengths=[5] * 7 + [4],
                       accepted_counts=[4] * 7 + [3], proposal_lengths=[7] * 8)]
    run = write(tmp_path / "two-categories", records, systems=["plain", "dspark"], categories=("coding", "math"),
                prompts=1)
    result = _together(monkeypatch, capfd, run)
    (row,) = [r for r in result["rows"] if r["system"] == "dspark"]
    assert (row["delivered_tokens"], row["delivered_rounds"]) == (78, 28)  # (39 tokens in 20 rounds, 39 in 8)
    assert row["delivered_acceptance_length"] == pytest.approx(78 / 28)  # (the categories' mean: (1.95 + 4.875) / 2)
    assert row["delivered_acceptance_rate"] == pytest.approx((19 + 31) / (28 * 7))
    assert "overall: pooled over categories" in result["legend"]


def _synthetic(root) -> object:
    """A run whose DSpark system's acceptance was synthetic (its manifest's profile): the single-run table
    shows its profile AL and realised rates in place of accept and = plain."""
    run = write(root / "synthetic", [native(s, q, t) for q in ("q1", "q2") for s, t in (("plain", 5.0), ("dspark", 4.0))],
                systems=["plain", "dspark"])
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["settings"]["acceptance"] = {"dspark": {"name": "flat", "source": "given", "rates": [0.5] * 7,
                                                     "mean_length": 2.0}}
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def test_each_runs_rows_show_the_columns_its_own_table_shows(tmp_path, monkeypatch, capfd):
    """A synthetic-acceptance run's own table has profile AL and realised rates where accept and = plain
    stand (they mean nothing there); a run timed on a busy machine has a busy column. In one table each row
    keeps its own run's columns: the others' are blank."""
    from harness.analysis.table_text import columns

    synthetic = _synthetic(tmp_path)
    busy = write(tmp_path / "busy", [native(s, q, t, contended=q == "q1") for q in ("q1", "q2")
                                     for s, t in (("plain", 5.0), ("ngram", 4.0))], systems=["plain", "ngram"])
    own = columns(summarize_folder(synthetic))
    assert ("profile AL", "profile_acceptance_length") in own and ("accept", "spec_decode_acceptance_rate") not in own
    result = _together(monkeypatch, capfd, synthetic, busy)
    heads = [h for h, _ in result["columns"]]
    assert heads[:7] == ["run", "engine", "system", "T", "requests", "busy", "tokens"]
    assert heads[-6:] == ["AL", "accept", "profile AL", "rounds", "= plain", "realised rates"]
    assert "busy: requests timed while other processes competed" in result["legend"]
    assert "profile AL: the synthetic profile's mean acceptance length" in result["legend"]
    code, out, err = run_cli(monkeypatch, capfd, "report", "--together", synthetic, busy)
    assert code == 0, err
    cells = {(line.split("│")[1].strip(), line.split("│")[3].strip()): [c.strip() for c in line.split("│")[1:-1]]
             for line in out.splitlines() if line.startswith(("│ A", "│ B"))}
    at = heads.index
    dspark, ngram = cells[("A", "dspark")], cells[("B", "ngram")]
    assert dspark[at("accept")] == dspark[at("= plain")] == dspark[at("busy")] == ""
    assert dspark[at("profile AL")] == "2.00"
    assert ngram[at("profile AL")] == ngram[at("realised rates")] == "" and ngram[at("busy")] == "1/2"
    assert ngram[at("= plain")] == "2/2" and ngram[at("accept")].endswith("%")


def test_a_wave_whose_requests_do_not_add_up_to_the_counters_is_a_warning_under_the_table(tmp_path, monkeypatch, capfd):
    """A served wave's `acceptance_check` that failed (the requests' own figures, which the table reads, are
    not what the server's counters grew by): the report says so under the table, naming the wave and each
    figure both ways; a wave whose check held says nothing."""
    own = {"num_spec_steps": 7, "num_draft_tokens": 28, "num_accepted_draft_tokens": 28}
    records = [served("plain", q, 2, 10.0, 100.0) for q in ("q1", "q2")]
    records += [_served_draft(q, 2, 300.0, acceptance_source="vllm totals", acceptance_totals=own) for q in ("q1", "q2")]
    sums = {k: 2 * v for k, v in own.items()}
    check = {"checked": True, "agrees": False, "per_request_sums": sums | {"accepted_per_pos": [14] * 4},
             "differs": {"num_spec_steps": [14, 17], "num_draft_tokens": [56, 68]}, "why": "another client?"}
    wave = {"wave": "draft2", "system": "draft", "max_concurrency": 2, "temperature": 0.0, "turn": 0, "requests": 2,
            "spec_counters": {"num_spec_steps": 17, "num_draft_tokens": 68, "num_accepted_draft_tokens": 56,
                              "accepted_per_pos": [14] * 4}, "acceptance_check": check}
    run = write(tmp_path / "disagrees", records, waves=[wave], systems=["plain", "draft"], backend="vllm-server",
                concurrency=(2,))
    code, out, err = run_cli(monkeypatch, capfd, "report", run)
    assert code == 0, err
    said = " ".join(out.split())
    assert "warning: acceptance check failed: the requests' own acceptance figures (what the tables read) do not " \
           "add up to the server's counters" in said
    assert "draft T=0 c=2 (wave draft2): num_spec_steps 14 by the requests, 17 by the counters; num_draft_tokens " \
           "56 by the requests, 68 by the counters" in said
    held = write(tmp_path / "agrees", records, waves=[wave | {"acceptance_check": {
        "checked": True, "agrees": True, "per_request_sums": check["per_request_sums"]}}], systems=["plain", "draft"],
        backend="vllm-server", concurrency=(2,))
    assert not any("acceptance check" in w for w in summarize_folder(held)["warnings"])

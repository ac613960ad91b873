"""What a terminal shows of a run: tables that never cut a figure at 80 or 120 columns, `report A B`
with B's figures against A's and the settings that differ, and the pictures' titles."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from cli_runner import run_cli
from rich.console import Console

from harness.analysis.compare_runs import deltas, settings_diff, settings_line
from harness.analysis.run_figures import run_caption
from harness.analysis.summary import summarize
from harness.analysis.table_text import cells, columns, sweep_cells
from harness.cli.render import deltas_table, show, summary_table, sweep_table
from harness.cli.run import print_summary

LONG = "dspark-with-a-rather-long-system-name"


def _record(system: str, qid: str, tpot: float, temperature: float = 0.0, concurrency: int = 1) -> dict:
    method = "plain" if system == "plain" else "dspark"
    return {"system": system, "method": method, "question_id": qid, "category": "coding", "turn": 0,
            "temperature": temperature, "max_concurrency": concurrency, "prompt_sha256": qid, "output_tokens": 1100,
            "acceptance_lengths": [] if method == "plain" else [3, 2, 4],
            "proposal_lengths": [] if method == "plain" else [7, 7, 7], "ttft_ms": 5.0, "tpot_ms": tpot,
            "e2el_ms": 5.0 + 1100 * tpot, "round_ms": {}, "peak_memory_bytes": None,
            "matches_baseline": None if method == "plain" else True, "load_avg": [0.5, 0.6]}


def _summary(concurrency: int = 1, prompts: int = 6) -> dict:
    records = []
    for i, (fast, slow) in enumerate(((4.1, 7.3), (3.9, 7.9), (4.4, 6.2), (4.0, 8.8), (4.2, 7.0), (3.8, 8.1))[:prompts]):
        for temp in (0.0, 1.0):
            records += [_record("plain", f"q{i}", 5.123, temp, concurrency), _record(LONG, f"q{i}", fast, temp,
                                                                                     concurrency),
                        _record("ngram", f"q{i}", slow, temp, concurrency)]
    return summarize(records, cores=2)


def _terminal(width: int, renderable) -> str:
    console = Console(width=width, force_terminal=True, record=True, file=io.StringIO())
    show(console, renderable)
    return console.export_text()


def _has_row(text: str, figures: list[str]) -> bool:
    """Some line holds every figure of a row whole, in order, with only spaces or borders between."""
    pattern = r"(^|[\s│])" + r"[\s│]+".join(map(re.escape, figures)) + r"($|[\s│])"
    return any(re.search(pattern, line) for line in text.splitlines())


@pytest.mark.parametrize("width", [80, 120])
def test_terminal_tables_never_cut_a_figure(width):
    summary = _summary()
    cols = columns(summary)
    text = _terminal(width, summary_table(summary, "run"))
    rows = [r for r in summary["rows"] if r["category"] == "overall"]
    assert len(rows) == 6
    for row in rows:
        figures = cells(row, cols)[1:]  # everything but the name, which may wrap
        assert _has_row(text, figures), (figures, text)
    assert "…" not in text and max(map(len, text.splitlines())) <= width
    first = "".join(re.split(r"[\s│]+", line.strip(" │"))[0] for line in text.splitlines())
    assert first.count(LONG) == 2  # the long name wraps (folds) rather than being cut, at T = 0 and 1

    swept = _summary(concurrency=4)
    text = _terminal(width, sweep_table(swept, "sweep"))
    assert "…" not in text and max(map(len, text.splitlines())) <= width
    for row in (r for r in swept["rows"] if r["category"] == "overall"):
        assert _has_row(text, sweep_cells(row)[1:]), text


@pytest.mark.parametrize("width", [80, 120, 200])
def test_a_speedup_from_too_few_prompts_says_so_and_the_table_still_fits(width):
    """Two prompts: each speedup without an interval or a verdict (`*`), its interval's cell saying why in
    words that may wrap (the figures never do), in the summary and sweep tables alike."""
    summary = _summary(prompts=2)
    for renderable, row_cells in ((summary_table(summary, "run"), lambda r: cells(r, columns(summary))),
                                  (sweep_table(summary, "sweep"), sweep_cells)):
        text = _terminal(width, renderable)
        assert "…" not in text and max(map(len, text.splitlines())) <= width
        drafted = [r for r in summary["rows"] if r["category"] == "overall" and r["system"] != "plain"]
        for row in drafted:
            figures = row_cells(row)
            cut = figures.index("too few prompts (2) for an interval")
            assert figures[cut - 1].endswith("*") and _has_row(text, figures[1:cut]), (figures, text)
            assert _has_row(text, figures[cut + 1:]) if figures[cut + 1:] else True, text
        body = re.split(r"\n(?:T: temperature|c: most requests)", text)[0]  # (the table, not its legend)
        assert body.count("too few") == len(drafted) == 4
        if width == 200:  # room for the reason on one line
            assert text.count("too few prompts (2) for an interval") == 4, text


def _run(path, records, **settings):
    path.mkdir()
    base = {"experiment": "demo", "backend": "native", "split": "qualitative", "categories": ["coding"],
            "num_prompts": 4, "temperatures": [0.0, 1.0], "seed": 0, "device": "cpu"}
    (path / "manifest.json").write_text(json.dumps({"settings": base | settings, "threads": {"count": 1}}))
    (path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_report_a_b_shows_b_against_a_and_the_settings_that_differ(tmp_path, monkeypatch, capfd):
    a = [_record(s, f"q{i}", tpot, temp) for i in range(4) for temp in (0.0, 1.0)
         for s, tpot in (("plain", 10.0), ("dspark", 5.0 + i % 2))]  # speedups 2 and 10/6
    b = [_record(s, f"q{i}", tpot, 0.0) for i in range(2) for s, tpot in (("plain", 12.0), ("dspark", 12.0))]
    run_a = _run(tmp_path / "run-a-with-a-long-folder-name", a)
    run_b = _run(tmp_path / "run-b", b, num_prompts=2, temperatures=[0.0])

    result = deltas(summarize(a), summarize(b))
    (plain, dspark) = result["rows"]
    assert (dspark["system"], dspark["temperature"]) == ("dspark", 0.0)
    assert dspark["speedup"][1] == pytest.approx(1.0) and dspark["speedup_diff"] == pytest.approx(
        1.0 - (2 * 10 / 6) ** 0.5)
    assert dspark["acceptance_length"] == [3.0, 3.0] and dspark["acceptance_length_diff"] == 0
    assert dspark["tpot_ms"] == [pytest.approx(5.5), 12.0] and dspark["tpot_ratio"] == pytest.approx(12 / 5.5)
    assert plain["tpot_ratio"] == pytest.approx(1.2)
    assert result["only_in"] == [[("plain", 1.0, 1), ("dspark", 1.0, 1)], []]
    diff = settings_diff(json.loads((run_a / "manifest.json").read_text()),
                         json.loads((run_b / "manifest.json").read_text()))
    assert diff == [("num_prompts", "4", "2"), ("temperatures", "[0, 1]", "[0]")]
    assert settings_line(diff) == "settings differ (A vs B): num_prompts 4 vs 2; temperatures [0, 1] vs [0]"
    assert settings_line([]) == "settings equal (A and B)"

    code, out, _ = run_cli(monkeypatch, capfd, "report", run_a, run_b)
    assert code == 0
    assert f"A: {run_a} (overall)" in out and f"B: {run_b} (overall)" in out
    assert "settings differ (A vs B): num_prompts 4 vs 2; temperatures [0, 1] vs [0]" in out
    assert _has_row(out, ["dspark", "0", f"{dspark['speedup'][0]:.2f} -> 1.00", f"{dspark['speedup_diff']:+.2f}"])
    assert _has_row(out, ["5.5 -> 12.0", "2.18x"]) and "only in A: plain T=1, dspark T=1" in out
    assert "run-a-with-a-long-folder-name/dspark" not in out  # no run-name prefix in the rows
    for width in (80, 120):  # the deltas fit a terminal whole too
        text = _terminal(width, deltas_table(result, ("A", "B"), "B against A"))
        assert _has_row(text, [f"{dspark['speedup'][0]:.2f} -> 1.00", f"{dspark['speedup_diff']:+.2f}"]), text
        assert "…" not in text and max(map(len, text.splitlines())) <= width


def test_a_runs_picture_title_names_its_categories():
    settings = {"backend": "native", "device": "cpu", "target": "demo", "split": "qualitative"}
    assert "qualitative coding, math," in run_caption({"settings": settings | {"categories": ["coding", "math"]}}, "r")
    assert "qualitative all categories," in run_caption({"settings": settings | {"categories": None}}, "r")


def test_a_settings_diff_of_lists_prints_its_brackets(tmp_path, monkeypatch, capfd):
    """Settings are printed as written, not read as Rich markup (`[coding, math]` is no style tag)."""
    records = [_record(s, "q0", 10.0) for s in ("plain", "dspark")]
    run_a = _run(tmp_path / "a", records)
    run_b = _run(tmp_path / "b", records, categories=["coding", "math"])
    code, out, _ = run_cli(monkeypatch, capfd, "report", run_a, run_b)
    assert code == 0 and "categories [coding] vs [coding, math]" in out, out


SERVED = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "serving_cpu" / "summary.json"  # a real CPU sweep


def _serving_figures(row: dict) -> list[str]:
    """vllm bench serve's headline figures of one level, as the table prints them: output tok/s, then TTFT
    and ITL, each median and p99 (ms)."""
    return [f"{row[k]:.1f}" for k in ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms",
                                      "p99_itl_ms")]


@pytest.mark.parametrize("width", [80, 120])
def test_a_served_runs_terminal_table_has_vllm_bench_serves_headline_figures(width):
    """The summary of a real served sweep (plain and n-gram on vLLM, CPU, c = 1, 4, 16): the terminal shows
    each level's output tok/s and TTFT and ITL medians and p99s, whole; a served run at one level shows
    them too; a run that streamed nothing (our engine) shows no serving table."""
    summary = json.loads(SERVED.read_text())
    overall = [r for r in summary["rows"] if r["category"] == "overall"]
    assert {r["max_concurrency"] for r in overall} == {1, 4, 16} and all(r["median_itl_ms"] for r in overall)
    table = sweep_table(summary, "sweep")
    headers = [c.header for c in table.columns]
    assert headers[3:11] == ["req/s", "out tok/s", "TTFT med", "TTFT p99", "TPOT med", "TPOT p99", "ITL med",
                             "ITL p99"]
    console = Console(width=width, force_terminal=True, record=True, file=io.StringIO())
    print_summary(summary, "served", console=console)
    text = console.export_text()
    assert "concurrency sweep (overall rows)" in text and "…" not in text
    for row in overall:
        shown = sweep_cells(row)
        assert [shown[i] for i in (4, 5, 6, 9, 10)] == _serving_figures(row)
        assert _has_row(text, shown[1:]), (shown, text)

    one_level = summary | {"max_concurrency": [1], "rows": [r for r in summary["rows"] if r["max_concurrency"] == 1]}
    console = Console(width=width, force_terminal=True, record=True, file=io.StringIO())
    print_summary(one_level, "served at c = 1", console=console)
    text = console.export_text()
    assert "serving (overall rows)" in text
    for row in (r for r in one_level["rows"] if r["category"] == "overall"):
        assert _has_row(text, sweep_cells(row)[1:]), text

    console = Console(width=width, force_terminal=True, record=True, file=io.StringIO())
    print_summary(_summary(), "native", console=console)
    assert "serving" not in console.export_text() and "sweep" not in console.export_text()

"""What the summaries and tables tell a reader beyond the figures: an unfinished run, a machine that
was busy while it was timed, a speedup whose interval spans 1, every cell printed whole in a log."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from harness.analysis.summary import expected_requests, summarize, warnings
from harness.analysis.table_text import COLUMNS, LEGEND, markdown
from harness.cli.render import show
from harness.cli.render import summary_table as table
from harness.runs.progress import RunProgress


def _record(system: str, qid: str, tpot: float, load=(0.5, 0.6), category: str = "coding", temperature: float = 0.0):
    method = "plain" if system == "plain" else "dspark"
    return {"system": system, "method": method, "question_id": qid, "category": category, "turn": 0,
            "temperature": temperature, "prompt_sha256": qid, "output_tokens": 11, "acceptance_lengths":
            [] if method == "plain" else [3, 2], "proposal_lengths": [] if method == "plain" else [6, 6],
            "ttft_ms": 5.0, "tpot_ms": tpot, "e2el_ms": 5.0 + 10 * tpot, "round_ms": {}, "peak_memory_bytes": None,
            "matches_baseline": None if method == "plain" else True, "load_avg": list(load)}


def test_spread_load_and_a_speedup_whose_interval_spans_one():
    records = [_record("plain", f"q{i}", 10.0) for i in range(6)]  # (6 prompts: enough pairs for an interval)
    records += [_record("fast", f"q{i}", 5.0, load=(1.0, 3.5 if i == 2 else 1.2)) for i in range(6)]
    records += [_record("mixed", f"q{i}", t) for i, t in enumerate((5.0, 20.0) * 3)]
    summary = summarize(records, cores=2)
    rows = {r["system"]: r for r in summary["rows"] if r["category"] == "overall"}
    assert rows["fast"]["speedup"] == pytest.approx(2.0) and rows["fast"]["speedup_ci95_spans_1"] is False
    assert rows["mixed"]["speedup"] == pytest.approx(1.0) and rows["mixed"]["speedup_ci95_spans_1"] is True
    assert rows["plain"]["speedup_ci95_spans_1"] is None  # the baseline against itself says nothing
    # std of (5, 20, 5, 20, 5, 20): sqrt(6 * 7.5^2 / 5); cv = std / mean 12.5
    assert rows["mixed"]["std_tpot_ms"] == pytest.approx((6 * 7.5**2 / 5) ** 0.5)
    assert rows["mixed"]["cv_tpot_ms"] == pytest.approx(rows["mixed"]["std_tpot_ms"] / 12.5)
    assert rows["fast"]["std_tpot_ms"] == 0.0
    assert (rows["fast"]["load_avg_before"], rows["fast"]["load_avg_after"], rows["fast"]["load_avg_max"]) == \
        (1.0, 1.2, 3.5)
    assert summary["load_avg_max"] == 3.5
    (warning,) = warnings(summary)
    assert "load average reached 3.5 on 2 cores" in warning and summary["warnings"] == [warning]
    assert warnings(summarize(records, cores=4)) == []  # 3.5 on 4 cores: nothing competed
    cells = {r.split("│")[1].strip(): r for r in _printed(table(summary, "t")).splitlines() if r.count("│") > 5}
    assert "1.00*" in cells["mixed"] and "2.00 " in cells["fast"] and "*" not in cells["fast"]


def test_an_incomplete_run_is_marked_in_the_summary_and_every_table():
    plan = expected_requests([(s, 0.0, c) for s in ("plain", "fast") for c in ("coding", "math") for _ in range(2)])
    assert sorted((e["system"], e["category"], e["requests"]) for e in plan) == [
        ("fast", "coding", 2), ("fast", "math", 2), ("plain", "coding", 2), ("plain", "math", 2)]
    records = [_record("plain", "a", 10.0), _record("plain", "b", 10.0), _record("plain", "c", 10.0, category="math"),
               _record("fast", "a", 5.0)]
    summary = summarize(records, plan)
    assert (summary["requests_done"], summary["requests_expected"], summary["complete"]) == (4, 8, False)
    rows = {(r["system"], r["category"]): r for r in summary["rows"]}
    assert rows[("plain", "math")]["requests_expected"] == 2 and rows[("plain", "overall")]["requests_expected"] == 4
    printed = _printed(table(summary, "run"))
    assert "INCOMPLETE: 4 of 8 requests done" in printed and "3/4" in printed and "1/4" in printed
    assert "INCOMPLETE" in _printed(table(summary, "run", "math"))
    md = markdown(summary, "run")
    assert "incomplete run: 4 of 8 requests done" in md and "| 1/2 |" in md
    done = summarize(records + [_record("plain", "d", 10.0, category="math")] +
                     [_record("fast", q, 5.0, category=c) for q, c in (("b", "coding"), ("c", "math"), ("d", "math"))],
                     plan)
    (few,) = warnings(done)  # finished: not incomplete any more; its 4 prompt pairs are too few for a verdict
    assert done["complete"] is True and few.startswith("too few prompts for an interval, so no verdict: fast T=0")
    rows = [line.split("│") for line in _printed(table(done, "run")).splitlines() if line.count("│") > 5]
    assert [r[3].strip() for r in rows] == ["4", "4"] and "INCOMPLETE" not in _printed(table(done, "run"))


def test_the_legend_defines_every_column():
    for header, _ in COLUMNS[1:]:  # `system` needs no definition
        assert f"{header}:" in LEGEND, header


def _printed(renderable) -> str:
    buf = io.StringIO()
    show(Console(file=buf, width=80), renderable)
    return buf.getvalue()


def test_off_a_terminal_a_wide_table_prints_every_cell_whole():
    from rich.table import Table

    t = Table(title="wide")
    cells = [f"cell-{i}-{'x' * 12}" for i in range(10)]
    for i in range(10):
        t.add_column(f"column {i} header")
    t.add_row(*cells)
    printed = _printed(t)
    assert all(c in printed for c in cells) and all(f"column {i} header" in printed for i in range(10))
    assert "…" not in printed and max(map(len, printed.splitlines())) > 80


def test_off_a_terminal_progress_is_plain_lines(monkeypatch):
    buf = io.StringIO()
    now = [0.0]
    monkeypatch.setattr("harness.runs.progress.time.monotonic", lambda: now[0])

    def at(t, action, *args):
        now[0] = t
        action(*args)

    with RunProgress(Console(file=buf, width=80), 3, interval_s=15) as p:
        at(0, p.step, "plain T=0", "(warm-up)")  # a new label prints
        at(1, p.step, "plain T=0", "coding")  # the same label: no line
        at(2, p.advance)  # 2 s since the last line: no line
        at(20, p.advance)  # 20 s since the last line
        at(21, p.step, "dspark T=0", "coding")  # a new label
        at(40, p.advance)  # 19 s since the last line
        now[0] = 41
    assert buf.getvalue().splitlines() == [
        "[0/3 requests, 0 s] plain T=0 (warm-up)", "[2/3 requests, 20 s] plain T=0 coding",
        "[2/3 requests, 21 s] dspark T=0 coding", "[3/3 requests, 40 s] dspark T=0 coding",
        "[3/3 requests, 41 s] finished"]


def test_progress_lines_name_the_system_and_category_and_the_time_left(monkeypatch):
    """As a run of alternating systems logs it: the periodic line names the request running now (its system
    and category, not only the temperature) and, from the third request done, the time left: the mean
    time between requests after the first (which waited for the warm-up) times those to come."""
    buf = io.StringIO()
    now = [0.0]
    monkeypatch.setattr("harness.runs.progress.time.monotonic", lambda: now[0])
    with RunProgress(Console(file=buf, width=80), 12, interval_s=5) as p:
        p.step("warm-up plain T=0", "(untimed)")
        now[0] = 30.0  # the warm-ups
        for i in range(12):
            p.step("T=0", f"{'coding' if i < 6 else 'humanities'} {'plain' if i % 2 == 0 else 'dspark'}")
            now[0] += 2.0 if i else 1.0  # the first request ends 1 s after the warm-ups, then one every 2 s
            p.advance()
    lines = buf.getvalue().splitlines()
    assert lines[:4] == ["[0/12 requests, 0 s] warm-up plain T=0 (untimed)",
                         "[0/12 requests, 30 s] T=0 coding plain",
                         "[3/12 requests, 35 s, about 18 s left] T=0 coding plain",  # 2 s a request, 9 to come
                         "[6/12 requests, 41 s, about 12 s left] T=0 coding dspark"]
    assert lines[4:] == ["[9/12 requests, 47 s, about 6 s left] T=0 humanities plain",
                         "[12/12 requests, 53 s] T=0 humanities dspark", "[12/12 requests, 53 s] finished"]

"""Issue 52's intervals that must not mislead: a contention warning that says an interval was widened only
where it moved (and by how much), in lines a reader can read; no figure or interval end that is not 1
printed as 1.00; an acceptance length's interval by the speedup's rule (a t interval over requests, none
below MIN_PAIRS); and a run folder whose requests.jsonl is gone said in one line, with no empty table."""

from __future__ import annotations

import io
import math

import pytest
from rich.console import Console

from harness.analysis.metrics import MIN_PAIRS, interval_text, length_interval, side_text, t_quantile
from harness.analysis.report_text import clause, ratio_cell, warning_html
from harness.analysis.summary import summarize, summarize_folder
from harness.analysis.table_text import WRAP, cells, contention_line, markdown, warning_lines
from harness.cli.run import print_summary
from tests.cli_runner import run_cli
from tests.run_folders import empty, native, write


def _record(system: str, qid: str, tpot: float, share: float, contended: bool) -> dict:
    method = "plain" if system == "plain" else "fast"
    return {"system": system, "method": method, "question_id": qid, "category": "coding", "turn": 0,
            "temperature": 0.0, "prompt_sha256": qid, "output_tokens": 11,
            "acceptance_lengths": [] if method == "plain" else [3, 2],
            "proposal_lengths": [] if method == "plain" else [6, 6], "ttft_ms": 5.0, "tpot_ms": tpot,
            "e2el_ms": 5.0 + 10 * tpot, "round_ms": {}, "matches_baseline": None,
            "contention": {"cpu_share": share, "other_cores": 1.5 if contended else 0.0, "contended": contended}}


def _overall(summary: dict, system: str = "fast") -> dict:
    return next(r for r in summary["rows"] if r["system"] == system and r["category"] == "overall")


def test_a_widening_that_moved_no_interval_says_so():
    """The issue's 8 rows of "0.56-1.82 (wall times alone: 0.56-1.82)": one contended plain request, its
    TPOT doubled, is an outlier of the wall-time pairs; scaled back to a quiet machine the pairs agree, so
    their interval lies inside the wall-time one and the union is the wall-time interval. The warning must
    not call it widened."""
    plain = [10.0, 10.5, 9.5, 10.2, 9.8, 10.0]
    records = [_record("plain", f"q{i}", t * (2 if i == 5 else 1), 0.5 if i == 5 else 1.0, i == 5)
               for i, t in enumerate(plain)]
    records += [_record("fast", f"q{i}", 5.0, 1.0, False) for i in range(len(plain))]
    summary = summarize(records, cores=2)
    fast = _overall(summary)
    assert fast["speedup_ci95"] == fast["speedup_ci95_timed"]  # the union changed nothing
    assert summary["contention_widened"] == [] and summary["contention_unwidened"] == ["fast T=0"]
    (warning,) = summary["warnings"]
    assert "wall times alone" not in warning and "intervals widened" not in warning
    assert "widening changed no interval: fast T=0" in warning
    assert "widening changed no interval" in contention_line(summary)
    assert "intervals widened" not in contention_line(summary)


def test_a_widened_interval_says_by_how_much_in_short_lines():
    """Plain decoding timed at half a core: the interval moves down to the quiet figure; the warning lists the
    row on a line of its own with the wall-time interval and how far the lower end moved, and no line of the
    terminal's, summary.md's or the HTML's warning runs past the wrap width."""
    tpots = [10.0, 11.0, 9.0, 10.5, 9.5, 10.25]
    records = [_record("plain", f"q{i}", 2 * t, 0.5, True) for i, t in enumerate(tpots)]
    records += [_record("fast", f"q{i}", t / 1.2, 1.0, False) for i, t in enumerate(tpots)]
    records += [_record("plain", "q9", 10.0, 1.0, False)]
    summary = summarize(records, cores=2)
    fast = _overall(summary)
    lo, lo_timed = fast["speedup_ci95"][0], fast["speedup_ci95_timed"][0]
    (line,) = summary["contention_widened"]
    assert line.startswith(f"fast T=0: {interval_text(fast['speedup_ci95'])} (wall times alone: "
                           f"{interval_text(fast['speedup_ci95_timed'])}; lower end down by {lo_timed - lo:.2g})")
    (warning,) = summary["warnings"]
    assert f"\n- {line}" in warning and "widening changed no interval" not in warning
    printed = warning_lines(warning)
    assert printed[0].startswith("warning: contention: 6 of 13") and any(x.startswith("  - fast T=0:") for x in printed)
    assert max(map(len, printed)) <= WRAP
    text = markdown(summary, "t")
    assert "**Warning**: contention" in text
    warned = text[text.index("**Warning**"):].split("\n\n")[0].splitlines()
    assert max(map(len, warned)) <= WRAP and any(x.startswith("  - fast T=0:") for x in warned)
    console = Console(file=io.StringIO(), width=300)
    print_summary(summary, "t", console=console)
    shown = console.file.getvalue()
    block = shown[shown.index("warning: contention"):].splitlines()
    assert "  - fast T=0:" in shown and len(block) == len(printed) and max(map(len, block)) <= WRAP
    html = warning_html(warning)
    assert "<ul><li>fast T=0:" in html and html.count("<li>") == 2


def test_an_interval_that_excludes_1_never_prints_touching_it():
    """dflash's 0.70-0.9966 printed as "0.70-1.00" with no `*`: each end that rounds to 1.00 gets the
    digits that show its side, in the table's cells, the HTML's cells and the verdict; a speedup of 0.998
    is not "1.00"; an interval that includes 1 keeps printing so."""
    assert side_text(0.9966) == "0.997" and side_text(0.998) == "0.998" and side_text(1.0004) == "1.0004"
    assert side_text(1.0) == "1.00" and side_text(1.234) == "1.23" and side_text(0.5) == "0.50"
    assert interval_text([0.7012, 0.9966]) == "0.70-0.997" and interval_text([1.004, 1.5]) == "1.004-1.50"
    assert interval_text([0.996, 1.3]) == "0.996-1.30"  # (includes 1, and reads so)
    row = {"system": "dflash", "method": "dflash", "temperature": 0.0, "max_concurrency": 1, "speedup": 0.8354,
           "speedup_ci95": [0.7012, 0.9966], "speedup_ci95_spans_1": False, "speedup_ci95_reason": None}
    assert cells(row, [("speedup", "speedup"), ("95% CI", "speedup_ci95")]) == ["0.84", "0.70-0.997"]
    assert cells(row | {"speedup": 0.998, "speedup_ci95": [0.95, 1.04], "speedup_ci95_spans_1": True},
                 [("speedup", "speedup")]) == ["0.998*"]
    assert ratio_cell([0.7012, 0.9966]) == "0.70-0.997" and ratio_cell(0.998) == "0.998"
    assert clause(row, "dflash", False) == "dflash: slower than plain decoding at T=0, 0.84x (95 % CI 0.70-0.997)"
    near = row | {"speedup": 0.998, "speedup_ci95": [0.9971, 0.9989]}
    assert clause(near, "dflash", False).endswith("0.998x (95 % CI 0.997-0.999)")
    summary = summarize([native("plain", f"q{i}", 10.0) for i in range(8)] +
                        [native("dflash", f"q{i}", 10.0 / (0.9966 - i / 1000)) for i in range(8)], cores=2)
    dflash = _overall(summary, "dflash")
    assert dflash["speedup_ci95"][1] < 1 and dflash["speedup_ci95_spans_1"] is False
    line = next(x for x in markdown(summary, "t").splitlines() if x.startswith("| dflash"))
    assert "1.00" not in line and "*" not in line


def test_acceptance_length_interval_follows_the_speedup_rule():
    """A t interval on per-request values, none below MIN_PAIRS requests: with equal rounds per request it
    is the one-sample t interval of the requests' acceptance lengths; a bootstrap over 3 requests used to
    give one."""
    accepted = [10, 14, 9, 20, 12, 16, 11, 15]
    got = length_interval([[(10, a) for a in accepted]])
    values = [1 + a / 10 for a in accepted]
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    half = t_quantile(0.975, len(values) - 1) * sd / math.sqrt(len(values))
    assert got["centre"] == pytest.approx(mean) and got["ci"] == pytest.approx([mean - half, mean + half])
    few = length_interval([[(10, a) for a in accepted[:MIN_PAIRS - 1]]])
    assert few["ci"] is None and few["reason"] == f"too few requests ({MIN_PAIRS - 1}) for an interval"
    # two categories: the macro length, its variance pooled within them
    two = length_interval([[(10, a) for a in accepted[:4]], [(20, 2 * a) for a in accepted[4:]]])
    assert two["centre"] == pytest.approx((1 + sum(accepted[:4]) / 40 + 1 + sum(accepted[4:]) / 40) / 2)
    assert two["ci"][0] < two["centre"] < two["ci"][1]


def test_html_al_column_says_too_few_requests(tmp_path):
    """The HTML headline's AL 95 % CI column: the reason where a system has fewer than MIN_PAIRS requests."""
    from harness.analysis.frames import load_runs
    from harness.analysis.report_text import summary_table

    run = write(tmp_path / "r", [native(s, f"q{i}", 5.0 if s == "plain" else 4.0) for s in ("plain", "dspark")
                                 for i in range(4)], systems=["plain", "dspark"])
    table = repr(summary_table(load_runs([run])))
    assert "too few requests (4) for an interval" in table


def test_a_run_without_requests_jsonl_says_so_and_prints_no_empty_table(tmp_path, monkeypatch, capfd):
    """The issue's deleted requests.jsonl of a one-at-a-time run: no "concurrency sweep" table, no empty
    table at all, one line naming what is missing and how to recover."""
    run = write(tmp_path / "gone", [native(s, f"q{i}", 5.0) for s in ("plain", "dspark") for i in range(6)],
                systems=["plain", "dspark"])
    (run / "requests.jsonl").unlink()
    code, out, err = run_cli(monkeypatch, capfd, "report", run)
    assert code == 0, err
    assert "concurrency sweep" not in out and "┃" not in out and "│" not in out
    (warning,) = out.split("warning: ")[1:]  # one message (wrapped at the width): what is missing, how to recover
    assert "no requests.jsonl in" in warning and f"--resume {run.resolve()}" in " ".join(warning.split())
    assert "incomplete" not in out
    assert summarize_folder(run)["warnings"][0].startswith(f"no requests.jsonl in {run.resolve()}")
    assert "| system" not in markdown(summarize_folder(run), "t")
    # a run stopped before any request finished: the file is there, empty; no sweep table either
    code, out, _ = run_cli(monkeypatch, capfd, "report", empty(tmp_path))
    assert code == 0 and "concurrency sweep" not in out and "incomplete run: 0 of 4" in out


def test_report_a_b_never_prints_a_speedup_that_is_not_1_as_1():
    """`report A B`'s deltas: B's speedup 0.998 reads 0.998, not 1.00."""
    from harness.cli.render import deltas_table

    row = {"system": "dflash", "temperature": 0.0, "max_concurrency": 1, "speedup": [1.2, 0.998],
           "speedup_diff": -0.202, "intervals_overlap": False, "speedup_pairs": [8, 8],
           "speedup_ci95_reason": [None, None], "acceptance_length": [2.0, 2.0], "acceptance_length_diff": 0.0,
           "tpot_ms": [5.0, 6.0], "tpot_ratio": 1.2}
    console = Console(file=io.StringIO(), width=200)
    console.print(deltas_table({"rows": [row]}, ("A", "B"), "t"))
    assert "1.20 -> 0.998" in console.file.getvalue()

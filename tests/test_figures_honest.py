"""Figures that count what their labels say (issue 52): per-position acceptance over every verify round
(n-gram's rounds that proposed nothing included) in summary.png, the HTML's joint panel and the metrics;
the predicted speedup line per system from its own round cost; a note where a profile and a run were
timed under different conditions; the "too few prompts" label clear of the panel title; the engines
notebook's settings line, the one `parity` prints."""

from __future__ import annotations

import json

import matplotlib
import pytest

matplotlib.use("Agg")

import run_folders  # noqa: E402

from harness.analysis import frames, report_figures  # noqa: E402
from harness.analysis.metrics import acceptance  # noqa: E402
from harness.analysis.run_figures import summary_figure  # noqa: E402
from harness.analysis.summary import summarize_folder  # noqa: E402

# n-gram's rounds of two requests: most rounds find no match and propose nothing (they still verify one
# token); 10 rounds, 3 of which proposed: position 1 accepted in 2, position 2 in 1, position 3 in none
NGRAM = {"q1": ([0, 0, 3, 0, 2], [0, 0, 2, 0, 1]), "q2": ([0, 0, 0, 3, 0], [0, 0, 0, 0, 0])}


def _ngram_run(root, prompts=("q1", "q2")):
    """plain and n-gram on two prompts, n-gram's rounds as NGRAM."""
    records = []
    for q in prompts:
        proposed, accepted = NGRAM[q]
        records.append(run_folders.native("plain", q, 10.0))
        records.append(run_folders.native("ngram", q, 9.0, method="ngram") | {
            "proposal_lengths": proposed, "accepted_counts": accepted, "acceptance_lengths": [a + 1 for a in accepted],
            "num_rounds": len(accepted)})
    return run_folders.write(root / "ngram", records, systems=["plain", "ngram"])


def test_joint_acceptance_counts_every_round_in_the_metrics_the_frames_and_both_figures(tmp_path):
    proposed = NGRAM["q1"][0] + NGRAM["q2"][0]
    accepted = NGRAM["q1"][1] + NGRAM["q2"][1]
    m = acceptance([a + 1 for a in accepted], proposed, accepted)
    # over all 10 rounds, not over the 3 that proposed (2/3, 1/3, 0/2 were drawn before)
    assert m["spec_decode_per_position_acceptance_rates"] == pytest.approx([0.2, 0.1, 0.0])
    assert sum(m["spec_decode_per_position_acceptance_rates"]) == pytest.approx(m["spec_decode_acceptance_length"] - 1)
    assert m["spec_decode_conditional_acceptance_rates"] == pytest.approx([2 / 3, 1 / 2, 0.0])  # given k proposed

    run = _ngram_run(tmp_path)
    pos = frames.positions(frames.load_runs([run]).counts.query("system == 'ngram'"))
    assert list(pos["rounds"]) == [10, 10, 10] and list(pos["joint"]) == pytest.approx([0.2, 0.1, 0.0])
    assert list(pos["proposed"]) == [3, 3, 2] and list(pos["conditional"]) == pytest.approx([2 / 3, 1 / 2, 0.0])

    fig = report_figures.position_curves(frames.load_runs([run]))
    joint, cond = fig.axes[0], fig.axes[1]
    assert list(joint.lines[0].get_ydata()) == pytest.approx([0.2, 0.1, 0.0])
    assert "over all rounds" in joint.get_title() and "k proposed" in cond.get_title()
    assert "sum to the pooled AL - 1" in " ".join(t.get_text() for t in fig.texts)

    summary = summarize_folder(run)
    left = summary_figure(summary, "t").axes[0]
    assert list(left.lines[0].get_ydata()) == pytest.approx([0.2, 0.1, 0.0])
    assert left.get_ylabel() == "share of all rounds accepting it" and "over all rounds" in left.get_title()


def test_a_request_whose_rounds_all_proposed_nothing_still_counts_its_rounds(tmp_path):
    records = [run_folders.native("ngram", "q1", 9.0, method="ngram") | {
        "proposal_lengths": [0] * 6, "accepted_counts": [0] * 6, "acceptance_lengths": [1] * 6, "num_rounds": 6},
        run_folders.native("ngram", "q2", 9.0, method="ngram") | {
        "proposal_lengths": [2, 2], "accepted_counts": [2, 1], "acceptance_lengths": [3, 2], "num_rounds": 2}]
    run = run_folders.write(tmp_path / "r", records, systems=["ngram"])
    pos = frames.positions(frames.load_runs([run]).counts)
    assert list(pos["rounds"]) == [8, 8] and list(pos["joint"]) == pytest.approx([2 / 8, 1 / 8])


@pytest.mark.parametrize("prompts", [1, 2, 3])
def test_the_too_few_prompts_label_stays_clear_of_the_panel_title(tmp_path, prompts):
    records = [run_folders.native(s, q, tpot) for q in run_folders.MANY[:prompts]
               for s, tpot in (("plain", 10.0), ("dspark", 5.0))]
    summary = summarize_folder(run_folders.write(tmp_path / "few", records, systems=["plain", "dspark"]))
    fig = summary_figure(summary, "a run of few prompts")
    fig.canvas.draw()
    right = fig.axes[1]
    labels = [t for t in right.texts if "too few" in t.get_text()]
    assert labels and f"prompts ({prompts})" in labels[0].get_text()
    renderer = fig.canvas.get_renderer()
    box, title, axes = (labels[0].get_window_extent(renderer), right.title.get_window_extent(renderer),
                        right.get_window_extent(renderer))
    assert not box.overlaps(title) and box.y1 <= axes.y1  # inside the panel, under its title


BENCH = {"decode_ms": 4.0, "round_ms": 10.44, "round_over_decode": 2.61, "shapes": {"draft": {"name": "demo-dspark"}},
         "eagle3": {"name": "demo-eagle3", "round_ms": 6.0}}


def test_each_system_gets_the_line_of_its_own_round_cost_and_none_without_one(tmp_path):
    from harness.analysis import study_figures

    records = [run_folders.native(s, q, tpot, method=s if s != "plain" else None)
               for q in run_folders.MANY[:3] for s, tpot in (("plain", 10.0), ("dspark", 5.0), ("eagle3", 6.0),
                                                              ("ngram", 9.0))]
    run = run_folders.write(tmp_path / "four", records, systems=["plain", "dspark", "eagle3", "ngram"])
    fig = study_figures.speedup_vs_acceptance(frames.load_runs([run]), BENCH)
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.lines if "AL /" in line.get_label()}
    dspark = lines["dspark: AL / 2.61 (demo-dspark's round, engine-bench)"]
    eagle3 = lines["eagle3: AL / 1.50 (demo-eagle3's round, engine-bench)"]
    for line, cost in ((dspark, 2.61), (eagle3, 1.5)):
        xs, ys = line.get_xdata(), line.get_ydata()
        assert ys[-1] == pytest.approx(xs[-1] / cost) and ys[0] == pytest.approx(1 / cost)
    assert len(lines) == 2  # no line through n-gram's points: engine-bench timed no n-gram round
    dots = {c.get_label(): c.get_facecolor()[0] for c in ax.collections}
    assert tuple(dspark.get_color()) == pytest.approx(tuple(dots["dspark T=0"]))  # each line in its system's colour
    assert "No predicted line for ngram" in " ".join(t.get_text() for t in fig.texts)
    # a vLLM run's systems are not our engine's: no line through them, and the figure says so
    served = run_folders.write(tmp_path / "served", records, systems=["plain", "dspark", "eagle3", "ngram"],
                               backend="vllm")
    fig = study_figures.speedup_vs_acceptance(frames.load_runs([served]), BENCH)
    assert not [line for line in fig.axes[0].lines if "AL /" in line.get_label()]
    assert "No predicted line for dspark, eagle3, ngram" in " ".join(t.get_text() for t in fig.texts)


def test_the_engines_notebook_shows_the_settings_line_parity_prints(tmp_path, monkeypatch, capfd):
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    from cli_runner import run_cli

    from harness.analysis.notebooks import execute, inputs
    from harness.analysis.parity import parity, settings_note

    a, b = run_folders.mixed(tmp_path), run_folders.vllm(tmp_path)  # native against vLLM: settings differ
    line = settings_note(parity(a, b))
    assert line.startswith("settings differ (A vs B): ") and "backend native vs vllm" in line
    code, stdout, _ = run_cli(monkeypatch, capfd, "parity", a, b)
    assert code == 0 and line in stdout.replace("\n", "")  # the command's own line
    nb = execute("engines", inputs([], parity=(a, b)))
    shown = json.dumps([o.get("data", {}).get("text/plain", "") + o.get("data", {}).get("text/html", "")
                        for c in nb.cells if c.cell_type == "code" for o in c.outputs])
    assert json.dumps(line)[1:-1] in shown


def _profiled(root, tpot: float, contended: bool):
    """A CPU profile folder whose dspark child run timed its requests at `tpot`, contended or not."""
    path = run_folders.cpu_profile(root)
    run_folders.write(path / "dspark", [run_folders.native("dspark", q, tpot, contended=contended)
                                        for q in run_folders.QIDS], systems=["dspark"])
    return path


def _quiet_run(root, tpot: float = 5.6):
    return run_folders.write(root / "quiet", [run_folders.native(s, q, t) for q in run_folders.QIDS
                                              for s, t in (("plain", 10.0), ("dspark", tpot))],
                             systems=["plain", "dspark"])


def test_a_profile_timed_under_contention_beside_a_quiet_run_is_said_with_both_figures(tmp_path):
    from harness.analysis.conditions import profile_notes

    run = _quiet_run(tmp_path)
    (note,) = profile_notes([run], [_profiled(tmp_path / "busy", 16.0, True)])
    assert "profile cpu-profile/dspark was timed at 16.0 ms a token" in note and "under contention (4 of 4" in note
    assert "run quiet's dspark at 5.6 ms, quiet" in note and "the profile saw contention" in note
    assert "2.9x apart" in note
    # no contention, but step times far apart: said too; alike and quiet: nothing to say
    (far,) = profile_notes([run], [_profiled(tmp_path / "slow", 12.0, False)])
    assert "their TPOTs are 2.1x apart" in far and "contention" not in far.split(":", 2)[2].split(",")[0]
    assert profile_notes([run], [_profiled(tmp_path / "alike", 6.0, False)]) == []
    assert profile_notes([run], [run_folders.cpu_profile(tmp_path / "bare")]) == []  # no requests: nothing known


def test_the_html_report_shows_the_mixed_conditions_note(tmp_path, monkeypatch, capfd):
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    from cli_runner import run_cli

    run, profile = _quiet_run(tmp_path), _profiled(tmp_path / "busy", 16.0, True)
    code, _, err = run_cli(monkeypatch, capfd, "report", run, "--profile", profile, "--html", tmp_path / "r.html")
    assert code == 0, err
    page = (tmp_path / "r.html").read_text()
    assert "mixed conditions: profile cpu-profile/dspark was timed at 16.0 ms a token" in page
    assert "s dspark at 5.6 ms, quiet: the profile saw contention, their TPOTs are 2.9x apart" in page

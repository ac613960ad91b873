"""The report notebooks execute top to bottom on a real demo run and a real recorded profile (the nsys
traces of `tests/fixtures/nsys`, laid out as `dspark-bench profile` writes a folder), each producing
its figures with no error cell; `report --html` writes one self-contained file with the images
embedded; the notebooks are stored without outputs; the analysis layer imports neither torch nor
rich, and a folder that is not a run or a profile is one line. On every kind of run folder the tool
writes (built in Python by `run_folders`: plain only, no plain, interrupted, empty, failed and
contended requests, vLLM's totals, a served sweep, a CPU profile), each figure draws or says why in
one line, the headline says what ran where and the verdict, and `report --html` writes a clean page
with nothing on the console but the file written."""

from __future__ import annotations

import importlib.util
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import run_cli

from dspark.checkpoint import DEMO_DIR
from dspark.errors import DSparkError

ROOT = Path(__file__).resolve().parents[1]
NSYS = Path(__file__).parent / "fixtures" / "nsys"
needs_tools = pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("nbclient", "nbconvert",
                                                                                   "ipykernel")),
                                 reason="the report extra is not installed (CI installs it with dev)")
needs_demo = pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(),
                                reason="the demo models are not built")
# figures each notebook draws on these inputs (the confidence and sweep figures have nothing to show
# for a native run without them, and say so)
FIGURES = {"acceptance": 4, "speed": 3, "where_time_goes": 3, "engines": 1}  # (acceptance: the DSpark runs record confidences)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    from rich.console import Console

    from harness.runs.plan import RunOptions
    from harness.runs.runner import run

    root = tmp_path_factory.mktemp("notebooks")
    runs = []
    for name in ("a", "b"):  # two runs of the same prompts: the engines notebook's pair
        run(RunOptions(categories=["coding"], num_prompts=3, output_len=24, systems=["plain", "dspark", "ngram"],
                       threads=1, out=str(root / name)), Console(file=io.StringIO()))
        runs.append(root / name)
    profile = root / "profile"  # a profile folder: <system>.sqlite per system
    profile.mkdir()
    for system in ("plain", "dspark"):
        shutil.copy(NSYS / f"engine_{system}.sqlite", profile / f"{system}.sqlite")
    return {"runs": runs, "profile": profile, "root": root}


@needs_tools
@needs_demo
@pytest.mark.parametrize("name", list(FIGURES))
def test_each_notebook_runs_top_to_bottom_and_draws_its_figures(inputs, name):
    from harness.analysis.notebooks import execute
    from harness.analysis.notebooks import inputs as notebook_inputs

    env = notebook_inputs(inputs["runs"][:1], [inputs["profile"]], None, tuple(inputs["runs"]))
    nb = execute(name, env)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == FIGURES[name], name
    text = json.dumps([o.get("data", {}).get("text/plain", "") for o in outputs])
    if name == "where_time_goes":
        assert "dspark" in text and "plain" in text  # the launches table names both systems


@needs_tools
@needs_demo
def test_the_html_report_of_a_demo_run_embeds_its_images(inputs, monkeypatch, capfd):
    out = inputs["root"] / "report.html"
    code, _, err = run_cli(monkeypatch, capfd, "report", inputs["runs"][0], "--html", out)
    assert code == 0, err
    html = out.read_text()
    assert html.count("data:image/png;base64,") >= FIGURES["acceptance"] + FIGURES["speed"]
    assert "src=\"http" not in html.replace("src=\"https://cdn", "")  # the figures are in the file, not linked
    assert "the acceptance, speed notebooks" in err and inputs["runs"][0].name in html  # what produced them


def test_the_notebooks_are_stored_without_outputs():
    books = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert {b.stem for b in books} == {"acceptance", "speed", "where_time_goes", "engines"}
    for book in books:
        cells = json.loads(book.read_text())["cells"]
        assert all(not c.get("outputs") and c.get("execution_count") is None for c in cells if c["cell_type"] == "code")


def test_the_analysis_layer_needs_neither_torch_nor_rich():
    code = ("import sys; import harness.analysis.frames, harness.analysis.report_figures, harness.analysis.notebooks, "
            "harness.analysis.calibration, harness.analysis.policies, harness.analysis.reliability; "
            "bad = [m for m in ('torch', 'rich') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_folder_that_is_not_a_run_or_profile_is_one_line(tmp_path, monkeypatch, capfd):
    from harness.analysis.frames import load_profiles, load_runs

    with pytest.raises(DSparkError, match="not a run folder"):
        load_runs([tmp_path])
    with pytest.raises(DSparkError, match="not a profile folder"):
        load_profiles([tmp_path])
    code, _, err = run_cli(monkeypatch, capfd, "report", tmp_path, "--html", tmp_path / "r.html")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "not" in err
    import run_folders

    run = run_folders.plain_only(tmp_path)
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli(monkeypatch, capfd, "report", run, "--html", tmp_path / "r.html", "--profile",
                           tmp_path / "empty")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "not a profile folder" in err  # before any kernel


# --- every kind of run folder, without a kernel: each section draws or says why in one line ---------------

SECTIONS = ("acceptance_length", "position_curves", "accepted_histogram", "acceptance_vs_confidence",
            "latency_distributions", "paired_speedup", "speedup_vs_acceptance", "reliability_diagrams")
RECORDED_ONLY = ("acceptance_vs_confidence", "reliability_diagrams")  # drawn where a run recorded them
FIG = "figure"
# what each kind of folder must give (a section left out here must still draw or say why in one line)
EXPECTED = {
    "plain_only": {"acceptance_length": "no speculative system", "paired_speedup": "plain decoding only",
                   "latency_distributions": FIG},
    "no_plain": {"acceptance_length": FIG, "position_curves": FIG, "accepted_histogram": FIG,
                 "paired_speedup": "no plain-decoding baseline in this run",
                 "speedup_vs_acceptance": "no plain-decoding baseline in this run"},
    "interrupted": {"paired_speedup": "plain decoding only", "latency_distributions": FIG},
    "empty": {section: "no finished request" for section in SECTIONS if section not in RECORDED_ONLY},
    "mixed": {section: FIG for section in SECTIONS if section not in RECORDED_ONLY},
    "vllm": {"acceptance_length": FIG, "position_curves": FIG, "accepted_histogram": "totals, not rounds",
             "paired_speedup": "no request has a TPOT"},
    "sweep": {"acceptance_length": "counters count whole waves", "position_curves": FIG, "paired_speedup": FIG},
    "older": {"acceptance_length": FIG, "position_curves": FIG, "paired_speedup": FIG, "latency_distributions": FIG},
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    import run_folders

    root = tmp_path_factory.mktemp("kinds")
    return {kind: make(root) for kind, make in run_folders.KINDS.items()} | {"cpu_profile": run_folders.cpu_profile(root)}


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_every_section_draws_or_says_why_in_one_line_on_every_kind_of_run(folders, kind):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from harness.analysis import frames, reliability, report_figures, report_text, study_figures

    runs = frames.load_runs([folders[kind]])
    modules = {"reliability_diagrams": reliability, "speedup_vs_acceptance": study_figures}
    for section in SECTIONS:
        drawn = getattr(modules.get(section, report_figures), section)(runs)
        want = EXPECTED[kind].get(section)
        if isinstance(drawn, str):
            assert "\n" not in drawn and want != FIG, (section, drawn)
            assert want is None or want in drawn, (section, drawn)
        else:
            assert want is None or want == FIG, (section, want)
            alt = report_figures.alt_text(drawn)
            assert drawn._suptitle.get_text() in alt and "against" in alt  # the image says what it shows
            for ax in drawn.axes:
                assert ax.get_yscale() == "linear"
            plt.close(drawn)
    shown = [report_text.Headline(runs), report_text.speed_table(runs), report_text.acceptance_table(runs)]
    for thing in shown:
        text = thing._repr_html_() + repr(thing)
        assert not any(bad in text for bad in ("nan", "NaN", "None", "[", "Traceback")), (kind, text)
    if kind == "sweep":
        rows = runs.summary[runs.summary["run"] == runs.meta["run"][0]]
        fig = report_figures.speedup_vs_concurrency(rows, runs.caption())
        assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["1", "4"]
        plt.close(fig)


def test_the_headline_says_what_ran_where_the_verdict_and_the_warnings(folders):
    from harness.analysis import frames, report_text

    runs = frames.load_runs([folders["mixed"]])
    text = repr(report_text.Headline(runs))
    assert ("mixed: native backend on cpu (x86_64, 2 cores); target demo; qualitative split, coding, math; "
            "systems plain, dspark, dflash; 41 of 48 requests; git 0123456 (uncommitted changes); 2026-01-02") in text
    verdict = report_text.verdict(runs)
    assert verdict.startswith("dspark: 2.00x faster than plain decoding at T=0 (95 % CI 1.78-")
    assert "dflash: no clear speedup at T=0, 1.28x (the 95 % CI 0." in verdict and "spans 1)" in verdict
    assert "dflash: too few prompts (1) for an interval at T=1 (1.11x measured, no verdict)" in verdict
    assert verdict.endswith(".") and "faster than plain decoding at T=1" not in verdict
    html = report_text.Headline(runs)._repr_html_()
    for warning in ("incomplete run: 41 of 48 requests done", "1 requests failed", "contention: 2 of",
                    "too few prompts for an interval, so no verdict: dflash T=1 (1 pair)"):
        assert warning in html
    assert "busy: requests timed while other processes competed" in html  # the legend defines the busy column
    assert "8 (1 failed)" in html and "1 of 8" in html  # requests per row: failed and unfinished
    assert "<td>too few prompts (1) for an interval</td>" in html  # the table's interval cell says why
    both = frames.load_runs([folders["mixed"], folders["no_plain"]])
    verdict = report_text.verdict(both)
    assert verdict.startswith("mixed/dspark: 2.00x faster") and "no-plain: no speedup: plain decoding is not" in verdict
    assert report_text.verdict(frames.load_runs([folders["plain_only"]])) == \
        "plain decoding only, no speculative system to compare with it."


def test_per_position_acceptance_has_wilson_intervals_and_leaves_out_sparse_positions():
    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd

    from harness.analysis import frames, report_figures

    lo, hi = frames.wilson(8, 10)
    assert (round(lo, 3), round(hi, 3)) == (0.490, 0.943)  # the Wilson score interval of 8 of 10
    assert frames.wilson(5, 5)[1] == 1.0 and frames.wilson(5, 5)[0] < 0.6  # all accepted: not a certainty
    # 40 rounds propose 3 drafts: 20 accept none, 12 one, 6 two, 2 all three
    counts = pd.DataFrame([{"run": "r", "system": "dspark", "method": "dspark", "temperature": 0.0,
                            "max_concurrency": 1, "position": k, "rounds": 40, "proposed": 40, "reached": r,
                            "accepted": a}
                           for k, r, a in ((1, 40, 20), (2, 20, 8), (3, 8, 2))])
    pos = frames.positions(counts)
    assert list(pos["joint"]) == [0.5, 0.2, 0.05] and list(pos["conditional"]) == [0.5, 0.4, 0.25]
    assert (pos["joint_lo"] < pos["joint"]).all() and (pos["conditional_hi"] > pos["conditional"]).all()
    runs = frames.Runs(pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), pd.DataFrame([{"run": "r", "backend": "native",
                       "device": "cpu", "target": "demo", "date": "?"}]), counts)
    fig = report_figures.position_curves(runs)
    cond = fig.axes[1].lines[0]
    assert list(cond.get_xdata()) == [1, 2]  # position 3: 8 rounds reached it, fewer than 10
    assert "fewer than 10 rounds" in " ".join(t.get_text() for t in fig.texts) and "dspark T=0 from 3" in \
        " ".join(t.get_text() for t in fig.texts)


def test_tables_are_rounded_with_no_index_and_a_dash_for_a_missing_value():
    import pandas as pd

    from harness.analysis.report_text import Table, percent

    frame = pd.DataFrame([{"system": "a", "x": 1.23456, "ci": [0.91234, 1.5], "rate": 0.4567, "empty": None},
                          {"system": "b", "x": float("nan"), "ci": None, "rate": None, "empty": None}])
    table = Table(frame, [("system", "system", 0), ("x", "x", 2), ("ci", "95 % CI", 2), ("rate", "rate", percent),
                          ("empty", "never shown", 2), ("absent", "not in the frame", 2)])
    assert repr(table).splitlines() == ["system  x     95 % CI    rate", "a       1.23  0.91-1.50  46 %",
                                        "b       -     -          -"]
    html = table._repr_html_()
    assert "<th>system</th>" in html and html.count("</th>") == 4 and "never shown" not in html  # no index column
    assert '<td class="num">1.23</td>' in html and "nan" not in html


def test_a_cpu_profile_leaves_out_its_kernel_plots_in_one_line(folders, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from harness.analysis import frames, report_figures, report_text

    profiles = frames.load_profiles([folders["cpu_profile"]])
    assert "no GPU kernels" in report_figures.kernel_shares(profiles, "c")
    assert "no GPU kernels" in report_figures.launches_per_token(profiles, "c")
    fig = report_figures.step_times(profiles, "c")
    assert sorted(t.get_text() for t in fig.axes[0].get_yticklabels()) == ["decode", "verify"]
    assert "no profile saw GPU work" in repr(report_text.launches_table(profiles))
    # the folder named once: in the caption, not on each row
    assert repr(report_text.operators_table(profiles, top=1)).splitlines() == [
        "cpu-profile: the 1 operators with the most self time, per system",
        "system  operator  calls  self ms  share", "dspark  aten::mm  40     300.0    60 %",
        "plain   aten::mm  40     300.0    60 %"]
    assert report_text.operators_table(profiles)._repr_html_().count("cpu-profile") == 1
    # of several profiles, each named on the first of its rows
    second = shutil.copytree(folders["cpu_profile"], tmp_path / "second-profile")
    both = frames.load_profiles([folders["cpu_profile"], second])
    assert [line.split()[0] for line in repr(report_text.operators_table(both, top=1)).splitlines()[1:]] == [
        "profile", "cpu-profile", "plain", "second-profile", "plain"]
    page = report_text.operators_table(both)._repr_html_()
    assert page.count("cpu-profile") == page.count("second-profile") == 1


def test_the_engines_tables_of_a_parity_pair(folders):
    from harness.analysis import report_text
    from harness.analysis.parity import parity

    result = parity(folders["mixed"], folders["vllm"])  # native against vLLM's totals
    assert repr(report_text.parity_table(result)).splitlines()[1:] == [
        "plain   0  1  2        2/2           2/2                   none",
        "dspark  0  1  2        2/2           2/2                   unclassified 2"]
    assert "only totals are known for one side" in repr(report_text.divergences_table(result))
    apart = parity(folders["plain_only"], folders["no_plain"])
    assert repr(report_text.parity_table(apart)) == "parity: the two runs share no system, temperature and prompt"
    assert repr(report_text.divergences_table(apart)) == "divergences: nothing compared"


# --- report --html on every kind of run folder (built in Python; one notebook kernel per report) ----------

def _html_report(tmp_path, monkeypatch, capfd, *args) -> str:
    """`report ARGS --html`: exit 0, nothing on stderr but the file written; the page, checked for what a
    reader must never see (code prompts, tracebacks, NaN cells, raw lists, images without alt text)."""
    out = tmp_path / "report.html"
    code, stdout, err = run_cli(monkeypatch, capfd, "report", *args, "--html", out)
    assert code == 0, err
    assert stdout == ""  # the tables are in the page
    assert err.strip().splitlines() == [f"wrote {out}: the {err.split(': the ')[1].split(' notebooks')[0]} "
                                        "notebooks, figures embedded"], err
    page = out.read_text()
    body = re.sub(r"data:image/png;base64,[^\"]*", "", page[page.index("<body"):])  # (the text, not the pixels)
    for bad in ("Out[", "In [", "Traceback", ">nan<", "NaN", "could not be drawn", "<script src=", "['"):
        assert bad not in body, bad
    images = re.findall(r"<img [^>]*>", body)
    assert images and all(re.search(r'alt="[^"]{20,}"', img) for img in images)  # every figure described
    assert "<h1>DSpark benchmark report: " in body and "Verdict</span>" in body
    return body


def _words(body: str) -> str:
    """A page's text, its tags left out (a system's name in the verdict is in bold)."""
    return re.sub(r"<[^>]+>", "", body)


@needs_tools
def test_report_html_of_a_plain_only_run(tmp_path, monkeypatch, capfd):
    import run_folders

    body = _html_report(tmp_path, monkeypatch, capfd, run_folders.plain_only(tmp_path))
    assert "plain decoding only, no speculative system to compare with it." in body
    assert "speedup per prompt: plain decoding only" in body and "acceptance length: no speculative system" in body
    assert body.count("<img ") == 1  # latency: the one figure plain decoding has


@needs_tools
def test_report_html_of_a_native_and_a_vllm_run_with_a_cpu_profile_and_step_costs(tmp_path, monkeypatch, capfd):
    import run_folders
    from test_trace import _kineto

    bench = tmp_path / "engine-bench.json"  # (`engine-bench --json`: a round's cost in decode steps)
    bench.write_text(json.dumps({"round_over_decode": 1.5, "decode_ms": 4.0, "round_ms": 6.0}))
    raw = _kineto(tmp_path / "raw" / "trace.torch.json.gz", [("aten::zeta_op", 1.0, 50.0)])  # a trace file alone
    body = _html_report(tmp_path, monkeypatch, capfd, run_folders.mixed(tmp_path), run_folders.vllm(tmp_path),
                        "--profile", run_folders.cpu_profile(tmp_path), "--profile", raw, "--engine-bench", bench)
    assert "aten::zeta_op" in body  # the raw PyTorch trace was read (its host operators)
    # each block-draft system's predicted line, named with whose round it uses (in the alt text); none for vLLM's
    assert "dspark (mixed): AL / 1.50 (the block draft's round, engine-bench)" in body
    assert "dspark (vllm): AL /" not in body
    assert "mixed/dspark: 2.00x faster than plain decoding at T=0" in _words(body)
    assert "vllm/dspark: no speedup" in _words(body)
    for warning in ("mixed: incomplete run", "mixed: 1 requests failed", "mixed: contention"):
        assert warning in body
    assert "<h1" in body and "Engines" in body and "equal greedy outputs" in body  # the parity pair's table
    assert "kernel categories: the profiles recorded no GPU kernels" in body and "step ranges" in body
    assert body.count("<td>cpu-profile</td>") == 1  # the host operators name the folder once, not on its 4 rows


@needs_tools
def test_report_html_of_a_sweep_an_unfinished_run_an_empty_one_and_one_without_plain(tmp_path, monkeypatch, capfd):
    import run_folders

    body = _html_report(tmp_path, monkeypatch, capfd, *(make(tmp_path) for make in (
        run_folders.sweep, run_folders.interrupted, run_folders.empty, run_folders.no_plain)))
    words = _words(body)
    assert "sweep/ngram: 1.67x faster than plain decoding at T=0, c=1" in words
    assert "empty: no finished request yet" in words and "interrupted: incomplete run: 1 of 8 requests done" in words
    assert "no-plain: no speedup: plain decoding is not among the systems" in words
    assert "concurrency sweep" in body  # the sweep's figure (its alt text)


@needs_tools
def test_a_section_that_fails_is_one_line_in_the_report_and_the_rest_is_drawn(tmp_path):
    import run_folders

    from harness.analysis.notebooks import inputs, report_html

    (tmp_path / "empty").mkdir()  # DSPARK_PROFILES that hold no profile: its notebook cannot load them
    env = inputs([run_folders.plain_only(tmp_path)]) | {"DSPARK_PROFILES": str(tmp_path / "empty")}
    names, failures = report_html(env, tmp_path / "r.html")
    assert names == ["acceptance", "speed", "where_time_goes"]
    assert len(failures) == 1 and failures[0].startswith("where_time_goes: DSparkError: ") and \
        "not a profile folder" in failures[0]
    body = (tmp_path / "r.html").read_text()
    assert body.count("this section could not be drawn") == 1 and "Traceback" not in body
    assert "Where the time goes" in body and "Kernel categories" not in body  # the rest of that notebook left out
    assert "Latency per request" in body  # the others drawn

"""Every path a command writes is checked before any work (`harness.cli.paths`): one that cannot be
written is refused in one line naming it (exit 2), with nothing made and nothing run, never a traceback
after minutes of work. /proc takes no new file even for root (the tests run as root, where permission
bits say nothing), and nothing can be made under a file."""

from __future__ import annotations

from pathlib import Path

import pytest
import run_folders
from cli_runner import run_cli

from harness.cli import paths
from dspark.errors import DSparkError

NOWHERE = Path("/proc/nope")  # (no new file in /proc, whoever asks)
RUN = ["run", "--systems", "plain", "--num-prompts", "1", "--output-len", "4", "--device", "cpu"]


def _refused(monkeypatch, capfd, *args, says: str) -> str:
    """The command's one line on stderr, after checking it was refused as it must be."""
    code, out, err = run_cli(monkeypatch, capfd, *args)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and says in err, (args, code, out, err)
    return err


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_the_checks_accept_a_new_nested_path_and_make_nothing(tmp_path):
    """A path whose folders are still to be made passes, and the check leaves no trace: no folder made, no
    probe file left behind."""
    assert paths.output_file(tmp_path / "a" / "b" / "r.html", "--html") == tmp_path / "a" / "b" / "r.html"
    assert paths.output_folder(tmp_path / "c" / "d", "--out") == tmp_path / "c" / "d"
    (tmp_path / "e").mkdir()
    paths.output_folder(tmp_path / "e", "--out")  # an existing folder
    (tmp_path / "f.png").write_bytes(b"")
    paths.output_file(tmp_path / "f.png", "--plot")  # an existing file, to be replaced
    assert _tree(tmp_path) == ["e", "f.png"]
    with pytest.raises(DSparkError, match=r"^--out .*/f.png: is a file, not a folder"):
        paths.output_folder(tmp_path / "f.png", "--out")
    with pytest.raises(DSparkError, match=r"^--plot .*/e: is a folder; give a file name, e.g. .*/e/out$"):
        paths.output_file(tmp_path / "e", "--plot")
    with pytest.raises(DSparkError, match=r"f.png is a file, so no folder can be made under it; choose another --html"):
        paths.output_file(tmp_path / "f.png" / "sub" / "r.html", "--html")
    with pytest.raises(DSparkError, match=r"^--out /proc/nope/x: cannot create files in /proc \("):
        paths.output_folder(NOWHERE / "x", "--out")


def test_run_refuses_an_output_it_cannot_write_before_loading_anything(tmp_path, monkeypatch, capfd):
    """run --out under /proc, at a file, under a file, --resume at a file, and (no --out) a working folder
    where results/ cannot be made: one line each, and nothing made (the run folder, results/)."""
    monkeypatch.chdir(tmp_path)
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    _refused(monkeypatch, capfd, *RUN, "--out", NOWHERE / "run", says="--out /proc/nope/run: cannot create files in /proc")
    _refused(monkeypatch, capfd, *RUN, "--out", a_file, says=f"--out {a_file}: is a file, not a folder")
    _refused(monkeypatch, capfd, *RUN, "--out", a_file / "run", says=f"{a_file} is a file, so no folder can be made")
    _refused(monkeypatch, capfd, "run", "--resume", a_file, says=f"--resume {a_file}: is a file, not a folder")
    (tmp_path / "results").write_text("a file where the runs' folder goes")
    _refused(monkeypatch, capfd, *RUN, says="results: is a file, not a folder; run from a folder where files can be "
             "created, or give --out")
    assert _tree(tmp_path) == ["a-file", "results"]
    # the existing rule, now before anything loads: a new run never writes into another's folder
    done = run_folders.no_plain(tmp_path)
    _refused(monkeypatch, capfd, *RUN, "--out", done, says=f"{done} already holds a run; use --resume")


def test_run_refuses_a_folder_holding_other_files_and_takes_an_empty_one(tmp_path, monkeypatch, capfd):
    """`run --out` at a folder of the user's (files that are not a run) would write the run's files among
    them: refused in one line, the folder untouched, also for a dry run; an empty folder, or a new one, is
    a run's."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    for extra in ([], ["--dry-run"]):
        _refused(monkeypatch, capfd, *RUN, "--out", mine, *extra,
                 says=f"--out {mine}: the folder holds other files, not a run; choose an empty or new folder (or "
                      "--resume DIR to finish an unfinished run)")
    assert _tree(tmp_path) == ["mine", "mine/notes.txt"]
    (tmp_path / "empty").mkdir()
    paths.run_folder(str(tmp_path / "empty"), None)
    paths.run_folder(str(tmp_path / "new" / "run"), None)
    assert _tree(tmp_path) == ["empty", "mine", "mine/notes.txt"]


def test_profile_refuses_an_output_it_cannot_write(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    _refused(monkeypatch, capfd, "profile", "--torch", "--device", "cpu", "--out", NOWHERE / "p",
             says="--out /proc/nope/p: cannot create files in /proc")
    (tmp_path / "results").write_text("")
    _refused(monkeypatch, capfd, "profile", "--torch", "--device", "cpu", says="results: is a file")
    assert _tree(tmp_path) == ["results"]


def test_report_html_is_refused_before_the_notebooks_run(tmp_path, monkeypatch, capfd):
    run = run_folders.mixed(tmp_path / "runs")
    before = _tree(tmp_path)
    _refused(monkeypatch, capfd, "report", run, "--html", tmp_path,
             says=f"--html {tmp_path}: is a folder; give a file name, e.g. {tmp_path / 'report.html'}")
    _refused(monkeypatch, capfd, "report", run, "--html", NOWHERE / "r.html",
             says="--html /proc/nope/r.html: cannot create files in /proc")
    # a page is HTML whatever its name says: a name that promises another format is refused, not written as HTML
    _refused(monkeypatch, capfd, "report", run, "--html", tmp_path / "r.pdf",
             says=f"--html {tmp_path / 'r.pdf'}: the suffix .pdf names no format --html writes; end the name in "
                  f".html, .htm, e.g. {tmp_path / 'r.html'}")
    _refused(monkeypatch, capfd, "report", run, "--html", tmp_path / "report", says="the name has no suffix")
    assert _tree(tmp_path) == before


def test_calibrate_refuses_its_outputs_before_reading_the_runs(tmp_path, monkeypatch, capfd):
    run = run_folders.mixed(tmp_path / "runs")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    before = _tree(tmp_path)
    _refused(monkeypatch, capfd, "calibrate", run, "--plot", NOWHERE / "x.png", says="--plot /proc/nope/x.png: cannot")
    _refused(monkeypatch, capfd, "calibrate", run, "--fit-sts", NOWHERE / "s.json", says="--fit-sts /proc/nope/s.json")
    _refused(monkeypatch, capfd, "calibrate", run, "--plot", a_file / "x.png", says="a-file is a file, so no folder")
    _refused(monkeypatch, capfd, "calibrate", run, "--fit-sts", tmp_path, says="is a folder; give a file name, e.g.")
    # a figure's suffix names its format: one matplotlib does not write is refused before the runs are read
    _refused(monkeypatch, capfd, "calibrate", run, "--plot", tmp_path / "x.txt",
             says=f"--plot {tmp_path / 'x.txt'}: the suffix .txt names no format --plot writes; end the name in .png, "
                  f".pdf, .svg")
    assert _tree(tmp_path) == before


def test_every_figure_suffix_allowed_is_one_matplotlib_writes(tmp_path):
    """The fixed list `--plot` is held to (so the check needs no matplotlib) is within what matplotlib's
    Agg canvas writes here: each suffix is saved as a real figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(1, 1))
    assert {s.lstrip(".") for s in paths.FIGURE_SUFFIXES} <= set(fig.canvas.get_supported_filetypes())
    for suffix in paths.FIGURE_SUFFIXES:
        fig.savefig(tmp_path / f"f{suffix}")
        assert (tmp_path / f"f{suffix}").stat().st_size > 0
    plt.close(fig)
    assert paths.output_file(tmp_path / "R.PNG", "--plot", suffixes=paths.FIGURE_SUFFIXES) == tmp_path / "R.PNG"


def test_make_tiny_and_train_draft_refuse_their_folders_before_building(tmp_path, monkeypatch, capfd):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    _refused(monkeypatch, capfd, "make-tiny", NOWHERE / "tiny", says="OUT_DIR /proc/nope/tiny: cannot create files")
    _refused(monkeypatch, capfd, "make-tiny", a_file, says="is a file, not a folder")
    _refused(monkeypatch, capfd, "train-draft", "--target", "demo", "--data", "demo", "--out", NOWHERE / "d",
             "--steps", "1", "--device", "cpu", says="--out /proc/nope/d: cannot create files in /proc")
    _refused(monkeypatch, capfd, "train-draft", "--target", "demo", "--data", "demo", "--out", a_file / "d",
             "--steps", "1", "--device", "cpu", says="a-file is a file, so no folder can be made under it")
    assert _tree(tmp_path) == ["a-file"]


def test_a_trace_whose_export_cannot_be_written_is_refused_before_nsys_runs(tmp_path, monkeypatch, capfd):
    """A .nsys-rep is read through the .sqlite exported beside it: where that cannot be written (here a
    folder holds its name), both trace commands say so at once, before looking for nsys."""
    report = tmp_path / "dspark.nsys-rep"
    report.write_bytes(b"a report")
    (tmp_path / "dspark.sqlite").mkdir()
    for command in ("summarize", "compare"):
        _refused(monkeypatch, capfd, "trace", command, report,
                 says=f"dspark.nsys-rep's export {tmp_path / 'dspark.sqlite'}: is a folder; copy the .nsys-rep")

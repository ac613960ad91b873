"""Mistakes a new user makes on the command line (issue 52), each answered in one line and exit 2 before any
work: an empty value (an unset shell variable), make-tiny into a folder that is not its own, a resume past
--steps, a run compared with itself, a missing file; and figures that must not mislead (random weights'
size, the demo model's text)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import run_cli

import dspark


def _refused(monkeypatch, capfd, *args, says: str) -> str:
    """The command's one line on stderr, after checking it was refused (exit 2, nothing on stdout)."""
    code, out, err = run_cli(monkeypatch, capfd, *args)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and says in err, (args, code, out, err)
    return err


@pytest.mark.parametrize("args, says", [
    (["make-tiny", ""], "make-tiny OUT_DIR is empty"),
    (["make-tiny", "  "], "make-tiny OUT_DIR is empty"),
    (["run", "--resume", ""], "run --resume is empty"),
    (["run", "--out=", "--dry-run"], "run --out is empty"),
    (["profile", "--torch", "--out", ""], "profile --out is empty"),
    (["train-draft", "--target", "demo", "--data", "demo", "--out", "", "--steps", "1"], "train-draft --out is empty"),
    (["report", "runs/a", "", "--html", "r.html"], "report RUN_DIRS is empty"),
    (["report", "runs/a", "--html", ""], "report --html is empty"),
    (["trace", "summarize", ""], "trace summarize FILE is empty"),
    (["generate", "--target", "", "--no-draft", "--prompt", "hi"], "generate --target is empty"),
    (["calibrate", "runs/a", "--plot", ""], "calibrate --plot is empty"),
])
def test_an_empty_value_is_refused_before_the_command_runs(args, says, tmp_path, monkeypatch, capfd):
    """"" reads as the current folder to a path option and as "not given" to an optional text: make-tiny ""
    wrote nine models into the working folder, run --resume "" started a new run, train-draft --out ""
    saved its draft in the working folder. Each is refused in one line naming the option, nothing written."""
    monkeypatch.chdir(tmp_path)
    err = _refused(monkeypatch, capfd, *args, says=says)
    assert "an empty value names nothing" in err
    assert list(tmp_path.iterdir()) == []


def test_an_option_whose_default_is_empty_takes_an_empty_value(monkeypatch, capfd):
    """engine-bench --sweep-context "" is its default (no sweep): not refused as empty."""
    code, out, err = run_cli(monkeypatch, capfd, "engine-bench", "--sweep-context", "", "--help")
    assert code == 0 and "--sweep-context" in out, err


def test_make_tiny_refuses_a_folder_of_other_files_and_a_package(tmp_path, monkeypatch, capfd):
    """make-tiny . from the repository root wrote config.json and model.safetensors into dspark/: a folder
    holding other files, a Python package's folder and a new folder inside one are refused, nothing written."""
    (tmp_path / "notes.txt").write_text("mine")
    _refused(monkeypatch, capfd, "make-tiny", tmp_path, says="holds other files, not an earlier make-tiny output")
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    package = Path(dspark.__file__).parent
    _refused(monkeypatch, capfd, "make-tiny", package, says=f"inside the Python package {package}")
    _refused(monkeypatch, capfd, "make-tiny", package / "tiny-models", says=f"inside the Python package {package}")
    assert not (package / "tiny-models").exists() and not (package / "target").exists()


def test_make_tiny_writes_a_new_folder_and_again_over_its_own(tmp_path, monkeypatch, capfd):
    """A new folder is written; the same folder again (an earlier make-tiny output) is overwritten."""
    for _ in range(2):
        code, out, err = run_cli(monkeypatch, capfd, "make-tiny", tmp_path / "tiny")
        assert code == 0, err
    manifest = json.loads((tmp_path / "tiny" / "manifest.json").read_text())
    assert sorted(manifest) == sorted(["target", "dspark", "dspark-speculators", "dflash", "dflash-zlab", "eagle3",
                                       "eagle3-speculators", "eagle3-deepspec"])


def test_train_draft_refuses_a_resume_past_steps_and_says_the_steps_it_trained(tmp_path, monkeypatch, capfd):
    """A 2-step checkpoint resumed with --steps 1 showed "2/1" and then "draft saved ... 1 steps": refused in
    one line before any model loads, naming the checkpoint's steps and the fix; a resume that trains says
    how many steps it did now and where it resumed."""
    out_dir = tmp_path / "td"
    common = ["train-draft", "--target", "demo", "--data", "demo", "--out", out_dir, "--batch", "1",
              "--num-anchors", "4", "--checkpoint-every", "1", "--device", "cpu"]
    code, out, err = run_cli(monkeypatch, capfd, *common, "--steps", "2")
    assert code == 0 and "(deepspec format, dspark, 2 steps)" in out, err
    _refused(monkeypatch, capfd, *common, "--steps", "1", "--resume",
             says=f"--resume: the checkpoint in {out_dir} has 2 steps, more than --steps 1; pass --steps 2 or more")
    code, out, err = run_cli(monkeypatch, capfd, *common, "--steps", "3", "--resume")
    assert code == 0 and "3 steps, 1 of them now, resumed at step 2)" in out, err


def test_parity_refuses_a_run_compared_with_itself(tmp_path, monkeypatch, capfd):
    """parity RUN RUN reported all equal with no note: the same folder (by another path too) and a copy of
    it (the same start on the same host, the same records) are refused in one line; two separate runs are
    compared, two started within the same second on the same host too."""
    import shutil

    import run_folders

    run = run_folders.write(tmp_path / "a", [run_folders.native("plain", "q1", 5.0)], systems=["plain"])
    _refused(monkeypatch, capfd, "parity", run, run, says="are the same run folder")
    _refused(monkeypatch, capfd, "parity", run, tmp_path / "." / "b" / ".." / "a", says="are the same run folder")
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["provenance"]["host"] = "box"
    (run / "manifest.json").write_text(json.dumps(manifest))
    shutil.copytree(run, tmp_path / "copy")
    _refused(monkeypatch, capfd, "parity", run, tmp_path / "copy", says="are copies of one run (both started")
    other = run_folders.write(tmp_path / "other", [run_folders.native("plain", "q1", 6.0)], systems=["plain"])
    (other / "manifest.json").write_text(json.dumps(manifest))  # started in the same second, timed apart
    code, out, err = run_cli(monkeypatch, capfd, "parity", run, other)
    assert code == 0 and "1/1 prompts with equal prompt ids" in out, err
    manifest["provenance"]["time_utc"] = "2026-01-02T04:00:00+00:00"  # a second run of the same settings
    (tmp_path / "copy" / "manifest.json").write_text(json.dumps(manifest))
    code, out, err = run_cli(monkeypatch, capfd, "parity", run, tmp_path / "copy")
    assert code == 0 and "1/1 prompts with equal prompt ids" in out, err


@pytest.mark.parametrize("name", ["nosuch.nsys-rep", "nosuch.json.gz", "nosuch.sqlite"])
def test_trace_calls_a_missing_file_missing(name, tmp_path, monkeypatch, capfd):
    """A missing .nsys-rep was answered "no working nsys found", a missing .json.gz "not a PyTorch profiler
    Chrome trace (FileNotFoundError)": both commands say "no such file", before looking for nsys."""
    monkeypatch.setenv("PATH", "/nonexistent")  # (no nsys: the answer must not depend on one)
    for command in (["trace", "summarize"], ["trace", "compare"]):
        _refused(monkeypatch, capfd, *command, tmp_path / name, says=f"{tmp_path / name}: no such file; give a")
    _refused(monkeypatch, capfd, "trace", "summarize", tmp_path, says="a folder, not a trace file")


def test_a_random_target_is_sized_by_its_parameters_never_0_mb(monkeypatch):
    """A random:demo target printed "target weights 0 MB" (it has no weight files) and chose threads as if
    it weighed nothing: its size is its parameter count times its config's dtype, the size of the demo's own
    weight file (the same shape, stored in the same dtype), and the line says the weights are random."""
    from dspark.checkpoint import DEMO_DIR, random_folder
    from harness.runs.threads import ENV_VARS, choose, weights_bytes

    for var in ENV_VARS:  # (a thread variable set would decide the count instead)
        monkeypatch.delenv(var, raising=False)
    size, what = weights_bytes(random_folder("demo"))
    real, _ = weights_bytes(DEMO_DIR / "target")
    assert what == "random target weights" and abs(size - real) < 0.01 * real
    n, why = choose(None, "cpu", random_folder("demo"))
    assert n == 1 and why.startswith(f"auto: random target weights {size / 1e6:.0f} MB") and " 0 MB" not in why
    eight_b, _ = weights_bytes(random_folder("qwen3-8b"))  # (counted on the meta device: nothing allocated)
    assert 15e9 < eight_b < 17.5e9  # Qwen3-8B: 8.2 B parameters in bfloat16


@pytest.mark.parametrize("target, says", [("demo", "the demo target is a tiny 6.8 M-parameter model"),
                                          ("random:demo", "(random weights, 6.8 M parameters: the text means nothing")])
def test_generate_says_the_demo_models_text_is_not_meaningful(target, says, monkeypatch, capfd):
    """The README's generate example printed nonsense from a 6.8 M model without a word: under the text, one
    line says so, and what the run is for (the accounting)."""
    code, out, err = run_cli(monkeypatch, capfd, "generate", "--target", target, "--no-draft", "--prompt", "Hi",
                             "--max-new-tokens", "4", "--device", "cpu")
    assert code == 0 and says in err, err
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "its text is not\nmeant to make sense" in readme  # (the README says it too)


def test_generate_says_nothing_of_the_kind_for_another_target(tiny_dir, monkeypatch, capfd):
    code, out, err = run_cli(monkeypatch, capfd, "generate", "--target", tiny_dir / "target", "--no-draft",
                             "--prompt-ids", "1,2,3", "--max-new-tokens", "2", "--device", "cpu")
    assert code == 0 and "not meant to make sense" not in err and "means nothing" not in err, err


@pytest.mark.parametrize("args, says", [
    (["report", "{tmp}/nosuch"], "{tmp}/nosuch: no such folder; give a folder written by dspark-bench run"),
    (["calibrate", "{tmp}/nosuch"], "{tmp}/nosuch: no such folder; give a folder written by dspark-bench run"),
    (["parity", "{tmp}/nosuch", "{tmp}/other"], "{tmp}/nosuch: no such folder"),
    (["report", "{tmp}/file.txt"], "{tmp}/file.txt: a file, not a run folder"),
    (["run", "--experiment", "{tmp}/nosuch.toml", "--dry-run"], "--experiment {tmp}/nosuch.toml: no such file"),
    (["engine-bench", "--target", "{tmp}/nosuch"], "--target {tmp}/nosuch: no such folder or config.json"),
    (["engine-bench", "--target", "demo", "--draft", "{tmp}/nosuch"], "--draft {tmp}/nosuch: no such folder"),
])
def test_a_missing_path_is_called_missing(args, says, tmp_path, monkeypatch, capfd):
    """A mistyped run folder was answered "no manifest.json or requests.jsonl", a mistyped experiment file
    "unknown experiment", a mistyped model folder "unknown target preset": each says the path is not there."""
    (tmp_path / "file.txt").write_text("x")
    _refused(monkeypatch, capfd, *[a.format(tmp=tmp_path) for a in args], says=says.format(tmp=tmp_path))


@pytest.mark.parametrize("content, says", [
    (b"\x00\x01\xff\xfe", "not UTF-8 text"),
    (b"5\n", "a int, not a JSON object"),
    (b'{"prompt_ids": "abc", "response_ids": [1, 2]}\n', "must be lists of token ids"),
    (b'{"prompt_ids": [1], "response_ids": [1, 2, 999999]}\n', "token id 999999 is outside the target's vocabulary"),
])
def test_train_draft_refuses_bad_data_rows_in_one_line(content, says, tmp_path, monkeypatch, capfd):
    """Binary data, a row that is no object, ids that are no ids and ids past the vocabulary ended in a
    UnicodeDecodeError, a TypeError, a ValueError or an IndexError mid-training."""
    data = tmp_path / "rows.jsonl"
    data.write_bytes(content)
    _refused(monkeypatch, capfd, "train-draft", "--target", "demo", "--data", data, "--out", tmp_path / "td",
             "--steps", "1", "--device", "cpu", says=says)
    assert not (tmp_path / "td").exists()


def test_train_draft_calls_a_data_folder_a_folder(tmp_path, monkeypatch, capfd):
    """A folder given as --data (a run folder, say) was answered "no such data file"."""
    _refused(monkeypatch, capfd, "train-draft", "--target", "demo", "--data", tmp_path, "--out", tmp_path / "td",
             "--steps", "1", "--device", "cpu", says=f"--data {tmp_path}: a folder, not a data file")
    assert not (tmp_path / "td").exists()


def test_calibrate_names_a_system_the_run_lacks(tmp_path, monkeypatch, capfd):
    """calibrate --system with a name the run does not have answered "no rounds with recorded draft
    confidences"; it names the systems the run has."""
    import run_folders

    run = run_folders.write(tmp_path / "a", [run_folders.native("plain", "q1", 5.0)], systems=["plain"])
    _refused(monkeypatch, capfd, "calibrate", run, "--system", "dspak", says="--system dspak: not in this run; it has plain")


@pytest.mark.parametrize("extra, says", [(["--preset", "lean"], "--preset: for --nsys only; leave it out"),
                                         (["--nsys-arg=--sample=none", "--nsys-path", "/x/nsys"],
                                          "--nsys-path, --nsys-arg: for --nsys only; leave them out")])
def test_profile_refuses_nsys_options_with_the_torch_profiler(extra, says, tmp_path, monkeypatch, capfd):
    """profile --torch --preset lean (or --nsys-arg, --nsys-path) profiled as if nothing had been given:
    refused in one line before anything runs, nothing written."""
    _refused(monkeypatch, capfd, "profile", "--torch", *extra, "--out", tmp_path / "p", says=says)
    assert not (tmp_path / "p").exists()

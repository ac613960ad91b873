"""A run folder is one process's at a time, and nothing is counted twice (issue 52): a second `run` of a
folder another process holds is refused in one line naming that process, before any model loads; a
lock left by a killed process blocks nothing; a request recorded twice is read once, with a warning,
by the report and by a resume; `run --resume` of an edited experiment file names each key that changed;
`--resume` of something that is not an unfinished run says what it is."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from cli_runner import run_cli

import run_folders
from dspark.checkpoint import DEMO_DIR
from dspark.errors import DSparkError
from harness.analysis.records import RepeatedRequests, read_requests
from harness.analysis.summary import summarize_folder
from harness.runs.owner import LOCK, own

needs_demo = pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(),
                                reason="the demo models are not built")
SMALL = ["--category", "coding", "--num-prompts", "2", "--output-len", "3", "--temperature", "0", "--device", "cpu"]
HOLDER = ("import sys, time\nfrom harness.runs.owner import own\nowner = own(sys.argv[1], 'x')\n"
          "print('held', flush=True)\ntime.sleep(600)\n")


def _script() -> str:
    script = Path(sys.executable).with_name("dspark-bench")
    if not script.is_file():
        pytest.skip("the dspark-bench console script is not installed next to this Python")
    return str(script)


@needs_demo
def test_a_second_process_is_refused_while_the_first_owns_the_folder(tmp_path, monkeypatch, capfd):
    """While one process owns the run folder, `run --resume` in another exits 2 with one line naming the
    folder, the owner's pid and what to do, before any model loads; a fresh `run --out` of a folder being
    written is refused the same way. Once the owner is killed (kill -9: no chance to clean up) the folder
    resumes at once."""
    run = tmp_path / "r"
    code, _, err = run_cli(monkeypatch, capfd, "run", "--systems", "plain,ngram", *SMALL, "--out", run)
    assert code == 0, err
    done = len(read_requests(run))
    with own(run, "continue with dspark-bench run --resume"):
        second = subprocess.run([_script(), "run", "--resume", str(run)], capture_output=True, text=True,
                                timeout=600)
        assert second.returncode == 2, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in second.stderr
        assert str(run) in lines[0] and f"process {os.getpid()} is running it now" in lines[0]
        assert f"kill {os.getpid()}" in lines[0] and f"then continue with dspark-bench run --resume {run}" in lines[0]
        assert "threads:" not in second.stderr  # (refused before anything loaded)
    assert len(read_requests(run)) == done

    fresh = tmp_path / "fresh"
    with own(fresh, "continue"):  # (another `run --out fresh` setting up: no manifest yet)
        code, _, err = run_cli(monkeypatch, capfd, "run", "--systems", "plain", *SMALL, "--out", fresh)
        assert code == 2 and f"process {os.getpid()} is running it now" in err and len(err.strip().splitlines()) == 1
        assert "threads:" not in err

    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(DSparkError, match=f"process {holder.pid} is running it now"):
            own(run, "continue")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    code, _, err = run_cli(monkeypatch, capfd, "run", "--resume", run)
    assert code == 0, err
    assert f"{done} of {done} requests already done; nothing left to run" in err


def test_a_lock_left_by_a_killed_process_blocks_nothing_and_a_failed_start_leaves_no_folder(tmp_path):
    """The kernel drops a dead owner's lock: the folder is taken at once. A folder made for an owner that
    wrote nothing is removed when it lets go (a new run that failed before its manifest leaves nothing)."""
    folder = tmp_path / "r"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
    assert (folder / LOCK).read_text() == str(holder.pid)  # (its pid is still written there)
    with own(folder, "continue") as owner:
        assert (folder / LOCK).read_text() == str(os.getpid()) and not owner.made
    made = tmp_path / "new"
    with own(made, "continue"):
        assert made.is_dir()
    assert not made.exists()


def _doubled(tmp_path: Path) -> Path:
    """4 prompts of plain and dspark, then plain's q1 recorded a second time with another time (as two
    resumes at once wrote it): counted twice, plain's mean TPOT and dspark's speedup would move."""
    records = [run_folders.native(s, q, 5.0 if s == "plain" else 4.0) for s in ("plain", "dspark")
               for q in run_folders.QIDS]
    path = run_folders.write(tmp_path / "doubled", records, systems=["plain", "dspark"])
    with (path / "requests.jsonl").open("a") as f:
        f.write(json.dumps(run_folders.native("plain", "q1", 50.0)) + "\n")
    return path


def test_a_request_recorded_twice_is_counted_once_with_a_warning(tmp_path, monkeypatch, capfd):
    path = _doubled(tmp_path)
    with pytest.warns(RepeatedRequests, match="1 request recorded more than once"):
        records = read_requests(path)
    assert len(records) == 8 and all(r["tpot_ms"] != 50.0 for r in records)  # (the first kept)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (the summary says it among its warnings, not as a Python warning)
        summary = summarize_folder(path)
    rows = {r["system"]: r for r in summary["rows"] if r["category"] == "overall"}
    assert rows["plain"]["requests"] == 4 and rows["plain"]["mean_tpot_ms"] == 5.0
    assert rows["dspark"]["speedup"] == pytest.approx(1.25)
    assert "1 request recorded more than once" in summary["warnings"][0]
    assert "each counted once (8 requests)" in summary["warnings"][0]
    code, out, err = run_cli(monkeypatch, capfd, "report", path)
    assert code == 0, err
    assert "recorded more than once" in out and "counted once" in out


TOML = ('name = "mine"\ntarget = "demo"\ndataset = "demo"\n[sampling]\ntemperatures = [0.0]\noutput_len = 3\n'
        'num_prompts = 2\n[[systems]]\nname = "plain"\nmethod = "plain"\n'
        '[[systems]]\nname = "ngram"\nmethod = "ngram"\nnum_speculative_tokens = 7\n')


@needs_demo
def test_resume_of_an_edited_experiment_names_each_changed_key(tmp_path, monkeypatch, capfd):
    """The edited file's keys, old and new values, and what to do, in one line, before anything loads; a
    comment alone is named as such. The file restored, the run resumes, each request once, even with a
    request recorded twice in the meantime."""
    exp = tmp_path / "mine.toml"
    exp.write_text(TOML)
    run = tmp_path / "r"
    code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", exp, "--category", "coding", "--device", "cpu",
                           "--out", run)
    assert code == 0, err
    exp.write_text(TOML.replace("output_len = 3", "output_len = 4").replace("= 7", "= 5"))
    code, _, err = run_cli(monkeypatch, capfd, "run", "--resume", run)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "sha256" not in err.lower()
    assert f"the experiment file {exp} changed since the run started" in err
    assert "sampling.output_len: 3 -> 4; systems[1].num_speculative_tokens: 7 -> 5" in err
    assert "restore the file as it was" in err and "--out DIR" in err
    exp.write_text("# edited\n" + TOML)
    code, _, err = run_cli(monkeypatch, capfd, "run", "--resume", run)
    assert code == 2 and "(only comments or layout)" in err
    exp.write_text(TOML)
    lines = (run / "requests.jsonl").read_text().splitlines(keepends=True)
    (run / "requests.jsonl").write_text("".join(lines + lines[:1]))
    code, _, err = run_cli(monkeypatch, capfd, "run", "--resume", run)
    assert code == 0, err
    assert "warning:" in err and "1 request recorded more than once" in err
    assert f"{len(lines)} of {len(lines)} requests already done; nothing left to run" in err


def test_resume_of_a_folder_that_holds_no_unfinished_run_says_what_it_is(tmp_path, monkeypatch, capfd):
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("x")
    profile = tmp_path / "prof"
    profile.mkdir()
    (profile / "profile.json").write_text("{}")
    for folder, said in ((tmp_path / "nosuch", "no such folder"),
                         (other, "not a run folder (no manifest.json"),
                         (profile, f"a profile's folder, not a run's; finish it with dspark-bench profile --resume "
                                   f"{profile}")):
        code, _, err = run_cli(monkeypatch, capfd, "run", "--resume", folder)
        assert code == 2 and len(err.strip().splitlines()) == 1 and said in err, err
    assert not (tmp_path / "nosuch").exists()


def test_a_profile_folder_is_one_process_at_a_time(tmp_path):
    """`profile --resume DIR` while another process has DIR is refused before any file there is touched."""
    from rich.console import Console

    from harness.profiling.orchestrate import resume_profile

    folder = tmp_path / "p"
    folder.mkdir()
    (folder / "profile.json").write_text(json.dumps({"kind": "torch", "methods": {"plain": "plain"},
                                                     "requests_per_system": None, "commands": {}}))
    (folder / "plain").mkdir()  # (a partial child run that resuming would remove)
    with own(folder, "continue"):
        with pytest.raises(DSparkError, match=f"process {os.getpid()} is running it now.*profile --resume"):
            resume_profile(folder, Console(file=open(os.devnull, "w")))
    assert (folder / "plain").is_dir()


@needs_demo
def test_resume_of_a_run_without_recorded_options_given_other_arguments_is_refused_in_one_line(tmp_path, monkeypatch,
                                                                                               capfd):
    """A run made before options were recorded is resumed with the arguments given: one that differs from
    the run's is named in one line, exit 2 (it was a NameError traceback), and nothing is run."""
    run = tmp_path / "r"
    code, _, err = run_cli(monkeypatch, capfd, "run", "--systems", "plain", *SMALL, "--out", run)
    assert code == 0, err
    manifest = json.loads((run / "manifest.json").read_text())
    del manifest["options"]  # (as the runs before options were recorded)
    (run / "manifest.json").write_text(json.dumps(manifest))
    done = (run / "requests.jsonl").read_text()
    longer = [a if a != "3" else "4" for a in SMALL]  # (--output-len 4)
    code, _, err = run_cli(monkeypatch, capfd, "run", "--resume", run, "--systems", "plain", *longer)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"--resume {run}: 'output_len' was 3, now 4; resume with the run's own arguments" in err
    assert "(this run predates resuming from the folder alone)" in err
    assert (run / "requests.jsonl").read_text() == done


def test_lines_without_a_requests_identity_are_kept_and_repeated_requests_dropped(tmp_path):
    """Only a request (system, question, turn, temperature) is counted once: other lines are not requests
    (it raised KeyError 'system')."""
    same = run_folders.native("plain", "q1", 5.0)
    (tmp_path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in
                                                     ({"a": 1}, {"a": 1}, same, same | {"tpot_ms": 9.0})))
    with pytest.warns(RepeatedRequests, match="1 request recorded more than once.*each counted once \\(3 requests"):
        records = read_requests(tmp_path)
    assert records == [{"a": 1}, {"a": 1}, same]


def test_a_run_stopped_before_its_first_request_is_incomplete_not_gone(tmp_path, monkeypatch, capfd):
    """A new run's folder holds an empty requests.jsonl from the start (the runner appends to it as each
    request ends): stopped during warm-up, its report says 0 of N done and how to finish it, not that the
    requests were deleted. A folder whose requests.jsonl really vanished still says so."""
    from harness.runs.folder import RunFolder

    run = run_folders.empty(tmp_path)
    assert (run / "requests.jsonl").read_text() == ""
    fresh = tmp_path / "fresh"
    RunFolder(fresh).create(json.loads((run / "manifest.json").read_text()))  # (what the runner calls)
    assert sorted(p.name for p in fresh.iterdir()) == ["manifest.json", "requests.jsonl"]
    assert (fresh / "requests.jsonl").read_text() == ""
    warned = summarize_folder(fresh)["warnings"]
    assert any(w.startswith("incomplete run: 0 of 4 requests done") for w in warned), warned
    assert not any("gone" in w for w in warned)
    code, out, err = run_cli(monkeypatch, capfd, "report", fresh)
    assert code == 0 and "incomplete run: 0 of 4" in out and "gone" not in out, (out, err)
    (fresh / "requests.jsonl").unlink()
    assert any("the run's finished requests are gone (deleted or moved)" in w
               for w in summarize_folder(fresh)["warnings"])


def test_letting_go_survives_a_lock_file_made_meanwhile(tmp_path, monkeypatch):
    """Between release() removing the lock file of a folder it made and removing the folder, another process
    may open (so create) the lock file again: the folder then stays, and release() raises nothing (it ran in
    the runner's `finally`: a traceback)."""
    from harness.runs import owner as owner_module

    folder = tmp_path / "new"
    owner = own(folder, "continue")
    real = Path.unlink

    def unlink_then_another_opens(self, *args, **kwargs):
        real(self, *args, **kwargs)
        if self.name == LOCK:
            os.close(os.open(self, os.O_RDWR | os.O_CREAT, 0o644))  # (what own() in another process does)

    monkeypatch.setattr(owner_module.Path, "unlink", unlink_then_another_opens)
    owner.release()
    monkeypatch.undo()
    assert owner.fd == -1 and (folder / LOCK).exists()
    with own(folder, "continue"):  # (the folder is free)
        pass


def test_a_lock_on_a_removed_lock_file_is_not_ownership(tmp_path, monkeypatch):
    """B opens the lock file, then its owner A lets go (removing the file and the folder it made), and C takes
    the folder with a new lock file; B's flock then succeeds on the removed file. B must not own the folder
    too: it takes the lock again on the file now there, and is refused since C holds it."""
    from harness.runs import owner as owner_module

    folder = tmp_path / "r"
    a = own(folder, "continue")
    held = {}
    real = owner_module.fcntl.flock

    def a_lets_go_and_c_takes_it(fd, op):
        if not held:  # (B, between its open and its flock)
            held["b"] = fd
            a.release()
            held["c"] = own(folder, "continue")
        return real(fd, op)

    monkeypatch.setattr(owner_module.fcntl, "flock", a_lets_go_and_c_takes_it)
    with pytest.raises(DSparkError, match=f"process {os.getpid()} is running it now"):
        own(folder, "continue")
    monkeypatch.undo()
    held["c"].release()


def test_a_read_only_run_folder_is_refused_in_one_line(tmp_path):
    """own() of a folder this user may not write (its lock file cannot be made) names the folder and the fix
    in one line (it was a PermissionError traceback). Run as an unprivileged user: root writes anywhere."""
    folder = tmp_path / "ro"
    folder.mkdir()
    os.chmod(folder, 0o555)
    script = ("import sys\nfrom dspark.errors import DSparkError\nfrom harness.runs.owner import own\n"
              "try:\n    own(sys.argv[1], 'continue')\nexcept DSparkError as exc:\n    print(exc)\n    sys.exit(2)\n")
    unprivileged = []
    if os.geteuid() == 0:  # (root without CAP_DAC_OVERRIDE: bound by the folder's mode like anyone)
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv to drop CAP_DAC_OVERRIDE")
        unprivileged = ["setpriv", "--inh-caps=-dac_override", "--bounding-set=-dac_override"]
    done = subprocess.run([*unprivileged, sys.executable, "-c", script, str(folder)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, (done.stdout, done.stderr)
    line = done.stdout.strip()
    assert len(line.splitlines()) == 1 and str(folder) in line and "cannot write" in line, line


def test_a_profile_interrupted_before_its_jobs_lets_the_folder_go(tmp_path):
    """Ctrl-C between taking a profile's folder and starting its children releases the folder at once (the
    owner was held outside `with`: while the traceback lived, the folder stayed locked)."""
    from rich.console import Console

    from harness.profiling.orchestrate import resume_profile

    class Interrupting:
        def write(self, text):
            raise KeyboardInterrupt

        def flush(self):
            pass

    folder = tmp_path / "p"
    folder.mkdir()
    (folder / "profile.json").write_text(json.dumps({"kind": "torch", "methods": {"plain": "plain"},
                                                     "requests_per_system": None, "commands": {"plain": ["run"]}}))
    with pytest.raises(KeyboardInterrupt) as caught:
        resume_profile(folder, Console(file=Interrupting()))
    assert caught.value is not None  # (the traceback, and every frame it holds, still alive here)
    with own(folder, "continue"):
        pass


@needs_demo
def test_an_experiments_dataset_revision_under_dataset_path_is_refused(no_models, tmp_path, monkeypatch, capfd):
    """The revision held against the data the run reads, wherever each came from: the experiment's
    `dataset_revision` (its dataset the hub) with `--dataset-path` was silently ignored."""
    from test_option_mistakes import _refused

    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"turns": ["hello"], "category": "coding"}) + "\n")
    exp = tmp_path / "rev.toml"
    exp.write_text('name = "rev"\ntarget = "demo"\ndataset_revision = "v1"\n[[systems]]\nname = "plain"\n'
                   'method = "plain"\n')
    _refused(monkeypatch, capfd, ["--experiment", exp, "--dataset-path", rows], f'{exp}: dataset_revision = "v1"',
             "a revision applies only to hub datasets", "--dataset-path reads local files as they are",
             "drop dataset_revision from the experiment (or --dataset-path)")


def test_the_context_a_request_meets_is_one_rule_for_the_first_check_and_every_later_turn():
    """`context.limit`: the target's positions, or vLLM's max_model_len where the engine arguments set it lower
    (the runner's later-turn check used the target's positions alone). A refusal names which limit it was."""
    from harness.runs import context

    assert context.limit({"engine_args": {"max_model_len": 512}}, 2048) == 512
    assert context.limit({"engine_args": {"max_model_len": 4096}}, 2048) == 2048
    assert context.limit({}, 2048) == 2048
    if not (DEMO_DIR / "target" / "config.json").is_file():
        return
    settings = {"backend": "vllm", "target": "demo", "output_len": 100, "engine_args": {"max_model_len": 64}}
    with pytest.raises(DSparkError, match="past the target's context of 64 \\(vLLM's max_model_len, as the run's "
                                          "engine arguments set it\\); give --output-len 63 or less"):
        context.check(settings, None, None, None)

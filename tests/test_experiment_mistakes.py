"""Mistakes in experiment files and in what `run --dry-run` and `report` are given (issue 52, fresh-eyes pass):
a misspelt TOML key (`num_speculatve_tokens`, `temprature`) named with the nearest key the table takes; a
system name `--systems` could never pick (empty, with a comma or a space); a missing experiment file called
missing; a dry run that predicts a refusal ending as the run would (exit 2, the systems and why); `report` of
one folder twice; a run timed under a profiler saying so; an `--engine-bench` file that is not engine-bench's
refused before the notebooks run. Each one line, exit 2, before any model loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_runner import run_cli
from dspark.checkpoint import DEMO_DIR

needs_demo = pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(),
                                reason="the demo pair is not built")

EXPERIMENT = ('name = "bad"\ntarget = "demo"\ndataset = "demo"\n{top}[sampling]\noutput_len = 8\nnum_prompts = 2\n'
              'temperatures = [0.0]\n{sampling}\n[[systems]]\nname = "plain"\nmethod = "plain"\n[[systems]]\n'
              'name = {name}\ndraft = "demo-dspark"\nmethod = "dspark"\n{system}\n')


def _refused(monkeypatch, capfd, *args, says: str) -> str:
    """`dspark-bench ARGS`: exit 2, one line on stderr holding `says`, no traceback."""
    code, out, err = run_cli(monkeypatch, capfd, *args)
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, (args, out, err)
    assert says in err and "Traceback" not in err, (args, err)
    return err


def _experiment(tmp_path: Path, top: str = "", sampling: str = "", system: str = "", name: str = '"spark"') -> Path:
    path = tmp_path / "bad.toml"
    path.write_text(EXPERIMENT.format(top=top, sampling=sampling, system=system, name=name))
    return path


@pytest.mark.parametrize("top, sampling, system, says", [
    ("", "", "num_speculatve_tokens = 3",
     "unknown key 'systems[1].num_speculatve_tokens'; did you mean 'num_speculative_tokens'?"),
    ("", "temprature = 1", "", "unknown key 'sampling.temprature'; did you mean 'temperatures'?"),
    ('tagret = "demo"\n', "", "", "unknown key 'tagret'; did you mean 'target'?"),
    ('[samplng]\nseed = 1\n', "", "", "unknown key 'samplng'; did you mean 'sampling'?"),
    ("", "", "xyzzy = 1", "unknown key 'systems[1].xyzzy'; the keys here are name, method, draft"),
])
def test_a_misspelt_experiment_key_is_named_with_the_nearest_one(top, sampling, system, says, no_models, tmp_path,
                                                                  monkeypatch, capfd):
    """Silently ignored before: the run went on with the default number of drafts, the default temperature."""
    exp = _experiment(tmp_path, top, sampling, system)
    for mode in (["--dry-run"], ["--out", "never"]):
        _refused(monkeypatch, capfd, "run", "--experiment", exp, "--device", "cpu", *mode, says=f"{exp}: {says}")
    assert not (tmp_path / "never").exists()


def test_every_shipped_experiment_still_parses():
    from harness.specs.experiments import load_experiment, shipped

    for name in shipped():
        assert load_experiment(name).systems, name


@pytest.mark.parametrize("name, says", [
    ('""', 'systems[1].name = "": a system\'s name is letters, digits, \'-\', \'_\' or \'.\''),
    ('"a,b"', 'systems[1].name = "a,b": a system\'s name is letters'),
    ('"my spark"', 'systems[1].name = "my spark": a system\'s name is letters'),
    ('"plain"', "two systems are named 'plain'"),
])
def test_a_system_name_that_systems_cannot_pick_is_refused(name, says, no_models, tmp_path, monkeypatch, capfd):
    """An empty name ran as a blank row ("warm-up  T=0"), and "a,b" could never be picked by --systems."""
    exp = _experiment(tmp_path, name=name)
    _refused(monkeypatch, capfd, "run", "--experiment", exp, "--device", "cpu", "--dry-run", says=f"{exp}: {says}")
    ok = _experiment(tmp_path, name='"dspark-topk8.v2_b"')  # (the shipped names' style, and dots and underscores)
    from harness.specs.experiments import load_experiment

    assert [s.name for s in load_experiment(str(ok)).systems] == ["plain", "dspark-topk8.v2_b"]


@pytest.mark.parametrize("given", ["{tmp}/nosuch.toml", "{tmp}/sub/nosuch", "nosuch.toml"])
def test_a_missing_experiment_file_is_called_missing(given, no_models, tmp_path, monkeypatch, capfd):
    """`--experiment /path/nosuch.toml` answered "unknown experiment; give a .toml file", which it was."""
    given = given.format(tmp=tmp_path)
    err = _refused(monkeypatch, capfd, "run", "--experiment", given, "--dry-run", says=f"--experiment {given}: no such file")
    assert "unknown experiment" not in err


@needs_demo
def test_a_dry_run_that_predicts_a_refusal_exits_2_naming_the_systems(no_models, tmp_path, monkeypatch, capfd):
    """A system that does not fit printed "fits NO" and exit 1, while the run refused it with exit 2: the dry
    run now ends as the run would, its last line naming each refused system and why."""
    exp = _experiment(tmp_path, system="num_speculative_tokens = 50")
    code, out, err = run_cli(monkeypatch, capfd, "run", "--experiment", exp, "--device", "cpu", "--dry-run")
    assert code == 2 and "NO" in out, (out, err)
    assert err.strip() == ("error: the run would refuse system spark: demo-dspark proposes 7 tokens per round, but "
                           "the experiment says 50; fix num_speculative_tokens (the others run with --systems plain)")
    code, out, err = run_cli(monkeypatch, capfd, "run", "--experiment", exp, "--device", "cpu", "--dry-run",
                             "--systems", "plain")
    assert code == 0, err


def test_report_refuses_one_run_folder_given_twice(tmp_path, monkeypatch, capfd):
    """`report R R` printed one table and no note, as if a comparison had been made."""
    import run_folders

    run = run_folders.write(tmp_path / "a", [run_folders.native("plain", "q1", 5.0)], systems=["plain"])
    _refused(monkeypatch, capfd, "report", run, run, says=f"{run}: given twice (also as {run}); give each run "
                                                          "folder once")
    monkeypatch.chdir(tmp_path)
    _refused(monkeypatch, capfd, "report", "a", "./a/", says="given twice")


def _profile(root: Path, unprofiled: bool) -> Path:
    """A profile folder as `dspark-bench profile` lays it out: `plain/`, timed under the PyTorch profiler
    (its manifest's `profiled`), and with `unprofiled` its run of the same requests without one."""
    import json

    import run_folders

    run = run_folders.write(root / "plain", [run_folders.native("plain", "q1", 9.0)], systems=["plain"])
    manifest = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps(manifest | {"profiled": "torch"}))
    if unprofiled:
        run_folders.write(root / "unprofiled", [run_folders.native("plain", "q1", 5.0)], systems=["plain"])
    return run


@pytest.mark.parametrize("unprofiled", [True, False])
def test_report_of_a_run_timed_under_a_profiler_says_so(unprofiled, tmp_path, monkeypatch, capfd):
    """A profile's child run (its TPOTs inflated by the profiler) was reported as any other run."""
    run = _profile(tmp_path / "prof", unprofiled)
    code, out, err = run_cli(monkeypatch, capfd, "report", run)
    assert code == 0, err
    text = " ".join(out.split())  # (rich wraps the table's title and the warning)
    assert "[timed under the PyTorch profiler]" in text, out
    assert ("timed under the PyTorch profiler: every time and speedup here includes the profiler's overhead (not "
            "comparable with unprofiled runs)") in text, out
    if unprofiled:
        assert f"the same requests timed without it: dspark-bench report {run.parent.resolve() / 'unprofiled'}" in text
    else:
        assert "this profile timed no unprofiled run (dspark-bench profile --overhead times one)" in text
    code, out, err = run_cli(monkeypatch, capfd, "report", tmp_path / "prof" / "unprofiled") if unprofiled else (0, "", "")
    assert code == 0 and "profiler" not in out, out  # (the unprofiled run is no profiled one)


@pytest.mark.parametrize("content", [
    b'{"a": 1}',  # JSON, but not engine-bench's
    b"\x00\x01\xff\xfe\x80binary",  # not UTF-8
    b"not json",
    b'{"decode_ms": 4.0}',  # no round cost: the speed notebook's predicted line needs both
    b'[1, 2]',
    b'{"decode_ms": 4.0, "round_ms": NaN}',
])
def test_report_refuses_an_engine_bench_file_that_is_not_one_before_the_notebooks(content, tmp_path, monkeypatch,
                                                                                  capfd):
    """Such a file was silently unused (exit 0) or lost the speed section ("could not be drawn:
    UnicodeDecodeError"); refused in one line, no page written."""
    import run_folders

    run = run_folders.write(tmp_path / "a", [run_folders.native("plain", "q1", 5.0)], systems=["plain"])
    bench = tmp_path / "bench.json"
    bench.write_bytes(content)
    _refused(monkeypatch, capfd, "report", run, "--html", tmp_path / "r.html", "--engine-bench", bench,
             says=f"--engine-bench {bench}: not the output of dspark-bench engine-bench --json")
    assert not (tmp_path / "r.html").exists()

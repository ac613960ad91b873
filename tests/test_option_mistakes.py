"""Option and input mistakes of `dspark-bench run` (issue 52): more threads than cores, a dataset revision where
nothing reads one, a binary data file, an experiment file's field of the wrong type, a request longer than the
target's context. Each is refused in one line, exit 2, before any model loads, and `--dry-run` refuses what the
run refuses. Also: the dry run's estimate comes from the earlier run whose settings are closest, and says which."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cli_runner import run_cli
from dspark.checkpoint import DEMO_DIR

needs_demo = pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(),
                                reason="the demo pair is not built")
MODES = (["--dry-run"], ["--out", "never"])  # the dry run refuses what the run refuses


def _refused(monkeypatch, capfd, args: list, *words: str) -> str:
    """`run ARGS` in both modes: one line, exit 2, naming `words`, nothing written."""
    for mode in MODES:
        code, out, err = run_cli(monkeypatch, capfd, "run", "--device", "cpu", *args, *mode)
        assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, (args, mode, out, err)
        assert "Traceback" not in err and all(w in err for w in words), (args, mode, err)
        assert not Path("never").exists()
    return err


@needs_demo
def test_more_threads_than_usable_cores_are_refused(no_models, monkeypatch, capfd):
    from harness.runs.threads import usable_cores

    cores = usable_cores()
    assert cores == len(os.sched_getaffinity(0))
    err = _refused(monkeypatch, capfd, ["--threads", str(cores + 1)], f"--threads is {cores + 1}",
                   f"may use {cores} core(s); give at most {cores}")
    err2 = _refused(monkeypatch, capfd, ["--threads", "1000"], "--threads is 1000", f"give at most {cores}")
    assert err != err2


@needs_demo
def test_a_dataset_revision_where_no_hub_dataset_is_read_is_refused(no_models, tmp_path, monkeypatch, capfd):
    _refused(monkeypatch, capfd, ["--dataset-revision", "main"], "--dataset-revision main",
             "a revision applies only to hub datasets", "the demo suite", "drop --dataset-revision")
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"turns": ["hello"], "category": "coding"}) + "\n")
    _refused(monkeypatch, capfd, ["--dataset-path", rows, "--dataset-revision", "v1"], "--dataset-revision v1",
             "applies only to hub datasets", "--dataset-path reads local files as they are")
    exp = tmp_path / "rev.toml"  # the experiment file: the same mistake
    exp.write_text('name = "rev"\ntarget = "demo"\ndataset = "demo"\ndataset_revision = "main"\n'
                   '[[systems]]\nname = "plain"\nmethod = "plain"\n')
    _refused(monkeypatch, capfd, ["--experiment", exp], f'{exp}: dataset_revision = "main"',
             "applies only to hub datasets", "the demo suite ships with the package",
             "drop dataset_revision from the experiment")


@needs_demo
def test_a_binary_data_file_is_named_not_decoded(no_models, tmp_path, monkeypatch, capfd):
    for name in ("binary.jsonl", "binary.json", "binary"):
        path = tmp_path / name
        path.write_bytes(bytes(range(256)) * 8)
        _refused(monkeypatch, capfd, ["--dataset-path", path], f"{path}: not UTF-8 text",
                 "JSONL, JSON (a list) or parquet")


EXPERIMENT = 'name = "bad"\ntarget = "demo"\ndataset = "demo"\n{top}[sampling]\n{sampling}\n[[systems]]\n' \
             'name = "plain"\nmethod = "plain"\n[[systems]]\nname = "spark"\ndraft = "demo-dspark"\n' \
             'method = "dspark"\n{system}\n'
FIELD_MISTAKES = [  # (top level, [sampling], the second system, the words of the answer)
    ("", 'output_len = "lots"', "", 'sampling.output_len = "lots": expected a whole number of at least 1'),
    ("", "output_len = -3", "", "sampling.output_len = -3: expected a whole number of at least 1"),
    ("", "output_len = 2.5", "", "sampling.output_len = 2.5: expected a whole number"),
    ("", "output_len = true", "", "sampling.output_len = true: expected a whole number"),
    ("", 'num_prompts = "8"', "", 'sampling.num_prompts = "8": expected a whole number of at least 1'),
    ("", "num_prompts = 0", "", "sampling.num_prompts = 0: expected a whole number of at least 1"),
    ("", 'shuffle = "no"', "", 'sampling.shuffle = "no": expected true or false'),
    ("", "seed = 1.5", "", "sampling.seed = 1.5: expected a whole number"),
    ("", 'temperatures = "hot"', "", 'sampling.temperatures = "hot": expected a non-empty list of numbers'),
    ("", "turns = 2", "", 'sampling.turns = 2: expected "first" or "all"'),
    ("", "", "num_speculative_tokens = true", "systems[1].num_speculative_tokens = true: expected a whole number"),
    ("", "", "num_speculative_tokens = 2.0", "systems[1].num_speculative_tokens = 2.0: expected a whole number"),
    ("", "", "num_speculative_tokens = -1", "systems[1].num_speculative_tokens = -1: expected a whole number of "
                                            "at least 1"),
    ('description = 3\n', "", "", "description = 3: expected a string"),
    ('engine_args = "x"\n', "", "", 'engine_args = "x": expected a table'),
]


@needs_demo
def test_every_experiment_field_of_the_wrong_type_is_named_with_its_value(no_models, tmp_path, monkeypatch,
                                                                          capfd):
    exp = tmp_path / "bad.toml"
    for top, sampling, system, words in FIELD_MISTAKES:
        exp.write_text(EXPERIMENT.format(top=top, sampling=sampling, system=system))
        _refused(monkeypatch, capfd, ["--experiment", exp], f"{exp}: {words}")
    exp.write_text('name = "bad"\ntarget = "demo"\nsampling = 3\n[[systems]]\nname = "p"\nmethod = "plain"\n')
    _refused(monkeypatch, capfd, ["--experiment", exp], f"{exp}: sampling = 3: expected a table")
    exp.write_text('name = "bad"\ntarget = "demo"\nsystems = ["plain"]\n')
    _refused(monkeypatch, capfd, ["--experiment", exp], f'{exp}: systems[0] = "plain": expected a table')


@needs_demo
def test_a_request_longer_than_the_context_is_refused_before_the_models_load(no_models, monkeypatch, capfd):
    """The demo target's context is 2048: --output-len 5000 (and 100000000) cannot fit; the answer names the
    limit and run's own option (never generate's --max-new-tokens), in the dry run too."""
    for n in ("5000", "100000000"):
        err = _refused(monkeypatch, capfd, ["--output-len", n, "--ignore-eos"], "the run cannot fit",
                       f"+ --output-len {n})", "past the target's context of 2,048", "give --output-len ")
        assert "max-new-tokens" not in err
        room = int(err.split("give --output-len ")[1].split()[0])
        assert 1 <= room < 2048
        _refused(monkeypatch, capfd, ["--output-len", str(room + 1), "--ignore-eos"], "the run cannot fit")
    code, out, err = run_cli(monkeypatch, capfd, "run", "--device", "cpu", "--output-len", str(room), "--dry-run")
    assert code == 0 and "time:" in out, err


@needs_demo
def test_resuming_a_run_that_can_never_finish_says_so(tmp_path, monkeypatch, capfd):
    """A run folder whose settings cannot fit the context (as an older version let one start) is not resumed
    into the same error again: the answer says the run can never finish and to start a new one."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "r"
    code, _, err = run_cli(monkeypatch, capfd, "run", "--category", "coding", "--systems", "plain", "--num-prompts", "1",
                           "--output-len", "2", "--temperature", "0", "--device", "cpu", "--out", run)
    assert code == 0, err
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["options"]["output_len"] = 100_000_000
    manifest["settings"]["output_len"] = 100_000_000
    (run / "manifest.json").write_text(json.dumps(manifest))
    from harness.runs import runner

    monkeypatch.setattr(runner.Session, "open", lambda *a, **k: pytest.fail("the models loaded"))
    for mode in ([], ["--dry-run"]):
        code, out, err = run_cli(monkeypatch, capfd, "run", "--resume", run, *mode)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert f"--resume {run}: this run can never finish" in err and "start a new run with --output-len " in err


def _earlier_run(folder: Path, target: str, when: str, output_len: int, threads: int, seconds: float) -> Path:
    """A finished earlier run of plain decoding on this machine: its manifest (settings, threads, provenance)
    and summary (one overall row: `seconds` for 100 output tokens)."""
    from run_folders import native, write

    from harness.runs.estimate import machine_of

    write(folder, [native("plain", "q1", 5.0)], systems=["plain"])
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["settings"] |= {"target": target, "dtype": "auto", "output_len": output_len, "ignore_eos": False,
                             "turns": "first"}
    manifest["threads"] = {"count": threads, "chosen_by": "--threads"}
    manifest["provenance"] |= machine_of("cpu") | {"time_utc": when}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    row = {"system": "plain", "category": "overall", "temperature": 0.0, "max_concurrency": 1,
           "duration_s": seconds, "output_tokens": 100}
    (folder / "summary.json").write_text(json.dumps({"rows": [row]}))
    return folder


@needs_demo
def test_the_dry_run_estimate_scales_the_earlier_run_with_the_closest_settings(tmp_path, monkeypatch, capfd):
    """Two earlier runs of the same target on this machine: the newer at another output length and thread
    count, the older at this run's. The estimate comes from the older (closest settings), and the dry run
    says so; without it, from the newer, naming what differs."""
    monkeypatch.chdir(tmp_path)
    target = str(DEMO_DIR / "target")  # (a target name no committed run has)
    exp = tmp_path / "mine.toml"
    exp.write_text(f'name = "mine"\ntarget = "{target}"\ndataset = "demo"\n[sampling]\noutput_len = 8\n'
                   '[[systems]]\nname = "plain"\nmethod = "plain"\n')
    near = _earlier_run(tmp_path / "results" / "near", target, "2026-01-01T00:00:00+00:00", 8, 1, 1.0)
    far = _earlier_run(tmp_path / "results" / "far", target, "2026-06-01T00:00:00+00:00", 512, 2, 5.0)
    args = ["run", "--experiment", exp, "--category", "coding", "--num-prompts", "2", "--temperature", "0",
            "--threads", "1", "--device", "cpu", "--dry-run"]
    code, out, err = run_cli(monkeypatch, capfd, *args, "--json")
    assert code == 0, err
    guess = json.loads(out)["estimate"]
    assert [s["path"] for s in guess["sources"]] == [str(near.resolve())] and guess["earlier_runs"] == 2
    assert guess["sources"][0]["differs"] == []
    assert guess["seconds"] == pytest.approx([2 * 8 * 0.01, 2 * 8 * 0.01])
    code, out, err = run_cli(monkeypatch, capfd, *args)
    assert code == 0 and "results/near (measured 2026-01-01): scaled from the closest settings of 2 earlier runs, " \
                         "the same settings" in out, out
    (near / "summary.json").unlink()
    code, out, err = run_cli(monkeypatch, capfd, *args)
    assert code == 0 and "results/far (measured 2026-06-01): scaled from the closest settings of 1 earlier run, " \
                         "differs in output_len 512 (this run 8), threads 2 (this run 1)" in out, out
    assert far.is_dir()


@needs_demo
def test_a_later_turn_past_the_context_is_a_failed_request_naming_output_len(tmp_path, monkeypatch, capfd):
    """Without --ignore-eos a first reply's length is not known before the run: a second turn that outgrows
    the context after a long reply (random weights: no stop token, 1000 tokens) is recorded as failed,
    naming run's own option, and the run goes on (never the engine's `--max-new-tokens`)."""
    from harness.analysis.records import read_requests

    exp = tmp_path / "turns.toml"
    exp.write_text('name = "turns"\ntarget = "random:demo"\ndataset = "demo"\n[sampling]\nturns = "all"\n'
                   'temperatures = [0.0]\n[[systems]]\nname = "plain"\nmethod = "plain"\n')
    run = tmp_path / "r"
    code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", exp, "--category", "math", "--num-prompts", "1",
                           "--output-len", "1000", "--device", "cpu", "--out", run)
    assert code == 0 and "max-new-tokens" not in err, err
    first, second = sorted(read_requests(run), key=lambda r: r["turn"])
    assert not first.get("failed") and first["output_tokens"] == 1000
    assert second["failed"] and "+ --output-len (1000) passes the target's context (2048)" in second["error"]

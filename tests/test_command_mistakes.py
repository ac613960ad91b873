"""Mistakes on the commands besides `run` (issue 52's fresh-eyes pass), each answered in one line naming the value
and the fix, exit 2, before any model loads where the mistake is in the options: train-draft into a package or a
folder of other files, a draft and a target swapped in inspect, engine-bench past its target's context or with a
default draft that cannot fit, profile of a server someone else runs, trace summarize of a folder, generate's
options that cannot apply; and the project's own warnings printed as one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import run_folders
from cli_runner import run_cli

import dspark


def _refused(monkeypatch, capfd, *args, says: str) -> str:
    """The command's one line on stderr, after checking it was refused (exit 2, nothing on stdout)."""
    code, out, err = run_cli(monkeypatch, capfd, *args)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and says in err, (args, code, out, err)
    return err


@pytest.fixture
def no_loading(monkeypatch):
    """Loading a target's weights fails the test: the mistake must be refused from the options and config.json."""
    from dspark import checkpoint

    def never(*args, **kwargs):
        raise AssertionError("the command loaded a model before refusing the mistake")

    monkeypatch.setattr(checkpoint, "load_target", never)


def _doubled(root: Path, name: str) -> Path:
    """A run folder whose requests.jsonl holds one request twice (two processes ran it at once)."""
    records = [run_folders.native(s, q, 5.0 if s == "plain" else 4.0) for s in ("plain", "dspark")
               for q in run_folders.QIDS]
    path = run_folders.write(root / name, records, systems=["plain", "dspark"])
    with (path / "requests.jsonl").open("a") as f:
        f.write(json.dumps(run_folders.native("plain", "q1", 50.0)) + "\n")
    return path


def test_a_warning_of_the_analysis_is_one_line_on_the_command_line(tmp_path, monkeypatch, capfd):
    """parity and calibrate of a run holding a request twice printed Python's two-line warning (its class, file
    and line, then the source line); the command line says it in one `warning:` line, as its errors."""
    a, b = _doubled(tmp_path, "a"), _doubled(tmp_path, "b")
    code, _, err = run_cli(monkeypatch, capfd, "parity", a, b)
    lines = err.strip().splitlines()
    assert lines == [f"warning: {p}/requests.jsonl: 1 request recorded more than once (two processes ran this run "
                     "at the same time); each counted once (8 requests)" for p in (a, b)], err
    code, _, err = run_cli(monkeypatch, capfd, "calibrate", a)
    assert "RepeatedRequests" not in err and "read_requests(" not in err
    assert err.splitlines()[0].startswith("warning: ") and "recorded more than once" in err


def _listing(folder: Path) -> dict[str, int]:
    """Every file under `folder` and its size and modification time, to see that nothing was written."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))}


def test_train_draft_refuses_a_package_folder_and_a_folder_of_other_files(tmp_path, monkeypatch, capfd, no_loading):
    """train-draft --out dspark/data/demo/dspark overwrote the shipped demo draft, and --out RUN_DIR wrote a draft
    and checkpoint/ beside a run's manifest, both with exit 0: refused in one line before anything loads, nothing
    written (as make-tiny refuses them, with the same check)."""
    common = ["train-draft", "--target", "demo", "--data", "demo", "--steps", "1"]
    package = Path(dspark.__file__).parent
    shipped = package / "data" / "demo" / "dspark"
    before = _listing(shipped)
    _refused(monkeypatch, capfd, *common, "--out", shipped, says=f"inside the Python package {package}")
    assert _listing(shipped) == before
    _refused(monkeypatch, capfd, *common, "--out", package / "my-draft", says="inside the Python package")
    assert not (package / "my-draft").exists()
    run = run_folders.plain_only(tmp_path)
    before = _listing(run)
    for resume in ([], ["--resume"]):
        err = _refused(monkeypatch, capfd, *common, "--out", run, *resume, says="the folder holds other files")
        assert "not an earlier train-draft's checkpoint" in err and "give a new or empty folder" in err
    assert _listing(run) == before


@pytest.mark.parametrize("extra, says", [
    (["--taps", "2,1"], "tapped target layers [2, 1] must be strictly increasing"),
    (["--taps", "1,9"], "tapped target layer 9 is too deep"),
    (["--mask-token-id", "999999"], "mask_token_id 999999 is outside the vocabulary"),
])
def test_train_draft_checks_the_drafts_shape_from_the_config_before_loading(extra, says, tmp_path, monkeypatch,
                                                                             capfd, no_loading):
    """Taps out of order or past the target's depth, a mask token past its vocabulary: refused from config.json
    alone (they were refused after the target loaded, about 10 s on a real model), nothing written."""
    out = tmp_path / "draft"
    _refused(monkeypatch, capfd, "train-draft", "--target", "demo", "--data", "demo", "--out", out, "--steps", "1",
             *extra, says=says)
    assert not out.exists()


@pytest.mark.parametrize("extra, says", [
    (["--no-draft", "--confidence-threshold", "0.3", "--prompt", "hi"],
     "--confidence-threshold 0.3 cuts a draft's proposals by its confidence head; --no-draft has no draft"),
    (["--ngram", "--confidence-threshold", "0.3", "--prompt", "hi"], "n-gram lookup has no confidence head"),
    (["--no-draft", "--prompt-ids", "1,x,3"], "--prompt-ids must be comma-separated integers, got '1,x,3'"),
    (["--no-draft", "--prompt-ids", "1,2,3", "--max-new-tokens", "100000"],
     "--max-new-tokens 100000: with the prompt's 3 tokens, past the target's context of 2048 "
     "(max_position_embeddings); give --max-new-tokens 2045 or less"),
    (["--no-draft", "--prompt", "hello", "--chat", "--max-new-tokens", "2048"], "past the target's context of 2048"),
])
def test_generate_refuses_what_cannot_apply_or_fit_before_loading(extra, says, monkeypatch, capfd, no_loading):
    """--no-draft with a confidence threshold generated plainly, the threshold silently ignored; prompt ids that
    are not numbers and a request past the context were refused only after the model loaded. Each is one line
    from the options, the target's config.json and its tokenizer."""
    _refused(monkeypatch, capfd, "generate", "--target", "demo", *extra, says=says)


@pytest.mark.parametrize("args, says", [
    (["inspect", "demo-dspark", "--target", "demo-dflash"],
     "--target demo-dflash is a draft (deepspec dflash), not a target; give the target model it drafts for"),
    (["inspect", "demo-dspark", "--target", "demo-dflash", "--json"], "--target demo-dflash is a draft"),
    (["inspect", "demo"], "demo is a model (Qwen3ForCausalLM), not a draft of a block or EAGLE-3 format: give it as "
                          "--target with the draft as the argument, or add --target"),
])
def test_inspect_names_a_draft_and_a_target_given_in_each_others_place(args, says, monkeypatch, capfd):
    """A draft given as --target printed a 24-line table of misfits (a 3-layer "target") and exited 1; a target
    given as the draft was "unknown draft format". Each is a mistake in the arguments: one line, exit 2. (A real
    draft that does not fit its target still gets its table and exit 1: test_cli's mismatched targets.)"""
    _refused(monkeypatch, capfd, *args, says=says)


@pytest.fixture
def no_building(monkeypatch):
    """Building engine-bench's random models fails the test: the mistake must be refused from the configs."""
    from harness.engine_bench import native

    def never(*args, **kwargs):
        raise AssertionError("engine-bench built its models before refusing the mistake")

    monkeypatch.setattr(native, "build_random", never)


@pytest.mark.parametrize("extra, says", [
    (["--context-len", "100000"], "--context-len 100000: past the target's context, 2048 positions "
     "(max_position_embeddings of demo) less the 64 tokens each timed engine generates; give at most 1984"),
    (["--sweep-context", "128,5000"], "--sweep-context 5000: past the target's context"),
    (["--target", "qwen3-8b"], "--target qwen3-8b: no --draft given, and its default on a CPU, demo-dspark, does "
     "not fit it (draft hidden_size 256 != target hidden_size 4096"),
])
def test_engine_bench_names_its_own_options_before_building(extra, says, monkeypatch, capfd, no_building):
    """--context-len past the demo's context answered "lower --max-new-tokens" (engine-bench has no such option);
    --target qwen3-8b on a CPU answered "the draft was trained for another target" where no draft was given.
    Each names the option and the value that works, before any model is built."""
    err = _refused(monkeypatch, capfd, "engine-bench", "--device", "cpu", *extra, says=says)
    assert "--max-new-tokens" not in err
    if "qwen3-8b" in extra:
        assert err.rstrip().endswith("give --draft dspark-qwen3-8b-block7")


@pytest.mark.parametrize("backend", [["openai", "--base-url", "http://127.0.0.1:9"], ["vllm-server"]])
def test_profile_of_a_served_backend_is_refused_before_any_folder(backend, tmp_path, monkeypatch, capfd):
    """profile --torch --backend openai was refused only in its child, after the parent had made the profile
    folder and printed a --resume hint that could never work: refused in the parent, nothing made."""
    monkeypatch.chdir(tmp_path)
    err = _refused(monkeypatch, capfd, "profile", "--torch", "--backend", *backend, "--systems", "plain",
                   says=f"--backend {backend[0]}: a served run is not profiled")
    assert "profile with --backend vllm" in err and "--resume" not in err
    assert list(tmp_path.iterdir()) == []


def test_trace_summarize_of_a_folder_names_the_traces_inside_it(tmp_path, monkeypatch, capfd):
    """trace summarize PROFILE_DIR (or a run folder a profile wrote) was "no such trace file" for a folder that
    exists: it says it is a folder, which of its traces to give, and, for a profile's folder, trace compare."""
    profile = tmp_path / "prof"
    for system in ("plain", "dspark"):
        (profile / system).mkdir(parents=True)
        (profile / system / "trace.torch.json.gz").write_bytes(b"")
        (profile / system / "manifest.json").write_text("{}")
    (profile / "profile.json").write_text(json.dumps({"commands": {"plain": [], "dspark": []}}))
    err = _refused(monkeypatch, capfd, "trace", "summarize", profile, says=f"{profile}: a folder, not a trace file")
    assert (f"give one of its traces: {profile}/dspark/trace.torch.json.gz, {profile}/plain/trace.torch.json.gz; "
            f"or compare its systems with: dspark-bench trace compare {profile}") in err
    err = _refused(monkeypatch, capfd, "trace", "summarize", profile / "plain", says="a folder, not a trace file")
    assert f"give one of its traces: {profile}/plain/trace.torch.json.gz" in err and "trace compare" not in err
    run = run_folders.plain_only(tmp_path)
    _refused(monkeypatch, capfd, "trace", "summarize", run, says=f"{run}: a folder, not a trace file, and it holds none")

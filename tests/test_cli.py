"""`dspark-bench` end to end: the README's commands in real processes, `generate --json` accounting for
every drafter, `inspect` of every tiny format, and drafts that do not fit their target."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_runner import run_cli

from dspark.checkpoint import load_target, save_target
from dspark.synthetic.tiny import random_target, tiny_target_config

PROMPT = [10, 20, 30, 40, 50, 60, 10, 20, 30, 40, 50, 60, 10, 20, 30]  # repeats, so n-gram lookup finds matches
MAX_NEW = 24
STOP_IDS = set(tiny_target_config().eos_token_ids)


def run_process(*args) -> subprocess.CompletedProcess:
    """The installed `dspark-bench` console script as a real process; stdout/stderr as raw bytes."""
    script = Path(sys.executable).with_name("dspark-bench")
    if not script.is_file():
        pytest.skip("the dspark-bench console script is not installed next to this Python")
    env = dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="80")  # a narrow console: nothing may wrap
    return subprocess.run([str(script), *map(str, args)], capture_output=True, env=env, timeout=300)


# ---- generate on the demo pair and on a tiny random pair ----------------------------------------

SUMMARY = re.compile(r"dspark: (\d+) tokens in [\d.]+ s \([\d.]+ tok/s\), (\d+) rounds, acceptance length [\d.]+, "
                     r"stop: (max_new_tokens|stop_token)")


README_PROMPT = "Write a Python function `count_vowels(s)` that counts the vowels in a string."


def test_generate_on_the_shipped_demo_pair(monkeypatch, capfd):
    from dspark.checkpoint import DEMO_DIR

    if not (DEMO_DIR / "target" / "model.safetensors").is_file():
        pytest.skip("the demo models are not built")
    args = ["generate", "--target", "demo", "--draft", "demo-dspark", "--chat", "--prompt", README_PROMPT]
    proc = run_process(*args)
    err = proc.stderr.decode()
    assert proc.returncode == 0 and "Traceback" not in err, err
    summary, note = err.rstrip("\n").split("\n")  # the figures, then (the demo target) that its text means little
    assert SUMMARY.fullmatch(summary) and "its text is not meant to make sense" in note, err
    code, out, _ = run_cli(monkeypatch, capfd, *args, "--json")
    result = json.loads(out)
    assert code == 0 and proc.stdout.decode() == result["text"] + "\n"
    assert result["text"].startswith("def ")  # the demo target answers with code
    assert sum(result["acceptance_lengths"]) / result["num_rounds"] > 1.3  # a trained draft, not a random one


def test_make_tiny_then_generate(tmp_path, monkeypatch, capfd):
    out_dir = tmp_path / "dspark-tiny"
    made = run_process("make-tiny", out_dir)
    assert made.returncode == 0, made.stderr.decode()
    listed = dict(line.split() for line in made.stdout.decode().splitlines())
    assert listed == {name: str(out_dir / name)
                      for name in ("target", "dspark", "dspark-speculators", "dflash", "dflash-zlab", "eagle3",
                                   "eagle3-speculators", "eagle3-deepspec")}
    for folder in listed.values():
        assert (Path(folder) / "config.json").is_file() and (Path(folder) / "model.safetensors").is_file()
    assert (out_dir / "target" / "tokenizer_config.json").is_file()

    args = ["generate", "--target", out_dir / "target", "--draft", out_dir / "dspark", "--prompt", "def fib(n):",
            "--chat", "--max-new-tokens", "64"]
    proc = run_process(*args)
    err = proc.stderr.decode()
    assert proc.returncode == 0 and "Traceback" not in err, err
    lines = err.rstrip("\n").split("\n")
    assert len(lines) == 1, err  # the summary is one line, however narrow the console
    summary = SUMMARY.fullmatch(lines[0])
    assert summary, lines[0]
    n_tokens, n_rounds, stop = int(summary[1]), int(summary[2]), summary[3]
    assert n_tokens == 64 or stop == "stop_token"

    # The same run with --json (deterministic at temperature 0): stdout was exactly the decoded text.
    code, out, _ = run_cli(monkeypatch, capfd, *args, "--json")
    assert code == 0
    result = json.loads(out)
    assert (result["num_tokens"], result["num_rounds"], result["stop_reason"]) == (n_tokens, n_rounds, stop)
    assert proc.stdout.decode() == result["text"] + "\n"
    assert result["prompt_tokens"] > len("def fib(n):")  # the chat template wrapped the prompt


# ---- generate --json ---------------------------------------------------------------------------

DRAFTERS = {  # name: (options, method reported, most tokens one proposal holds)
    "dspark": (["--draft", "{tiny}/dspark"], "dspark", 7),
    "dspark-speculators": (["--draft", "{tiny}/dspark-speculators"], "dspark", 7),
    "dflash": (["--draft", "{tiny}/dflash"], "dflash", 7),
    "dflash-zlab": (["--draft", "{tiny}/dflash-zlab"], "dflash", 7),
    "ngram": (["--ngram"], "ngram", 7),
    "plain": (["--no-draft"], "plain", 0),
}


@pytest.fixture(scope="module")
def prefill_token(tiny_dir):
    """The target's greedy token after PROMPT, computed directly from its forward."""
    model = load_target(tiny_dir / "target", dtype="float64").model
    cache = model.new_cache(len(PROMPT))
    hidden, _ = model(torch.tensor([PROMPT]), torch.arange(len(PROMPT))[None], cache, len(PROMPT))
    return int(model.logits(hidden[:, -1]).argmax())


def _generate_json(monkeypatch, capfd, tiny_dir, name, *extra) -> dict:
    options = [o.replace("{tiny}", str(tiny_dir)) for o in DRAFTERS[name][0]]
    code, out, err = run_cli(monkeypatch, capfd, "generate", "--target", tiny_dir / "target", *options,
                             "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", MAX_NEW,
                             "--dtype", "float64", "--device", "cpu", "--json", *extra)
    assert code == 0 and "Traceback" not in err, err
    return json.loads(out)


def _check_accounting(r: dict, block: int) -> None:
    tokens = r["tokens"]
    assert all(isinstance(t, int) and 0 <= t < 272 for t in tokens)
    assert r["num_tokens"] == len(tokens) and r["prompt_tokens"] == r["prompt_len"] == len(PROMPT)
    if r["stop_reason"] == "max_new_tokens":
        assert len(tokens) == MAX_NEW and not STOP_IDS & set(tokens)
    else:
        assert r["stop_reason"] == "stop_token" and tokens[-1] in STOP_IDS and not STOP_IDS & set(tokens[:-1])
        assert len(tokens) <= MAX_NEW
    acc, prop = r["acceptance_lengths"], r["proposal_lengths"]
    assert r["num_rounds"] == len(acc) == len(prop)
    if block == 0:
        assert r["num_rounds"] == 0 and r["acceptance_length"] is None
        return
    assert r["num_rounds"] >= 1
    assert all(0 <= p <= block and 1 <= a <= p + 1 for a, p in zip(acc, prop))
    assert 1 + sum(acc) >= len(tokens) > 1 + sum(acc[:-1])  # the prefill token, then every round was needed
    assert r["acceptance_length"] == pytest.approx(sum(acc) / len(acc))


@pytest.fixture(scope="module")
def plain_tokens(tiny_dir):
    from dspark.engine import Engine, GenerationConfig

    model = load_target(tiny_dir / "target", dtype="float64").model
    cfg = GenerationConfig(max_new_tokens=MAX_NEW, stop_token_ids=tuple(STOP_IDS))
    return Engine(model).generate(PROMPT, cfg).tokens


@pytest.mark.parametrize("name", DRAFTERS)
def test_generate_json_greedy(tiny_dir, prefill_token, plain_tokens, monkeypatch, capfd, name):
    r = _generate_json(monkeypatch, capfd, tiny_dir, name)
    _, method, block = DRAFTERS[name]
    assert r["method"] == method
    assert r["tokens"][0] == prefill_token  # the prefill token comes first
    _check_accounting(r, block)
    assert r["tokens"] == plain_tokens  # greedy speculative decoding is lossless
    assert r["settings"]["temperature"] == 0.0 and r["settings"]["max_new_tokens"] == MAX_NEW
    prov = r["provenance"]  # what produced the result travels with it
    assert prov["versions"]["torch"] == torch.__version__ and prov["device"] == "cpu" and prov["time_utc"]
    assert prov["git"]["commit"] is None or len(prov["git"]["commit"]) == 40
    from transformers import AutoTokenizer

    assert r["text"] == AutoTokenizer.from_pretrained(tiny_dir / "target").decode(r["tokens"])


@pytest.mark.parametrize("name", ["dspark", "dflash-zlab", "ngram"])
def test_generate_json_sampled(tiny_dir, monkeypatch, capfd, name):
    runs = [_generate_json(monkeypatch, capfd, tiny_dir, name, "--temperature", "1", "--seed", seed)
            for seed in ("7", "7", "8")]
    for r in runs:
        _check_accounting(r, DRAFTERS[name][2])
    assert runs[0]["tokens"] == runs[1]["tokens"] and runs[0]["acceptance_lengths"] == runs[1]["acceptance_lengths"]
    assert runs[0]["tokens"] != runs[2]["tokens"]  # the seed drives the sampling
    if name != "ngram":  # near-uniform tiny distributions: sampled drafts are often accepted
        assert max(runs[0]["acceptance_lengths"]) > 1


def test_generate_text_with_ids_only_target(tiny_dir, tmp_path, monkeypatch, capfd):
    """A target folder without tokenizer files: --prompt-ids works and stdout is the ids."""
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        (bare / name).write_bytes((tiny_dir / "target" / name).read_bytes())
    code, out, err = run_cli(monkeypatch, capfd, "generate", "--target", bare, "--draft", tiny_dir / "dspark",
                             "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", 40, "--ignore-eos")
    assert code == 0, err
    ids = out.rstrip("\n").split(",")
    assert len(ids) == 40 and all(i.isdigit() for i in ids)  # one line, never wrapped
    assert re.fullmatch(r"dspark: 40 tokens in .*, stop: max_new_tokens\n", err)


# ---- inspect -----------------------------------------------------------------------------------

INSPECT = {
    "dspark": {"format": "deepspec", "method": "dspark", "vllm_method": "dspark", "num_drafts": 7, "block_size": 7,
               "sample_from_anchor": True, "markov_rank": 16, "markov_head_type": "vanilla",
               "confidence_head": True, "target_layer_ids": [0, 1, 2], "ships_embeddings": True},
    "dspark-speculators": {"format": "speculators", "method": "dspark", "vllm_method": "dspark", "num_drafts": 7,
                           "sample_from_anchor": True, "markov_rank": 16, "target_layer_ids": [0, 1, 2],
                           "ships_embeddings": True, "architecture": "DSparkSpeculator"},
    "dflash": {"format": "deepspec", "method": "dflash", "num_drafts": 7, "sample_from_anchor": True,
               "markov_rank": 0, "confidence_head": False, "ships_embeddings": True},
    "dflash-zlab": {"format": "zlab", "method": "dflash", "vllm_method": "dflash", "num_drafts": 7, "block_size": 8,
                    "sample_from_anchor": False, "markov_rank": 0, "ships_embeddings": False,
                    "architecture": "DFlashDraftModel"},
}


@pytest.mark.parametrize("name", INSPECT)
def test_inspect_json(tiny_dir, monkeypatch, capfd, name):
    code, out, err = run_cli(monkeypatch, capfd, "inspect", tiny_dir / name, "--target", tiny_dir / "target", "--json")
    assert code == 0 and err == "", err
    info = json.loads(out)
    assert {k: info[k] for k in INSPECT[name]} == INSPECT[name]
    assert info["fits_target"] is True and "problem" not in info
    if name == "dflash":  # anchor-first without a Markov head: vLLM's dspark runtime, forced by hand
        assert info["vllm_method"] == "dspark" and "anchor-first" in info["vllm_note"]
    params = info["parameters"]
    assert params["total"] == sum(v for k, v in params.items() if not k.startswith("total"))
    assert params["total_without_embeddings"] == params["total"] - params["embed_tokens"] - params["lm_head"]
    assert params["embed_tokens"] == (272 * 64 if INSPECT[name]["ships_embeddings"] else 0)
    assert params["markov_head"] == (2 * 272 * 16 if INSPECT[name]["markov_rank"] else 0)
    code, out, _ = run_cli(monkeypatch, capfd, "inspect", tiny_dir / name, "--json")  # without a target
    assert code == 0 and "fits_target" not in json.loads(out)


def test_inspect_table(tiny_dir, monkeypatch, capfd):
    code, out, err = run_cli(monkeypatch, capfd, "inspect", tiny_dir / "dflash-zlab", "--target", tiny_dir / "target")
    assert code == 0 and err == ""
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in out.splitlines() if line.count("│") == 3}
    assert rows["format"] == "zlab" and rows["vllm_method"] == "dflash" and rows["fits_target"] == "True"


@pytest.fixture(scope="module")
def other_targets(tmp_path_factory):
    root = tmp_path_factory.mktemp("other-targets")
    for name, cfg in {"shallow": tiny_target_config(layers=3), "narrow": tiny_target_config(hidden=32),
                      "big-vocab": tiny_target_config(vocab_size=300)}.items():
        save_target(random_target(cfg, seed=5), root / name)
    return root


@pytest.mark.parametrize("target,problem", [
    ("shallow", "tapped target layer 2 is too deep for a 3-layer target"),
    ("narrow", "draft hidden_size 64 != target hidden_size 32"),
    ("big-vocab", "draft vocabulary 272 != target vocabulary 300"),
])
def test_inspect_against_a_mismatched_target(tiny_dir, other_targets, monkeypatch, capfd, target, problem):
    code, out, err = run_cli(monkeypatch, capfd, "inspect", tiny_dir / "dspark", "--target", other_targets / target,
                             "--json")
    assert code == 1, (out, err)
    info = json.loads(out)
    assert info["fits_target"] is False and problem in info["problem"]
    assert info["format"] == "deepspec" and info["method"] == "dspark"  # still describes the draft
    # generate refuses the same pair with one line and exit 2
    code, out, err = run_cli(monkeypatch, capfd, "generate", "--target", other_targets / target, "--draft",
                             tiny_dir / "dspark", "--prompt-ids", "1,2,3", "--max-new-tokens", 4)
    assert code == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1 and problem in err


# ---- help: every option described, flags that read as flags ---------------------------------------

def _commands(group, path=("dspark-bench",)):
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, path + (name,))
        else:
            yield " ".join(path + (name,)), cmd


def test_every_option_of_every_command_has_help_and_flags_take_no_value(monkeypatch, capfd):
    import typer

    from harness.cli import app

    commands = dict(_commands(typer.main.get_command(app)))
    assert {"dspark-bench run", "dspark-bench train-draft", "dspark-bench trace summarize"} <= set(commands)
    for path, cmd in commands.items():
        for param in cmd.params:
            if getattr(param, "hidden", False) or param.param_type_name != "option":
                continue
            assert param.help, f"{path} {param.opts[0]} has no help"
    code, out, _ = run_cli(monkeypatch, capfd, "generate", "--help")
    assert code == 0 and re.search(r"^  --ngram +Draft with n-gram", out, re.M) and "<bool>" not in out
    code, out, _ = run_cli(monkeypatch, capfd, "engine-bench", "--help")
    assert code == 0 and "Needs a CUDA GPU" in " ".join(out.split())
    code, _, err = run_cli(monkeypatch, capfd, "generate", "--target", "demo", "--ngram", "true", "--prompt", "x")
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith("error: Got unexpected extra argument(s) (true); a flag takes no value")


def test_dash_h_is_help_on_every_command_and_version_is_the_programs(monkeypatch, capfd):
    """`-h` answers as `--help` on the program, on every group and on every command; `--version` prints the
    installed version (and the checkout's commit) and exits 0; on a command it is refused in one line
    that says where it belongs."""
    from importlib import metadata

    import typer

    from harness.cli import app
    from harness.runs.provenance import git_revision

    root = typer.main.get_command(app)
    groups = [("dspark-bench",)] + [("dspark-bench", n) for n, c in root.commands.items() if hasattr(c, "commands")]
    paths = [tuple(p.split()) for p, _ in _commands(root)] + groups
    assert len(paths) >= 12 and ("dspark-bench", "trace", "summarize") in paths
    for path in paths:
        code, out, err = run_cli(monkeypatch, capfd, *path[1:], "-h")
        assert code == 0 and out.startswith(f"Usage: {' '.join(path)} ") and err == "", (path, out, err)
        assert "-h, --help" in out
    code, out, err = run_cli(monkeypatch, capfd, "--version")
    assert code == 0 and err == "" and out.startswith(f"dspark-bench {metadata.version('dspark-bench')}")
    assert (git_revision()["commit"] or "")[:12] in out and len(out.splitlines()) == 1
    code, out, err = run_cli(monkeypatch, capfd, "trace", "summarize", "--version")
    assert code == 2 and err == ("error: --version is the program's option, not dspark-bench trace summarize's: give "
                                 "it alone, dspark-bench --version\n")


def test_the_command_line_loads_no_torch_until_a_command_runs(tmp_path):
    """Importing the CLI, and refusing a bad option, an unparsable value or one the experiment does not
    have, load no torch (which takes seconds): each is one line and exit 2, in a fresh interpreter."""
    probe = ("import sys\nfrom harness.cli import main\ntry:\n    main()\nfinally:\n"
             "    print('torch' in sys.modules, file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", "import sys, harness.cli; print('torch' in sys.modules)"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout == "False\n", proc.stderr
    for args, message in ((["run", "--nope"], "No such option: --nope"),
                          (["run", "--temperature", "x"], "--temperature must be numbers separated by commas"),
                          (["run", "--temperature", "nan"], "--temperature nan: give temperatures from 0"),
                          (["run", "--device", "gpu"], "--device gpu: unknown device"),
                          (["run", "--dtype", "fp17"], "--dtype fp17: unknown dtype"),
                          (["run", "--split", "qualitativ"], "unknown split 'qualitativ'"),
                          (["run", "--max-concurrency", "x"], "--max-concurrency must be whole numbers"),
                          (["run", "--systems", "nope"], "'nope' is not in experiment demo"),
                          (["run", "--output-len", "0"], "--output-len is 0"),
                          (["report", "--nope"], "No such option: --nope")):
        proc = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, cwd=tmp_path)
        error, loaded = proc.stderr.splitlines()
        assert proc.returncode == 2 and error.startswith("error: ") and message in error, (args, proc.stderr)
        assert loaded == "False", (args, proc.stderr)


def test_an_unknown_device_is_one_line_on_every_command_that_takes_one(tmp_path, monkeypatch, capfd):
    """`--device` is read in one place for every command: a name we do not run on (`gpu`, `mps`, a malformed
    `cuda:x`, printed as typed) is refused in one line before anything loads or is made, not a traceback
    from torch after the folder was made."""
    commands = [["run", "--dry-run"], ["run", "--out", tmp_path / "run"], ["profile", "--torch", "--out", tmp_path / "p"],
                ["generate", "--target", "demo", "--no-draft", "--prompt-ids", "1,2"], ["engine-bench"],
                ["train-draft", "--target", "demo", "--data", "demo", "--out", tmp_path / "d", "--steps", "1"]]
    for command in commands:
        for name in ("gpu", "mps", "cuda:x", "CUDA", "cuda:"):
            code, out, err = run_cli(monkeypatch, capfd, *command, "--device", name)
            assert code == 2 and out == "" and err == f"error: --device {name}: unknown device; use auto, cpu, cuda " \
                                                       "or cuda:N\n", (command, name, err)
    assert list(tmp_path.iterdir()) == []
    from harness.cli.options import device

    assert device("cpu") == "cpu" and device("cuda:12", resolve=False) == "cuda:12"  # (the name; the machine later)
    if not torch.cuda.is_available():
        with pytest.raises(Exception, match="--device cuda:0: no CUDA device is visible; use --device cpu"):
            device("cuda:0")
    else:
        with pytest.raises(Exception, match=f"--device cuda:{torch.cuda.device_count()}: this machine shows"):
            device(f"cuda:{torch.cuda.device_count()}")


def test_list_options_refuse_empty_items_repeats_and_values_out_of_range(monkeypatch, capfd):
    """Each list option names each value once, with no empty item; a temperature is a number from 0 to 2 (nan
    ran every token as id 0, inf read as acceptance 8.00, `0,0` compared plain with itself); a concurrency
    level is at least 1, refused for its value rather than blamed on the backend. One line each, at the
    options (a dry run prints nothing before it)."""
    cases = [(["--temperature", "nan"], "--temperature nan: give temperatures from 0 (greedy) to 2, e.g. 0,1"),
             (["--temperature", "inf"], "--temperature inf: give temperatures from 0 (greedy) to 2"),
             (["--temperature", "1e9"], "--temperature 1e+09: give temperatures from 0 (greedy) to 2"),
             (["--temperature", "-0.5"], "--temperature -0.5: give temperatures from 0 (greedy) to 2"),
             (["--temperature", "0,0"], "--temperature '0,0' gives '0' twice; give each once"),
             (["--temperature", "0,0.0"], "--temperature '0,0.0' gives '0' and '0.0', the same value; give each once"),
             (["--temperature", "0,,1"], "--temperature '0,,1' has an empty item; give values separated by single "
                                         "commas, e.g. 0,1"),
             (["--temperature", ","], "--temperature ',' names no temperature"),
             (["--systems", "plain,"], "--systems 'plain,' has an empty item"),
             (["--systems", "plain,plain"], "--systems 'plain,plain' gives 'plain' twice; give each once"),
             (["--systems", ","], "--systems ',' names nothing"),
             (["--category", "coding, coding"], "--category 'coding, coding' gives 'coding' twice"),
             (["--max-concurrency", "0"], "--max-concurrency 0: give levels of at least 1, e.g. 1,4,16,32"),
             (["--max-concurrency", "4,4"], "--max-concurrency '4,4' gives '4' twice"),
             (["--max-concurrency", "1,,4"], "--max-concurrency '1,,4' has an empty item")]
    for extra, message in cases:
        code, out, err = run_cli(monkeypatch, capfd, "run", "--dry-run", "--device", "cpu", *extra)
        assert code == 2 and out == "" and err.startswith(f"error: {message}") and len(err.splitlines()) == 1, \
            (extra, err)
    code, _, err = run_cli(monkeypatch, capfd, "engine-bench", "--device", "cpu", "--sweep-context", "128,0")
    assert code == 2 and err == "error: --sweep-context 0: give context lengths of at least 1, e.g. 1024,4096,16384\n"
    code, out, err = run_cli(monkeypatch, capfd, "run", "--dry-run", "--device", "cpu", "--systems", "plain",
                             "--temperature", "0,2", "--num-prompts", "1")
    assert code == 0 and "1 prompt x 2 temperatures x 1 system = 2 requests" in out, err  # the bounds themselves run


def test_a_damaged_manifest_is_one_line_for_every_reader(tmp_path, monkeypatch, capfd):
    """`manifest.json` not JSON, empty, or JSON but no object: report, parity, calibrate and run --resume
    (each reads it through `read_manifest`) name the file and what to do in one line, exit 2."""
    import run_folders

    good = run_folders.plain_only(tmp_path / "good")
    bad = run_folders.plain_only(tmp_path / "bad")
    for text, what in (("{not", "not JSON"), ("", "empty"), ("[]", "not a JSON object")):
        (bad / "manifest.json").write_text(text)
        for args in (["report", bad], ["report", good, bad], ["parity", bad, good], ["calibrate", bad],
                     ["run", "--resume", bad]):
            code, out, err = run_cli(monkeypatch, capfd, *args)
            assert code == 2 and out == "" and err == (
                f"error: {bad / 'manifest.json'}: damaged ({what}), so the run's record of what produced it is "
                "lost; restore the file from a copy, or run again into a new folder\n"), (args, err)


def test_commands_are_listed_in_the_order_a_user_needs_them(monkeypatch, capfd):
    """`dspark-bench --help` lists run, report, profile, trace, parity and calibrate first (the trace group
    among them, not last), each summary whole where it fits: train-draft's names EAGLE-3."""
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_cli(monkeypatch, capfd, "--help")
    listed = re.findall(r"^  ([a-z-]+)  ", out.split("Commands:")[1], re.M)
    assert code == 0 and listed[:6] == ["run", "report", "profile", "trace", "parity", "calibrate"]
    assert sorted(listed) == sorted(["run", "report", "profile", "trace", "parity", "calibrate", "generate",
                                     "engine-bench", "train-draft", "inspect", "make-tiny", "fetch-tokenizer"])
    assert re.search(r"^  train-draft +Train a DSpark, DFlash, DFlash 2, EAGLE-3 or draft model\.$", out, re.M)


def test_systems_help_lists_the_demo_experiments_systems(monkeypatch, capfd):
    from harness.specs.experiments import load_experiment

    code, out, _ = run_cli(monkeypatch, capfd, "run", "--help")
    names = ", ".join(s.name for s in load_experiment("demo").systems)
    assert code == 0 and f"(the demo experiment's: {names})" in " ".join(out.split()) and names.startswith("plain")
    assert "another --experiment defines its own" in " ".join(out.split())


def test_provenance_names_the_code_by_its_digest_as_well_as_its_commit(tmp_path):
    """A copy of the tree with some other commit's .git reports that commit: the source digest still names
    the code. It covers every .py file of dspark/ and harness/ and changes when one byte does."""
    import hashlib
    import shutil

    from harness.runs.provenance import source_sha256

    root = Path(__file__).resolve().parents[1]
    copy = tmp_path / "tree"
    for package in ("dspark", "harness"):
        shutil.copytree(root / package, copy / package, ignore=shutil.ignore_patterns("data", "__pycache__"))
    code = "from harness.runs.provenance import source_sha256; print(source_sha256())"

    def digest_of(tree: Path) -> str:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tree,
                              env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}, check=True).stdout.strip()

    assert digest_of(copy) == source_sha256()
    (copy / "dspark" / "schedule.py").write_text((copy / "dspark" / "schedule.py").read_text() + "\n")
    assert digest_of(copy) != source_sha256()
    assert len(source_sha256()) == len(hashlib.sha256().hexdigest())

"""AIPerf's artifacts imported (issue 56), from recorded real AIPerf 0.13.0 runs, no server:

- its server-metrics export (`server_metrics_export.json`) gives the same speculative counters as our own
  reads of /metrics around the same wave (`tests/fixtures/aiperf-counters/`: a `run --load-generator
  aiperf` sweep at c=1 and c=2, its `waves.jsonl` and each wave's export trimmed to vLLM's spec-decode
  counters); the wave record says which scrape its counters came from, and where the two part, keeps
  ours, AIPerf's beside, and says why;
- `report --aiperf PLAIN SPEC` reads two folders `aiperf profile` wrote without dspark-bench
  (`tests/fixtures/aiperf-pair/`, its README has the commands): our tables with AIPerf named in every
  title, per-request acceptance as vLLM sent it, SPEED-Bench's category, the settings that differ, the
  warm-up left out (its phase's level too), requests paired by what they sent and its turn, whatever
  session ids AIPerf gave (one that does not pair is one line), no stop reason or temperature made up,
  and bad input (folders swapped or of one kind, a folder missing what pairs it) one line, exit 2;
- a request AIPerf gave up on at the run's --request-timeout (AIPerf's real error format; and with AIPerf
  installed, a real AIPerf run against a server slower than the limit) fails as our client says it;
- and (item 4's console hint) a `random:qwen3-*` run that falls back to shaped prompts (no hub, no fetched
  Qwen3 tokenizer) says once, in one line, that `dspark-bench fetch-tokenizer qwen3` gives the real one.
"""

from __future__ import annotations

import json
import shutil
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from harness.backends.served import aiperf
from harness.backends.served.metrics import exported_counters
from tests.cli_runner import run_cli
from tests.test_aiperf import AIPERF, needs_aiperf
from tests.test_qwen3_tokenizer import RUN as QWEN3_RUN

FIXTURES = Path(__file__).parent / "fixtures"
COUNTERS, PAIR = FIXTURES / "aiperf-counters", FIXTURES / "aiperf-pair"


def _waves() -> list[dict]:
    return [json.loads(line) for line in (COUNTERS / "waves.jsonl").read_text().splitlines()]


def test_aiperf_export_gives_our_scrapes_counters():
    waves = _waves()
    assert [w["max_concurrency"] for w in waves] == [1, 2]
    for wave in waves:
        folder = COUNTERS / f"ngram-c{wave['max_concurrency']}"
        theirs = exported_counters(json.loads((folder / aiperf.SERVER_METRICS).read_text()))
        assert theirs == wave["spec_counters"] == wave["acceptance_check"]["per_request_sums"]
        assert theirs["num_spec_steps"] > 0 and len(theirs["accepted_per_pos"]) == 7
        kept, said = aiperf.wave_counters(wave["spec_counters"], folder)
        assert kept == wave["spec_counters"]
        assert said == {"counters_source": aiperf.OUR_SCRAPE,
                        "aiperf_counters": {"spec_counters": theirs, "agrees": True}}
        assert {k: wave[k] for k in said} == said  # (what the run wrote)
        alone, said = aiperf.wave_counters(None, folder)  # (we read none: AIPerf's, and the record says so)
        assert alone == theirs and said == {"counters_source": aiperf.THEIR_SCRAPE}


def test_counters_that_part_keep_ours_and_say_why(tmp_path):
    wave = _waves()[1]
    ours = dict(wave["spec_counters"], num_spec_steps=wave["spec_counters"]["num_spec_steps"] + 1)
    kept, said = aiperf.wave_counters(ours, COUNTERS / "ngram-c2")
    assert kept == ours and said["counters_source"] == aiperf.OUR_SCRAPE
    assert said["aiperf_counters"]["agrees"] is False and "scrape" in said["aiperf_counters"]["why"]
    assert said["aiperf_counters"]["spec_counters"] == wave["spec_counters"]
    assert aiperf.wave_counters(ours, tmp_path) == (ours, {"counters_source": aiperf.OUR_SCRAPE,
                                                          "aiperf_counters": None})  # (no export)


def test_a_wave_whose_aiperf_counters_part_from_ours_is_a_warning():
    from harness.analysis.summary import acceptance_disagreements, warnings

    wave = _waves()[1]
    ours = dict(wave["spec_counters"], num_spec_steps=wave["spec_counters"]["num_spec_steps"] + 1)
    kept, said = aiperf.wave_counters(ours, COUNTERS / "ngram-c2")
    lines = acceptance_disagreements([wave, wave | {"spec_counters": kept} | said])
    steps = wave["spec_counters"]["num_spec_steps"]
    assert lines == [f"ngram T=0 c=2 (wave {wave['wave']}): num_spec_steps {steps} by AIPerf's scrape, {steps + 1} by "
                     f"ours ({said['aiperf_counters']['why']})"]
    (warning,) = [w for w in warnings({"acceptance_disagreements": lines, "rows": []}) if "acceptance check" in w]
    assert "AIPerf's scrape of the counters parts from ours" in warning and lines[0] in warning


def _records(folder: Path) -> dict[str, dict]:
    rows = [json.loads(line) for line in (folder / "profile_export.jsonl").read_text().splitlines()]
    return {r["metadata"]["conversation_id"]: r for r in rows if r["metadata"]["benchmark_phase"] == "profiling"}


def test_report_reads_two_aiperf_folders(monkeypatch, capfd):
    code, out, err = run_cli(monkeypatch, capfd, "report", "--aiperf", str(PAIR / "plain"), str(PAIR / "ngram"), "--json")
    assert code == 0, err
    summary = json.loads(out)
    rows = {(r["system"], r["category"]): r for r in summary["rows"]}
    assert set(rows) == {("plain", "coding"), ("plain", "overall"), ("ngram", "coding"), ("ngram", "overall")}
    assert summary["load_generator"] == "load by AIPerf 0.13.0"
    ngram = rows[("ngram", "coding")]
    assert ngram["requests"] == 2  # (AIPerf's warm-up request of that run left out)
    assert ngram["speedup_pairs"] == 2 and ngram["speedup"] is not None
    theirs = _records(PAIR / "ngram")
    steps = sum(r["spec_decode_acceptance"]["num_spec_steps"] for r in theirs.values())
    accepted = sum(r["spec_decode_acceptance"]["num_accepted_draft_tokens"] for r in theirs.values())
    assert ngram["spec_decode_acceptance_length"] == pytest.approx(1 + accepted / steps) and steps > 0
    assert ngram["num_rounds"] == steps and ngram["spec_decode_num_accepted_tokens"] == accepted
    assert summary["aiperf"]["unpaired"] == []
    assert ["endpoint.urls", "[http://127.0.0.1:8411]", "[http://127.0.0.1:8412]"] in summary["aiperf"]["settings_differ"]

    code, out, err = run_cli(monkeypatch, capfd, "report", "--aiperf", str(PAIR / "plain"), str(PAIR / "ngram"))
    assert code == 0, err
    said = " ".join(out.split())  # (a title too wide for the terminal wraps)
    assert "ngram against " in said and "plain (overall) [load by AIPerf 0.13.0]" in said
    assert "concurrency sweep (overall rows) [load by AIPerf 0.13.0]" in said
    assert "settings differ (plain vs speculative): endpoint.urls" in said


def test_requests_pair_by_what_they_sent(monkeypatch, capfd, tmp_path):
    spec = tmp_path / "ngram"
    shutil.copytree(PAIR / "ngram", spec)
    inputs = json.loads((spec / "inputs.json").read_text())
    changed = inputs["data"][0]["session_id"]
    inputs["data"][0]["payloads"][0]["messages"][0]["content"] += " (edited)"
    (spec / "inputs.json").write_text(json.dumps(inputs))
    code, out, err = run_cli(monkeypatch, capfd, "report", "--aiperf", str(PAIR / "plain"), str(spec), "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["aiperf"]["unpaired"] == [(f"conversation {changed}: the two runs sent different prompts under "
                                              "this id; left out")]
    assert {r["requests"] for r in summary["rows"] if r["category"] == "coding"} == {1}

    records = (spec / "profile_export.jsonl").read_text().splitlines()  # a request the speculative run lacks
    kept = [line for line in records if changed not in line]
    (spec / "profile_export.jsonl").write_text("\n".join(kept) + "\n")
    code, out, err = run_cli(monkeypatch, capfd, "report", "--aiperf", str(PAIR / "plain"), str(spec), "--json")
    assert code == 0, err
    assert json.loads(out)["aiperf"]["unpaired"] == [f"conversation {changed}: only in the plain run "
                                                     f"({PAIR / 'plain'}); left out"]

    for session in inputs["data"]:  # every prompt differs: not two runs of the same prompts
        session["payloads"][0]["messages"][0]["content"] += " (edited)"
    (spec / "inputs.json").write_text(json.dumps(inputs))
    code, out, err = run_cli(monkeypatch, capfd, "report", "--aiperf", str(PAIR / "plain"), str(spec))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "the two runs sent different prompts" in err and "Traceback" not in err


@pytest.mark.parametrize("case, said", [
    ("no export", "no AIPerf export (profile_export_aiperf.json)"),
    ("one folder", "--aiperf reads two AIPerf folders"),
    ("without --aiperf", "an AIPerf artifact folder, not a run folder; give two with --aiperf"),
])
def test_bad_aiperf_input_is_one_line(monkeypatch, capfd, tmp_path, case, said):
    args = {"no export": ["--aiperf", str(PAIR / "plain"), str(tmp_path)],
            "one folder": ["--aiperf", str(PAIR / "plain")],
            "without --aiperf": [str(PAIR / "plain"), str(PAIR / "ngram")]}[case]
    code, _, err = run_cli(monkeypatch, capfd, "report", *args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and said in err, err


def test_a_whole_splits_categories_come_from_its_input_file(monkeypatch, capfd, tmp_path):
    """Runs of the whole qualitative split (`speed_bench_qualitative`): AIPerf's records name no category, so
    each prompt's comes from the input file its config names, found beside the artifact folders; without
    that file, `all`."""
    rows = [json.loads(line) for line in (PAIR / "qualitative.jsonl").read_text().splitlines()]
    rows[1]["category"] = "python"  # (the second coding prompt, under a category of its own)
    for name in ("plain", "ngram"):
        shutil.copytree(PAIR / name, tmp_path / name)
        profile = json.loads((tmp_path / name / "profile_export_aiperf.json").read_text())
        profile["input_config"]["datasets"][0]["format"] = "speed_bench_qualitative"
        (tmp_path / name / "profile_export_aiperf.json").write_text(json.dumps(profile))
    (tmp_path / "qualitative.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, err = run_cli(monkeypatch, capfd, "report", "--aiperf", str(tmp_path / "plain"), str(tmp_path / "ngram"),
                             "--json")
    assert code == 0, err
    cats = {(r["system"], r["category"]): r["requests"] for r in json.loads(out)["rows"]}
    assert {k: v for k, v in cats.items() if k[1] != "overall"} == {("plain", "coding"): 1, ("plain", "python"): 1,
                                                                     ("ngram", "coding"): 1, ("ngram", "python"): 1}
    (tmp_path / "qualitative.jsonl").unlink()
    code, out, err = run_cli(monkeypatch, capfd, "report", "--aiperf", str(tmp_path / "plain"), str(tmp_path / "ngram"),
                             "--json")
    assert code == 0, err
    assert {r["category"] for r in json.loads(out)["rows"]} == {"all", "overall"}


def test_report_html_of_two_aiperf_folders(monkeypatch, capfd, tmp_path):
    page = tmp_path / "r.html"
    code, _, err = run_cli(monkeypatch, capfd, "report", "--aiperf", str(PAIR / "plain"), str(PAIR / "ngram"),
                           "--html", str(page))
    assert code == 0, err
    assert "could not be drawn" not in err and f"wrote {page}" in " ".join(err.split())
    assert "DSpark benchmark report: aiperf plain vs ngram" in page.read_text()


def test_a_qwen3_preset_without_its_tokenizer_says_how_to_fetch_it_once(tmp_path, monkeypatch, capfd):
    """A run of `random:qwen3-8b` at the 1k bucket on a machine with neither the hub's Qwen3 tokenizer nor a
    fetched copy (an empty cache of ours, an empty offline hub cache; the preset's layers shrunk: its
    vocabulary stays Qwen3's): one line says the prompts are shaped and which command gives the real tokenizer."""
    from dataclasses import replace

    import huggingface_hub.constants

    from dspark.synthetic import presets
    from harness.specs import shaped

    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(shaped, "_hinted", set())
    small = replace(presets.QWEN3_8B.backbone, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2,
                    num_kv_heads=1, head_dim=32)
    monkeypatch.setitem(presets.TARGETS, "qwen3-8b", replace(presets.QWEN3_8B, backbone=small))
    exp = tmp_path / "qwen3-shapes.toml"
    exp.write_text(QWEN3_RUN)  # (test_qwen3_tokenizer's run of the preset, plain decoding, 2 tokens)
    code, out, err = run_cli(monkeypatch, capfd, "run", "--experiment", str(exp), "--split", "throughput_1k",
                             "--num-prompts", "2", "--disable-shuffle", "--ignore-eos", "--device", "cpu",
                             "--out", str(tmp_path / "r"))
    assert code == 0, err
    said = [line for line in (out + err).splitlines() if "fetch-tokenizer" in line]
    assert len(said) == 1, out + err
    assert said[0].startswith("notice: random:qwen3-8b: no Qwen3 tokenizer here") and "shaped" in said[0]
    assert "`dspark-bench fetch-tokenizer qwen3` gives the real tokenizer" in said[0]
    assert json.loads((tmp_path / "r" / "manifest.json").read_text())["tokenizer"]["shaped"]["split"] == "throughput_1k"
    tokenizer = shaped.ShapedTokenizer("throughput_1k", 151936)
    assert shaped.fetch_hint("random:qwen3-8b", tokenizer) is None  # (once a process)
    assert shaped.fetch_hint("random:qwen3-4b", tokenizer) is not None
    assert shaped.fetch_hint("random:demo", tokenizer) is None  # (not a Qwen3 preset: nothing to fetch)
    assert shaped.fetch_hint("random:qwen3-0.6b", object()) is None  # (a real tokenizer: no hint)


def _copy(tmp_path: Path, *names: str) -> list[Path]:
    """The recorded pair's folders copied into tmp_path, to be varied there."""
    for name in names:
        shutil.copytree(PAIR / name, tmp_path / name)
    return [tmp_path / name for name in names]


def _edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_runs_with_random_session_ids_pair_by_what_they_sent(monkeypatch, capfd, tmp_path):
    """Without --random-seed AIPerf gives each session a random UUID, a new one each run: the same prompts
    under other ids still pair (by what was sent and the turn), under plain's ids."""
    (spec,) = _copy(tmp_path, "ngram")
    text = "\n".join((spec / name).read_text() for name in ("inputs.json", "profile_export.jsonl"))
    for old in {r["metadata"]["conversation_id"] for r in _records(PAIR / "ngram").values()}:
        assert old in text
        new = str(uuid.uuid4())  # (one id a session, in its payloads and its records alike)
        for name in ("inputs.json", "profile_export.jsonl"):
            (spec / name).write_text((spec / name).read_text().replace(old, new))
    code, out, err = run_cli(monkeypatch, capfd, "report", "--aiperf", str(PAIR / "plain"), str(spec), "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["aiperf"]["unpaired"] == []
    (ngram,) = [r for r in summary["rows"] if (r["system"], r["category"]) == ("ngram", "coding")]
    assert ngram["requests"] == ngram["speedup_pairs"] == 2


def test_the_level_and_rate_are_the_profiling_phases(monkeypatch, capfd, tmp_path):
    """AIPerf's warm-up phase comes first in its config: the level is its profiling phase's, and a rate phase
    keeps its rate (in the wave record and every title), its level the phase's cap, else its request count."""
    plain, spec = _copy(tmp_path, "plain", "ngram")
    for folder in (plain, spec):
        _edit_json(folder / "profile_export_aiperf.json",
                   lambda p: p["input_config"]["phases"][0].update(concurrency=1))  # (the warm-up at c=1)
    code, out, err = run_cli(monkeypatch, capfd, "report", "--aiperf", str(plain), str(spec), "--json")
    assert code == 0, err
    assert {r["max_concurrency"] for r in json.loads(out)["rows"]} == {2}

    def paced(p):
        phase = p["input_config"]["phases"][1]
        phase.update(type="poisson", rate=4.0)
        del phase["concurrency"]
    _edit_json(spec / "profile_export_aiperf.json", paced)
    code, out, err = run_cli(monkeypatch, capfd, "report", "--aiperf", str(plain), str(spec), "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert {r["max_concurrency"] for r in summary["rows"] if r["system"] == "ngram"} == {2}  # (no cap: both requests)
    assert "ngram at 4 req/s (poisson arrivals, no cap)" in summary["load_generator"]
    from harness.runs import aiperf_import
    aiperf_import.write_run(aiperf_import.read_folder(plain), aiperf_import.read_folder(spec), tmp_path / "run")
    waves = {w["system"]: w for w in map(json.loads, (tmp_path / "run" / "waves.jsonl").read_text().splitlines())}
    assert (waves["ngram"]["request_rate"], waves["ngram"]["arrival"], waves["ngram"]["burstiness"]) == (4.0, "poisson", 1.0)
    assert "request_rate" not in waves["plain"]


@pytest.mark.parametrize("order", ["swapped", "two plain", "two speculative"])
def test_folders_swapped_or_of_one_kind_are_refused(monkeypatch, capfd, tmp_path, order):
    plain, spec = _copy(tmp_path, "plain", "ngram")
    shutil.copytree(plain, tmp_path / "plain2")
    shutil.copytree(spec, tmp_path / "ngram2")
    args = {"swapped": (spec, plain), "two plain": (plain, tmp_path / "plain2"),
            "two speculative": (spec, tmp_path / "ngram2")}[order]
    code, _, err = run_cli(monkeypatch, capfd, "report", "--aiperf", *map(str, args))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "give plain decoding's folder first" in err
    assert ("shows speculative decoding" if order != "two plain" else "shows no speculative decoding") in err


@pytest.mark.parametrize("case, said", [
    ("no inputs.json", "no inputs.json (the payloads AIPerf sent"),
    ("empty records", "holds no request of AIPerf's profiling phase"),
    ("warm-up only", "holds no request of AIPerf's profiling phase (1 records in all)"),
    ("no metadata", "record 2 of profile_export.jsonl has no metadata"),
])
def test_a_folder_missing_what_pairs_it_says_what(monkeypatch, capfd, tmp_path, case, said):
    plain, spec = _copy(tmp_path, "plain", "ngram")
    records = (spec / "profile_export.jsonl").read_text().splitlines()
    if case == "no inputs.json":
        (spec / "inputs.json").unlink()
    elif case == "empty records":
        (spec / "profile_export.jsonl").write_text("")
    elif case == "warm-up only":
        (spec / "profile_export.jsonl").write_text(records[0] + "\n")
    else:
        bare = json.loads(records[1])
        del bare["metadata"]
        (spec / "profile_export.jsonl").write_text("\n".join([records[0], json.dumps(bare), *records[2:]]) + "\n")
    code, _, err = run_cli(monkeypatch, capfd, "report", "--aiperf", str(plain), str(spec))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert said in " ".join(err.split()) and "sent different prompts" not in err


def test_stop_reason_and_temperature_are_what_aiperf_recorded(monkeypatch, capfd, tmp_path):
    """No made-up labels: without AIPerf's raw export a request's stop reason is unknown (None), with it the
    server's finish_reason (the real raw export of tests/fixtures/aiperf: `length`; its last chunk changed to
    `stop`: EOS); a temperature AIPerf did not send is said in every title."""
    from harness.runs import aiperf_import

    plain, spec = _copy(tmp_path, "plain", "ngram")
    aiperf_import.write_run(aiperf_import.read_folder(plain), aiperf_import.read_folder(spec), tmp_path / "run")
    assert {json.loads(line)["stop_reason"] for line in (tmp_path / "run" / "requests.jsonl").read_text().splitlines()} \
        == {None}
    real = FIXTURES / "aiperf"
    record = json.loads((real / "profile_export.jsonl").read_text().splitlines()[0])
    raw = json.loads((real / "profile_export_raw.jsonl").read_text().splitlines()[0])
    assert raw["metadata"]["x_request_id"] == record["metadata"]["x_request_id"]
    assert aiperf_import.stop_reason(record, raw) == "max_new_tokens"
    eos = json.loads(json.dumps(raw).replace('\\"finish_reason\\":\\"length\\"', '\\"finish_reason\\":\\"stop\\"'))
    assert eos != raw and aiperf_import.stop_reason(record, eos) == "stop_token"
    assert aiperf_import.stop_reason(record, None) is None

    for folder in (plain, spec):
        _edit_json(folder / "profile_export_aiperf.json",
                   lambda p: p["input_config"]["endpoint"]["extra"].pop("temperature"))
    code, out, err = run_cli(monkeypatch, capfd, "report", "--aiperf", str(plain), str(spec))
    assert code == 0, err
    assert "ngram: no temperature sent (the server's default, unknown; T=1 shown)" in " ".join(out.split())


def test_the_html_headline_and_json_name_what_is_known(monkeypatch, capfd, tmp_path):
    page = tmp_path / "r.html"
    code, _, err = run_cli(monkeypatch, capfd, "report", "--aiperf", str(PAIR / "plain"), str(PAIR / "ngram"),
                           "--html", str(page))
    assert code == 0, err
    first = min(r["metadata"]["request_start_ns"] for r in _records(PAIR / "plain").values())
    day = datetime.fromtimestamp(first / 1e9, UTC).date().isoformat()
    text = page.read_text()
    assert "systems plain, ngram;" in text and f"; {day}" in text and "systems ?" not in text
    assert "; no git revision recorded;" in text and "git ?" not in text  # (AIPerf's folders name no revision of ours)
    code, out, err = run_cli(monkeypatch, capfd, "report", "--aiperf", str(PAIR / "plain"), str(PAIR / "ngram"), "--json")
    assert code == 0, err
    assert json.loads(out)["run_dir"] == [str((PAIR / "plain").resolve()), str((PAIR / "ngram").resolve())]
    code, _, err = run_cli(monkeypatch, capfd, "report", "--aiperf", str(PAIR / "plain"), str(PAIR / "plain"))
    assert code == 2 and "give each AIPerf folder once" in err


def test_a_request_past_the_limit_fails_as_ours_says(tmp_path):
    """`run --load-generator aiperf --request-timeout S` gives AIPerf the limit, and a request AIPerf gave up
    on (its real error for aiohttp's limit: `ErrorDetails.from_exception(asyncio.TimeoutError())`), or one it
    saw end past the limit, fails as our client says it; within the limit, AIPerf's own error stays."""
    from harness.backends.base import Schedule

    args = aiperf.command("aiperf", "URL", "M", "T", tmp_path / "inputs.json", 2, Schedule(1), tmp_path, 2.5)
    assert args[args.index("--request-timeout-seconds") + 1] == "2.5"
    assert "--request-timeout-seconds" not in aiperf.command("aiperf", "URL", "M", "T", tmp_path, 2, Schedule(1),
                                                             tmp_path)
    assert "REQUEST_TIMEOUT_S" in aiperf.template()
    record = json.loads((FIXTURES / "aiperf" / "profile_export.jsonl").read_text().splitlines()[0])
    took = (record["metadata"]["request_end_ns"] - record["metadata"]["request_start_ns"]) / 1e9
    late = dict(record, error={"type": "TimeoutError", "message": "TimeoutError()", "cause_chain": ["TimeoutError"]})
    assert aiperf.streamed(late, None, 2.0).error == "timed out after 2 s"
    assert aiperf.streamed(record, None, took / 2).error == f"timed out after {took / 2:g} s"  # (ended past it)
    assert aiperf.streamed(record, None, took * 2).error is None
    refused = dict(record, error={"type": "Not Found", "code": 404, "message": "no model"})
    assert aiperf.streamed(refused, None, took * 2).error == "AIPerf: Not Found 404 no model"


@needs_aiperf
def test_a_wave_aiperf_gave_up_on_whole_is_recorded_failed(tmp_path, monkeypatch):
    """Real AIPerf against a server slower than the run's limit (its first chunk after 3 s, the limit 1 s): AIPerf
    gives up on the request (`TimeoutError`) and exits 1, as it does whenever no request succeeded; the wave is
    still a wave of failed requests, recorded `timed out after 1 s` as under our client, not a failed run."""
    import asyncio
    import socket
    import threading

    from aiohttp import web

    from dspark.checkpoint import DEMO_DIR
    from harness.backends.base import RequestSpec, Schedule

    async def models(_):
        return web.json_response({"object": "list", "data": [{"id": "M", "object": "model"}]})

    async def slow(request):
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(3)
        await response.write(b'data: {"choices": [{"index": 0, "text": "x", "finish_reason": "length"}]}\n\n')
        return response

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", slow)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("AIPERF_DATASET_MMAP_CACHE_DIR", str(tmp_path / "cache"))
    try:
        spec = RequestSpec(max_new_tokens=1, temperature=0.0, seed=1, stop_token_ids=())
        results, artifacts = aiperf.run(AIPERF, f"http://127.0.0.1:{port}", "M", str(DEMO_DIR / "target"), [[5, 6, 7]],
                                        [spec], Schedule(1), tmp_path, "plain-c1", 1.0)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(60)
    (record,) = aiperf.read_lines(artifacts / aiperf.RECORDS)
    assert record["error"]["type"] == "TimeoutError"  # (AIPerf's own record of it)
    assert list(results) == [0] and results[0].error == "timed out after 1 s"

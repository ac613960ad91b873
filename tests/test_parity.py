"""`dspark-bench parity` on two hand-written run folders whose every figure is known: inputs and
outputs compared, rounds and per-position acceptance side by side, and each kind of divergence
(accounting, numerics, semantics) named at its round. The same report on real vLLM runs is in
`tests/test_vllm.py`."""

from __future__ import annotations

import json

import pytest
from cli_runner import run_cli

from dspark.checkpoint import DEMO_DIR
from dspark.errors import DSparkError
from harness.analysis.parity import divergences, parity

OUT = list(range(100, 120))  # a greedy output both engines produced


def record(system, qid, accepted, proposed=None, margins=None, output=OUT, stop="max_new_tokens", sha="p1"):
    proposed = proposed or [7] * len(accepted)
    return {"system": system, "method": "ngram" if system == "ngram" else system, "question_id": qid, "turn": 0,
            "temperature": 0.0, "prompt_sha256": sha, "output_ids": output, "accepted_counts": accepted,
            "proposal_lengths": proposed, "acceptance_lengths": [a + 1 for a in accepted],
            "num_rounds": len(accepted), "draft_margins": margins, "stop_reason": stop, "category": "coding"}


def write_run(path, backend, records):
    path.mkdir()
    (path / "manifest.json").write_text(json.dumps({"settings": {"backend": backend, "device": "cpu",
                                                                 "dtype": "auto"}, "backend": {}}))
    (path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def runs(tmp_path):
    ours = [record("plain", "q1", []), record("plain", "q2", []),
            record("dspark", "q1", [2, 3, 1]),
            record("dspark", "q2", [2, 3, 1], margins=[[5, 5, 1], [4.0, 0.0004, 3, 2], [3, 1]]),  # slot 1 a near tie
            record("dspark", "q3", [2, 3, 1], margins=[[5, 5, 1], [4.0, 6.5, 3, 2], [3, 1]]),
            record("dspark", "q4", [2, 3], stop="stop_token"),
            record("ngram", "q1", [0, 3, 0, 1], proposed=[0, 3, 0, 2]),
            record("ngram", "q2", [0, 3, 0, 1], proposed=[0, 3, 0, 2])]
    theirs = [record("plain", "q1", []), record("plain", "q2", [], output=OUT[:7] + [0] + OUT[8:]),
              record("dspark", "q1", [2, 3, 1]),
              record("dspark", "q2", [2, 1, 1, 1]), record("dspark", "q3", [2, 1, 1, 1]),
              record("dspark", "q4", [2, 4], stop="stop_token"),
              record("ngram", "q1", [3, 1], proposed=[3, 2]),
              record("ngram", "q2", [3, 4], proposed=[3, 7])]
    return write_run(tmp_path / "native", "native", ours), write_run(tmp_path / "vllm", "vllm", theirs)


def test_parity_names_every_kind_of_divergence_at_its_round(tmp_path):
    a, b = runs(tmp_path)
    result = parity(a, b)
    groups = {g["system"]: g for g in result["groups"]}
    plain = groups["plain"]
    assert (plain["prompts"], plain["prompt_ids_equal"], plain["outputs_equal"]) == (2, 2, 1)
    assert [p["first_difference"] for p in plain["per_prompt"]] == [None, 7]
    (differ,) = plain["divergences"]  # an output that differs is the targets' divergence, not the drafts'
    assert (differ["question_id"], differ["kind"], differ["token"]) == ("q2", "unclassified", 7)

    dspark = groups["dspark"]
    assert [p["rounds"] for p in dspark["per_prompt"]] == [[3, 3], [3, 4], [3, 4], [2, 2]]
    assert [p["accepted"] for p in dspark["per_prompt"]] == [[6, 6], [6, 5], [6, 5], [5, 6]]
    by_prompt = {d["question_id"]: d for d in dspark["divergences"]}
    assert set(by_prompt) == {"q2", "q3", "q4"}  # q1 agrees round for round
    # round 1 starts at token 1 + (2 + 1) = 4; ours accepted 3 there, theirs 1: slot 1 is where they differ
    assert {k: by_prompt["q2"][k] for k in ("kind", "round", "token", "slot", "margin")} == \
        {"kind": "numerics", "round": 1, "token": 4, "slot": 1, "margin": 0.0004}
    assert (by_prompt["q3"]["kind"], by_prompt["q3"]["margin"]) == ("semantics", 6.5)
    assert "DeepSeek's reference" in by_prompt["q3"]["detail"]
    assert (by_prompt["q4"]["kind"], by_prompt["q4"]["round"]) == ("accounting", 1)  # the stop-token round
    assert dspark["kinds"] == {"accounting": 1, "numerics": 1, "semantics": 1, "unclassified": 0}
    # without our margins (a native run without --record-margins) the kind is not guessed
    (found,) = divergences(record("dspark", "q5", [2, 3, 1]), record("dspark", "q5", [2, 1, 1, 1]), "dspark", 1e-3)
    assert found["kind"] == "unclassified" and "--record-margins" in found["detail"]
    # where vLLM gave only its totals (0.26) there are no rounds to align: steps, accepted drafts and
    # accepted drafts per position are compared, and ours [2, 3] counts as 2 steps, 5 accepted, [2, 2, 1, 0, ...]
    totals = record("dspark", "q6", []) | {"acceptance_source": "vllm totals", "acceptance_totals": {
        "num_spec_steps": 2, "num_draft_tokens": 14, "num_accepted_draft_tokens": 5,
        "accepted_per_pos": [2, 2, 1, 0, 0, 0, 0]}}
    assert divergences(record("dspark", "q6", [2, 3]), totals, "dspark", 1e-3) == []
    (found,) = divergences(record("dspark", "q6", [2, 2]), totals, "dspark", 1e-3)
    assert found["kind"] == "unclassified" and "only totals" in found["detail"] and "no margins" in found["detail"]
    # with our margins, the first position that differs (slot 2: ours accepted it in 0 rounds, theirs in 1)
    # points at the round of ours that rejected slot 2 with the smallest margin there: round 1 (0.0002)
    near = record("dspark", "q6", [2, 2, 0], margins=[[5, 5, 3], [4, 4, 0.0002], [0.5]])
    totals["acceptance_totals"] = {"num_spec_steps": 3, "num_draft_tokens": 21, "num_accepted_draft_tokens": 5,
                                   "accepted_per_pos": [2, 2, 1, 0, 0, 0, 0]}
    (found,) = divergences(near, totals, "dspark", 1e-3)
    assert {k: found[k] for k in ("kind", "round", "token", "slot", "margin")} == \
        {"kind": "numerics", "round": 1, "token": 4, "slot": 2, "margin": 0.0002}
    near["draft_margins"][1][2] = 0.5  # far above float error: not told from semantics without their rounds
    (found,) = divergences(near, totals, "dspark", 1e-3)
    assert (found["kind"], found["round"]) == ("unclassified", 1) and "cannot be told" in found["detail"]
    # pooled by hand: ours 4 prompts x rounds [2,3,1],[2,3,1],[2,3,1],[2,3] -> 11 rounds, 23 accepted
    ours, theirs = dspark["pooled"]
    assert (ours["rounds"], ours["accepted"]) == (11, 23) and abs(ours["acceptance_length"] - (1 + 23 / 11)) < 1e-12
    assert ours["accepted_per_position"] == [11, 8, 4, 0, 0, 0, 0]  # rounds accepting >= 1, >= 2, >= 3 drafts
    assert (theirs["rounds"], theirs["accepted"]) == (13, 22)
    assert theirs["accepted_per_position"] == [13, 6, 2, 1, 0, 0, 0]

    ngram = groups["ngram"]
    kinds = [(d["question_id"], d["kind"]) for d in ngram["divergences"]]
    # both prompts: 2 empty steps are rounds for ours and not for vLLM; q2's second drafting step also differs
    assert kinds == [("q1", "accounting"), ("q2", "accounting"), ("q2", "semantics")]
    q2 = ngram["divergences"][-1]
    assert (q2["round"], q2["token"]) == (3, 7) and "lookup rules" in q2["detail"]  # ours: round 3, at 1+1+4+1


def test_parity_command_prints_the_report_and_refuses_a_folder_that_is_not_a_run(tmp_path, monkeypatch, capfd):
    a, b = runs(tmp_path)
    code, out, _ = run_cli(monkeypatch, capfd, "parity", a, b)
    assert code == 0
    assert "numerics: q2 turn 0 at round 1 (token 4)" in out and "accounting: q4 turn 0 at round 1" in out
    assert "1/2 greedy outputs equal" in out and "differs at 7" in out
    code, out, _ = run_cli(monkeypatch, capfd, "parity", a, b, "--json")
    assert code == 0 and [g["kinds"]["numerics"] for g in json.loads(out)["groups"]] == [0, 1, 0]
    code, _, err = run_cli(monkeypatch, capfd, "parity", a, tmp_path)
    assert code == 2 and err.strip() == f"error: {tmp_path}: no manifest.json; not a run folder (give the folders " \
        "two `run`s wrote)"


def test_sampled_outputs_with_the_same_seeds_are_compared_per_temperature(tmp_path, monkeypatch, capfd):
    def sampled(system, qid, seed, output=OUT):
        return record(system, qid, [2, 3, 1]) | {"temperature": 1.0, "seed": seed, "output_ids": output}

    a = [sampled("plain", "q1", 11), sampled("dspark", "q1", 11), sampled("dspark", "q2", 12),
         sampled("dspark", "q3", 13), record("dspark", "q1", [2, 3, 1])]
    b = [sampled("plain", "q1", 11), sampled("dspark", "q1", 11), sampled("dspark", "q2", 12, OUT[:5] + [0] + OUT[6:]),
         sampled("dspark", "q3", 99), record("dspark", "q1", [2, 3, 1])]
    run_a, run_b = write_run(tmp_path / "a", "native", a), write_run(tmp_path / "b", "native", b)
    result = parity(run_a, run_b)
    (t1,) = result["sampled"]  # only T > 0 is sampled
    assert t1 == {"temperature": 1.0, "requests": 4, "compared": 3, "outputs_equal": 2, "seeds_differ": 1,
                  "first_divergence": {"system": "dspark", "question_id": "q2", "turn": 0, "token": 5}}
    groups = {(g["system"], g["temperature"]): g for g in result["groups"]}
    g = groups[("dspark", 1.0)]
    assert (g["seeds_equal"], g["sampled_outputs_equal"], g["outputs_equal"]) == (2, 1, None)
    assert [p["outputs_equal"] for p in g["per_prompt"]] == [True, False, None]  # q3: other seeds, not compared
    (differ,) = g["divergences"]
    assert (differ["question_id"], differ["token"]) == ("q2", 5) and "same seed" in differ["detail"]
    assert groups[("dspark", 0.0)]["seeds_equal"] is None  # greedy: no seed to compare
    code, out, _ = run_cli(monkeypatch, capfd, "parity", run_a, run_b)
    assert code == 0 and "1/2 sampled outputs equal" in " ".join(out.split())
    assert "T=1: 2 of 3 sampled requests with equal prompts and seeds have equal outputs (1 of 4 not compared: " \
        "their seeds differ" in out and "the first that differs: dspark q2 turn 0 from token 5" in out


def test_outputs_kept_only_as_text_are_compared_by_text(tmp_path):
    """A server that returns text and no token ids: equal texts are equal outputs, different ones differ
    with no token index to name."""
    def texts(path, second):
        recs = [record("plain", "q1", []) | {"output_ids": None, "output_text": "def f(x):"},
                record("plain", "q2", []) | {"output_ids": None, "output_text": second}]
        return write_run(path, "openai", recs)

    report = parity(write_run(tmp_path / "native", "native", [record("plain", "q1", []) | {"output_text": "def f(x):"},
                                                              record("plain", "q2", []) | {"output_text": "x"}]),
                    texts(tmp_path / "served", "y"))
    (group,) = report["groups"]
    equal = {p["question_id"]: (p["outputs_equal"], p["first_difference"]) for p in group["per_prompt"]}
    assert equal == {"q1": (True, None), "q2": (False, None)} and group["outputs_equal"] == 1
    (found,) = group["divergences"]
    assert found["question_id"] == "q2" and found["token"] is None and "in their text" in found["detail"]


@pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(), reason="the demo models are not built")
def test_runs_that_asked_for_different_requests_are_refused_and_others_compared_over_what_they_share(
        tmp_path, monkeypatch, capfd):
    """Two real demo runs, 16 and 8 tokens: refused in one line naming the setting and its fix, not
    "the targets disagree" at token 8; a run of more prompts is compared over the prompt both ran,
    the difference named in the header."""
    common = ["run", "--category", "coding", "--temperature", "0", "--device", "cpu"]
    for name, extra in (("a", ["--systems", "plain", "--num-prompts", "1", "--output-len", "16"]),
                        ("b", ["--systems", "plain", "--num-prompts", "1", "--output-len", "8"]),
                        ("c", ["--systems", "plain,dspark", "--num-prompts", "2", "--output-len", "16"])):
        code, _, err = run_cli(monkeypatch, capfd, *common, *extra, "--out", tmp_path / name)
        assert code == 0, err[-2000:]
    a, b, c = (tmp_path / n for n in "abc")
    code, out, err = run_cli(monkeypatch, capfd, "parity", a, b)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert f"{a} and {b} asked for different requests (output_len 16 vs 8)" in err and \
        "rerun one with the other's --output-len" in err and "targets disagree" not in err
    with pytest.raises(DSparkError, match="output_len 16 vs 8"):
        parity(a, b)
    code, out, err = run_cli(monkeypatch, capfd, "parity", a, c)
    assert code == 0, err
    assert "settings differ (A vs B): systems [plain] vs [plain, dspark]; num_prompts 1 vs 2: the requests " \
           "both ran are compared" in " ".join(out.split())  # (the lists printed as they are, not read as markup)
    assert "1/1 prompts with equal prompt ids, 1/1 greedy outputs equal" in " ".join(out.split())
    assert parity(a, c)["settings_differ"] == [["systems", "[plain]", "[plain, dspark]"], ["num_prompts", "1", "2"]]


def test_a_system_defined_differently_in_the_two_runs_is_refused(tmp_path):
    """The same system name with another draft (or method, or drafts per round) is another system."""
    a, b = runs(tmp_path)
    for path, draft in ((a, "demo-dspark"), (b, "other-dspark")):
        manifest = json.loads((path / "manifest.json").read_text())
        manifest["experiment"] = {"systems": [{"name": "dspark", "method": "dspark", "draft": draft,
                                               "num_speculative_tokens": 7, "confidence": "off"}]}
        (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DSparkError, match="system 'dspark' ran with draft demo-dspark in .* and other-dspark in"):
        parity(a, b)


def test_a_runs_dtype_is_named_as_torch_names_it_whatever_alias_was_typed():
    """bf16 and bfloat16 are one dtype: parity must neither call them different nor give float32's
    tolerance a miss (its table is keyed by torch's names); auto as the engine resolves it."""
    from harness.analysis.parity import FLOAT_ERROR, _dtype

    run = {"engines": None}
    assert _dtype(run | {"dtype": "bf16", "device": "cuda"}) == _dtype(run | {"dtype": "bfloat16", "device": "cpu"})
    assert _dtype(run | {"dtype": "fp32", "device": "cuda"}) == "float32" in FLOAT_ERROR
    assert _dtype(run | {"dtype": "auto", "device": "cpu"}) == "float32"
    assert _dtype(run | {"dtype": None, "device": "cuda:1"}) == "bfloat16"

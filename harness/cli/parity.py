"""`dspark-bench parity RUN_A RUN_B`: two runs of the same prompts and systems (on different backends, or
on one: a rerun, a resumed run), compared input for input, token for token and round for round, each
divergence named by its kind; at T > 0 the sampled outputs of requests with equal seeds compared too."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from dspark.errors import DSparkError
from harness.cli.render import grid, out, show


def parity(
    run_a: Path = typer.Argument(..., help="A run folder (e.g. the native backend's)."),
    run_b: Path = typer.Argument(..., help="A run folder of the same prompts and systems (e.g. vLLM's)."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
):
    """Compare two runs of the same prompts: inputs, greedy outputs, sampled outputs of equal seeds, rounds,
    acceptance. Runs that asked for different requests (target, dataset, output length) are refused; other
    settings may differ (the header names them): the requests both ran are compared."""
    from harness.analysis.parity import parity as compare
    from harness.analysis.parity import settings_note

    _check_two_runs(run_a, run_b)
    result = compare(run_a, run_b)
    if not result["groups"]:
        raise DSparkError(f"{run_a} and {run_b} share no prompt of any system and temperature; run the same "
                          "prompts and systems on both")
    if as_json:
        print(json.dumps(result))
        return
    a, b = result["runs"]
    names = [f"{label}: {r['backend']}" + (f" {r['version']}" if r["version"] else "") for label, r in
             zip("AB", (a, b))]
    out.print(f"A = {a['path']} ({a['backend']}, {a['device']}); B = {b['path']} ({b['backend']}, {b['device']}); "
              f"float error taken as a top-2 logit margin below {result['float_error']:g}", highlight=False, markup=False,
              soft_wrap=True)
    out.print(settings_note(result), highlight=False, markup=False, soft_wrap=True)
    for g in result["groups"]:
        level = "" if g["max_concurrency"] == 1 else f", concurrency {g['max_concurrency']}"
        title = f"{g['system']} ({g['method']}) at T={g['temperature']:g}{level}: {g['prompt_ids_equal']}/{g['prompts']} " \
                "prompts with equal prompt ids" + (
                    f", {g['seeds_equal']}/{g['prompts']} with equal seeds too, {g['sampled_outputs_equal']}/"
                    f"{g['seeds_equal']} sampled outputs equal" if g["outputs_equal"] is None else
                    f", {g['outputs_equal']}/{g['prompts']} greedy outputs equal")
        sampled = g["temperature"] > 0
        cols = ("prompt", "turn", "prompt ids") + (("seed",) if sampled else ()) + (
            "output", "rounds A", "rounds B", "accepted A", "accepted B")
        rows = [cols]
        for p in g["per_prompt"]:
            output = "-" if p["outputs_equal"] is None else "equal" if p["outputs_equal"] else \
                f"differs at {p['first_difference']}"
            seed = ("equal" if p["seeds_equal"] else "DIFFER",) if sampled else ()
            rows.append((p["question_id"][:12], str(p["turn"]), "equal" if p["prompt_ids_equal"] else "DIFFER", *seed,
                         output, *(str(v) for v in (*p["rounds"], *p["accepted"]))))
        show(out, grid(title, rows, cols))
        if g["method"] != "plain":
            pa, pb = g["pooled"]
            cols = ("run", *(str(k + 1) for k in range(max(len(pa["accepted_per_position"]),
                                                            len(pb["accepted_per_position"])))), "rounds", "acceptance length")
            rows = [cols, *((name, *(str(c) for c in p["accepted_per_position"]), str(p["rounds"]),
                             "-" if p["acceptance_length"] is None else f"{p['acceptance_length']:.3f}")
                            for name, p in zip(names, (pa, pb)))]
            show(out, grid(f"{g['system']}: accepted drafts per position (rounds that accepted position k)", rows, cols))
        for d in g["divergences"]:
            at = "" if d["round"] is None else f" at round {d['round']} (token {d['token']})"
            out.print(f"  {d['kind']}: {d['question_id'][:12]} turn {d['turn']}{at}: {d['detail']}",
                      highlight=False, markup=False, soft_wrap=True)
    for s in result["sampled"]:
        out.print(sampled_line(s, result["same_engine"]), highlight=False, markup=False, soft_wrap=True)
    for i, missing in enumerate(result["only_in"]):
        for system, temp, conc in missing:
            level = "" if conc == 1 else f", concurrency {conc}"
            out.print(f"only in {'AB'[i]} (or no prompt in common): {system} at T={temp:g}{level}", style="dim",
                      highlight=False, markup=False)


def _records_bytes(run: Path) -> bytes | None:
    """The run's requests.jsonl as written, or None where it has none."""
    path = run / "requests.jsonl"
    return path.read_bytes() if path.is_file() else None


def _check_two_runs(run_a: Path, run_b: Path) -> None:
    """Refuse a run compared with itself: the same folder (by any path to it), or a copy of it (a manifest
    recording the same start on the same host, and the same records: two runs started within one second
    of each other share the start, never their measured times). Its requests are the same records, so
    every figure would read "equal", which says nothing about parity."""
    from harness.analysis.records import read_manifest

    if run_a.resolve() == run_b.resolve() or (run_a.exists() and run_b.exists() and run_a.samefile(run_b)):
        raise DSparkError(f"{run_a} and {run_b} are the same run folder: a run compared with itself is equal by "
                          "construction; give two runs of the same prompts (e.g. one per backend)")
    manifests = [read_manifest(run) for run in (run_a, run_b)]
    started = [((m or {}).get("provenance") or {}).get("time_utc") for m in manifests]
    hosts = [((m or {}).get("provenance") or {}).get("host") for m in manifests]
    if None not in (*started, *hosts) and started == started[::-1] and hosts == hosts[::-1] and \
            _records_bytes(run_a) == _records_bytes(run_b):
        raise DSparkError(f"{run_a} and {run_b} are copies of one run (both started {started[0]} on {hosts[0]}): its "
                          "records compared with themselves are equal by construction; give two separate runs")


def sampled_line(s: dict, same_engine: bool) -> str:
    """One temperature's sampled parity: `T=1: 64 of 64 sampled requests with equal prompts and seeds have
    equal outputs`, and where the first that does not departs."""
    line = f"T={s['temperature']:g}: {s['outputs_equal']} of {s['compared']} sampled requests with equal prompts " \
           "and seeds have equal outputs"
    if s["seeds_differ"]:
        line += f" ({s['seeds_differ']} of {s['requests']} not compared: their seeds differ; the runs' --seed differ?)"
    d = s["first_divergence"]
    if d is not None:
        at = f"from token {d['token']}" if d["token"] is not None else "in its text (no token ids kept)"
        line += f"; the first that differs: {d['system']} {d['question_id'][:12]} turn {d['turn']} {at}" + (
            "" if same_engine else " (different engines sample differently: expected)")
    return line

"""`dspark-bench run`: SPEED-Bench prompts through every system of an experiment, each request
recorded as it finishes, then the summaries.

Order: systems (plain decoding first, so greedy outputs can be checked against it as they come),
then temperatures, prompts and turns. Each system gets its caches, graph captures and one short
request before any timing. At temperature > 0 a request's seed derives from the run seed, the
question, the turn and the temperature, so every system draws the same target-side randomness and
a resumed request is the same draw. The runner speaks to its backend only through
`harness.backends.base.Backend`.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict
from pathlib import Path

from rich.console import Console

from dspark.checkpoint import resolve_path
from dspark.errors import DSparkError
from dspark.tokenizer import chat_prompt_ids, conversation
from harness.analysis.metrics import first_difference
from harness.analysis.plots import plot
from harness.analysis.summary import expected_requests, markdown, summarize_folder, to_csv
from harness.backends.base import Backend, RequestResult, RequestSpec
from harness.backends.fingerprints import model_record, tokenizer_record
from harness.profiling.capture import capture_window
from harness.runs import threads
from harness.analysis.records import MANIFEST, REQUESTS, read_requests, request_key
from harness.runs.folder import RunFolder
from harness.runs.plan import BACKENDS, RunOptions, default_out, recorded_options, request_seed, resolve_settings
from harness.runs.progress import RunProgress
from harness.runs.provenance import provenance
from harness.specs import datasets
from harness.specs.experiments import load_experiment


def run(opts: RunOptions, console: Console) -> tuple[Path, dict]:
    """Every pending request of the run, each recorded as it finishes; then the summaries. `console`
    gets the progress and notices (the caller prints the tables)."""
    from transformers import AutoTokenizer

    exp = load_experiment(opts.experiment)
    settings = resolve_settings(opts, exp)
    folder = RunFolder(Path(opts.resume) if opts.resume else Path(opts.out) if opts.out else default_out(settings))
    if opts.resume:
        folder.check_resume(settings)
    data = datasets.load(opts.split, Path(opts.dataset_path) if opts.dataset_path else None, exp.dataset,
                         settings["dataset_revision"])
    rows = datasets.select(data.rows, opts.split, settings["categories"], settings["num_prompts"], settings["seed"],
                           settings["shuffle"])
    if settings["num_prompts"] is not None and len(rows) < settings["num_prompts"]:
        console.print(f"notice: {settings['num_prompts']} prompts asked for, but {opts.split} "
                      f"{', '.join(settings['categories'] or ['(all categories)'])} has {len(rows)}: running "
                      f"{len(rows)}", style="yellow", highlight=False, soft_wrap=True)
    backend: Backend = BACKENDS[settings["backend"]](exp.target, opts.device, opts.dtype)
    n_threads, threads_by = threads.choose(opts.threads, opts.device, backend.tokenizer_path)
    threads.apply(n_threads)
    tokenizer = AutoTokenizer.from_pretrained(backend.tokenizer_path)
    if not getattr(tokenizer, "chat_template", None):
        raise DSparkError(f"{exp.target}: the tokenizer has no chat template; SPEED-Bench prompts need one")
    stop = () if settings["ignore_eos"] else backend.stop_token_ids
    turns_of = {r.question_id: (list(r.turns) if settings["turns"] == "all" else [r.turns[0]]) for r in rows}
    jobs = [(name, temp, row, turn) for name in settings["systems"] for temp in settings["temperatures"]
            for row in rows for turn in range(len(turns_of[row.question_id]))]

    prepared = {name: backend.prepare(exp.system(name)) for name in settings["systems"]}
    models = backend.models()
    for p in prepared.values():
        if p.system.draft:
            models[p.system.name] = model_record(resolve_path(p.system.draft))
    inputs = {"dataset": data.origin | {"selected": [r.question_id for r in rows]}, "models": models,
              "tokenizer": tokenizer_record(backend.tokenizer_path, tokenizer)}
    if opts.resume:
        folder.check_inputs(inputs)
        if folder.manifest().get("threads", {}).get("count", n_threads) != n_threads:
            raise DSparkError(f"--resume {folder.path}: the run used {folder.manifest()['threads']['count']} "
                              f"thread(s), this one would use {n_threads}; pass --threads "
                              f"{folder.manifest()['threads']['count']} (or unset OMP_NUM_THREADS)")
    else:
        folder.create({"settings": settings, "options": recorded_options(opts),
                       "experiment": {"path": exp.path, "sha256": exp.sha256,
                                      "systems": [asdict(s) for s in exp.systems]},
                       **inputs, "methods": {n: p.method for n, p in prepared.items()},
                       "threads": {"count": n_threads, "chosen_by": threads_by},
                       "prompts_selected": len(rows), "requests_expected": expected_requests(
                           [(name, temp, row.category) for name, temp, row, _ in jobs]),
                       "profiled": opts.profiled or False, "provenance": provenance(opts.device)})
    records = read_requests(folder.path, repair=True)
    done = {request_key(r) for r in records}
    replies = {(r["system"], r["question_id"], r["temperature"], r["turn"]): r["output_text"] for r in records}
    base_name = next((n for n in settings["systems"] if prepared[n].method == "plain"), None)  # sorted first
    baseline = {(r["question_id"], r["turn"], r["temperature"]): r for r in records if r["system"] == base_name}
    pending = [j for j in jobs if (j[0], j[2].question_id, j[3], j[1]) not in done]
    if opts.resume:
        console.print(f"resuming {folder.path}: {len(jobs) - len(pending)} of {len(jobs)} requests already done",
                      highlight=False, soft_wrap=True)
    console.print(f"threads: {n_threads} ({threads_by})", highlight=False, soft_wrap=True)

    # the longest request: every user turn, and at most output_len tokens (plus template) per reply
    longest = min(max(len(chat_prompt_ids(tokenizer, conversation(turns_of[r.question_id])))
                      + len(turns_of[r.question_id]) * (settings["output_len"] + 16) for r in rows),
                  backend.max_context + 16)  # no request may exceed the target's limit
    warmed: set[tuple] = set()

    def warm(name: str, temp: float) -> None:
        if (name, temp) in warmed:
            return
        p = prepared[name]
        spec = RequestSpec(max_new_tokens=settings["output_len"], temperature=temp, stop_token_ids=stop,
                           confidence_threshold=p.system.confidence_threshold)
        backend.reset_peak_memory()
        backend.warmup(p, longest, spec, chat_prompt_ids(tokenizer, conversation(turns_of[rows[0].question_id][:1])))
        warmed.add((name, temp))

    if opts.profiled:  # everything untimed happens before the capture window opens
        for name, temp, _, _ in pending:
            warm(name, temp)
    try:
        with RunProgress(console, len(pending)) as progress, capture_window(opts.profiled, folder.path, opts.device):
            for name, temp, row, turn in pending:
                p = prepared[name]
                spec = RequestSpec(max_new_tokens=settings["output_len"], temperature=temp,
                                   seed=request_seed(settings["seed"], row.question_id, turn, temp),
                                   stop_token_ids=stop, confidence_threshold=p.system.confidence_threshold)
                if (name, temp) not in warmed:
                    progress.step(f"{name} T={temp:g}", "(warm-up)")
                    for other, q in prepared.items():  # one system's caches and graphs on the device at a time
                        if other != name and not opts.profiled:
                            backend.release(q)
                    warm(name, temp)
                progress.step(f"{name} T={temp:g}", row.category)
                previous = [replies[(name, row.question_id, temp, t)] for t in range(turn)]
                ids = chat_prompt_ids(tokenizer, conversation(turns_of[row.question_id][: turn + 1], previous))
                load_before = os.getloadavg()[0]
                result = backend.generate(p, ids, spec)
                record = _record(name, p.method, row, turn, temp, spec.seed, ids, result, tokenizer)
                record |= {"peak_memory_bytes": backend.peak_memory(), "load_avg": [load_before, os.getloadavg()[0]]}
                if temp == 0 and base_name is not None and name != base_name:
                    base = baseline.get((row.question_id, turn, temp))
                    if base is not None and base["prompt_sha256"] == record["prompt_sha256"]:
                        record["matches_baseline"] = first_difference(result.tokens, base["output_ids"])
                folder.append(record)
                replies[(name, row.question_id, temp, turn)] = record["output_text"]
                if name == base_name:
                    baseline[(row.question_id, turn, temp)] = record
                progress.advance()
    except KeyboardInterrupt:
        write_summaries(folder)  # of the finished requests, marked incomplete
        console.print(f"interrupted: {len(read_requests(folder.path))} finished requests and their summaries are in "
                      f"{folder.path}; continue with: dspark-bench run --resume {folder.path}", highlight=False,
                      soft_wrap=True)
        raise
    summary = write_summaries(folder)
    return folder.path, summary


def _record(system: str, method: str, row: datasets.Row, turn: int, temp: float, seed: int, ids: list[int],
            result, tokenizer, device: str) -> dict:
    n = len(result.tokens)
    ttft = result.prefill_s * 1e3
    e2el = (result.prefill_s + result.decode_s) * 1e3
    return {
        "system": system, "method": method, "question_id": row.question_id, "category": row.category,
        "turn": turn, "temperature": temp, "seed": seed, "prompt_tokens": len(ids),
        "prompt_sha256": hashlib.sha256(json.dumps(ids).encode()).hexdigest(), "output_tokens": n,
        "output_ids": result.tokens, "output_text": tokenizer.decode(result.tokens, skip_special_tokens=True),
        "stop_reason": result.stop_reason, "acceptance_lengths": result.acceptance_lengths,
        "proposal_lengths": result.proposal_lengths,
        "accepted_counts": result.accepted_counts, "num_rounds": result.num_rounds, "ttft_ms": ttft,
        "tpot_ms": (e2el - ttft) / (n - 1) if n > 1 else None, "e2el_ms": e2el, "round_ms": result.round_ms,
        "matches_baseline": None, "peak_memory_bytes": peak_memory(device), "time_utc": time.time(),
    }


def _record(system: str, method: str, row: datasets.Row, turn: int, temp: float, seed: int, ids: list[int],
            result: RequestResult, tokenizer) -> dict:
    n = len(result.tokens)
    ttft = result.prefill_s * 1e3
    e2el = (result.prefill_s + result.decode_s) * 1e3
    return {
        "system": system, "method": method, "question_id": row.question_id, "category": row.category,
        "turn": turn, "temperature": temp, "seed": seed, "prompt_tokens": len(ids),
        "prompt_sha256": hashlib.sha256(json.dumps(ids).encode()).hexdigest(), "output_tokens": n,
        "output_ids": result.tokens, "output_text": tokenizer.decode(result.tokens, skip_special_tokens=True),
        "stop_reason": result.stop_reason, "acceptance_lengths": result.acceptance_lengths,
        "proposal_lengths": result.proposal_lengths,
        "accepted_counts": result.accepted_counts, "num_rounds": result.num_rounds, "ttft_ms": ttft,
        "tpot_ms": (e2el - ttft) / (n - 1) if n > 1 else None, "e2el_ms": e2el, "round_ms": result.round_ms,
        "matches_baseline": None, "time_utc": time.time(),
    }


def write_summaries(folder: RunFolder) -> dict:
    """summary.json, .csv, .md and .png from the requests; the summary carries what it was written to."""
    manifest = folder.manifest() or {}
    summary = summarize_folder(folder.path)
    folder.write_json("summary.json", {"settings": manifest.get("settings"), **summary})
    folder.write_text("summary.csv", to_csv(summary))
    folder.write_text("summary.md", markdown(summary, f"run {folder.path.name}"))
    written = [MANIFEST, REQUESTS, "summary.json", "summary.csv", "summary.md"]
    if summary["rows"]:
        plot(summary, folder.path / "summary.png", f"run {folder.path.name}")
        written.append("summary.png")
    return summary | {"files": [str(folder.path / name) for name in written]}

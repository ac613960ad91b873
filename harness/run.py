"""`dspark-bench run`: SPEED-Bench prompts through every system of an experiment, each request
recorded as it finishes, then the summaries and the comparison table.

Order: systems (plain decoding first, so greedy outputs can be checked against it as they come),
then temperatures, prompts and turns. Each system gets its caches, graph captures and one short
request before any timing. At temperature > 0 a request's seed derives from the run seed, the
question, the turn and the temperature, so every system draws the same target-side randomness and
a resumed request is the same draw.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.table import Table

from dspark.checkpoint import read_config, resolve_path
from dspark.config import TargetConfig
from dspark.engine import GenerationConfig
from dspark.errors import DSparkError
from harness import datasets, threads
from harness.backends import NativeBackend, model_record, peak_memory, reset_peak_memory, resolve_system, tokenizer_record
from harness.experiments import Experiment, load_experiment
from harness.metrics import first_difference
from harness.profile import capture_window
from harness.console import RunProgress, show
from harness.provenance import provenance
from harness.report import expected_requests, markdown, plot, summarize_folder, table, to_csv, warnings
from harness.results import MANIFEST, REQUESTS, RunFolder, read_requests, request_key


@dataclass
class RunOptions:
    split: str = "qualitative"
    categories: list[str] | None = None
    experiment: str = "demo"
    dataset_path: str | None = None
    dataset_revision: str | None = None
    systems: list[str] | None = None
    backend: str | None = None
    num_prompts: int | None = None
    output_len: int | None = None
    temperatures: list[float] | None = None
    turns: str | None = None
    ignore_eos: bool = False
    concurrency: int = 1
    seed: int | None = None
    disable_shuffle: bool = False
    device: str = "cpu"
    dtype: str = "auto"
    threads: int | None = None  # intra-op threads (None: `harness.threads.choose`)
    out: str | None = None
    resume: str | None = None
    profiled: str | None = None  # "nsys" or "torch": warm every system first, capture only the timed requests


NOT_RECORDED = ("out", "resume", "profiled")  # where and how this invocation runs, not what the run is
FLAGS = {"categories": "--category", "temperatures": "--temperature"}  # the rest: --field-name


def flag(field: str) -> str:
    return FLAGS.get(field, "--" + field.replace("_", "-"))


def recorded_options(opts: RunOptions) -> dict:
    """The options a run was started with, as the manifest keeps them for `--resume DIR`."""
    return {k: v for k, v in asdict(opts).items() if k not in NOT_RECORDED}


def resume_options(opts: RunOptions, given: set[str]) -> RunOptions:
    """`--resume DIR` continues with the options in DIR's manifest. An option given on the command line
    (`given`: RunOptions field names) must equal the recorded one; the first that differs is refused
    by its flag. A manifest from before options were recorded keeps the old rule: the arguments given
    are the run's (its settings are compared later)."""
    folder = RunFolder(Path(opts.resume))
    manifest = folder.manifest()
    if manifest is None:
        raise DSparkError(f"--resume {folder.path}: no manifest.json there; not a run folder")
    recorded = manifest.get("options")
    if recorded is None:
        return opts
    known = {f.name for f in fields(RunOptions)}
    for name in sorted((given & known) - set(NOT_RECORDED)):
        if getattr(opts, name) != recorded.get(name):
            raise DSparkError(f"--resume {folder.path}: {flag(name)} was {json.dumps(recorded.get(name))} in this "
                              f"run, now {json.dumps(getattr(opts, name))}; drop {flag(name)} to continue the run "
                              "as it was started")
    return replace(opts, **{k: v for k, v in recorded.items() if k in known})


def resolve_settings(opts: RunOptions, exp: Experiment) -> dict:
    """Everything that decides which requests run and how: compared on --resume."""
    backend = opts.backend or exp.backend
    if backend != "native":
        raise DSparkError(f"--backend {backend} is not available yet; use native")
    if opts.concurrency != 1:
        raise DSparkError(f"--concurrency {opts.concurrency}: the native backend serves one request at a time; "
                          "use --concurrency 1 (a batched backend comes later)")
    systems = [s.name for s in exp.systems]
    if opts.systems:
        unknown = [s for s in opts.systems if s not in systems]
        if unknown:
            raise DSparkError(f"--systems: '{unknown[0]}' is not in experiment {exp.name}; it has {', '.join(systems)}")
        systems = [s for s in systems if s in opts.systems]
    systems.sort(key=lambda s: exp.system(s).method != "plain")  # the baseline first
    temps = opts.temperatures if opts.temperatures is not None else list(exp.temperatures)
    if any(t < 0 for t in temps):
        raise DSparkError("--temperature must be >= 0")
    output_len = exp.output_len if opts.output_len is None else opts.output_len
    if output_len < 1:
        raise DSparkError(f"--output-len is {output_len}; give at least 1")
    if opts.num_prompts is not None and opts.num_prompts < 1:
        raise DSparkError(f"--num-prompts is {opts.num_prompts}; give at least 1")
    return {
        "experiment": exp.name, "experiment_sha256": exp.sha256, "target": exp.target, "backend": backend,
        "split": opts.split, "categories": opts.categories, "dataset_path": opts.dataset_path,
        "dataset": "files" if opts.dataset_path else exp.dataset,
        "dataset_revision": opts.dataset_revision or exp.dataset_revision,
        "systems": systems, "num_prompts": opts.num_prompts if opts.num_prompts is not None else exp.num_prompts,
        "output_len": output_len, "temperatures": [float(t) for t in temps], "turns": opts.turns or exp.turns,
        "ignore_eos": opts.ignore_eos, "seed": exp.seed if opts.seed is None else opts.seed,
        "shuffle": exp.shuffle and not opts.disable_shuffle, "device": opts.device, "dtype": opts.dtype,
    }


def request_seed(run_seed: int, question_id: str, turn: int, temperature: float) -> int:
    digest = hashlib.sha256(f"{run_seed}/{question_id}/{turn}/{temperature:g}".encode()).hexdigest()
    return int(digest[:12], 16)


def dry_run(opts: RunOptions, console: Console) -> list[dict]:
    """Resolve every system of the experiment against the target's config, reading no weights."""
    exp = load_experiment(opts.experiment)
    settings = resolve_settings(opts, exp)
    target_path = resolve_path(exp.target)
    target_cfg = TargetConfig.from_hf(read_config(target_path), f"target {exp.target}")
    rows = [resolve_system(exp.system(name), target_cfg) for name in settings["systems"]]
    t = Table(title=f"dry run: experiment {exp.name}, target {exp.target} ({target_path})")
    for col in ("system", "draft", "format", "method", "tokens/round", "fits", "problem"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["system"], r["draft"] or "-", r["format"] or "-", r["method"] or "-",
                  str(r.get("num_speculative_tokens", "-")), "yes" if r["fits_target"] else "NO", r["problem"] or "")
    console.print(t)
    return rows


def _prompt_ids(tokenizer, turns: list[str], replies: list[str]) -> list[int]:
    messages = []
    for i, text in enumerate(turns):
        messages.append({"role": "user", "content": text})
        if i < len(replies):
            messages.append({"role": "assistant", "content": replies[i]})
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=False,
                                              tokenize=True, return_dict=False))


def default_out(settings: dict) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    base = Path("results") / f"{settings['experiment']}-{settings['split']}-{stamp}"
    out, n = base, 1
    while out.exists():  # never write into an earlier run
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return out


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
    backend = NativeBackend(exp.target, opts.device, opts.dtype)
    n_threads, threads_by = threads.choose(opts.threads, opts.device, backend.loaded.path)
    threads.apply(n_threads)
    tokenizer = AutoTokenizer.from_pretrained(backend.loaded.path)
    if not getattr(tokenizer, "chat_template", None):
        raise DSparkError(f"{exp.target}: the tokenizer has no chat template; SPEED-Bench prompts need one")
    stop = () if settings["ignore_eos"] else backend.loaded.stop_token_ids
    turns_of = {r.question_id: (list(r.turns) if settings["turns"] == "all" else [r.turns[0]]) for r in rows}
    jobs = [(name, temp, row, turn) for name in settings["systems"] for temp in settings["temperatures"]
            for row in rows for turn in range(len(turns_of[row.question_id]))]

    prepared = {name: backend.prepare(exp.system(name)) for name in settings["systems"]}
    models = backend.models()
    for p in prepared.values():
        if p.system.draft:
            models[p.system.name] = model_record(resolve_path(p.system.draft))
    inputs = {"dataset": data.origin | {"selected": [r.question_id for r in rows]}, "models": models,
              "tokenizer": tokenizer_record(backend.loaded.path, tokenizer)}
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
    longest = min(max(len(_prompt_ids(tokenizer, turns_of[r.question_id], [])) + len(turns_of[r.question_id])
                      * (settings["output_len"] + 16) for r in rows),
                  backend.model.config.max_position_embeddings + 16)  # no request may exceed the target's limit
    warmed: set[tuple] = set()

    def warm(name: str, temp: float) -> None:
        if (name, temp) in warmed:
            return
        p = prepared[name]
        cfg = GenerationConfig(max_new_tokens=settings["output_len"], temperature=temp, stop_token_ids=stop,
                               confidence_threshold=p.system.confidence_threshold)
        reset_peak_memory(opts.device)
        backend.warmup(p, longest, cfg, _prompt_ids(tokenizer, turns_of[rows[0].question_id][:1], []))
        warmed.add((name, temp))

    if opts.profiled:  # everything untimed happens before the capture window opens
        for name, temp, _, _ in pending:
            warm(name, temp)
    try:
        with RunProgress(console, len(pending)) as progress, capture_window(opts.profiled, folder.path, opts.device):
            for name, temp, row, turn in pending:
                p = prepared[name]
                cfg = GenerationConfig(max_new_tokens=settings["output_len"], temperature=temp,
                                       seed=request_seed(settings["seed"], row.question_id, turn, temp),
                                       stop_token_ids=stop, confidence_threshold=p.system.confidence_threshold)
                if (name, temp) not in warmed:
                    progress.step(f"{name} T={temp:g}", "(warm-up)")
                    for other, q in prepared.items():  # one system's caches and graphs on the device at a time
                        if other != name and not opts.profiled:
                            q.engine.release()
                    warm(name, temp)
                progress.step(f"{name} T={temp:g}", row.category)
                previous = [replies[(name, row.question_id, temp, t)] for t in range(turn)]
                ids = _prompt_ids(tokenizer, turns_of[row.question_id][: turn + 1], previous)
                load_before = os.getloadavg()[0]
                result = backend.generate(p, ids, cfg)
                record = _record(name, p.method, row, turn, temp, cfg.seed, ids, result, tokenizer, opts.device)
                record["load_avg"] = [load_before, os.getloadavg()[0]]
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


def print_tables(summary: dict, console: Console, title: str) -> None:
    show(console, table(summary, title))
    for line in warnings(summary):
        console.print(f"warning: {line}", style="yellow", highlight=False, soft_wrap=True)
    if summary["baseline"] is None:
        console.print("no speedup: plain decoding was not among the systems", style="dim")

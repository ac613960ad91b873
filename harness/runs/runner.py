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

import functools
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console

from dspark.checkpoint import resolve_path
from dspark.errors import DSparkError
from dspark.tokenizer import chat_prompt_ids, conversation
from harness.analysis.metrics import first_difference
from harness.analysis.plots import plot
from harness.analysis.records import MANIFEST, REQUESTS, read_requests, request_key
from harness.analysis.summary import expected_requests, markdown, summarize_folder, to_csv
from harness.backends.base import Backend, RequestResult, RequestSpec
from harness.backends.fingerprints import model_record, tokenizer_record
from harness.backends.registry import backend_class
from harness.runs import threads
from harness.runs.folder import RunFolder
from harness.runs.plan import RunOptions, default_out, recorded_options, request_seed, resolve_settings
from harness.runs.progress import RunProgress
from harness.runs.provenance import provenance
from harness.specs import datasets
from harness.specs.experiments import load_experiment


def run(opts: RunOptions, console: Console) -> tuple[Path, dict]:
    """Every pending request of the run, each recorded as it finishes; then the summaries. `console`
    gets the progress and notices (the caller prints the tables)."""
    session = Session.open(opts, console)
    pending = session.pending()
    try:
        if opts.profiled:  # everything untimed happens before the capture window opens
            for name, temp, _, _ in pending:
                session.warm(name, temp)
        with RunProgress(console, len(pending)) as progress, session.backend.capture(opts.profiled,
                                                                                      session.folder.path):
            for name, temp, row, turn in pending:
                if (name, temp) not in session.warmed:
                    progress.step(f"{name} T={temp:g}", "(warm-up)")
                    session.warm(name, temp)
                progress.step(f"{name} T={temp:g}", row.category)
                session.request(name, temp, row, turn)
                progress.advance()
    except KeyboardInterrupt:
        write_summaries(session.folder)  # of the finished requests, marked incomplete
        console.print(f"interrupted: {len(read_requests(session.folder.path))} finished requests and their summaries "
                      f"are in {session.folder.path}; continue with: dspark-bench run --resume {session.folder.path}",
                      highlight=False, soft_wrap=True)
        raise
    finally:  # engines and servers stop with the run, whichever way it ends
        for prepared in session.prepared.values():
            session.backend.release(prepared)
    return session.folder.path, write_summaries(session.folder)


@dataclass
class Session:
    """A run once its inputs are loaded and checked: the folder and its records so far, the prompts, the
    backend with every system prepared, and what each request needs (template, stop tokens, baseline)."""

    opts: RunOptions
    settings: dict
    folder: RunFolder
    rows: list[datasets.Row]
    turns_of: dict[str, list[str]]
    jobs: list[tuple]
    backend: Backend
    tokenizer: object
    prepared: dict
    records: dict[tuple, dict]  # finished requests by request_key
    warmed: set = field(default_factory=set)

    @classmethod
    def open(cls, opts: RunOptions, console: Console) -> Session:
        """Load and check everything before the first request: settings against a resumed run's, the
        prompts, the target, the thread count, the systems; then write (or check) the manifest."""
        from transformers import AutoTokenizer

        exp = load_experiment(opts.experiment)
        settings = resolve_settings(opts, exp)
        folder = RunFolder(Path(opts.resume) if opts.resume else Path(opts.out) if opts.out else default_out(settings))
        if opts.resume:
            folder.check_resume(settings)
        data = datasets.load(opts.split, Path(opts.dataset_path) if opts.dataset_path else None, exp.dataset,
                             settings["dataset_revision"])
        rows = datasets.select(data.rows, opts.split, settings["categories"], settings["num_prompts"],
                               settings["seed"], settings["shuffle"])
        if settings["num_prompts"] is not None and len(rows) < settings["num_prompts"]:
            console.print(f"notice: {settings['num_prompts']} prompts asked for, but {opts.split} "
                          f"{', '.join(settings['categories'] or ['(all categories)'])} has {len(rows)}: running "
                          f"{len(rows)}", style="yellow", highlight=False, soft_wrap=True)
        backend: Backend = backend_class(settings["backend"])(
            exp.target, opts.device, opts.dtype, engine_args=settings.get("engine_args"),
            run_dir=folder.path, profiled=opts.profiled, margins=settings.get("record_margins", False))
        n_threads, threads_by = threads.choose(opts.threads, opts.device, backend.tokenizer_path)
        threads.apply(n_threads)
        tokenizer = AutoTokenizer.from_pretrained(backend.tokenizer_path)
        if not getattr(tokenizer, "chat_template", None):
            raise DSparkError(f"{exp.target}: the tokenizer has no chat template; SPEED-Bench prompts need one")
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
            folder.check_inputs(inputs)  # (its thread count came with its options)
            recorded = folder.manifest().get("backend") or {}
            was = recorded.get("version", recorded.get("vllm"))  # (the first vLLM runs kept it as "vllm")
            if was != backend.record().get("version"):
                raise DSparkError(f"--resume {folder.path}: the run used {settings['backend']} {was}, this is "
                                  f"{backend.record().get('version')}; start a new run")
        else:
            folder.create({"settings": settings, "options": recorded_options(opts),
                           "experiment": {"path": exp.path, "sha256": exp.sha256,
                                          "systems": [asdict(s) for s in exp.systems]},
                           **inputs, "methods": {n: p.method for n, p in prepared.items()},
                           "threads": {"count": n_threads, "chosen_by": threads_by},
                           "prompts_selected": len(rows), "requests_expected": expected_requests(
                               [(name, temp, row.category) for name, temp, row, _ in jobs]),
                           "backend": backend.record(), "profiled": opts.profiled or False,
                           "provenance": provenance(opts.device)})
        records = {request_key(r): r for r in read_requests(folder.path, repair=True)}
        session = cls(opts, settings, folder, rows, turns_of, jobs, backend, tokenizer, prepared, records)
        if opts.resume:
            console.print(f"resuming {folder.path}: {len(jobs) - len(session.pending())} of {len(jobs)} requests "
                          "already done", highlight=False, soft_wrap=True)
        console.print(f"threads: {n_threads} ({threads_by})", highlight=False, soft_wrap=True)
        return session

    @functools.cached_property
    def longest(self) -> int:
        """The longest request: every user turn, and at most output_len tokens (plus template) per reply;
        never past the target's limit. Computed once, for every system's warm-up."""
        return min(max(len(chat_prompt_ids(self.tokenizer, conversation(self.turns_of[r.question_id])))
                       + len(self.turns_of[r.question_id]) * (self.settings["output_len"] + 16) for r in self.rows),
                   self.backend.max_context + 16)

    @property
    def baseline_system(self) -> str | None:
        return next((n for n in self.settings["systems"] if self.prepared[n].method == "plain"), None)  # sorted first

    def pending(self) -> list[tuple]:
        """The requests not yet recorded, in run order."""
        return [j for j in self.jobs if (j[0], j[2].question_id, j[3], float(j[1])) not in self.records]

    def spec(self, name: str, temp: float, seed: int = 0, messages: list[dict] = ()) -> RequestSpec:
        return RequestSpec(max_new_tokens=self.settings["output_len"], temperature=temp, seed=seed,
                           stop_token_ids=() if self.settings["ignore_eos"] else self.backend.stop_token_ids,
                           confidence_threshold=self.prepared[name].system.confidence_threshold,
                           messages=tuple(messages))

    def warm(self, name: str, temp: float) -> None:
        """Caches sized for the run's longest request, graphs captured, one short request: all untimed.
        Outside a profile, the other systems' caches and graphs are released first (one on the device at
        a time); a profile warms every system before its capture window and releases none."""
        if (name, temp) in self.warmed:
            return
        if not self.opts.profiled:
            for other, q in self.prepared.items():
                if other != name:
                    self.backend.release(q)
        self.backend.reset_peak_memory()
        messages = conversation(self.turns_of[self.rows[0].question_id][:1])
        first = chat_prompt_ids(self.tokenizer, messages)
        self.backend.warmup(self.prepared[name], self.longest, self.spec(name, temp, messages=messages), first)
        self.warmed.add((name, temp))
        was = self.folder.manifest().get("backend") or {}
        now = was | self.backend.record()  # what the engine started with, once known; a resume's engines added
        if "engines" in now:
            now["engines"] = was.get("engines", {}) | now["engines"]
        if now != was:
            self.folder.update_manifest("backend", now)

    def request(self, name: str, temp: float, row: datasets.Row, turn: int) -> dict:
        """One timed request, recorded (and at T = 0 held against plain decoding's) as soon as it ends."""
        p = self.prepared[name]
        previous = [self._reply(name, row.question_id, temp, t) for t in range(turn)]
        messages = conversation(self.turns_of[row.question_id][: turn + 1], previous)
        spec = self.spec(name, temp, request_seed(self.settings["seed"], row.question_id, turn, temp), messages)
        ids = chat_prompt_ids(self.tokenizer, messages)
        load_before = os.getloadavg()[0]
        result = self.backend.generate(p, ids, spec)
        record = _record(name, p.method, row, turn, temp, spec.seed, ids, result, self.tokenizer)
        record |= {"peak_memory_bytes": self.backend.peak_memory(), "load_avg": [load_before, os.getloadavg()[0]]}
        base_name = self.baseline_system
        if temp == 0 and base_name is not None and name != base_name:
            base = self._find(base_name, row.question_id, temp, turn)
            if base is not None and base["prompt_sha256"] == record["prompt_sha256"]:
                record["matches_baseline"] = first_difference(result.tokens, base["output_ids"])
        self.folder.append(record)
        self.records[request_key(record)] = record
        return record

    def _find(self, system: str, question_id: str, temp: float, turn: int) -> dict | None:
        return self.records.get((system, question_id, turn, float(temp)))

    def _reply(self, system: str, question_id: str, temp: float, turn: int) -> str:
        return self._find(system, question_id, temp, turn)["output_text"]


def _record(system: str, method: str, row: datasets.Row, turn: int, temp: float, seed: int, ids: list[int],
            result: RequestResult, tokenizer) -> dict:
    n = len(result.tokens)
    ttft = None if result.prefill_s is None else result.prefill_s * 1e3  # None: the backend cannot tell
    e2el = ((result.prefill_s or 0.0) + result.decode_s) * 1e3
    return {
        "system": system, "method": method, "question_id": row.question_id, "category": row.category,
        "turn": turn, "temperature": temp, "seed": seed, "prompt_tokens": len(ids),
        "prompt_sha256": hashlib.sha256(json.dumps(ids).encode()).hexdigest(), "output_tokens": n,
        "output_ids": result.tokens, "output_text": tokenizer.decode(result.tokens, skip_special_tokens=True),
        "stop_reason": result.stop_reason, "acceptance_lengths": result.acceptance_lengths,
        "proposal_lengths": result.proposal_lengths,
        "accepted_counts": result.accepted_counts, "num_rounds": result.num_rounds, "ttft_ms": ttft,
        "tpot_ms": (e2el - ttft) / (n - 1) if n > 1 and ttft is not None else None, "e2el_ms": e2el,
        "round_ms": result.round_ms,
        "draft_margins": [[float(f"{m:.4g}") for m in r] for r in result.draft_margins] or None,
        "acceptance_source": result.acceptance_source if method != "plain" else None,
        "acceptance_totals": result.acceptance_totals, **result.extra,
        "matches_baseline": None, "time_utc": time.time(),
    }


def write_summaries(folder: RunFolder) -> dict:
    """summary.json, .csv, .md and .png from the requests; the summary carries what it was written to."""
    summary = summarize_folder(folder.path)
    folder.write_json("summary.json", {"settings": (folder.manifest() or {}).get("settings"), **summary})
    folder.write_text("summary.csv", to_csv(summary))
    folder.write_text("summary.md", markdown(summary, f"run {folder.path.name}"))
    written = [name for name in (MANIFEST, REQUESTS) if (folder.path / name).is_file()]
    written += ["summary.json", "summary.csv", "summary.md"]
    if summary["rows"]:
        plot(summary, folder.path / "summary.png", f"run {folder.path.name}")
        written.append("summary.png")
    return summary | {"files": [str(folder.path / name) for name in written]}

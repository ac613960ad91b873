"""`dspark-bench run`: SPEED-Bench prompts through every system of an experiment, each request
recorded as it finishes, then the summaries.

Order: on a backend whose systems stay warm together (`Capabilities.interleaves`, our engine) the
systems alternate prompt by prompt: for each temperature, prompt and turn, plain decoding first (so
greedy outputs are checked against it as they come), then each drafter, before the next prompt; so
a machine that slows down or speeds up during the run moves both sides of every pair. Elsewhere
(one vLLM engine or server at a time) systems run one after another, then concurrency levels,
temperatures, prompts and turns. Requests go out in waves (`Session.waves`): one request at a time
at concurrency 1, every prompt of a turn together above, at most the level in flight. Every system
gets its caches, graph captures and one short request before any timing (all of them first, when
they alternate or are profiled). Around every request the runner measures how much the machine was
shared (`harness.runs.contention`) and records it with the request. At temperature > 0 a request's
seed derives from the run seed, the question, the turn and the temperature, so every system draws
the same target-side randomness and a resumed request is the same draw. The runner speaks to its
backend only through `harness.backends.base.Backend`.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console

from dspark.checkpoint import resolve_path
from dspark.errors import DSparkError
from dspark.tokenizer import chat_prompt_ids, conversation
from harness.analysis.metrics import first_difference, request_latencies
from harness.analysis.records import MANIFEST, REQUESTS, WAVES, read_requests, read_waves, request_key, requests_and_notes
from harness.analysis.run_figures import plot, plot_sweep, run_caption
from harness.analysis.summary import expected_requests, interpreted, summarize_folder
from harness.analysis.synthetic_check import label
from harness.analysis.table_text import markdown, to_csv
from harness.backends.base import Backend, RequestResult, RequestSpec, Schedule
from harness.backends.fingerprints import model_record, tokenizer_record
from harness.backends.registry import backend_class
from harness.runs import contention, context, threads
from harness.runs.folder import RunFolder, experiment_text
from harness.runs.owner import Owner, own
from harness.runs.plan import (
    RunOptions,
    default_out,
    load_dataset,
    plan_jobs,
    recorded_options,
    request_seed,
    resolve_settings,
    select_prompts,
    user_turns,
)
from harness.runs.progress import Interrupted, RunProgress
from harness.runs.provenance import provenance
from harness.runs.synthetic import with_synthetic
from harness.specs import datasets
from harness.specs.experiments import load_experiment
from harness.specs.shaped import ShapedTokenizer, fetch_hint, run_tokenizer


def run(opts: RunOptions, console: Console, data: datasets.Dataset | None = None) -> tuple[Path, dict]:
    """Every pending request of the run, each recorded as it finishes; then the summaries. `console`
    gets the progress and notices (the caller prints the tables); `data`: the run's dataset, where the
    caller has loaded it already (to check the selection before the models load)."""
    session = Session.open(opts, console, data)
    waves = session.waves()
    try:
        with RunProgress(console, sum(len(w.rows) for w in waves)) as progress:
            if session.keeps_all_warm:  # every warm-up before the first timed request (and the capture window)
                for system, temp in dict.fromkeys((w.system, w.temperature) for w in waves):
                    progress.step(f"warm-up {system} T={temp:g}", "(untimed)")
                    session.warm(system, temp)
            with session.backend.capture(opts.profiled, session.folder.path):
                for wave in waves:
                    level = f" c={wave.concurrency}" if session.sweep else ""
                    if (wave.system, wave.temperature) not in session.warmed:
                        progress.step(f"warm-up {wave.system} T={wave.temperature:g}{level}", "(untimed)")
                        session.warm(wave.system, wave.temperature)
                    what = wave.rows[0].category if len(wave.rows) == 1 else f"{len(wave.rows)} requests"
                    if session.interleaved:  # the label changes per temperature, the system per request
                        progress.step(f"T={wave.temperature:g}", f"{what} {wave.system}")
                    else:
                        progress.step(f"{wave.system} T={wave.temperature:g}{level}", what)
                    session.serve(wave, progress.advance)
        summary = write_summaries(session.folder)  # (before the folder is let go)
    except KeyboardInterrupt:
        write_summaries(session.folder)  # of the finished requests, marked incomplete
        console.print(f"interrupted: {len(read_requests(session.folder.path))} finished requests and their summaries "
                      f"are in {session.folder.path}; continue with: {resume_command(opts, session.folder.path)}",
                      highlight=False, soft_wrap=True)
        raise Interrupted from None
    finally:  # engines and servers stop with the run, whichever way it ends
        for prepared in session.prepared.values():
            session.backend.release(prepared)
        gc.unfreeze()  # (the warm-ups froze what loading left: collectable again, at exit too)
        session.owner.release()
    return session.folder.path, summary


def resume_command(opts: RunOptions, run_dir: Path) -> str:
    """The command that finishes this run once stopped: a profile's child is finished by its profile."""
    return (f"dspark-bench profile --resume {run_dir.parent}" if opts.profiled
            else f"dspark-bench run --resume {run_dir}")


@dataclass
class Session:
    """A run once its inputs are loaded and checked: the folder and its records so far, the prompts, the
    backend with every system prepared, and what each request needs (template, stop tokens, baseline)."""

    opts: RunOptions
    settings: dict
    folder: RunFolder
    rows: list[datasets.Row]
    turns_of: dict[str, list[str]]
    jobs: list[tuple]  # (system, concurrency, temperature, row, turn), in run order
    backend: Backend
    tokenizer: object
    prepared: dict
    records: dict[tuple, dict]  # finished requests by request_key
    owner: Owner  # this process's hold on the folder (`harness.runs.owner`), from before anything loads
    warmed: set = field(default_factory=set)

    @classmethod
    def open(cls, opts: RunOptions, console: Console, data: datasets.Dataset | None = None) -> Session:
        """Load and check everything before the first request: settings against a resumed run's, the
        prompts (of `data`, else of the dataset loaded here), the target, the thread count, the systems;
        then write (or check) the manifest. The folder is this process's alone from before anything
        loads (`own`): a second process is refused, and the folder let go if loading fails."""
        exp = load_experiment(opts.experiment)
        settings = resolve_settings(opts, exp)
        folder = RunFolder(Path(opts.resume) if opts.resume else Path(opts.out) if opts.out else default_out(settings))
        owner = own(folder.path, f"continue with {resume_command(opts, folder.path)}")
        try:
            return cls._load(opts, console, data, exp, settings, folder, owner)
        except BaseException:
            owner.release()
            raise

    @classmethod
    def _load(cls, opts: RunOptions, console: Console, data: datasets.Dataset | None, exp, settings: dict,
              folder: RunFolder, owner: Owner) -> Session:
        """`open`'s work once the folder is owned."""
        if opts.resume:
            folder.check_resume(settings)
        data = load_dataset(opts, exp, settings) if data is None else data
        rows = select_prompts(data, settings)
        if settings["num_prompts"] is not None and len(rows) < settings["num_prompts"]:
            console.print(f"notice: {settings['num_prompts']} prompts asked for, but {opts.split} "
                          f"{', '.join(settings['categories'] or ['(all categories)'])} has {len(rows)}: running "
                          f"{len(rows)}", style="yellow", highlight=False, soft_wrap=True)
        backend: Backend = backend_class(settings["backend"])(
            exp.target, opts.device, opts.dtype, engine_args=settings.get("engine_args"),
            run_dir=folder.path, profiled=opts.profiled, margins=settings.get("record_margins", False),
            compile=settings.get("compile", False),
            server={"base_url": settings.get("base_url"), "model": settings.get("model"),
                    "request_timeout_s": settings.get("request_timeout"),
                    "load_generator": settings.get("load_generator"), "aiperf": opts.aiperf})
        n_threads, threads_by = threads.choose(opts.threads, opts.device, backend.tokenizer_path)
        threads.apply(n_threads)
        tokenizer = run_tokenizer(backend.tokenizer_path, exp.target, opts.split)
        if (hint := fetch_hint(exp.target, tokenizer)) is not None:
            console.print(hint, style="yellow", highlight=False, markup=False, soft_wrap=True)
        turns_of = user_turns(rows, settings["turns"])
        jobs = plan_jobs(settings, rows, turns_of, backend.capabilities.interleaves)
        prepared = {name: backend.prepare(with_synthetic(exp.system(name), settings)) for name in settings["systems"]}
        models = backend.models()
        for p in prepared.values():
            if p.system.draft:
                models[p.system.name] = model_record(resolve_path(p.system.draft))
        inputs = {"dataset": data.origin | {"selected": [r.question_id for r in rows]}, "models": models,
                  "tokenizer": tokenizer.record() if isinstance(tokenizer, ShapedTokenizer) else
                  tokenizer_record(backend.tokenizer_path, tokenizer)}
        if opts.resume:
            folder.check_inputs(inputs)  # (its thread count came with its options)
            recorded = folder.manifest().get("backend") or {}
            was = recorded.get("version", recorded.get("vllm"))  # (the first vLLM runs kept it as "vllm")
            if was != backend.record().get("version"):
                raise DSparkError(f"--resume {folder.path}: the run used {settings['backend']} {was}, this is "
                                  f"{backend.record().get('version')}; start a new run")
        else:
            prov = provenance(opts.device)
            folder.create({"settings": settings, "options": recorded_options(opts),
                           "experiment": {"path": exp.path, "sha256": exp.sha256,
                                          "systems": [asdict(s) for s in exp.systems],
                                          "toml": experiment_text(exp)},  # (what a resume names the changes against)
                           **inputs, "methods": {n: p.method for n, p in prepared.items()},
                           "threads": {"count": n_threads, "chosen_by": threads_by},
                           **({"label": named} if (named := "; ".join(filter(None, (
                               label(settings), interpreted({"provenance": prov}))))) else {}),
                           "prompts_selected": len(rows), "requests_expected": expected_requests(
                               [(name, temp, row.category, conc) for name, conc, temp, row, _ in jobs]),
                           "backend": backend.record(), "profiled": opts.profiled or False,
                           "provenance": prov})
        done, notes = requests_and_notes(folder.path, repair=True)  # (a request recorded twice: done once)
        for note in notes:
            console.print(f"warning: {note}", style="yellow", highlight=False, markup=False, soft_wrap=True)
        records = {request_key(r): r for r in done}
        read_waves(folder.path, repair=True)  # (a torn last wave line is cut before more are appended)
        session = cls(opts, settings, folder, rows, turns_of, jobs, backend, tokenizer, prepared, records, owner)
        if opts.resume:
            failed = sum(1 for r in records.values() if r.get("failed"))
            left = len(session.pending())
            console.print(f"resuming {folder.path}: {len(jobs) - left} of {len(jobs)} requests already done"
                          + (f" ({failed} of them failed: kept as failed, not sent again)" if failed else "")
                          + ("; nothing left to run (the summaries are written again)" if not left else ""),
                          highlight=False, soft_wrap=True)
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

    @property
    def interleaved(self) -> bool:
        return self.backend.capabilities.interleaves

    @property
    def keeps_all_warm(self) -> bool:
        """Every system warm at once: when they alternate, or in a profile (nothing untimed inside its window)."""
        return self.interleaved or bool(self.opts.profiled)

    @property
    def sweep(self) -> bool:
        return "max_concurrency" in self.settings

    def pending(self) -> list[tuple]:
        """The requests not yet recorded, in run order."""
        return [j for j in self.jobs if (j[0], j[3].question_id, j[4], float(j[2]), j[1]) not in self.records]

    def waves(self) -> list[Wave]:
        """The pending requests as waves, each sent together: at concurrency 1 one request per wave (so
        later turns follow their own earlier ones, and the server's counters are per request); above,
        every pending request of a system, level, temperature and turn (turn by turn, each wave after
        the one holding the earlier turns); with AIPerf (one process per wave) at every level so."""
        out: list[Wave] = []
        for name, conc, temp, row, turn in self.pending():
            last = out[-1] if out else None
            if (conc > 1 or "load_generator" in self.settings) and last is not None and \
                    (last.system, last.concurrency, last.temperature, last.turn) == (name, conc, temp, turn):
                last.rows.append(row)
            else:
                out.append(Wave(name, conc, temp, turn, [row]))
        if any(w.concurrency > 1 for w in out) or "load_generator" in self.settings:  # later turns after earlier
            out.sort(key=lambda w: (self.settings["systems"].index(w.system), w.concurrency, w.temperature, w.turn))
        return out

    def spec(self, name: str, temp: float, seed: int = 0, messages: list[dict] = ()) -> RequestSpec:
        return RequestSpec(max_new_tokens=self.settings["output_len"], temperature=temp, seed=seed,
                           stop_token_ids=() if self.settings["ignore_eos"] else self.backend.stop_token_ids,
                           confidence_threshold=self.prepared[name].system.confidence_threshold,
                           confidence_schedule=self.prepared[name].system.confidence_costs,
                           confidence_temperatures=self.prepared[name].system.confidence_temperatures,
                           messages=tuple(messages))

    def warm(self, name: str, temp: float) -> None:
        """Caches sized for the run's longest request, graphs captured, one short request: all untimed.
        Where systems run one after another, the other systems' caches and graphs are released first (one
        on the device at a time); where they alternate, or in a profile, every system is warmed before
        the first timed request and none is released."""
        if (name, temp) in self.warmed:
            return
        if not self.keeps_all_warm:
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
        # What loading left (torch, transformers, the models: millions of objects) is collected now and kept out
        # of every later collection: otherwise a full collection falls inside a timed request, whichever it
        # reaches first (100-200 ms on the demo's first requests, by chance of where loading left the counts).
        gc.collect()
        gc.freeze()

    def serve(self, wave: Wave, advance) -> None:
        """One wave, each request recorded (and at T = 0 held against plain decoding's at the same
        concurrency) as soon as it ends; then what the server's counters say about the wave."""
        p = self.prepared[wave.system]
        sent, specs, prompts = [], [], []
        for row in wave.rows:
            previous = [self._find(wave.system, row.question_id, wave.temperature, t, wave.concurrency)
                        for t in range(wave.turn)]
            if any(r is None or r.get("failed") for r in previous):  # nothing to continue from
                self._write(self._failed(wave, row, "an earlier turn of this conversation failed"))
                advance()
                continue
            messages = conversation(self.turns_of[row.question_id][: wave.turn + 1],
                                    [r["output_text"] for r in previous])
            ids = chat_prompt_ids(self.tokenizer, messages)
            limit = context.limit(self.settings, self.backend.max_context)
            if len(ids) + self.settings["output_len"] > limit:  # (a later turn after long replies)
                self._write(self._failed(wave, row, f"prompt ({len(ids)}) + --output-len ({self.settings['output_len']}"
                                                    f") passes the target's context ({limit})"))
                advance()
                continue
            seed = request_seed(self.settings["seed"], row.question_id, wave.turn, wave.temperature)
            sent.append(row)
            specs.append(self.spec(wave.system, wave.temperature, seed, messages))
            prompts.append(ids)
        if not sent:
            return
        wave_id = uuid.uuid4().hex[:12]
        load_before = os.getloadavg()[0]
        if self.interleaved:  # the device's peak while this wave ran (every system's caches are resident)
            self.backend.reset_peak_memory()
        sent_at = contention.sample()  # (above concurrency 1 each request's figures span the wave up to its end)
        counted = "server counters (request)" if len(sent) == 1 else "server counters (wave)"

        def on_result(i: int, result: RequestResult) -> None:
            row, spec, ids = sent[i], specs[i], prompts[i]
            if result.error is not None:
                record = self._failed(wave, row, result.error) | {
                    "e2el_ms": ((result.prefill_s or 0.0) + result.decode_s) * 1e3}
            else:
                record = _record(wave.system, p.method, row, wave.turn, wave.temperature, spec.seed, ids, result,
                                 self.tokenizer)
                if record["acceptance_source"] is None and p.method != "plain":
                    record["acceptance_source"] = counted  # (joined with the wave's counters by the summary)
                base = self._find(self.baseline_system, row.question_id, wave.temperature, wave.turn,
                                  wave.concurrency) if self.baseline_system not in (None, wave.system) else None
                if wave.temperature == 0 and base is not None and not base.get("failed") and \
                        base["prompt_sha256"] == record["prompt_sha256"] and record["output_ids"] is not None:
                    record["matches_baseline"] = first_difference(result.tokens, base["output_ids"])
            record |= {"max_concurrency": wave.concurrency, "wave": wave_id, "start_utc": result.start_utc,
                       "peak_memory_bytes": self.backend.peak_memory(),
                       "load_avg": [load_before, os.getloadavg()[0]],
                       "contention": contention.between(sent_at, contention.sample(),
                                                        self.backend.capabilities.serves_here)}
            self._write(record)
            advance()

        schedule = Schedule(wave.concurrency, self.settings.get("request_rate"), self.settings.get("burstiness", 1.0),
                            arrival_seed(self.settings["seed"], wave))
        told = self.backend.generate_many(p, prompts, specs, schedule, on_result)
        if told:
            self.folder.append({"wave": wave_id, "system": wave.system, "max_concurrency": wave.concurrency,
                                "temperature": wave.temperature, "turn": wave.turn, "requests": len(sent), **told},
                               WAVES)

    def _failed(self, wave: Wave, row: datasets.Row, error: str) -> dict:
        """The record of a request that did not finish: counted as failed, never sent again silently."""
        return {"system": wave.system, "method": self.prepared[wave.system].method, "question_id": row.question_id,
                "category": row.category, "turn": wave.turn, "temperature": wave.temperature,
                "max_concurrency": wave.concurrency, "failed": True, "error": error, "output_tokens": 0,
                "output_ids": None, "acceptance_lengths": [], "proposal_lengths": [], "accepted_counts": [],
                "round_ms": {}, "ttft_ms": None, "tpot_ms": None, "e2el_ms": None, "matches_baseline": None,
                "time_utc": time.time()}

    def _write(self, record: dict) -> None:
        self.folder.append(record)
        self.records[request_key(record)] = record

    def _find(self, system: str, question_id: str, temp: float, turn: int, concurrency: int) -> dict | None:
        return self.records.get((system, question_id, turn, float(temp), concurrency))


def arrival_seed(run_seed: int, wave: Wave) -> int:
    """The seed of a wave's arrivals: the same for every run of these settings (as `vllm bench serve`'s
    fixed seed), different per system, level, temperature and turn."""
    return request_seed(run_seed, f"arrivals/{wave.system}/{wave.concurrency}", wave.turn, wave.temperature)


@dataclass
class Wave:
    """Requests sent together: one system, concurrency level, temperature and turn."""

    system: str
    concurrency: int
    temperature: float
    turn: int
    rows: list[datasets.Row]


def _record(system: str, method: str, row: datasets.Row, turn: int, temp: float, seed: int, ids: list[int],
            result: RequestResult, tokenizer) -> dict:
    n = len(result.tokens) or (result.extra.get("usage_output_tokens") or 0 if result.text is not None else 0)
    return {
        "system": system, "method": method, "question_id": row.question_id, "category": row.category,
        "turn": turn, "temperature": temp, "seed": seed, "prompt_tokens": len(ids),
        "prompt_sha256": hashlib.sha256(json.dumps(ids).encode()).hexdigest(), "output_tokens": n,
        "output_ids": result.tokens if result.text is None else None,
        "output_text": tokenizer.decode(result.tokens, skip_special_tokens=True) if result.text is None else result.text,
        "stop_reason": result.stop_reason, "acceptance_lengths": result.acceptance_lengths,
        "proposal_lengths": result.proposal_lengths,
        "accepted_counts": result.accepted_counts, "num_rounds": result.num_rounds,
        **request_latencies(result.prefill_s, result.decode_s, n),
        "round_ms": result.round_ms,
        "draft_margins": [[float(f"{m:.4g}") for m in r] for r in result.draft_margins] or None,
        # 7 digits: the logits behind them (what Sequential Temperature Scaling rescales) stay recoverable
        "draft_confidences": [[float(f"{c:.7g}") for c in r] for r in result.draft_confidences] or None,
        "acceptance_source": result.acceptance_source if method != "plain" else None,
        "acceptance_totals": result.acceptance_totals, **result.extra,
        "matches_baseline": None, "time_utc": time.time(),
    }


def write_summaries(folder: RunFolder) -> dict:
    """summary.json, .csv, .md and .png from the requests; the summary carries what it was written to.
    The pictures of the last summary go first: one drawn from fewer requests must not stay beside the
    new summary.json when this one is broken off (a process killed) or has nothing to draw."""
    for picture in ("summary.png", "concurrency.png"):
        (folder.path / picture).unlink(missing_ok=True)
    summary = summarize_folder(folder.path)
    folder.write_json("summary.json", {"settings": (folder.manifest() or {}).get("settings"), **summary})
    folder.write_text("summary.csv", to_csv(summary))
    folder.write_text("summary.md", markdown(summary, f"run {folder.path.name}"))
    written = [name for name in (MANIFEST, REQUESTS) if (folder.path / name).is_file()]
    written += ["summary.json", "summary.csv", "summary.md"]
    caption = run_caption(folder.manifest() or {}, folder.path.name)
    if summary["rows"]:
        plot(summary, folder.path / "summary.png", caption)
        written.append("summary.png")
    if summary["rows"] and summary["max_concurrency"] != [1]:
        plot_sweep(summary, folder.path / "concurrency.png", caption)
        written.append("concurrency.png")
    if (folder.path / WAVES).is_file():
        written.append(WAVES)
    return summary | {"files": [str(folder.path / name) for name in written]}

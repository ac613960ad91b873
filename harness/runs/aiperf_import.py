"""Two AIPerf artifact folders a user made alone (`aiperf profile` against a plain server, then a
speculative one, the same prompts) as one run folder of ours, so `report --aiperf PLAIN SPEC` shows them
with our tables, intervals, per-category rows and HTML report, never a second copy of that code.

Why this shape:
- A run folder (manifest, `requests.jsonl`, `waves.jsonl`) is what every reader of ours reads; writing
  one from AIPerf's exports (in a temporary folder the report reads and drops) keeps one summary, one
  interval and one notebook path for both load generators.
- Requests are paired by what they sent: the payload `inputs.json` holds for their conversation and turn
  (messages or prompt), hashed, and the turn; the conversation id only breaks ties (the same prompt sent
  twice), since without `--random-seed` AIPerf gives each session a random UUID, a new one each run. A
  request only one run sent is left out and named in one line; none in common is a refusal.
- Timings are AIPerf's (`time_to_first_token`, `inter_chunk_latency`: vLLM's ITL, not its TPOT, which
  AIPerf calls `inter_token_latency`); per-request acceptance is vLLM's as AIPerf recorded it
  (`spec_decode_acceptance`, read by our one reader of vLLM's per-request metrics); the wave's counters
  are AIPerf's server-metrics export (`metrics.exported_counters`), the only scrape there is.
- The category is SPEED-Bench's where AIPerf loaded one (`--custom-dataset-type speed_bench_<category>`,
  as AIPerf's own `speed-bench-report` reads it); for a whole split, each row's from the input file where
  it is still there; else `all`: AIPerf's records carry none.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from dspark.errors import DSparkError
from harness.analysis.compare_runs import settings_diff
from harness.analysis.metrics import request_latencies
from harness.analysis.records import MANIFEST, REQUESTS, WAVES
from harness.backends.served.acceptance import request_acceptance, wave_check
from harness.backends.served.aiperf import RAW, RECORDS, SERVER_METRICS, THEIR_SCRAPE, read_json, read_lines, streamed, timed
from harness.backends.served.metrics import exported_counters

PROFILE, INPUTS = "profile_export_aiperf.json", "inputs.json"
CATEGORY_PREFIXES = ("speed_bench_", "spec_al_")  # AIPerf's SPEED-Bench and acceptance-length loaders


@dataclass
class Folder:
    """One AIPerf run as its exports hold it."""

    path: Path
    profile: dict  # profile_export_aiperf.json
    records: list[dict]  # profile_export.jsonl, its profiling phase
    sent: dict[tuple, str]  # (conversation id, turn): sha256 of what was sent (inputs.json)
    server: dict | None  # server_metrics_export.json
    raw: dict[str, dict]  # profile_export_raw.jsonl by request id, where AIPerf wrote one (--export-level raw)

    @property
    def version(self) -> str:
        return str(self.profile.get("aiperf_version") or "unknown")

    @property
    def config(self) -> dict:
        return self.profile.get("input_config") or {}


def is_aiperf(path: Path) -> bool:
    """A folder `aiperf profile` wrote (its aggregate export), not a run folder of ours."""
    return (Path(path) / PROFILE).is_file() and not (Path(path) / MANIFEST).is_file()


def read_folder(path: Path) -> Folder:
    """An AIPerf artifact folder; one line naming what is missing where it is not one."""
    path = Path(path)
    if not path.is_dir():
        raise DSparkError(f"--aiperf {path}: no such folder; give the folder aiperf profile wrote (--artifact-dir)")
    if not (path / PROFILE).is_file():
        raise DSparkError(f"--aiperf {path}: no AIPerf export ({PROFILE}); give the folder aiperf profile wrote "
                          "(--artifact-dir)")
    if not (path / RECORDS).is_file():
        raise DSparkError(f"--aiperf {path}: no per-request records ({RECORDS}); run aiperf profile with "
                          "--export-level records (its default)")
    if not (path / INPUTS).is_file():
        raise DSparkError(f"--aiperf {path}: no {INPUTS} (the payloads AIPerf sent, by which the two runs' requests "
                          "pair); give the folder as aiperf profile wrote it")
    try:
        records, raw = read_lines(path / RECORDS), read_lines(path / RAW)
    except ValueError as exc:
        raise DSparkError(f"--aiperf {path}: a line of {RECORDS} or {RAW} is not JSON ({exc}); give the folder as "
                          "aiperf wrote it") from None
    profile, inputs = read_json(path / PROFILE), read_json(path / INPUTS)
    for name, got in ((PROFILE, profile), (INPUTS, inputs)):
        if not isinstance(got, dict):
            raise DSparkError(f"--aiperf {path}: {name} is not a JSON object; give the folder as aiperf wrote it")
    for n, record in enumerate(records, 1):
        meta = record.get("metadata") if isinstance(record, dict) else None
        if not isinstance(meta, dict) or any(k not in meta for k in ("request_start_ns", "request_end_ns")):
            raise DSparkError(f"--aiperf {path}: record {n} of {RECORDS} has no metadata (its request's id and "
                              "times); give the records as aiperf profile wrote them")
    sent = {}
    for session in inputs.get("data") or []:
        for turn, payload in enumerate(session.get("payloads") or []):
            said = payload.get("messages", payload.get("prompt"))
            sent[(str(session.get("session_id")), turn)] = hashlib.sha256(json.dumps(said).encode()).hexdigest()
    profiled = [r for r in records if timed(r)]
    if not profiled:
        raise DSparkError(f"--aiperf {path}: {RECORDS} holds no request of AIPerf's profiling phase ({len(records)} "
                          "records in all); give the folder of a finished aiperf profile run")
    by_id = {m["metadata"].get("x_request_id"): m for m in raw if isinstance(m.get("metadata"), dict) and timed(m)}
    return Folder(path, profile, profiled, sent, read_json(path / SERVER_METRICS), by_id)


def category(config: dict) -> str | None:
    """SPEED-Bench's category of the run (`speed_bench_coding`: coding), as AIPerf's speed-bench-report
    reads it from the input config; None for a whole split (`speed_bench_qualitative`, a throughput
    bucket) or another dataset."""
    for entry in config.get("datasets") or []:
        name = (entry or {}).get("format") or (entry or {}).get("dataset")
        for prefix in CATEGORY_PREFIXES:
            if isinstance(name, str) and name.startswith(prefix):
                rest = name.removeprefix(prefix)
                return None if rest == "qualitative" or rest.startswith("throughput_") else rest
    return None


def file_categories(config: dict, folder: Path) -> dict[str, str]:
    """Each prompt's category by its question id (AIPerf's conversation id for SPEED-Bench rows) from the
    input file AIPerf read, where it is still there (as given, or beside the artifact folder) and its rows
    carry one: a whole split's run keeps its categories, though AIPerf's records name none."""
    for entry in config.get("datasets") or []:
        given = (entry or {}).get("path")
        for path in ([Path(given), folder.parent / given] if isinstance(given, str) else []):
            try:
                rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            except (OSError, ValueError):
                continue
            return {str(r["question_id"]): str(r["category"]) for r in rows
                    if isinstance(r, dict) and r.get("question_id") and r.get("category")}
    return {}


def settings(config: dict) -> dict:
    """AIPerf's input config flattened (`endpoint.urls`, `phases.0.concurrency`, ...), its artifact folder
    left out (each run's own, named by the report already): the settings the report holds side by side."""
    flat: dict = {}

    def walk(value, key: str) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for i, v in enumerate(value):
                walk(v, f"{key}.{i}")
        elif key != "artifacts.dir":
            flat[key] = value

    walk(config, "")
    return flat


def key(record: dict) -> tuple:
    """(conversation id, turn) of an AIPerf record: where `inputs.json` holds what it sent (the session id
    there is the record's conversation id) and the name a line about it uses."""
    meta = record["metadata"]
    return str(meta.get("conversation_id")), int(meta.get("turn_index") or 0)


def pair(plain: Folder, spec: Folder) -> tuple[list[tuple[dict, dict, str]], list[str]]:
    """(plain's record, the speculative run's, the id both go by) for each request both runs sent alike:
    the same payload (its hash) at the same turn; among requests alike, those of the same conversation id
    pair first, then the rest in the order sent. One line for each request that does not pair; none in
    common is a refusal: two runs of different prompts. The id they go by is plain's conversation id (with
    `#n` for the n-th repeat of one), so the summary pairs them whatever id the speculative run gave."""
    groups: dict[tuple, tuple[list, list]] = {}
    lines: list[str] = []
    for side, folder in enumerate((plain, spec)):
        for r in sorted(folder.records, key=lambda r: r["metadata"]["request_start_ns"]):
            sent = folder.sent.get(key(r))
            if sent is None:
                lines.append(f"{_name(key(r))}: not in {folder.path / INPUTS} (what it sent is unknown); left out")
            else:
                groups.setdefault((sent, key(r)[1]), ([], []))[side].append(r)
    pairs, used, alone = [], set(), ([], [])
    for a, b in groups.values():
        same_id = [(r, next((s for s in b if key(s) == key(r)), None)) for r in a]
        matched = [(r, s) for r, s in same_id if s is not None]
        rest_a = [r for r, s in same_id if s is None]
        rest_b = [s for s in b if all(s is not m for _, m in matched)]
        for r, s in matched + list(zip(rest_a, rest_b)):
            name, n = key(r)[0], 1
            while (name, key(r)[1]) in used:
                name, n = f"{key(r)[0]}#{n}", n + 1
            used.add((name, key(r)[1]))
            pairs.append((r, s, name))
        alone[0].extend(rest_a[len(rest_b):])
        alone[1].extend(rest_b[len(rest_a):])
    for r in alone[0]:  # (the same id with another prompt in the other run: one line for both)
        if any(key(s) == key(r) for s in alone[1]):
            lines.append(f"{_name(key(r))}: the two runs sent different prompts under this id; left out")
        else:
            lines.append(f"{_name(key(r))}: only in the plain run ({plain.path}); left out")
    lines += [f"{_name(key(s))}: only in the speculative run ({spec.path}); left out" for s in alone[1]
              if not any(key(r) == key(s) for r in alone[0])]
    if not pairs:
        raise DSparkError(f"--aiperf {plain.path} {spec.path}: the two runs sent different prompts (no request with "
                          "the same prompt in both); give two runs of the same prompts (the same --input-file)")
    return pairs, lines


def _name(k: tuple) -> str:
    return f"conversation {k[0]}" + (f" turn {k[1]}" if k[1] else "")


STOPS = {"stop": "stop_token", "length": "max_new_tokens"}  # the server's finish_reason, as our client names it


def stop_reason(record: dict, raw: dict | None) -> str | None:
    """Why the server stopped, from its last chunk's finish_reason where AIPerf's raw export holds the
    response (read as our client reads a stream); None where it does not: AIPerf's records do not say,
    and a request may have stopped at EOS as well as at its length."""
    return STOPS.get(streamed(record, raw).finish_reason or "") if raw else None


def request(record: dict, system: str, method: str, cat: str, temperature: float, concurrency: int,
            sent: str | None, wave: str, question: str, raw: dict | None = None) -> dict:
    """One AIPerf record as a request record of ours (the fields the summary and notebooks read), under
    the id (`question`) it pairs by."""
    meta, metrics = record["metadata"], record.get("metrics") or {}
    def value(name: str):
        return (metrics.get(name) or {}).get("value")

    conversation, turn = question, key(record)[1]
    ttft, itl = value("time_to_first_token"), value("inter_chunk_latency") or []
    out_tokens = int(value("usage_completion_tokens") or value("output_sequence_length") or 0)
    e2el_s = (ttft + sum(itl)) / 1e3 if ttft is not None else (meta["request_end_ns"] - meta["request_start_ns"]) / 1e9
    spec = dict(record.get("spec_decode_acceptance") or {})
    if isinstance(spec.get("acceptance_histogram"), dict):  # (AIPerf keeps vLLM's histogram list as {"j": steps})
        hist = {int(j): n for j, n in spec["acceptance_histogram"].items()}
        spec["acceptance_histogram"] = [hist.get(j, 0) for j in range(max(hist) + 1)] if hist else []
    accepted = request_acceptance(spec) if method != "plain" else {"acceptance_source": None}
    failed = record.get("error")
    return {"system": system, "method": method, "question_id": conversation, "category": cat, "turn": turn,
            "temperature": temperature, "seed": None, "prompt_tokens": value("input_sequence_length"),
            "prompt_sha256": sent or hashlib.sha256(f"{conversation}/{turn}".encode()).hexdigest(),
            "output_tokens": 0 if failed else out_tokens, "output_ids": None, "output_text": None,
            "stop_reason": "failed" if failed else stop_reason(record, raw),
            "acceptance_lengths": accepted.get("acceptance_lengths", []),
            "proposal_lengths": accepted.get("proposal_lengths", []),
            "accepted_counts": accepted.get("accepted_counts", []), "num_rounds": None, "round_ms": {},
            "draft_margins": None, "draft_confidences": None, "peak_memory_bytes": None, "load_avg": None,
            "contention": None, "time_utc": meta["request_end_ns"] / 1e9,
            **request_latencies(None if ttft is None else ttft / 1e3, e2el_s - (ttft or 0.0) / 1e3, out_tokens),
            "acceptance_source": accepted["acceptance_source"], "acceptance_totals": accepted.get("acceptance_totals"),
            "itl_ms": list(itl), "usage_output_tokens": value("usage_completion_tokens"),
            "max_concurrency": concurrency, "wave": wave, "start_utc": meta["request_start_ns"] / 1e9,
            "matches_baseline": None, **({"failed": True, "error": f"AIPerf: {json.dumps(failed)[:300]}"} if failed else {})}


def profiling_phase(config: dict) -> dict:
    """AIPerf's timed phase in its input config (kind `profiling`): its warm-up phase, where it ran one,
    comes first, at its own concurrency or rate. A config whose phases name no kind: its last."""
    phases = [p for p in config.get("phases") or [] if isinstance(p, dict)]
    return next((p for p in phases if p.get("kind") == "profiling"), phases[-1] if phases else {})


def speculative(folder: Folder) -> str | None:
    """What in a folder shows speculative decoding (vLLM's per-request figures in AIPerf's records, or the
    server's spec-decode counters in its scrape), None where nothing does."""
    if any(r.get("spec_decode_acceptance") for r in folder.records):
        return "its records carry spec_decode_acceptance"
    return "its server metrics hold vllm:spec_decode counters" if exported_counters(folder.server) else None


def check_order(plain: Folder, spec: Folder) -> None:
    """Refuse the folders swapped, or two of one kind: the speedup is plain decoding's over the second's,
    so a speculative first folder would be labelled plain, and two plain runs give a speedup of nothing."""
    said, none = speculative(plain), speculative(spec)
    if said or not none:
        what = (f"{plain.path} shows speculative decoding ({said})" if said else
                f"{spec.path} shows no speculative decoding (no spec_decode_acceptance, no vllm:spec_decode counters)")
        raise DSparkError(f"--aiperf: {what}; give plain decoding's folder first, the speculative run's second: "
                          "dspark-bench report --aiperf PLAIN_DIR SPEC_DIR")


def schedule(folder: Folder, system: str) -> tuple[int, dict, list[str]]:
    """A run's level (its profiling phase's concurrency; a rate phase with no cap: its request count, all
    may be in flight), its rate for the wave record, and what the tables' titles must say of it: the rate,
    and a temperature AIPerf did not send."""
    phase, said = profiling_phase(folder.config), []
    rate = phase.get("rate")
    paced = {} if rate is None else {"request_rate": rate, "arrival": phase.get("type"),
                                     "burstiness": phase.get("smoothness", 1.0 if phase.get("type") == "poisson" else None)}
    if rate is not None:
        said.append(f"{system} at {rate:g} req/s ({phase.get('type')} arrivals"
                    + (f", at most {phase['concurrency']} in flight)" if phase.get("concurrency") else ", no cap)"))
    if "temperature" not in ((folder.config.get("endpoint") or {}).get("extra") or {}):
        said.append(f"{system}: no temperature sent (the server's default, unknown; T=1 shown)")
    return int(phase.get("concurrency") or len(folder.records)), paced, said


def write_run(plain: Folder, spec: Folder, out: Path) -> list[str]:
    """Both runs as one run folder in `out` (systems `plain` and the speculative folder's name); returns
    the lines naming the requests that did not pair."""
    check_order(plain, spec)
    pairs, lines = pair(plain, spec)
    name = spec.path.resolve().name if spec.path.resolve().name != "plain" else "speculative"
    requests, waves, notes = [], [], []
    for side, (folder, system, method) in enumerate(((plain, "plain", "plain"), (spec, name, "speculative"))):
        config = folder.config
        temperature = float(((config.get("endpoint") or {}).get("extra") or {}).get("temperature", 1.0))
        concurrency, paced, said = schedule(folder, system)
        notes += said
        cat, wave = category(config), f"aiperf-{system}"
        of_row = {} if cat else file_categories(config, folder.path)
        mine = [request(r, system, method, of_row.get(key(r)[0], cat or "all"), temperature, concurrency,
                        folder.sent.get(key(r)), wave, question, folder.raw.get(r["metadata"].get("x_request_id")))
                for r, question in ((p[side], p[2]) for p in pairs)]
        requests += mine
        counters = exported_counters(folder.server)
        check = wave_check([r["acceptance_totals"] for r in mine if not r.get("failed")], counters) \
            if method != "plain" else None
        waves.append({"wave": wave, "system": system, "max_concurrency": concurrency, "temperature": temperature,
                      "turn": 0, "requests": len(mine), **paced, **({"spec_counters": counters,
                                                                      "counters_source": THEIR_SCRAPE}
                                                           if counters else {}),
                      **({"acceptance_check": check} if check else {})})
    config = plain.config
    dataset = (config.get("datasets") or [{}])[0] or {}
    named = {"backend": "served (AIPerf artifact folders)", "device": "the server's (AIPerf records none)",
             "target": ((config.get("models") or {}).get("items") or [{}])[0].get("name"),
             "split": dataset.get("format") or dataset.get("dataset") or dataset.get("path"),
             "categories": sorted({r["category"] for r in requests})}  # (what the report's captions name)
    first = min(r["start_utc"] for r in requests)  # (the headline's date: when the first timed request went)
    manifest = {"settings": {"load_generator": "aiperf", **named, "systems": ["plain", name], **settings(config)},
                "options": {"systems": ["plain", name]},
                "provenance": {"time_utc": datetime.fromtimestamp(first, UTC).isoformat(timespec="seconds")},
                "backend": {"name": "aiperf artifact folders (no dspark-bench run)",
                            "load_generator": {"name": "aiperf", "version": plain.version, "notes": notes,
                                               "folders": {"plain": str(plain.path), name: str(spec.path)}}}}
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    (out / REQUESTS).write_text("".join(json.dumps(r) + "\n" for r in requests))
    (out / WAVES).write_text("".join(json.dumps(w) + "\n" for w in waves))
    return lines


def settings_differ(plain: Folder, spec: Folder) -> list[tuple[str, str, str]]:
    """(setting, plain's, the speculative run's) for each AIPerf setting that differs between the two runs
    (their AIPerf versions too), as `compare_runs.settings_diff` holds two runs of ours."""
    return settings_diff(*({"settings": {"aiperf_version": f.version, **settings(f.config)}} for f in (plain, spec)))

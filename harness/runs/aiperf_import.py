"""Two AIPerf artifact folders a user made alone (`aiperf profile` against a plain server, then a
speculative one, the same prompts) as one run folder of ours, so `report --aiperf PLAIN SPEC` shows them
with our tables, intervals, per-category rows and HTML report, never a second copy of that code.

Why this shape:
- A run folder (manifest, `requests.jsonl`, `waves.jsonl`) is what every reader of ours reads; writing
  one from AIPerf's exports (in a temporary folder the report reads and drops) keeps one summary, one
  interval and one notebook path for both load generators.
- Requests are paired by what they sent: AIPerf's conversation id and turn, and the payload its
  `inputs.json` holds for them (messages or prompt); a conversation only one run sent, or sent with a
  different prompt, is left out and named in one line; no conversation in common is a refusal.
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
from pathlib import Path

from dspark.errors import DSparkError
from harness.analysis.compare_runs import settings_diff
from harness.analysis.metrics import request_latencies
from harness.analysis.records import MANIFEST, REQUESTS, WAVES
from harness.backends.served.acceptance import request_acceptance, wave_check
from harness.backends.served.aiperf import RECORDS, SERVER_METRICS, THEIR_SCRAPE
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
    try:
        profile = json.loads((path / PROFILE).read_text())
        records = [json.loads(line) for line in (path / RECORDS).read_text().splitlines() if line.strip()]
        inputs = json.loads((path / INPUTS).read_text()) if (path / INPUTS).is_file() else {"data": []}
        server = json.loads((path / SERVER_METRICS).read_text()) if (path / SERVER_METRICS).is_file() else None
    except ValueError as exc:
        raise DSparkError(f"--aiperf {path}: an export is not JSON ({exc}); give the folder as aiperf wrote it") from None
    sent = {}
    for session in inputs.get("data") or []:
        for turn, payload in enumerate(session.get("payloads") or []):
            said = payload.get("messages", payload.get("prompt"))
            sent[(str(session.get("session_id")), turn)] = hashlib.sha256(json.dumps(said).encode()).hexdigest()
    timed = [r for r in records if (r.get("metadata") or {}).get("benchmark_phase", "profiling") == "profiling"]
    return Folder(path, profile, timed, sent, server)


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
    meta = record["metadata"]
    return str(meta.get("conversation_id")), int(meta.get("turn_index") or 0)


def pair(plain: Folder, spec: Folder) -> tuple[set[tuple], list[str]]:
    """The requests both runs sent alike (conversation, turn), and one line for each that does not pair;
    none in common is a refusal: two runs of different prompts."""
    a, b = {key(r) for r in plain.records}, {key(r) for r in spec.records}
    lines, same = [], set()
    for k in sorted(a | b):
        name = f"conversation {k[0]}" + (f" turn {k[1]}" if k[1] else "")
        if k not in a or k not in b:
            which = f"the plain run ({plain.path})" if k in a else f"the speculative run ({spec.path})"
            lines.append(f"{name}: only in {which}; left out")
        elif plain.sent.get(k) != spec.sent.get(k):
            lines.append(f"{name}: the two runs sent different prompts under this id; left out")
        else:
            same.add(k)
    if not same:
        raise DSparkError(f"--aiperf {plain.path} {spec.path}: the two runs sent different prompts (no conversation "
                          "with the same prompt in both); give two runs of the same prompts (the same --input-file)")
    return same, lines


def request(record: dict, system: str, method: str, cat: str, temperature: float, concurrency: int,
            sent: str | None, wave: str) -> dict:
    """One AIPerf record as a request record of ours (the fields the summary and notebooks read)."""
    meta, metrics = record["metadata"], record.get("metrics") or {}
    def value(name: str):
        return (metrics.get(name) or {}).get("value")

    conversation, turn = key(record)
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
            "stop_reason": "failed" if failed else "max_new_tokens",
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


def write_run(plain: Folder, spec: Folder, out: Path) -> list[str]:
    """Both runs as one run folder in `out` (systems `plain` and the speculative folder's name); returns
    the lines naming the requests that did not pair."""
    same, lines = pair(plain, spec)
    name = spec.path.resolve().name if spec.path.resolve().name != "plain" else "speculative"
    requests, waves = [], []
    for folder, system, method in ((plain, "plain", "plain"), (spec, name, "speculative")):
        config = folder.config
        temperature = float(((config.get("endpoint") or {}).get("extra") or {}).get("temperature", 1.0))
        concurrency = int(((config.get("phases") or [{}])[0] or {}).get("concurrency") or 1)
        cat, wave = category(config), f"aiperf-{system}"
        of_row = {} if cat else file_categories(config, folder.path)
        mine = [request(r, system, method, of_row.get(key(r)[0], cat or "all"), temperature, concurrency,
                        folder.sent.get(key(r)), wave) for r in folder.records if key(r) in same]
        requests += mine
        counters = exported_counters(folder.server)
        check = wave_check([r["acceptance_totals"] for r in mine if not r.get("failed")], counters) \
            if method != "plain" else None
        waves.append({"wave": wave, "system": system, "max_concurrency": concurrency, "temperature": temperature,
                      "turn": 0, "requests": len(mine), **({"spec_counters": counters, "counters_source": THEIR_SCRAPE}
                                                           if counters else {}),
                      **({"acceptance_check": check} if check else {})})
    config = plain.config
    dataset = (config.get("datasets") or [{}])[0] or {}
    named = {"backend": "served (AIPerf artifact folders)", "device": "the server's (AIPerf records none)",
             "target": ((config.get("models") or {}).get("items") or [{}])[0].get("name"),
             "split": dataset.get("format") or dataset.get("dataset") or dataset.get("path"),
             "categories": sorted({r["category"] for r in requests})}  # (what the report's captions name)
    manifest = {"settings": {"load_generator": "aiperf", **named, **settings(config)},
                "options": {"systems": ["plain", name]},
                "backend": {"name": "aiperf artifact folders (no dspark-bench run)",
                            "load_generator": {"name": "aiperf", "version": plain.version,
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

"""What a run will cost before it starts (`run --dry-run`): its requests and output tokens, and the time
they should take, from what was measured before on a machine of this kind. In order:

1. Earlier runs of the same target, backend, device and dtype on a machine of this kind (the same GPU;
   on a CPU, the same processor and core count), unprofiled, in the working folder's results/ or the
   checkout's results/ and benchmarks/results/: each system's time per output token at its temperature and
   concurrency level (its requests' in-flight time over their output tokens), from the run whose settings are
   closest (`distance`; the newest among equals) that has it. The newest run alone misled: a run at another
   output length or thread count times its tokens differently (54 s estimated from it, 37 s measured).
2. Else, for our engine, an `engine-bench --json` measurement on this GPU (or CPU) of a target of the
   same shape (random weights, one context length) in the checkout's benchmarks/results/: plain decoding a
   decode step per token; a drafter of the bench's method and block a verify round per token at most
   (nothing accepted) and per block + 1 tokens at least (everything accepted).
3. Else no estimate, said so.

Loading the models, the warm-up and a server's start are never counted: the figure is the timed part.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

from dspark.errors import DSparkError
from harness.analysis.records import read_manifest
from harness.runs.plan import RESULTS

CHECKOUT = Path(__file__).resolve().parents[2]  # the source tree, when this runs from one (not an installed wheel)


def run_size(settings: dict, jobs: list[tuple] | None, prompts: int | None) -> dict:
    """The run's size: prompts, user turns, requests (turns x temperatures x systems x levels) and output
    tokens (every request output_len tokens: exact with --ignore-eos, else a bound); None where the
    prompts are not known."""
    levels = settings.get("max_concurrency", [1])
    turns = None if jobs is None else len({(j[3].question_id, j[4]) for j in jobs})
    requests = None if jobs is None else len(jobs)
    return {"prompts": prompts, "user_turns": turns, "temperatures": len(settings["temperatures"]),
            "systems": len(settings["systems"]), "concurrency_levels": len(levels), "requests": requests,
            "requests_per_prompt_turn": len(settings["temperatures"]) * len(settings["systems"]) * len(levels),
            "output_len": settings["output_len"],
            "output_tokens": None if requests is None else requests * settings["output_len"],
            "output_tokens_exact": bool(settings["ignore_eos"])}


def machine_of(device: str) -> dict:
    """This machine as run manifests record it (`provenance.device_info`): the GPU's name on a GPU; the
    processor and usable cores on a CPU."""
    from harness.runs.provenance import device_info

    info = device_info(device)
    return {"gpu": info.get("gpu")} if device.startswith("cuda") else {"cpu": info["cpu"], "cores": info["cores"]}


def _same_machine(provenance: dict, machine: dict) -> bool:
    return all(provenance.get(k) == v for k, v in machine.items())


def _roots() -> list[Path]:
    """Where earlier runs may be: results/ of the working folder, results/ and benchmarks/results/ of the checkout."""
    found = []
    for root in (RESULTS, CHECKOUT / RESULTS, CHECKOUT / "benchmarks" / "results"):
        if root.is_dir() and root.resolve() not in found:
            found.append(root.resolve())
    return found


# settings whose difference counts 1 in `distance` (the output length and thread count count by their ratio)
SAME = ("device", "systems", "split", "ignore_eos", "turns", "compile", "acceptance", "engine_args")


def distance(was: dict, was_threads: int | None, settings: dict, threads: int | None) -> tuple[float, list[str]]:
    """How far an earlier run's settings (`was`, and the thread count it ran at) are from this run's: the
    target, backend, dtype and machine are the same already (else it is no source). Each setting of `SAME`
    that differs counts 1 (the device's index, the set of systems, the split, --ignore-eos, the turns,
    --compile, synthetic acceptance, vLLM's engine arguments); the output length counts the doublings
    between the two, |log2(was / now)| (a cache and attention that grow with it); the thread count twice
    its doublings (on a CPU it changes a step's time more than anything else: `benchmarks/threads.py`).
    Temperatures and concurrency levels are matched per system, not here. Returns (distance, what differs,
    as `name was (this run now)`)."""
    far, differs = 0.0, []
    for key in SAME:
        if (was.get(key) or None) != (settings.get(key) or None) and not (
                key == "systems" and set(was.get(key) or ()) == set(settings.get(key) or ())):
            far += 1
            differs.append(f"{key} {json.dumps(was.get(key))} (this run {json.dumps(settings.get(key))})")
    for key, now, then, weight in (("output_len", settings.get("output_len"), was.get("output_len"), 1),
                                   ("threads", threads, was_threads, 2)):
        if now and then and now != then:
            far += weight * abs(math.log2(then / now))
            differs.append(f"{key} {then} (this run {now})")
    return far, differs


def earlier_runs(settings: dict, machine: dict, threads: int | None = None) -> list[dict]:
    """Finished or partial runs like this one (see the module's first way), closest settings first
    (`distance`), the newest first among equals: {path, when, rows (their summary's overall rows),
    distance, differs}. `threads`: the count this run would use."""
    runs = []
    for root in _roots():
        for summary_file in root.rglob("summary.json"):
            try:  # (a damaged earlier run is no source: skipped)
                manifest = read_manifest(summary_file.parent)
                summary = json.loads(summary_file.read_text())
            except (DSparkError, OSError, ValueError):
                continue
            if manifest is None or not isinstance(summary, dict):
                continue
            was, prov = manifest.get("settings") or {}, manifest.get("provenance") or {}
            if manifest.get("profiled") or not _same_machine(prov, machine) or any(
                    was.get(k) != settings[k] for k in ("target", "backend", "dtype")) or \
                    str(was.get("device", "")).startswith("cuda") != settings["device"].startswith("cuda"):
                continue
            rows = [r for r in summary.get("rows", []) if r.get("category") == "overall"
                    and r.get("duration_s") and r.get("output_tokens")]
            if rows:
                far, differs = distance(was, (manifest.get("threads") or {}).get("count"), settings, threads)
                runs.append({"path": summary_file.parent, "when": prov.get("time_utc") or "", "rows": rows,
                             "distance": far, "differs": differs})
    runs.sort(key=lambda r: r["when"], reverse=True)  # (a stable sort: the newest first among equals)
    return sorted(runs, key=lambda r: r["distance"])


def _from_runs(group: tuple, runs: list[dict]) -> tuple[float, dict] | None:
    """Seconds per output token of (system, temperature, level) from the first of `runs` (the closest) that
    timed the system at that level (at the nearest temperature), and that run."""
    system, temp, level = group
    for run in runs:
        rows = [r for r in run["rows"] if r["system"] == system and r.get("max_concurrency", 1) == level]
        if rows:
            row = min(rows, key=lambda r: abs(r["temperature"] - temp))
            return row["duration_s"] / row["output_tokens"], run
    return None


def engine_costs(target_cfg, machine: dict, dtype: str) -> dict | None:
    """The newest `engine-bench --json` measurement in the checkout's benchmarks/results/ on this machine, of a
    target shaped as `target_cfg`, at `dtype`: {path, when, decode_ms, round_ms, method, block}."""
    from dspark.synthetic.presets import DRAFTS, TARGETS

    found = []
    for path in sorted((CHECKOUT / "benchmarks" / "results").glob("*.json")):
        try:
            bench = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        prov = bench.get("provenance") if isinstance(bench, dict) else None
        args = (prov or {}).get("arguments") or {}
        if not prov or "decode_ms" not in bench or not _same_machine(prov, machine) or args.get("dtype") != dtype:
            continue
        shape = TARGETS.get(args.get("target"))
        if shape is None or shape.backbone != target_cfg.backbone:
            continue
        draft = DRAFTS[args["draft"]]() if args.get("draft") in DRAFTS and bench.get("round_ms") else None
        found.append({"path": path, "when": prov.get("time_utc") or "", "decode_ms": bench["decode_ms"],
                      "round_ms": bench.get("round_ms"), "method": draft.method if draft else None,
                      "block": draft.num_drafts if draft else None, "context_len": args.get("context_len")})
    return max(found, key=lambda b: b["when"]) if found else None


def _from_engine(system: dict, bench: dict) -> tuple[float, float] | None:
    """Seconds per output token of a resolved system (`systems.resolve_system`) from step costs: a range."""
    if system["method"] == "plain":
        return bench["decode_ms"] / 1e3, bench["decode_ms"] / 1e3
    if bench["round_ms"] and system["method"] == bench["method"] and system.get("num_speculative_tokens") == \
            bench["block"]:
        return bench["round_ms"] / 1e3 / (bench["block"] + 1), bench["round_ms"] / 1e3
    return None


def estimate(settings: dict, jobs: list[tuple], systems: list[dict], target_cfg, machine: dict,
             dtype: str, threads: int | None = None) -> dict:
    """The time of `jobs`, every request taken at output_len tokens: {seconds: [low, high] of the requests
    with a figure, requests (those), of (all), ways (earlier runs, engine-bench), sources, missing (the
    system x temperature x level groups with no figure), caveats}. `systems`: the resolved systems (the
    dry run's rows); `dtype` and `threads`: what the run would use. Each source says how its settings differ
    from this run's (`differs`) and how many earlier runs were weighed."""
    groups = Counter((j[0], j[2], j[1]) for j in jobs)
    runs = earlier_runs(settings, machine, threads)
    by_name = {s["system"]: s for s in systems}
    bench = engine_costs(target_cfg, machine, dtype) if settings["backend"] == "native" and not all(
        _from_runs(g, runs) for g in groups) else None
    low = high = 0.0
    done, ways, sources, missing = 0, [], {}, []
    for (system, temp, level), n in groups.items():
        measured = _from_runs((system, temp, level), runs)
        span = (measured[0], measured[0]) if measured else \
            _from_engine(by_name[system], bench) if bench and system in by_name else None
        if span is None:
            missing.append(f"{system} T={temp:g}" + (f" c={level}" if level != 1 else ""))
            continue
        source, way = (measured[1], "earlier runs") if measured else (bench, "engine-bench")
        sources[str(source["path"])] = {"measured_utc": source["when"], "way": way, "differs": source.get("differs", [])}
        ways += [way] if way not in ways else []
        tokens = n * settings["output_len"]
        low, high, done = low + tokens * span[0], high + tokens * span[1], done + n
    caveats = ["loading, warm-up and a server's start are not counted"]
    if not settings["ignore_eos"]:
        caveats.append("every reply is taken at output-len tokens: less where replies end sooner")
    if "earlier runs" in ways:
        caveats.append("an earlier run's prompts, reply lengths, acceptance and machine load were not this run's")
    if "engine-bench" in ways:
        caveats.append(f"engine-bench times a step alone (random weights, context {bench['context_len']}): no host "
                       "work between steps, no prefill; a drafter's range spans every draft accepted to none")
    return {"seconds": [low, high] if done else None, "requests": done, "of": len(jobs), "ways": ways,
            "sources": [{"path": p, **v} for p, v in sources.items()], "earlier_runs": len(runs), "missing": missing,
            "machine": machine, "caveats": caveats}

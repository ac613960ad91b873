"""Run folders of every kind `dspark-bench run` writes, built in Python (no engine, no model): records
shaped like the runner's (`harness.runs.runner._record` and `_failed`), a manifest with its plan and
provenance, and a served run's waves. Cheap enough for the report's tests to cover each kind."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from harness.analysis.summary import expected_requests

DRAFTS = 7  # drafts a round proposes


def _rounds(seed: str, n: int) -> tuple[list[int], list[int]]:
    """Proposals and accepted drafts of `n` rounds: mostly short accepts, now and then a long one."""
    rng = random.Random(seed)
    accepted = [min(DRAFTS, int(rng.expovariate(0.7))) for _ in range(n)]
    return [DRAFTS] * n, accepted


def native(system: str, qid: str, tpot: float, temperature: float = 0.0, category: str = "coding",
           method: str | None = None, rounds: int = 20, contended: bool = False, **extra) -> dict:
    """A finished request of the native engine: rounds (plain decoding: none), timings, token ids."""
    method = method or ("plain" if system == "plain" else system)
    proposed, accepted = _rounds(f"{system}{qid}{temperature}", rounds) if method != "plain" else ([], [])
    tokens = 40  # (every system the same greedy output: equal to plain decoding's)
    record = {
        "system": system, "method": method, "question_id": qid, "category": category, "turn": 0,
        "temperature": temperature, "seed": 7, "prompt_tokens": 30, "prompt_sha256": hashlib.sha256(qid.encode()).hexdigest(),
        "output_tokens": tokens, "output_ids": list(range(tokens)), "output_text": "x" * tokens,
        "stop_reason": "max_new_tokens", "acceptance_lengths": [a + 1 for a in accepted], "proposal_lengths": proposed,
        "accepted_counts": accepted, "num_rounds": len(accepted), "ttft_ms": 12.0, "tpot_ms": tpot,
        "e2el_ms": 12.0 + tpot * (tokens - 1),
        "round_ms": {"decode": [tpot] * 3} if method == "plain" else {"propose": [1.0], "verify": [2.0], "host": [0.1]},
        "draft_margins": None, "acceptance_source": None if method == "plain" else "rounds", "acceptance_totals": None,
        "matches_baseline": None if method == "plain" or temperature else True, "time_utc": 1.0e9,
        "max_concurrency": 1, "wave": f"w-{system}-{qid}", "start_utc": 1.0e9, "peak_memory_bytes": None,
        "load_avg": [0.4, 0.5],
        "contention": {"wall_s": 0.2, "cpu_s": 0.1 if contended else 0.19, "cpu_share": 0.5 if contended else 0.95,
                       "cores": 2, "other_cores": 1.4 if contended else 0.0, "idle_cores": 0.0 if contended else 1.0,
                       "stall_share": 0.5 if contended else 0.0, "contended": contended},
    }
    return record | extra


def failed(system: str, qid: str, temperature: float = 0.0, category: str = "coding", method: str | None = None,
           concurrency: int = 1) -> dict:
    """A request that did not finish, as the runner records it."""
    return {"system": system, "method": method or system, "question_id": qid, "category": category, "turn": 0,
            "temperature": temperature, "max_concurrency": concurrency, "failed": True,
            "error": "timed out after 5 s", "output_tokens": 0, "output_ids": None, "acceptance_lengths": [],
            "proposal_lengths": [], "accepted_counts": [], "round_ms": {}, "ttft_ms": None, "tpot_ms": None,
            "e2el_ms": None, "matches_baseline": None, "time_utc": 1.0e9}


def vllm_totals(system: str, qid: str, temperature: float = 0.0, category: str = "coding") -> dict:
    """A vLLM offline request: token ids, no first-token time (so no TPOT), acceptance as totals only."""
    plain = system == "plain"
    record = native(system, qid, 5.0, temperature, category, rounds=0, method="plain")  # (its token ids)
    return record | {"method": system, "acceptance_lengths": [], "proposal_lengths": [], "accepted_counts": [], "num_rounds": 0,
                     "ttft_ms": None, "tpot_ms": None, "round_ms": {}, "contention": None,
                     "acceptance_source": None if plain else "vllm totals",
                     "acceptance_totals": None if plain else {"num_spec_steps": 20, "num_draft_tokens": 140,
                                                              "num_accepted_draft_tokens": 30,
                                                              "accepted_per_pos": [14, 8, 4, 2, 1, 1, 0]}}


def served(system: str, qid: str, concurrency: int, tpot: float, start: float) -> dict:
    """A request to a vLLM server at a concurrency level: acceptance from the wave's counters."""
    plain = system == "plain"
    record = native(system, qid, tpot, rounds=0, method="plain" if plain else "ngram")
    return record | {"acceptance_lengths": [], "proposal_lengths": [], "accepted_counts": [], "num_rounds": 0,
                     "round_ms": {}, "max_concurrency": concurrency, "wave": f"{system}{concurrency}",
                     "start_utc": start, "itl_ms": [tpot] * 5, "contention": None,
                     "acceptance_source": None if plain else "server counters (wave)", "matches_baseline": None}


def manifest(records: list[dict], *, systems: list[str], temperatures=(0.0,), categories=("coding",),
             prompts: int | None = None, backend: str = "native", concurrency=(1,), device: str = "cpu") -> dict:
    """A run's manifest: settings, plan and provenance. The plan is `prompts` per system x temperature x
    category x level (default: as many as recorded)."""
    n = prompts or max(1, len({r["question_id"] for r in records}) // max(1, len(categories)))
    plan = expected_requests([(s, t, c, k) for s in systems for t in temperatures for c in categories
                              for k in concurrency for _ in range(n)])
    return {"settings": {"backend": backend, "target": "demo", "split": "qualitative",
                         "categories": list(categories), "systems": systems, "temperatures": list(temperatures),
                         "num_prompts": n, "device": device},
            "provenance": {"time_utc": "2026-01-02T03:04:05+00:00", "git": {"commit": "0123456789abcdef", "dirty": True},
                           "device": device, "cpu": "x86_64", "cores": 2},
            "requests_expected": plan}


def write(path: Path, records: list[dict], *, waves: list[dict] | None = None, **plan) -> Path:
    """A run folder: manifest.json (`manifest`, of `plan`'s keywords), requests.jsonl, and waves.jsonl if given."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "manifest.json").write_text(json.dumps(manifest(records, **plan)))
    (path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if waves is not None:
        (path / "waves.jsonl").write_text("".join(json.dumps(w) + "\n" for w in waves))
    return path


QIDS = ("q1", "q2", "q3", "q4")
MANY = tuple(f"q{i}" for i in range(1, 9))  # enough prompt pairs for a speedup's interval (metrics.MIN_PAIRS)


def plain_only(root: Path) -> Path:
    """`run --systems plain`."""
    return write(root / "plain-only", [native("plain", q, 5.0 + i / 10, t) for t in (0.0, 1.0)
                                       for i, q in enumerate(QIDS)], systems=["plain"], temperatures=(0.0, 1.0))


def no_plain(root: Path) -> Path:
    """`run --systems dspark`: acceptance, no speedup."""
    return write(root / "no-plain", [native("dspark", q, 4.0) for q in QIDS], systems=["dspark"])


def interrupted(root: Path) -> Path:
    """Ctrl-C during the first prompt: one plain request of the eight planned."""
    return write(root / "interrupted", [native("plain", "q1", 5.0)], systems=["plain", "dspark"], prompts=4)


def empty(root: Path) -> Path:
    """Ctrl-C before any request finished (during warm-up): the folder as the runner made it
    (`RunFolder.create`), its manifest and an empty requests.jsonl."""
    from harness.runs.folder import RunFolder

    path = root / "empty"
    RunFolder(path).create(manifest([], systems=["plain", "dspark"], prompts=2))
    return path


def mixed(root: Path) -> Path:
    """plain, dspark (two categories of 4 prompts, one request failed, some contended) and dflash (no clear
    speedup at T = 0, one prompt pair at T = 1: too few for an interval), unfinished: the headline's every
    kind of verdict."""
    records = []
    for t in (0.0, 1.0):
        for i, (q, cat) in enumerate(zip(MANY, ("coding",) * 4 + ("math",) * 4)):
            records.append(native("plain", q, 10.0 + i, t, cat))
            if (q, t) != (MANY[-1], 1.0):
                records.append(native("dspark", q, (5.0 if t == 0 else 12.0) + i / 2, t, cat, contended=i == 1))
            else:
                records.append(failed("dspark", q, t, cat))
            if t == 0:  # half the prompts faster, half slower: no clear speedup
                records.append(native("dflash", q, (5.0 if i % 2 == 0 else 20.0) + i / 10, t, cat))
            elif q == "q1":  # one prompt pair: no interval
                records.append(native("dflash", q, 9.0, t, cat))
    return write(root / "mixed", records, systems=["plain", "dspark", "dflash"], temperatures=(0.0, 1.0),
                 categories=("coding", "math"), prompts=4)


def vllm(root: Path) -> Path:
    """`--backend vllm`: totals only, no TPOT, at T = 0."""
    return write(root / "vllm", [vllm_totals(s, q) for s in ("plain", "dspark") for q in QIDS[:2]],
                 systems=["plain", "dspark"], backend="vllm", device="cuda")


def sweep(root: Path) -> Path:
    """`--backend vllm-server --max-concurrency 1,4`: waves of 6 prompts with the server's counters, one
    request failed (so 5 prompt pairs at 4: too few for an interval)."""
    prompts = MANY[:6]
    records = [served("plain", q, 1, 10.0, 100.0 + i) for i, q in enumerate(prompts)]
    records += [served("plain", q, 4, 20.0, 200.0) for q in prompts]
    records += [served("ngram", q, 1, 6.0, 300.0 + i) for i, q in enumerate(prompts)]
    records += [served("ngram", q, 4, 15.0, 400.0) for q in prompts if q != "q2"]
    records += [failed("ngram", "q2", method="ngram", concurrency=4) | {"wave": "ngram4"}]
    waves = [{"wave": f"{s}{k}", "system": s, "max_concurrency": k, "temperature": 0.0, "turn": 0, "requests": 6,
              **({"spec_counters": {"num_spec_steps": 30, "num_draft_tokens": 120, "num_accepted_draft_tokens": 24,
                                    "accepted_per_pos": [12, 7, 4, 1]}} if s == "ngram" else {})}
             for s in ("plain", "ngram") for k in (1, 4)]
    return write(root / "sweep", records, systems=["plain", "ngram"], backend="vllm-server", concurrency=(1, 4),
                 waves=waves, device="cuda")


def older(root: Path) -> Path:
    """A run written before requests recorded their contention, concurrency, wave or seed, whose manifest has
    no plan or provenance: still read, its figures as they were."""
    old_keys = ("contention", "max_concurrency", "wave", "start_utc", "seed", "accepted_counts")
    records = [{k: v for k, v in native(s, q, tpot).items() if k not in old_keys}
               for q in QIDS for s, tpot in (("plain", 5.0), ("dspark", 4.0))]
    path = write(root / "older", records, systems=["plain", "dspark"])
    (path / "manifest.json").write_text(json.dumps({"settings": {"backend": "native", "split": "qualitative"}}))
    return path


KINDS = {"plain_only": plain_only, "no_plain": no_plain, "interrupted": interrupted, "empty": empty,
         "mixed": mixed, "vllm": vllm, "sweep": sweep, "older": older}


def cpu_profile(root: Path) -> Path:
    """A CPU torch profile folder: `<system>.summary.json` with step ranges, host operators and no GPU
    kernels."""
    path = root / "cpu-profile"
    path.mkdir(parents=True, exist_ok=True)
    for system in ("plain", "dspark"):
        summary = {"nvtx": [{"range": "decode" if system == "plain" else "verify", "instances": 40,
                             "total_ns": 4.0e8, "avg_ns": 1.0e7}], "kernels": None, "categories": None,
                   "launches": {"kernels": 0, "graph_launches": 0}, "diagnosis": [],
                   "host": {"operators": [{"name": name, "calls": 40, "self_ns": ns, "prefill_ns": 0, "share": share}
                                          for name, ns, share in (("aten::mm", 3.0e8, 0.6), ("aten::add", 2.0e8, 0.4))],
                            "self_ns": 5.0e8, "thread_ns": 6.0e8, "prefill_ns": 0}}
        (path / f"{system}.summary.json").write_text(json.dumps(summary))
    return path

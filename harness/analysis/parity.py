"""Parity of two runs of the same prompts and systems (`dspark-bench parity`): per system and
temperature, the inputs and greedy outputs compared, rounds and accepted drafts side by side per
prompt and per position, and each divergence named by its kind:

- accounting: the engines did the same work and count it differently (an n-gram step that proposed
  nothing is a round for one engine and not the other; a last round whose accepted drafts include the
  stop token counted past it);
- numerics: at the first round where the proposals differ, our engine's draft picked its token by a
  top-2 logit margin within float error of the run's dtype (either engine could flip it);
- semantics: the proposals differ by more than float error; the engines compute different drafts
  (our engine is checked token- and round-exact against DeepSeek's reference, so the other one
  departs from it), or, for n-gram, their lookup rules differ;
- unclassified: the proposals differ and the native run recorded no margins (`--record-margins`).

Rounds align on the output: at T = 0 with equal outputs, round i of both engines starts at the same
token until the first round whose accepted count differs: the first round where the proposals differ
in what they let through (at slot min(accepted), the first slot one engine got right and the other
wrong). Two proposals that differ only past the first rejected slot accept alike and are not told
apart; neither engine reports its rejected drafts. A greedy output that differs is a divergence of the
targets (unclassified: no target margins are recorded).

At T > 0 a request's seed derives from the run seed, the prompt, the turn and the temperature, so two
runs of one engine with the same seeds must sample the same outputs (a resumed run relies on it):
each sampled request whose prompt and seed are equal in both runs is compared token for token, and
`sampled` says per temperature how many matched and where the first that did not departed. Two
different engines draw from different random streams: their sampled outputs are not expected to match.

The runs' settings are compared first, as `report A B` compares them (`compare_runs.settings_diff`).
Runs that asked for different requests (another target, dataset or output length, EOS ignored in
one) are refused in one line: a divergence between them would blame the engines for what the runs
asked. Settings that only choose which requests ran (prompts, categories, systems, temperatures,
turns, seed, levels) or say how they ran (backend, device, dtype, threads, engine arguments: what
parity exists to compare across) may differ: the runs are compared over the requests both ran,
prompt by prompt, and `settings_differ` names the differences. A system both ran must be one system
in both (method, draft, drafts per round, proposal-length policy), and have run one method in both: the
method an engine ran (`ran_method`: a vLLM engine's, read back from it, else its speculative config's) is
the one its divergences are named by, so the n-gram wording names only systems that ran n-gram lookup.
"""

from __future__ import annotations

from pathlib import Path

from dspark.dtypes import resolved_dtype
from dspark.errors import DSparkError
from harness.analysis.compare_runs import settings_diff, settings_line
from harness.analysis.metrics import acceptance, acceptance_from_totals, first_difference
from harness.analysis.records import MANIFEST, not_a_run, read_manifest, read_requests

KINDS = ("accounting", "numerics", "semantics", "unclassified")
# a greedy top-2 logit margin below this can be flipped by another engine's float error in that dtype
FLOAT_ERROR = {"float32": 1e-3, "bfloat16": 0.125, "float16": 0.0625}
# settings that may differ between the two runs (any other setting, a new one included, is refused):
# those that choose which requests ran (compared over the requests both ran, prompt by prompt, by id and
# by text) and those that say how they ran (what parity compares across)
CHOOSE_REQUESTS = ("experiment", "experiment_sha256", "split", "categories", "systems", "num_prompts",
                   "temperatures", "turns", "seed", "shuffle", "max_concurrency")
HOW_RUN = ("backend", "device", "dtype", "threads", "engine_args", "record_margins", "compile", "base_url", "model",
           "request_timeout", "request_rate", "burstiness")
# the flag that sets a refused setting, for the one-line fix
FIX = {"output_len": "--output-len", "ignore_eos": "--ignore-eos", "dataset_path": "--dataset-path",
       "dataset_revision": "--dataset-revision", "target": "--experiment", "dataset": "--experiment"}


def load_run(path: Path) -> tuple[dict, list[dict]]:
    path = Path(path)
    manifest = read_manifest(path)
    if manifest is None:
        why = f"no {MANIFEST}; not a run folder" if path.is_dir() else not_a_run(path)
        raise DSparkError(f"{path}: {why} (give the folders two `run`s wrote)")
    return manifest, read_requests(path)


def _describe(path: Path, manifest: dict) -> dict:
    settings, backend = manifest.get("settings", {}), manifest.get("backend", {})
    return {"path": str(path), "backend": settings.get("backend", "native"), "version": backend.get("version"),
            "device": settings.get("device"), "dtype": settings.get("dtype"),
            "engine_args": backend.get("engine_args"), "engines": backend.get("engines")}


def _dtype(run: dict) -> str:
    """The dtype the run computed in, as torch names it: what vLLM's engines resolved, else the setting
    (an alias such as bf16 named as torch does; auto as the engine resolves it on the run's device)."""
    for engine in (run.get("engines") or {}).values():
        return str(engine.get("dtype", "")).replace("torch.", "")
    return resolved_dtype(run["dtype"] or "auto", run["device"])


def _totals_only(record: dict) -> bool:
    return bool(record.get("acceptance_totals")) and not record.get("acceptance_lengths")


def _pooled(records: list[dict], as_totals: bool) -> dict:
    """Pooled acceptance of one side; `as_totals` (the other side, or this one, knows only totals): both
    as vLLM counts them, the steps that proposed drafts."""
    if as_totals:
        a = acceptance_from_totals([totals_of(r) for r in records])
    else:
        a = acceptance([n for r in records for n in r.get("acceptance_lengths") or []],
                       [d for r in records for d in r.get("proposal_lengths") or []],
                       [c for r in records for c in r.get("accepted_counts") or []])
    return {"rounds": a["num_rounds"], "accepted": a["spec_decode_num_accepted_tokens"],
            "acceptance_length": a["spec_decode_acceptance_length"],
            "accepted_per_position": a["spec_decode_num_accepted_tokens_per_pos"],
            "per_position_rates": a["spec_decode_per_position_acceptance_rates"]}


def totals_of(record: dict) -> dict:
    """A record's speculative totals as vLLM counts them: from its rounds where it has them (the rounds
    that proposed drafts), else the backend's own totals (vLLM 0.26 reports nothing per round)."""
    if not _totals_only(record):
        rounds = [(d, a) for d, a in zip(record.get("proposal_lengths") or [], record.get("accepted_counts") or [])
                  if d > 0]
        return {"num_spec_steps": len(rounds), "num_draft_tokens": sum(d for d, _ in rounds),
                "num_accepted_draft_tokens": sum(a for _, a in rounds),
                "accepted_per_pos": [sum(a > k for _, a in rounds) for k in range(max((d for d, _ in rounds),
                                                                                      default=0))]}
    return record["acceptance_totals"]


def _rounds_accepted(record: dict) -> list[int]:
    """[rounds, accepted drafts] of a record: its own rounds, else its backend's totals."""
    if not _totals_only(record):
        return [record["num_rounds"], sum(record.get("accepted_counts") or [])]
    t = record["acceptance_totals"]
    return [t.get("num_spec_steps") or 0, t.get("num_accepted_draft_tokens") or 0]


def _totals_divergences(ours: dict, theirs: dict, method: str, tol: float) -> list[dict]:
    """The first difference of two records when one side has only totals: steps, accepted drafts and
    accepted drafts per position compared; for the first position that differs, the round of ours most
    likely behind it (the smallest top-2 margin at that slot among the rounds that could have gone the
    other way) names numerics when that margin is within float error."""
    a, b = totals_of(ours), totals_of(theirs)
    width = max(len(a.get("accepted_per_pos") or []), len(b.get("accepted_per_pos") or []))
    pa, pb = ((list(t.get("accepted_per_pos") or []) + [0] * width)[:width] for t in (a, b))
    counts = [(t.get("num_spec_steps"), t.get("num_accepted_draft_tokens")) for t in (a, b)]
    if counts[0] == counts[1] and pa == pb:
        return []
    what = (f"steps that proposed drafts: ours {counts[0][0]}, theirs {counts[1][0]}; accepted drafts: ours "
            f"{counts[0][1]}, theirs {counts[1][1]}; per position ours {pa}, theirs {pb} (only totals are known for "
            "one side)")
    base = {"round": None, "token": None, "slot": None}
    if method == "ngram":
        return [base | {"kind": "semantics", "detail": f"the n-gram lookup rules differ: {what}"}]
    slot = next((k for k in range(width) if pa[k] != pb[k]), None)
    margins = ours.get("draft_margins") or []
    if slot is None or not margins:
        return [base | {"kind": "unclassified", "detail": what + ("" if margins else "; no margins recorded")}]
    # ours accepted slot `slot` in more rounds: one of those could have been rejected; in fewer: one it rejected there
    more = pa[slot] > pb[slot]
    candidates = [(m[slot], i) for i, (m, acc) in enumerate(zip(margins, ours.get("accepted_counts") or []))
                  if slot < len(m) and (acc > slot if more else acc == slot)]
    if not candidates:
        return [base | {"kind": "unclassified", "detail": what}]
    margin, i = min(candidates)
    kind = "numerics" if margin < tol else "unclassified"
    token = 1 + sum((ours.get("acceptance_lengths") or [])[:i])  # where that round starts in the output
    return [base | {"kind": kind, "round": i, "token": token, "slot": slot, "margin": margin, "detail": (
        f"{what}; the likeliest round of ours is {i}, whose top-2 margin at slot {slot} is {margin:.3g} "
        + (f"(within float error, {tol:g})" if kind == "numerics" else f"(above float error, {tol:g}: without the "
           "other side's rounds it cannot be told from semantics)"))}]


def _drafting(record: dict) -> list[tuple[int, int, int, int]]:
    """(round index, output token where it starts, proposed, accepted) of the rounds that proposed drafts."""
    out, token = [], 1  # the first token comes from the prefill
    for i, (d, a, n) in enumerate(zip(record.get("proposal_lengths") or [], record.get("accepted_counts") or [],
                                      record.get("acceptance_lengths") or [])):
        if d > 0:
            out.append((i, token, d, a))
        token += n
    return out


def divergences(ours: dict, theirs: dict, method: str, tol: float) -> list[dict]:
    """What differs between two records of one prompt with equal outputs (greedy, or sampled with one
    seed), first difference only:
    `ours` is the native engine's (its margins decide numerics), `theirs` the other engine's."""
    if "vllm totals" in (ours.get("acceptance_source"), theirs.get("acceptance_source")):  # no rounds to align
        return _totals_divergences(ours, theirs, method, tol)
    found = []
    empty = [sum(d == 0 for d in r.get("proposal_lengths") or []) for r in (ours, theirs)]
    if empty[0] != empty[1]:
        found.append({"kind": "accounting", "round": None, "token": None, "slot": None,
                      "detail": f"steps with an empty proposal counted as rounds: ours {empty[0]}, theirs "
                                f"{empty[1]} (one engine counts only the steps that proposed drafts)"})
    a, b = _drafting(ours), _drafting(theirs)
    for j, ((i, token, da, aa), (_, _, db, ab)) in enumerate(zip(a, b)):
        if (da, aa) == (db, ab):
            continue
        where = {"round": i, "token": token}
        last = j == len(a) - 1 == len(b) - 1
        if last and da == db and ours.get("stop_reason") == theirs.get("stop_reason") == "stop_token":
            found.append(where | {"kind": "accounting", "slot": None, "detail": (
                f"the last round's accepted drafts include the stop token: ours counts {aa} (up to it), "
                f"theirs {ab}")})
        elif method == "ngram":
            found.append(where | {"kind": "semantics", "slot": None, "detail": (
                f"the n-gram lookup rules differ: ours proposed {da} and accepted {aa}, theirs {db} and {ab}")})
        elif da != db:
            found.append(where | {"kind": "semantics", "slot": None, "detail": (
                f"proposal lengths differ: ours {da}, theirs {db}")})
        else:
            slot = min(aa, ab)  # the first slot one engine's draft got right and the other's did not
            margins = (ours.get("draft_margins") or [])
            margin = margins[i][slot] if i < len(margins) and slot < len(margins[i]) else None
            if margin is None:
                kind, why = "unclassified", ("no margin recorded to tell numerics from semantics (run the native "
                                             "side with --record-margins)")
            elif margin < tol:
                kind, why = "numerics", f"our draft's top-2 logit margin there is {margin:.3g}, within float error ({tol:g})"
            else:
                kind, why = "semantics", (f"our draft's top-2 logit margin there is {margin:.3g}, far above float "
                                          f"error ({tol:g}): the other engine's draft computes something else "
                                          "(ours matches DeepSeek's reference)")
            found.append(where | {"kind": kind, "slot": slot, "margin": margin, "detail": (
                f"proposals first differ at slot {slot} (accepted: ours {aa}, theirs {ab}); {why}")})
        break
    if len(a) != len(b) and not any(d["round"] is not None for d in found):
        found.append({"kind": "semantics", "round": None, "token": None, "slot": None,
                      "detail": f"rounds that proposed drafts: ours {len(a)}, theirs {len(b)}"})
    return found



def _output_difference(x: dict, y: dict) -> bool | int | str:
    """True when two records' outputs are equal, else the first differing token; "text" when one of them
    kept only its text (a server that returns no token ids) and the texts differ."""
    if x.get("output_ids") is not None and y.get("output_ids") is not None:
        return first_difference(x["output_ids"], y["output_ids"])
    return True if x.get("output_text") == y.get("output_text") else "text"


def _where(diff: int | str) -> str:
    return f"from token {diff}" if diff != "text" else "in their text (a server returned no token ids)"


def check_settings(dir_a: Path, dir_b: Path, ma: dict, mb: dict) -> list[tuple[str, str, str]]:
    """The settings that differ between two runs (`compare_runs.settings_diff`, as `report A B` shows
    them); a DSparkError naming the first that makes the runs ask for different requests, and its fix."""
    diff = settings_diff(ma, mb)
    refused = [d for d in diff if d[0] not in CHOOSE_REQUESTS + HOW_RUN]
    if refused:
        key, va, vb = refused[0]
        fix = f"the other's {FIX[key]}" if key in FIX else "the other's settings (dspark-bench report A B lists them)"
        raise DSparkError(f"{dir_a} and {dir_b} asked for different requests ({key} {va} vs {vb}"
                          + "".join(f"; {k} {a} vs {b}" for k, a, b in refused[1:]) + "): their outputs would differ "
                          f"whatever the engines did; rerun one with {fix}")
    return diff


def _system_definition(manifest: dict, system: str) -> dict:
    return next((s for s in (manifest.get("experiment") or {}).get("systems") or [] if s.get("name") == system), {})


def check_system(dir_a: Path, dir_b: Path, ma: dict, mb: dict, system: str) -> None:
    """A DSparkError unless a system both runs ran is the same system in both: its method, draft,
    drafts per round, Markov top-k, its own vLLM options (its `speculative_config` table: a suffix tree's
    depth or an n-gram window changes every proposal) and proposal-length policy (from each run's
    experiment; runs from before experiments were recorded pass, and one from before the table reads as
    an empty one)."""
    policies = [_policy(m, system) for m in (ma, mb)]
    if policies[0] != policies[1]:
        raise DSparkError(f"system '{system}' ran with confidence {policies[0]} in {dir_a} and {policies[1]} in "
                          f"{dir_b}; parity compares runs of the same proposal-length policy")
    a, b = _system_definition(ma, system), _system_definition(mb, system)
    for key in ("method", "draft", "num_speculative_tokens", "markov_topk", "speculative_config"):
        va, vb = (s.get(key, {} if key == "speculative_config" else None) for s in (a, b))
        if a and b and va != vb:
            raise DSparkError(f"system '{system}' ran with {key} {va} in {dir_a} and {vb} in {dir_b}; "
                              "parity compares a system with itself: give the two systems different names, or run "
                              "both with one definition")


# our methods vLLM runs under another of its names: a DeepSpec-format DFlash draft runs as its dspark method
RUNS_AS = {"dflash": ("dflash", "dspark")}


def ran_method(manifest: dict, system: str, recorded: str) -> str:
    """The method `system`'s engine ran: a vLLM engine's own (read back from it), else the speculative config
    it was given (a run from before the read-back, whose `--vllm-arg speculative_config.method` may have run
    another method under the system's), else what its records say (`recorded`)."""
    backend = manifest.get("backend") or {}
    engine = {**(backend.get("servers") or {}), **(backend.get("engines") or {})}.get(system) or {}
    ran = engine.get("method") or (engine.get("speculative_config") or {}).get("method")
    return recorded if ran is None or ran in RUNS_AS.get(recorded, (recorded,)) else ran


def _policy(manifest: dict, system: str) -> str:
    """The system's proposal-length policy as the run recorded it ("off" for runs from before policies)."""
    found = _system_definition(manifest, system)
    policy = found.get("confidence") or ("threshold:%g" % found["confidence_threshold"]
                                         if found.get("confidence_threshold") else "off")
    extra = [f"{k}={found[k]}" for k in ("confidence_costs", "confidence_temperatures") if found.get(k)]
    return policy + (f" ({', '.join(extra)})" if extra else "")


def settings_note(result: dict) -> str:
    """A `parity` result's settings line, as the command prints it under its header and the engines
    notebook shows it: the settings that differ between A and B (`compare_runs.settings_line`), or that
    they are equal."""
    differ = result["settings_differ"]
    return settings_line(differ) + (": the requests both ran are compared, prompt by prompt" if differ else "")


def parity(dir_a: Path, dir_b: Path) -> dict:
    """The comparison of two run folders, A and B, as data (see the module's docstring)."""
    (ma, ra), (mb, rb) = load_run(dir_a), load_run(dir_b)
    differ = check_settings(dir_a, dir_b, ma, mb)
    runs = [_describe(Path(dir_a), ma), _describe(Path(dir_b), mb)]
    native = next((i for i, r in enumerate(runs) if r["backend"] == "native"), 0)
    tol = max(FLOAT_ERROR.get(_dtype(r), 0.125) for r in runs)
    # (a sweep's requests are compared level by level: a request at concurrency 4 against one at 4)
    index = [{(r["system"], float(r["temperature"]), int(r.get("max_concurrency", 1)), r["question_id"], r["turn"]): r
              for r in recs if not r.get("failed")} for recs in (ra, rb)]
    groups = [g for g in dict.fromkeys(k[:3] for k in index[0]) if g in {k[:3] for k in index[1]}]  # A's order
    same_engine = (runs[0]["backend"], runs[0]["version"]) == (runs[1]["backend"], runs[1]["version"])
    dtypes = [_dtype(r) for r in runs]
    out = {"runs": runs, "native": native, "float_error": tol, "groups": [], "same_engine": same_engine,
           "settings_differ": [list(d) for d in differ],
           "only_in": [sorted({k[:3] for k in index[i]} - set(groups)) for i in (0, 1)]}
    for system in dict.fromkeys(g[0] for g in groups):
        check_system(dir_a, dir_b, ma, mb, system)
    for system, temp, conc in groups:
        keys = sorted(k for k in index[0] if k[:3] == (system, temp, conc) and k in index[1])
        if not keys:  # the same system and temperature, but no prompt in common
            out["only_in"][0].append((system, temp, conc))
            continue
        pairs = [(index[0][k], index[1][k]) for k in keys]
        as_totals = any(_totals_only(r) for p in pairs for r in p)  # (then both sides pooled as vLLM counts)
        ran = [ran_method(m, system, pairs[0][i]["method"]) for i, m in enumerate((ma, mb))]
        if ran[0] != ran[1]:
            raise DSparkError(f"system '{system}' ran method {ran[0]} in {dir_a} and {ran[1]} in {dir_b} (as each "
                              "engine ran it); parity compares a system with itself: rerun both with one method")
        method = ran[native]
        prompts, found = [], []
        for (x, y), key in zip(pairs, keys):
            same_input = x["prompt_sha256"] == y["prompt_sha256"]
            same_seed = None if temp == 0 else x.get("seed") is not None and x.get("seed") == y.get("seed")
            diff = _output_difference(x, y) if same_input and same_seed is not False else None
            row = {"question_id": key[3], "turn": key[4], "prompt_ids_equal": same_input, "seeds_equal": same_seed,
                   "outputs_equal": None if diff is None else diff is True,
                   "first_difference": diff if isinstance(diff, int) and diff is not True else None,
                   **dict(zip(("rounds", "accepted"), map(list, zip(_rounds_accepted(x), _rounds_accepted(y)))))}
            where = {"question_id": key[3], "turn": key[4]}
            if diff is True and method != "plain":
                ours, theirs = (x, y) if native == 0 else (y, x)
                found += [where | d for d in divergences(ours, theirs, method, tol)]
            elif diff not in (None, True) and temp == 0:
                found.append(where | {"kind": "unclassified", "round": None, "token": row["first_difference"],
                                      "slot": None, "detail": (
                    f"the greedy outputs differ {_where(diff)}: the targets disagree (no target margins are "
                    "recorded to tell numerics from semantics" + ("" if dtypes[0] == dtypes[1] else
                                                                  f"; the runs computed in {dtypes[0]} and {dtypes[1]}, "
                                                                  "which alone can flip a near tie") + ")")})
            elif diff not in (None, True) and same_engine:  # (across engines a sampled difference is expected)
                found.append(where | {"kind": "unclassified", "round": None, "token": row["first_difference"],
                                      "slot": None, "detail": (
                    f"the sampled outputs (same prompt, same seed) differ {_where(diff)}"), "sampled": True})
            prompts.append(row)
        greedy = temp == 0
        out["groups"].append({
            "system": system, "temperature": temp, "max_concurrency": conc, "method": method, "prompts": len(pairs),
            "prompt_ids_equal": sum(p["prompt_ids_equal"] for p in prompts),
            "outputs_equal": sum(bool(p["outputs_equal"]) for p in prompts) if greedy else None,
            "seeds_equal": None if greedy else sum(bool(p["prompt_ids_equal"] and p["seeds_equal"]) for p in prompts),
            "sampled_outputs_equal": None if greedy else sum(bool(p["outputs_equal"]) for p in prompts),
            "per_prompt": prompts, "pooled": [_pooled([p[i] for p in pairs], as_totals) for i in (0, 1)],
            "divergences": found, "kinds": {k: sum(d["kind"] == k for d in found) for k in KINDS}})
    out["sampled"] = sampled_parity(out["groups"])
    return out


def sampled_parity(groups: list[dict]) -> list[dict]:
    """Per temperature above 0, over every system: the sampled requests compared (equal prompt ids and
    seeds in both runs), how many of them have equal outputs, and the first that does not (system,
    question, turn, the token where it departs), None when all match."""
    out = []
    for temp in sorted({g["temperature"] for g in groups if g["temperature"] > 0}):
        rows = [(g, p) for g in groups if g["temperature"] == temp for p in g["per_prompt"]]
        compared = [(g, p) for g, p in rows if p["outputs_equal"] is not None]
        first = next(({"system": g["system"], "question_id": p["question_id"], "turn": p["turn"],
                       "token": p["first_difference"]} for g, p in compared if not p["outputs_equal"]), None)
        out.append({"temperature": temp, "requests": len(rows), "compared": len(compared),
                    "outputs_equal": sum(bool(p["outputs_equal"]) for _, p in compared),
                    "seeds_differ": sum(p["seeds_equal"] is False for _, p in rows), "first_divergence": first})
    return out

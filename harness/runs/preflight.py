"""What a run would refuse, checked before it makes a folder or loads a model, by one set of calls that
`run`, `run --dry-run` and `profile` all make: `profile --output-len 100000` once made its folder, its child
run refused, and the user was told to resume a profile that could never finish.

- The prompts (`prompts`): the dataset loaded and the prompts selected (a split, category or data-file
  mistake answers here), and the run's longest request held against the target's context (`context.check`).
- The systems (`systems`): each resolved against the target's config, reading no weights
  (`systems.resolve_system`); on the vLLM backends, what the installed vLLM refuses (`backends/vllm/checks.py`: vLLM
  missing or too old, an engine argument or value, a draft its CPU build cannot run).
- On the native backend, a system our engine cannot run (`engine_problem`: one of vLLM's methods, or vLLM's
  own options in its `speculative_config` table), naming the backends that run it; on the openai backend, a
  `speculative_config` table or a `markov_topk` (the server there was started with its own settings).
- `refuse`: a system that would not run, in one line naming each (exit 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dspark.errors import DSparkError
from harness.runs import context
from harness.runs.plan import RunOptions, load_dataset, select_prompts, user_turns
from harness.specs.experiments import METHODS, Experiment, System

VLLM_BACKENDS = ("vllm", "vllm-server")
OTHERS = ("native", "openai")  # the backends that take no speculative config from us


@dataclass
class Prompts:
    """The run's prompts: None where the hub was out of reach and the caller could do without them (the dry
    run, which then counts per prompt; `unread` says why)."""

    data: object | None
    rows: list | None
    turns_of: dict[str, list[str]] | None
    unread: str | None = None


def prompts(opts: RunOptions, exp: Experiment, settings: dict, hub_optional: bool = False) -> Prompts:
    """The prompts the run would take, each request held against the target's context."""
    try:
        data, unread = load_dataset(opts, exp, settings), None
    except DSparkError as exc:  # the hub out of reach (offline, say): the dry run sizes per prompt only
        if not hub_optional or settings["dataset"] != "hub":
            raise
        data, unread = None, str(exc)
    rows = None if data is None else select_prompts(data, settings)
    turns_of = None if rows is None else user_turns(rows, settings["turns"])
    found = context.check(settings, rows, turns_of, opts.resume)
    if settings["backend"] == "native" and found is not None:  # (vLLM drafts no further than its draft's context)
        from harness.backends.systems import draft_model_room

        refuse([{"system": n, "fits_target": False, "problem": problem} for n in settings["systems"]
                if exp.system(n).method == "draft_model"
                and (problem := draft_model_room(exp.system(n).draft, found.positions, "--output-len"))])
    return Prompts(data, rows, turns_of, unread)


def systems(exp: Experiment, settings: dict, device: str) -> tuple[Path, object, list[dict]]:
    """(the target's folder, its config, every system resolved in the settings' order), with what the
    installed vLLM refuses of each on the vLLM backends, as the run's own start and `prepare` would."""
    from dspark.checkpoint import read_config, resolve_path
    from dspark.models.config import TargetConfig
    from harness.backends.systems import resolve_system

    target_path = resolve_path(exp.target)
    target_cfg = TargetConfig.from_hf(read_config(target_path), f"target {exp.target}")
    rows = [resolve_system(exp.system(name), target_cfg, target_path) for name in settings["systems"]]
    if settings["backend"] in OTHERS:
        rows = [row | ({"fits_target": False, "problem": problem} if (problem := engine_problem(exp.system(
            row["system"]), settings["backend"])) else {}) for row in rows]
    if settings["backend"] in VLLM_BACKENDS:
        from harness.backends.vllm.checks import dry_run_rows
        from harness.runs.synthetic import with_synthetic

        rows = dry_run_rows(rows, [with_synthetic(exp.system(n), settings) for n in settings["systems"]], device,
                            target_path, settings.get("engine_args", {}), settings["backend"])
    return target_path, target_cfg, rows


def engine_problem(system: System, backend: str) -> str | None:
    """Why `backend` (native or openai) cannot run `system` as the experiment says: on ours, a speculative
    method only vLLM has, or vLLM's own options (its `speculative_config` table), which our engine would
    silently ignore; on openai, that table or a `markov_topk` (each sets the drafter of an engine the run
    starts: the server measured there was started with its own settings)."""
    runs_it = f"run it with --backend {' or '.join(VLLM_BACKENDS)}, which run vLLM"
    served = ("sets vLLM options of an engine the run starts; the openai backend measures a server started with its "
              "own settings (its --speculative-config)")
    if backend == "native" and system.method not in METHODS:
        return (f"method '{system.method}' is not one of our engine's ({', '.join(METHODS)}); {runs_it}, or leave "
                "it out with --systems")
    if system.speculative_config:
        keys = ", ".join(sorted(system.speculative_config))
        if backend == "openai":
            return f"speculative_config ({keys}) {served}: drop the table, or use --backend vllm-server"
        return f"speculative_config ({keys}) holds vLLM's options, which our engine does not take; {runs_it}, or drop the table"
    if system.markov_topk is not None and backend == "openai":
        return (f"markov_topk = {system.markov_topk} {served}: start it with --speculative-config '{{..., "
                f"\"dspark_draft_topk\": {system.markov_topk}}}' and drop markov_topk, or use --backend vllm-server")
    return None


def refuse(rows: list[dict]) -> None:
    """A system that would not run refused as the run refuses it, in one line and exit 2 (the dry run once
    exited 1 with its table alone): which systems, and why, and the --systems that runs the others."""
    refused = [r for r in rows if not r["fits_target"]]
    if refused:
        others = [r["system"] for r in rows if r["fits_target"]]
        raise DSparkError("the run would refuse " + "; ".join(f"system {r['system']}: {r['problem']}" for r in refused)
                          + (f" (the others run with --systems {','.join(others)})" if others else ""))


def check(opts: RunOptions, exp: Experiment, settings: dict) -> Prompts:
    """Everything above, for a run about to start (or a profile about to make its folder): the prompts
    against the context, and on the vLLM backends the installed vLLM against the systems and the engine
    arguments (the native backend checks its drafts as it loads them, but a `markov_topk` system's here: that
    mistake is in the options). Returns the prompts."""
    found = prompts(opts, exp, settings)
    if settings["backend"] in OTHERS:
        refuse([{"system": n, "fits_target": not (problem := engine_problem(exp.system(n), settings["backend"])),
                 "problem": problem} for n in settings["systems"]])
    # a markov_topk system (its draft's Markov head and vocabulary) and a draft model (its vocabulary and tokenizer
    # against the target's), from configs alone
    early = [n for n in settings["systems"] if exp.system(n).markov_topk is not None
             or exp.system(n).method == "draft_model"]
    if settings["backend"] == "native" and early:
        refuse(systems(exp, settings | {"systems": early}, opts.device)[2])
    if settings["backend"] in VLLM_BACKENDS:
        refuse(systems(exp, settings, opts.device)[2])
    return found

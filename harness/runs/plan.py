"""What a run is, before anything loads: its options (as given, or as a run folder recorded them for
`--resume DIR`), the settings they resolve to against the experiment (compared on resume), the
request seeds, and the folder it writes to."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime, timezone
from pathlib import Path

from dspark.errors import DSparkError
from harness.backends.registry import CLASSES, backend_class
from harness.runs.folder import RunFolder
from harness.specs.experiments import Experiment


@dataclass
class RunOptions:
    split: str = "qualitative"
    categories: list[str] | None = None
    experiment: str = "demo"
    dataset_path: str | None = None
    dataset_revision: str | None = None
    systems: list[str] | None = None
    backend: str | None = None
    vllm_args: list[str] | None = None  # KEY=VALUE engine arguments for the vllm backend
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
    threads: int | None = None  # intra-op threads (None: `harness.runs.threads.choose`)
    record_margins: bool = False  # the native engine records its greedy drafts' top-2 margins (for `parity`)
    out: str | None = None
    resume: str | None = None
    profiled: str | None = None  # "nsys" or "torch": warm every system first, capture only the timed requests


NOT_RECORDED = ("out", "resume", "profiled")  # where and how this invocation runs, not what the run is
FLAGS = {"categories": "--category", "temperatures": "--temperature", "vllm_args": "--vllm-arg"}  # the rest: --field-name


def flag(field: str) -> str:
    return FLAGS.get(field, "--" + field.replace("_", "-"))


def recorded_options(opts: RunOptions) -> dict:
    """The options a run was started with, as the manifest keeps them for `--resume DIR`."""
    return {k: v for k, v in asdict(opts).items() if k not in NOT_RECORDED}


# RunOptions fields that, left at their default, the settings resolve under the same name (compared there on resume)
RESOLVED = ("output_len", "seed", "turns", "temperatures", "backend", "dataset_revision", "num_prompts")


def resume_options(opts: RunOptions, given: set[str]) -> RunOptions:
    """`--resume DIR` continues with the options in DIR's manifest and the thread count it used. An
    option given on the command line (`given`: RunOptions field names) must equal what the run used
    (as recorded, or as its settings resolved a default); the first that differs is refused by its
    flag. A manifest from before options were recorded keeps the old rule: the arguments given are
    the run's (its settings are compared later)."""
    folder = RunFolder(Path(opts.resume))
    manifest = folder.manifest()
    if manifest is None:
        raise DSparkError(f"--resume {folder.path}: no manifest.json there; not a run folder")
    recorded = manifest.get("options")
    if recorded is None:
        return opts
    recorded = recorded | {"threads": (manifest.get("threads") or {}).get("count", recorded.get("threads"))}
    settings = manifest.get("settings") or {}
    known = {f.name for f in fields(RunOptions)}
    for name in sorted((given & known) - set(NOT_RECORDED)):
        now, was = getattr(opts, name), recorded.get(name)
        if now == was or (was is None and name in RESOLVED and now == settings.get(name)):
            continue
        if name == "systems" and was is None and set(now or ()) == set(settings.get("systems") or ()):
            continue
        raise DSparkError(f"--resume {folder.path}: {flag(name)} was {json.dumps(was)} in this run, now "
                          f"{json.dumps(now)}; drop {flag(name)} to continue the run as it was started")
    return replace(opts, **{k: v for k, v in recorded.items() if k in known})


def resolve_settings(opts: RunOptions, exp: Experiment) -> dict:
    """Everything that decides which requests run and how: compared on --resume."""
    backend = opts.backend or exp.backend
    if backend not in CLASSES:
        raise DSparkError(f"--backend {backend} is not available yet; use {', '.join(CLASSES)}")
    most = backend_class(backend).capabilities.max_concurrency
    if not 1 <= opts.concurrency <= most:
        at_a_time = "one request" if most == 1 else f"{most} requests"
        raise DSparkError(f"--concurrency {opts.concurrency}: the {backend} backend serves {at_a_time} at a time; "
                          f"use --concurrency 1{'' if most == 1 else f' to {most}'} (a batched backend comes later)")
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
    if opts.threads is not None and opts.threads < 1:
        raise DSparkError(f"--threads is {opts.threads}; give at least 1")
    engine_args = engine_arguments(opts.vllm_args, exp.engine_args)
    if engine_args and backend not in ("vllm", "vllm-server"):
        where = "--vllm-arg" if opts.vllm_args else f"experiment {exp.name}'s [engine_args]"
        raise DSparkError(f"{where} sets vLLM's engine arguments; this run's backend is {backend} (add --backend "
                          f"vllm, or drop {'--vllm-arg' if opts.vllm_args else 'the table'})")
    settings = {
        "experiment": exp.name, "experiment_sha256": exp.sha256, "target": exp.target, "backend": backend,
        "split": opts.split, "categories": opts.categories, "dataset_path": opts.dataset_path,
        "dataset": "files" if opts.dataset_path else exp.dataset,
        "dataset_revision": opts.dataset_revision or exp.dataset_revision,
        "systems": systems, "num_prompts": opts.num_prompts if opts.num_prompts is not None else exp.num_prompts,
        "output_len": output_len, "temperatures": [float(t) for t in temps], "turns": opts.turns or exp.turns,
        "ignore_eos": opts.ignore_eos, "seed": exp.seed if opts.seed is None else opts.seed,
        "shuffle": exp.shuffle and not opts.disable_shuffle, "device": opts.device, "dtype": opts.dtype,
    }
    if engine_args:  # (only when given: older runs' settings have no such key, and still resume)
        settings["engine_args"] = engine_args
    if opts.record_margins:
        if backend != "native":
            raise DSparkError(f"--record-margins records our engine's draft margins; the {backend} backend has none "
                              "to give (record them on the native run you compare against)")
        settings["record_margins"] = True
    return settings


def engine_arguments(items: list[str] | None, base: dict) -> dict:
    """The experiment's `[engine_args]` with `--vllm-arg KEY=VALUE` over them; a value is read as JSON
    (numbers, true/false, lists, objects), else kept as text."""
    args = dict(base)
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise DSparkError(f"--vllm-arg {item}: give KEY=VALUE, e.g. --vllm-arg max_model_len=4096")
        try:
            value = json.loads({"True": "true", "False": "false", "None": "null"}.get(raw, raw))
        except ValueError:
            value = raw
        args[key.strip()] = value
    return args


def request_seed(run_seed: int, question_id: str, turn: int, temperature: float) -> int:
    digest = hashlib.sha256(f"{run_seed}/{question_id}/{turn}/{temperature:g}".encode()).hexdigest()
    return int(digest[:12], 16)


def default_out(settings: dict) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    base = Path("results") / f"{settings['experiment']}-{settings['split']}-{stamp}"
    out, n = base, 1
    while out.exists():  # never write into an earlier run
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return out

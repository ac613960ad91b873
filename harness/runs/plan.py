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
from dspark.synthetic.acceptance import check_spec
from harness.backends.registry import CLASSES, backend_class
from harness.backends.vllm.args import owned_problem
from harness.runs import threads
from harness.runs.folder import RunFolder
from harness.specs import datasets
from harness.specs.experiments import Experiment, System


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
    tensor_parallel_size: int | None = None  # vLLM backends: the target's TP (our engine runs on one device)
    draft_tensor_parallel_size: int | None = None  # vLLM backends: the draft's TP (speculative_config)
    num_prompts: int | None = None
    output_len: int | None = None
    temperatures: list[float] | None = None
    turns: str | None = None
    ignore_eos: bool = False
    max_concurrency: list[int] | None = None  # levels swept, each system at each (None: 1)
    request_rate: float | None = None  # requests/s of a served wave (None: all at once, up to the concurrency)
    burstiness: float = 1.0  # the gamma shape of arrivals at a request rate (1: Poisson)
    base_url: str | None = None  # the openai backend: the server someone else runs
    model: str | None = None  # the openai backend: the model name to request (default: the server's first)
    request_timeout: float | None = None  # a served request's limit in seconds (past it: recorded as failed)
    load_generator: str = "ours"  # served backends: who sends the timed requests (ours, or aiperf)
    aiperf: str | None = None  # --load-generator aiperf: its executable (None: aiperf on PATH)
    seed: int | None = None
    disable_shuffle: bool = False
    device: str = "cpu"
    dtype: str = "auto"
    threads: int | None = None  # intra-op threads (None: `harness.runs.threads.choose`)
    record_margins: bool = False  # the native engine records its greedy drafts' top-2 margins (for `parity`)
    compile: bool = False  # the native engine's CPU steps compiled (torch.compile)
    acceptance: str | None = None  # synthetic acceptance for every draft-model system (`dspark.synthetic.acceptance`)
    out: str | None = None
    resume: str | None = None
    profiled: str | None = None  # "nsys" or "torch": warm every system first, capture only the timed requests


NOT_RECORDED = ("out", "resume", "profiled")  # where and how this invocation runs, not what the run is
FLAGS = {"categories": "--category", "temperatures": "--temperature", "vllm_args": "--vllm-arg",
         "max_concurrency": "--max-concurrency"}  # the rest: --field-name


def flag(field: str) -> str:
    return FLAGS.get(field, "--" + field.replace("_", "-"))


def recorded_options(opts: RunOptions) -> dict:
    """The options a run was started with, as the manifest keeps them for `--resume DIR`."""
    return {k: v for k, v in asdict(opts).items() if k not in NOT_RECORDED}


# RunOptions fields that, left at their default, the settings resolve under the same name (compared there on resume)
RESOLVED = ("output_len", "seed", "turns", "temperatures", "backend", "dataset_revision", "num_prompts")


def resume_options(opts: RunOptions, given: set[str]) -> RunOptions:
    """`--resume DIR` continues with the options in DIR's manifest and the thread count it used (a
    different one from the environment is refused: `threads.resumed`). An option given on the command
    line (`given`: RunOptions field names) must equal what the run used (as recorded, or as its
    settings resolved a default); the first that differs is refused by its flag. A manifest from
    before options were recorded keeps the old rule: the arguments given are the run's (its settings
    are compared later)."""
    folder = RunFolder(Path(opts.resume))
    manifest = folder.resumable()
    recorded = manifest.get("options")
    if recorded is None:
        return opts
    count = (manifest.get("threads") or {}).get("count", recorded.get("threads"))
    recorded = recorded | {"threads": count}
    settings = manifest.get("settings") or {}
    known = {f.name for f in fields(RunOptions)}
    for name in sorted((given & known) - set(NOT_RECORDED)):
        now, was = getattr(opts, name), recorded.get(name)
        if now == was or (was is None and name in RESOLVED and now == settings.get(name)):
            continue
        if name == "systems" and was is None and set(now or ()) == set(settings.get("systems") or ()):
            continue
        default = settings.get(name) if name in RESOLVED else None
        then = (json.dumps(was) if was is not None else "not given" if default is None else
                f"not given (the experiment's default, {json.dumps(default)})")
        raise DSparkError(f"--resume {folder.path}: {flag(name)} was {then} in this run, now {json.dumps(now)}; "
                          f"drop {flag(name)} to continue the run as it was started")
    if count is not None:  # (the flag, if given, equals it by now; the environment must too)
        recorded["threads"] = threads.resumed(count, opts.threads if "threads" in given else None, folder.path)
    return replace(opts, **{k: v for k, v in recorded.items() if k in known})


def resolve_settings(opts: RunOptions, exp: Experiment) -> dict:
    """Everything that decides which requests run and how: compared on --resume."""
    checked = check_options(opts, exp)
    backend, systems, engine_args = checked["backend"], checked["systems"], checked["engine_args"]
    levels = served_levels(opts, backend)
    if backend == "openai" and len(systems) != 1:
        raise DSparkError(f"--backend openai measures the one system the server at {opts.base_url} runs; name it "
                          f"with --systems (one of {', '.join(systems)})")
    settings = {
        "experiment": exp.name, "experiment_sha256": exp.sha256, "target": exp.target, "backend": backend,
        "split": opts.split, "categories": opts.categories, "dataset_path": opts.dataset_path,
        "dataset": "files" if opts.dataset_path else exp.dataset,
        "dataset_revision": opts.dataset_revision or exp.dataset_revision,
        "systems": systems, "num_prompts": opts.num_prompts if opts.num_prompts is not None else exp.num_prompts,
        "output_len": checked["output_len"], "temperatures": checked["temperatures"],
        "turns": opts.turns or exp.turns, "ignore_eos": opts.ignore_eos,
        "seed": exp.seed if opts.seed is None else opts.seed,
        "shuffle": exp.shuffle and not opts.disable_shuffle, "device": opts.device, "dtype": opts.dtype,
    }
    if engine_args:  # (only when given: older runs' settings have no such key, and still resume)
        settings["engine_args"] = engine_args
        check_parallel(engine_args, opts.device)
    if levels != [1]:
        settings["max_concurrency"] = levels
    for key in ("request_rate", "base_url", "model", "request_timeout"):
        if getattr(opts, key) is not None:
            settings[key] = getattr(opts, key)
    if opts.burstiness != 1.0:
        settings["burstiness"] = opts.burstiness
    if opts.load_generator != "ours":  # (only when given: older runs' settings have none, and still resume)
        settings["load_generator"] = opts.load_generator
    if opts.record_margins:
        settings["record_margins"] = True
    if opts.compile:
        settings["compile"] = True
    from harness.runs.synthetic import check_random, synthetic_settings  # (reads draft configs: torch, loaded by now)

    if check_random(exp.target, exp, systems):
        settings["weights"] = "random"
    acceptance = synthetic_settings(opts.acceptance, exp, systems)
    if acceptance:
        settings["acceptance"] = acceptance
    if backend != "native":
        for name in systems:
            problem = vllm_policy_problem(exp.system(name), backend, opts.device)
            if problem:
                raise DSparkError(f"system '{name}': {problem}")
    return settings


def check_options(opts: RunOptions, exp: Experiment) -> dict:
    """The options held against the experiment as far as that needs neither the device nor a backend's
    code (so neither torch nor vLLM): `run` checks them first, so that a mistyped option answers at once.
    Returns what they resolve to: backend, systems (the baseline first), temperatures, output_len and
    engine_args. The rest (concurrency levels, policies) is checked by `resolve_settings`."""
    datasets.check_split(opts.split)
    backend = opts.backend or exp.backend
    if backend not in CLASSES:
        raise DSparkError(f"--backend {backend} is not available yet; use {', '.join(CLASSES)}")
    systems = [s.name for s in exp.systems]
    if opts.systems:
        unknown = [s for s in opts.systems if s not in systems]
        if unknown:
            raise DSparkError(f"--systems: '{unknown[0]}' is not in experiment {exp.name}; it has {', '.join(systems)}")
        systems = [s for s in systems if s in opts.systems]
    systems.sort(key=lambda s: exp.system(s).method != "plain")  # the baseline first
    temps = opts.temperatures if opts.temperatures is not None else list(exp.temperatures)  # (checked as parsed)
    output_len = exp.output_len if opts.output_len is None else opts.output_len
    if output_len < 1:
        raise DSparkError(f"--output-len is {output_len}; give at least 1")
    if opts.num_prompts is not None and opts.num_prompts < 1:
        raise DSparkError(f"--num-prompts is {opts.num_prompts}; give at least 1")
    if opts.threads is not None and not isinstance(opts.threads, threads.Recorded):  # (a resumed run keeps its own)
        threads.check(opts.threads)
    revision = opts.dataset_revision or exp.dataset_revision  # (as `resolve_settings` resolves it)
    if revision is not None:
        datasets.check_revision(revision, "files" if opts.dataset_path else exp.dataset,
                                None if opts.dataset_revision else exp.path)
    if opts.acceptance is not None:
        check_spec(opts.acceptance)
    engine_args = parallel_arguments(opts, backend, engine_arguments(opts.vllm_args, exp.engine_args))
    if engine_args and backend not in ("vllm", "vllm-server"):
        where = "--vllm-arg" if opts.vllm_args else f"experiment {exp.name}'s [engine_args]"
        raise DSparkError(f"{where} sets vLLM's engine arguments; this run's backend is {backend} (add --backend "
                          f"vllm, or drop {'--vllm-arg' if opts.vllm_args else 'the table'})")
    for given, where in ((engine_arguments(opts.vllm_args, {}), "--vllm-arg"),
                         (exp.engine_args, f"experiment {exp.name}'s [engine_args]")):
        problem = owned_problem(given, backend, where)  # (a key the harness sets itself would override its own)
        if problem:
            raise DSparkError(problem)
    if opts.record_margins and backend != "native":
        raise DSparkError(f"--record-margins records our engine's draft margins; the {backend} backend has none "
                          "to give (record them on the native run you compare against)")
    if opts.compile and (backend != "native" or opts.device.startswith("cuda")):
        raise DSparkError("--compile compiles our engine's CPU steps (CUDA graphs accelerate the GPU's); use it with "
                          "--backend native on --device cpu, or drop it")
    return {"backend": backend, "systems": systems, "temperatures": [float(t) for t in temps],
            "output_len": output_len, "engine_args": engine_args}


def vllm_policy_problem(system: System, backend: str, device: str) -> str | None:
    """Why a system's proposal-length policy cannot run on `backend`, or None. vLLM has one of ours:
    the prefix scheduler is its adaptive verification (DSpark only, full CUDA graphs, so a GPU), with its
    own cost tables timed at start and no temperatures from us."""
    if system.confidence == "off":
        return None
    if system.confidence != "schedule" or backend not in ("vllm", "vllm-server"):
        return (f"confidence = \"{system.confidence}\" runs on our engine; the {backend} backend verifies every "
                "draft (drop the system with --systems, or run it on --backend native)")
    if system.method != "dspark":
        return f"vLLM's adaptive verification (confidence = \"schedule\") is for method dspark, not {system.method}"
    if device != "cuda":
        return ("vLLM's adaptive verification (confidence = \"schedule\") needs full CUDA graphs; run it with "
                "--device cuda, or on --backend native")
    if system.confidence_costs or system.confidence_temperatures:
        return ("vLLM's adaptive verification times its own cost tables and takes no temperatures; drop "
                "confidence_costs and confidence_sts from the system, or run it on --backend native")
    return None


def served_levels(opts: RunOptions, backend: str) -> list[int]:
    """The concurrency levels, checked against what the backend can have in flight, and the served
    options checked against the backend."""
    levels = opts.max_concurrency or [1]
    most = backend_class(backend).capabilities.max_concurrency
    served = most > 1
    bad = next((c for c in levels if not 1 <= c <= most), None)
    if bad is not None:
        if not served:
            raise DSparkError(f"--max-concurrency {bad}: the {backend} backend serves one request at a time; use "
                              "--backend vllm-server (or openai) for concurrency, or --max-concurrency 1")
        raise DSparkError(f"--max-concurrency {bad}: give levels from 1 to {most}")
    if len(set(levels)) != len(levels):
        raise DSparkError(f"--max-concurrency {','.join(map(str, levels))}: a level is repeated; give each once")
    for name, given in (("--request-rate", opts.request_rate is not None), ("--burstiness", opts.burstiness != 1.0),
                        ("--request-timeout", opts.request_timeout is not None)):
        if given and not served:
            raise DSparkError(f"{name} schedules served requests; the {backend} backend serves one at a time "
                              "(use --backend vllm-server or openai)")
    load_generator(opts, backend, served)
    if opts.request_rate is not None and not opts.request_rate > 0:
        raise DSparkError(f"--request-rate {opts.request_rate:g}: give requests per second above 0 (leave it out to "
                          "send every request at once, up to the concurrency)")
    if not opts.burstiness > 0:
        raise DSparkError(f"--burstiness {opts.burstiness:g}: give a gamma shape above 0 (1: Poisson arrivals)")
    if opts.request_timeout is not None and not opts.request_timeout > 0:
        raise DSparkError(f"--request-timeout {opts.request_timeout:g}: give seconds above 0")
    if (backend == "openai") != (opts.base_url is not None):
        raise DSparkError("--backend openai needs --base-url URL (the server to measure)" if backend == "openai" else
                          "--base-url is the openai backend's server; add --backend openai or drop --base-url")
    if opts.model is not None and backend != "openai":
        raise DSparkError(f"--model names the model of an openai server; the {backend} backend runs the experiment's "
                          "target (drop --model)")
    return sorted(levels)


def load_generator(opts: RunOptions, backend: str, served: bool) -> None:
    """`--load-generator` and `--aiperf` checked before anything loads: AIPerf drives served backends only,
    and must be installed (one line naming the install where it is not)."""
    from harness.backends.served import aiperf

    if opts.load_generator not in aiperf.NAMES:
        raise DSparkError(f"--load-generator {opts.load_generator}: use ours (the default) or aiperf")
    if opts.load_generator == "ours":
        if opts.aiperf is not None:
            raise DSparkError("--aiperf names AIPerf's executable for --load-generator aiperf; add it or drop --aiperf")
        return
    if not served:
        raise DSparkError(f"--load-generator aiperf sends requests to a server; the {backend} backend has none (use "
                          "--backend vllm-server or openai)")
    aiperf.executable(opts.aiperf)


# option field -> vLLM engine argument (a speculative_config key for the draft)
PARALLEL = {"tensor_parallel_size": "tensor_parallel_size",
            "draft_tensor_parallel_size": "speculative_config.draft_tensor_parallel_size"}


def parallel_arguments(opts: RunOptions, backend: str, engine_args: dict) -> dict:
    """`engine_args` with --tensor-parallel-size and --draft-tensor-parallel-size in them, checked: at least 1,
    a vLLM backend (our engine is the single-device, batch-size-1 reference), no other value for the same
    argument from --vllm-arg or the experiment, the draft's TP at most the target's."""
    args = dict(engine_args)
    for field, key in PARALLEL.items():
        value, flag = getattr(opts, field), "--" + field.replace("_", "-")
        if value is None:
            continue
        if value < 1:
            raise DSparkError(f"{flag} is {value}; give at least 1")
        if backend not in ("vllm", "vllm-server"):
            raise DSparkError(f"{flag} {value}: our engine runs on one device (the batch-size-1 reference); tensor "
                              "parallelism runs through vLLM: add --backend vllm or --backend vllm-server")
        if key in args and args[key] != value:
            raise DSparkError(f"{flag} {value}, but {key} is {json.dumps(args[key])} from --vllm-arg or the "
                              f"experiment; give it once")
        args[key] = value
    target_tp, draft_tp = (args.get(key) for key in PARALLEL.values())
    if isinstance(target_tp, int) and isinstance(draft_tp, int) and draft_tp > target_tp:
        raise DSparkError(f"--draft-tensor-parallel-size {draft_tp} is above the target's {target_tp}: vLLM runs "
                          "the draft on the target's ranks or fewer")
    return args


def check_parallel(engine_args: dict, device: str) -> None:
    """A tensor-parallel size the machine cannot hold, refused before anything starts: more ranks than visible
    GPUs (on a GPU) or than usable cores (vLLM's CPU build)."""
    tp = engine_args.get("tensor_parallel_size")
    if not isinstance(tp, int) or tp <= 1:
        return
    if device.startswith("cuda"):
        import torch

        have, what = torch.cuda.device_count(), "GPU(s) visible (CUDA_VISIBLE_DEVICES decides which)"
    else:
        have, what = threads.usable_cores(), "usable core(s) for vLLM's CPU ranks"
    if tp > have:
        raise DSparkError(f"--tensor-parallel-size {tp}: this machine has {have} {what}; give at most {have}")


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


def load_dataset(opts: RunOptions, exp: Experiment, settings: dict) -> datasets.Dataset:
    """The run's dataset: its --dataset-path, else the experiment's (the demo suite, or the hub)."""
    return datasets.load(opts.split, Path(opts.dataset_path) if opts.dataset_path else None, exp.dataset,
                         settings["dataset_revision"])


def select_prompts(data: datasets.Dataset, settings: dict) -> list[datasets.Row]:
    """The rows of `data` the run's settings select (categories, how many, the seeded shuffle)."""
    return datasets.select(data.rows, settings["split"], settings["categories"], settings["num_prompts"],
                           settings["seed"], settings["shuffle"])


def user_turns(rows: list[datasets.Row], turns: str) -> dict[str, list[str]]:
    """The user turns the run sends of each prompt (by question id): its first, or all of them."""
    return {r.question_id: (list(r.turns) if turns == "all" else [r.turns[0]]) for r in rows}


def plan_jobs(settings: dict, rows: list[datasets.Row], turns_of: dict[str, list[str]],
              interleaved: bool) -> list[tuple]:
    """Every request of the run, (system, concurrency, temperature, row, turn), in run order: systems
    alternating on each prompt (`interleaved`), else one system after another."""
    levels = settings.get("max_concurrency", [1])
    if interleaved:  # the systems alternate on each prompt, plain decoding first
        return [(name, conc, temp, row, turn) for conc in levels for temp in settings["temperatures"]
                for row in rows for turn in range(len(turns_of[row.question_id])) for name in settings["systems"]]
    return [(name, conc, temp, row, turn) for name in settings["systems"] for conc in levels
            for temp in settings["temperatures"] for row in rows for turn in range(len(turns_of[row.question_id]))]


def request_seed(run_seed: int, question_id: str, turn: int, temperature: float) -> int:
    digest = hashlib.sha256(f"{run_seed}/{question_id}/{turn}/{temperature:g}".encode()).hexdigest()
    return int(digest[:12], 16)


RESULTS = Path("results")  # where a run without --out writes its folder (relative to the working folder)


def default_out(settings: dict) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    base = RESULTS / f"{settings['experiment']}-{settings['split']}-{stamp}"
    out, n = base, 1
    while out.exists():  # never write into an earlier run
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return out

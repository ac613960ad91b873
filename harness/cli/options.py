"""Options shared by several commands, declared once: the run options (`run` and `profile` take the
same ones, so a profile's child runs exactly what `run` would), and the parsing of values given as
text (devices, id lists, comma-separated names and temperatures)."""

from __future__ import annotations

import functools
import inspect
import re
import typing
from pathlib import Path
from typing import Optional

import typer

from dspark.dtypes import dtype_name
from dspark.errors import DSparkError
from harness.runs.plan import RunOptions
from harness.specs.experiments import MAX_TEMPERATURE

THREADS_HELP = ("Intra-op CPU threads (default: OMP_NUM_THREADS when set; else on the CPU 1 for a target of at "
                "most 200 MB of weights, as the demo, every core for a larger one); more than the cores this process may use "
                "is refused.")


def systems_help() -> str:
    """`--systems`' help, naming the default experiment's systems (read from its TOML, a few hundred bytes)."""
    from harness.specs.experiments import load_experiment

    names = ", ".join(s.name for s in load_experiment("demo").systems)
    return (f"Run only these systems of the experiment, comma-separated (the demo experiment's: {names}); another "
            "--experiment defines its own (its TOML's [[systems]]). Where each runs: plain, dspark, dflash, dflash2, "
            "eagle3, ngram and draft_model on every backend (native, vllm, vllm-server; dflash2 there as vLLM's dflash "
            "with its DFlash 2 speculator: docs/vllm.md); any other speculative method the "
            "installed vLLM knows (suffix, medusa, mlp_speculator, MTP heads, ...) on vllm and vllm-server only; what "
            "checks each: docs/drafts.md.")


# name, type, declaration: the options of a run, in the order `--help` lists them
RUN_OPTIONS = [
    ("split", str, typer.Option("qualitative", help="SPEED-Bench config: qualitative, throughput_1k ... "
                                "throughput_32k.")),
    ("category", Optional[str], typer.Option(None, help="Categories to run, comma-separated (default: all).")),
    ("experiment", str, typer.Option("demo", help="A shipped experiment (demo, qwen3-8b) or a TOML file.")),
    ("dataset_path", Optional[str], typer.Option(None, help="Local SPEED-Bench data: a file, or a folder holding "
                                                 "<split>.jsonl or <split>/*.parquet (hub, specdec_bench, "
                                                 "NeMo-Skills).")),
    ("dataset_revision", Optional[str], typer.Option(None, help="Pin the hub dataset's revision (commit or tag); "
                                                   "refused with the demo suite or --dataset-path.")),
    ("systems", Optional[str], typer.Option(None, help=systems_help())),
    ("backend", Optional[str], typer.Option(None, help="native (our engine), vllm (vLLM offline), vllm-server (vLLM "
                                            "served, started per system) or openai (a server at --base-url) "
                                            "(default: the experiment's).")),
    ("vllm_arg", Optional[list[str]], typer.Option(None, "--vllm-arg", help="KEY=VALUE: one of vLLM's engine "
                                                   "arguments (e.g. enforce_eager=false, max_model_len=4096, "
                                                   "gpu_memory_utilization=0.8; speculative_config.KEY for the "
                                                   "speculative config), for --backend vllm (repeatable).")),
    ("tensor_parallel_size", Optional[int], typer.Option(None, "--tensor-parallel-size", "--tp", help="vLLM "
                                                     "backends: the target's tensor-parallel size, ranks on as many "
                                                     "GPUs (or CPU cores on vLLM's CPU build); recorded in the "
                                                     "manifest and every table title (default: vLLM's, 1).")),
    ("draft_tensor_parallel_size", Optional[int], typer.Option(None, "--draft-tensor-parallel-size", help="vLLM "
                                                           "backends: the draft's tensor-parallel size, at most the "
                                                           "target's (vLLM's speculative_config."
                                                           "draft_tensor_parallel_size; default: vLLM's choice).")),
    ("num_prompts", Optional[int], typer.Option(None, help="Prompts to run (default: the experiment's, else all). "
                                                "More than the selection holds runs all of them, with a notice.")),
    ("disable_shuffle", bool, typer.Option(False, "--disable-shuffle", help="Take prompts in file order (a flag).")),
    ("seed", Optional[int], typer.Option(None, help="Shuffle and sampling seed (default: the experiment's).")),
    ("output_len", Optional[int], typer.Option(None, help="Most tokens generated per request, at least 1 (default: "
                                               "the experiment's).")),
    ("temperature", Optional[str], typer.Option(None, help=f"Temperatures, comma-separated, each from 0 (greedy) "
                                                f"to {MAX_TEMPERATURE:g} (default: the experiment's).")),
    ("turns", Optional[str], typer.Option(None, help="first: each row's first turn; all: every turn, with the "
                                          "model's own replies as history (default: the experiment's).")),
    ("ignore_eos", bool, typer.Option(False, "--ignore-eos", help="Generate output-len tokens whatever the stop "
                                      "tokens (a flag).")),
    ("max_concurrency", Optional[str], typer.Option(None, "--max-concurrency", "--concurrency", help="Requests "
                                                    "in flight, comma-separated levels to sweep, each system at each "
                                                    "(e.g. 1,4,16,32; default 1). Above 1 needs a served backend "
                                                    "(vllm-server, openai).")),
    ("request_rate", Optional[float], typer.Option(None, help="Served backends: requests per second, arrivals a "
                                                   "gamma process (default: all at once, up to the concurrency).")),
    ("burstiness", float, typer.Option(1.0, help="Served backends, with --request-rate: the arrivals' gamma shape "
                                       "(1: Poisson; below 1 burstier), as vllm bench serve.")),
    ("base_url", Optional[str], typer.Option(None, help="--backend openai: the OpenAI-compatible server to measure "
                                             "(e.g. http://127.0.0.1:8000).")),
    ("model", Optional[str], typer.Option(None, help="--backend openai: the model name to request (default: the "
                                          "first the server lists).")),
    ("request_timeout", Optional[float], typer.Option(None, help="Served backends: seconds one request may take; "
                                                      "past it the request is recorded as failed (default 3600).")),
    ("load_generator", str, typer.Option("ours", help="Served backends: who sends the timed requests: ours (the "
                                         "harness's client) or aiperf (NVIDIA AIPerf, one process per wave, the "
                                         "same requests; docs/serving.md).")),
    ("aiperf", Optional[str], typer.Option(None, help="--load-generator aiperf: AIPerf's executable, from its own "
                                           "environment (default: aiperf on PATH).")),
    ("device", str, typer.Option("auto", help="auto, cpu, cuda, cuda:N.")),
    ("dtype", str, typer.Option("auto", help="auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16.")),
    ("threads", Optional[int], typer.Option(None, help=THREADS_HELP)),
    ("acceptance", Optional[str], typer.Option(None, help="Synthetic acceptance for every draft-model system, to "
                                               "time it at a set acceptance (random weights accept nothing real): "
                                               "a profile name (official-coding, dspark-paper, dflash-paper, "
                                               "eagle3-paper, community, collapse, ...), a mean acceptance length "
                                               "(3.41) or per-slot unconditional rates (0.9,0.8,...). Default: each "
                                               "system's `acceptance`, else the real rule.")),
    ("compile", bool, typer.Option(False, "--compile", help="Native backend on a CPU: compile each step with "
                                   "torch.compile (inductor's cache in $DSPARK_CACHE/inductor). About 20 s per step "
                                   "and setting the first time, a few after; it pays on long runs, not the demo's "
                                   "main command (a flag).")),
    ("record_margins", bool, typer.Option(False, "--record-margins", help="Native backend, T = 0: record each "
                                          "greedy draft's top-2 logit margin, so `parity` can tell numerics from "
                                          "semantics (a flag; on the demo pair on an H200 it costs 9 % of a "
                                          "round).")),
]
# option name -> RunOptions field, where they differ
FIELDS = {"category": "categories", "temperature": "temperatures", "vllm_arg": "vllm_args"}


def with_run_options(command):
    """Give `command` every run option. It is called with `ctx` (a typer.Context parameter it declares),
    its own options, and `run_options`: {option name: value} of the run options."""
    hints = typing.get_type_hints(command)  # the command module's names, whatever this one imports
    own = [p.replace(annotation=hints.get(p.name, p.annotation))
           for p in inspect.signature(command).parameters.values() if p.name != "run_options"]
    shared = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=decl, annotation=kind)
              for name, kind, decl in RUN_OPTIONS]

    @functools.wraps(command)
    def wrapper(**values):
        run_options = {name: values.pop(name) for name, _, _ in RUN_OPTIONS}
        return command(run_options=run_options, **values)

    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + shared
    wrapper.__signature__ = inspect.Signature(params)
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    del wrapper.__wrapped__  # typer must read the signature above, not the command's own
    return wrapper


def given_fields(ctx: typer.Context) -> set[str]:
    """The RunOptions fields whose options were given on the command line (not left at their default)."""
    return {FIELDS.get(name, name) for name, _, _ in RUN_OPTIONS
            if ctx.get_parameter_source(name).name != "DEFAULT"}


def run_options_from(values: dict, resolve_device: bool = True, **where) -> RunOptions:
    """RunOptions from the run options' values (text parsed, the device and dtype checked by name, then the
    device resolved, which loads torch: with `resolve_device` False it stays as given) and `where` (out,
    resume, profiled)."""
    if values["turns"] not in (None, "first", "all"):
        raise DSparkError(f"--turns {values['turns']}: use first or all")
    dtype_name(values["dtype"], "--dtype")
    fields = {FIELDS.get(k, k): v for k, v in values.items()}
    fields |= {"categories": names(values["category"], "--category", "coding,math"),
               "systems": names(values["systems"], "--systems", "plain,dspark"),
               "temperatures": temperatures(values["temperature"]),
               "vllm_args": list(values["vllm_arg"]) if values["vllm_arg"] else None,
               "max_concurrency": levels(values["max_concurrency"]),
               "base_url": base_url(values["base_url"]),
               "device": device(values["device"], resolve_device)}
    return RunOptions(**fields, **where)


def base_url(text: str | None) -> str | None:
    """`--base-url` as given, refused unless it is an http(s)://HOST[:PORT][/path] URL: a bare name would
    pass every check and meet "no server answers at notaurl/v1/models" only when the run starts."""
    if text is None:
        return None
    from urllib.parse import urlsplit

    try:
        url = urlsplit(text)
        url.port  # noqa: B018  (a port that is not a number from 0 to 65535 raises here)
    except ValueError:
        url = None
    if url is None or url.scheme not in ("http", "https") or not url.hostname or url.query or url.fragment:
        raise DSparkError(f"--base-url {text}: not a server URL; give http://HOST:PORT (e.g. http://127.0.0.1:8000), "
                          "the address the OpenAI-compatible server listens on")
    return text


DEVICE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")  # the devices we run on (mps and others: no kernels of ours)


def device(text: str, resolve: bool = True) -> str:
    """`--device`, refused unless it names one we run on (without torch); then, with `resolve`, checked
    against this machine and `auto` resolved: the CPU needs no check (nor torch)."""
    if not DEVICE.fullmatch(text):
        raise DSparkError(f"--device {text}: unknown device; use auto, cpu, cuda or cuda:N")
    if text == "cpu" or not resolve:
        return text
    import torch

    if text == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not torch.cuda.is_available():
        raise DSparkError(f"--device {text}: no CUDA device is visible; use --device cpu")
    count = torch.cuda.device_count()
    if ":" in text and int(text.partition(":")[2]) >= count:
        raise DSparkError(f"--device {text}: this machine shows {count} CUDA device{'s' if count > 1 else ''} "
                          f"(cuda:0{f' to cuda:{count - 1}' if count > 1 else ''}); give one of them")
    return text


def items(text: str, flag: str, none: str, example: str) -> list[str]:
    """The comma-separated items of `text`, stripped; refused in one line when it names none (`none`: what
    it names then, e.g. "no level"), or has an empty item (`0,,1`, `plain,`), with an `example`."""
    parts = [t.strip() for t in text.split(",")]
    if not any(parts):
        raise DSparkError(f"{flag} '{text}' names {none}; give one or more separated by commas, e.g. {example}")
    if not all(parts):
        raise DSparkError(f"{flag} '{text}' has an empty item; give values separated by single commas, e.g. "
                          f"{example}")
    return parts


def distinct(values: list, parts: list[str], flag: str, text: str) -> list:
    """`values` (parsed from `parts`), refused when one is given twice: a list option names each value
    once (a system, a temperature or a level run twice would be compared against itself)."""
    for i, value in enumerate(values):
        if value in values[:i]:
            first = parts[values.index(value)]
            twice = f"'{first}' twice" if first == parts[i] else f"'{first}' and '{parts[i]}', the same value"
            raise DSparkError(f"{flag} '{text}' gives {twice}; give each once")
    return values


def names(text: str | None, flag: str, example: str) -> list[str] | None:
    """A comma-separated list of names (categories, systems), each once."""
    if text is None:
        return None
    parts = items(text, flag, "nothing", example)
    return distinct(parts, parts, flag, text)


def number_list(text: str | None, flag: str, convert, kind: str, noun: str, example: str,
                least: float | None = None) -> list | None:
    """A comma-separated list of numbers (`convert`: int or float), each once, refused in one line when a
    value is not one (`kind`), is below `least`, or when it names none (`noun`, with an `example`)."""
    if text is None:
        return None
    parts = items(text, flag, f"no {noun}", example)
    try:
        values = [convert(t) for t in parts]
    except ValueError:
        raise DSparkError(f"{flag} must be {kind} separated by commas, got '{text}'") from None
    low = next((t for t, v in zip(parts, values) if least is not None and v < least), None)
    if low is not None:
        raise DSparkError(f"{flag} {low}: give {noun}s of at least {least:g}, e.g. {example}")
    return distinct(values, parts, flag, text)


def temperatures(text: str | None) -> list[float] | None:
    """`--temperature`: numbers from 0 (greedy) to MAX_TEMPERATURE (so finite), each once."""
    values = number_list(text, "--temperature", float, "numbers", "temperature", "0,1")
    bad = next((t for t in values or [] if not 0 <= t <= MAX_TEMPERATURE), None)  # (nan compares false: here too)
    if bad is not None:
        raise DSparkError(f"--temperature {bad:g}: give temperatures from 0 (greedy) to {MAX_TEMPERATURE:g}, e.g. 0,1")
    return values


def levels(text: str | None) -> list[int] | None:
    """`--max-concurrency`: whole numbers of requests in flight, at least 1, each once."""
    return number_list(text, "--max-concurrency", int, "whole numbers", "level", "1,4,16,32", least=1)


def token_ids(text: str, flag: str = "--prompt-ids") -> list[int]:
    """Comma-separated integers given to `flag` (token ids, layer numbers)."""
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise DSparkError(f"{flag} must be comma-separated integers, got '{text}'") from None
    if not ids:
        raise DSparkError(f"{flag} is empty; give at least one number")
    return ids


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def load_tokenizer(path: Path, needed: bool):
    from transformers import AutoTokenizer

    try:
        # transformers 5 builds an empty tokenizer from a folder with none, rather than failing.
        if not any((path / name).is_file() for name in TOKENIZER_FILES):
            raise FileNotFoundError(f"none of {', '.join(TOKENIZER_FILES)}")
        return AutoTokenizer.from_pretrained(path)
    except Exception as exc:
        if needed:
            raise DSparkError(f"{path}: no usable tokenizer ({type(exc).__name__}); give --prompt-ids instead") from None
        return None

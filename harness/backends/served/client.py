"""The client half of every served backend (a `vllm serve` the harness starts, or a server at a URL):
a wave of streamed chat completions sent as `vllm bench serve` sends them (at most `concurrency` in
flight, arrivals at a request rate with burstiness), each result handed to the run as it finishes,
and the server's speculative counters read before and after the wave.

A request that fails while the server lives (timed out, refused) comes back as a failed result, to be
recorded and counted; a server that stops answering stops the wave (the finished requests are already
recorded, the run resumes from there). Subclasses say where the server is and whether it is alive.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from dspark.errors import DSparkError
from harness.backends.base import OnResult, Prepared, RequestResult, RequestSpec, Schedule
from harness.backends.served import aiperf
from harness.backends.served.acceptance import request_acceptance, wave_check
from harness.backends.served.metrics import delta, fetch, spec_counters
from harness.backends.served.stream import StreamResult, chat_body, completion_body, stream_chat

REQUEST_S = 3600.0  # one request's limit unless the run sets one: past it the request is recorded as failed


class ServedBackend:
    vllm_extensions = True  # the server takes vLLM's request fields (token ids back, stop ids, ignore_eos)
    sends_ids = False  # requests go as completions of our prompt ids (a server with no tokenizer), not as chats
    request_timeout_s = REQUEST_S
    aiperf_exe: str | None = None  # the load generator: our client, or AIPerf's executable (`use_load_generator`)
    aiperf_version: str | None = None

    def use_load_generator(self, server: dict) -> None:
        """The run's load generator (`server["load_generator"]`): ours, or AIPerf, found (one line where it is
        not) and its version read before any server starts."""
        if server.get("load_generator") == "aiperf":
            self.aiperf_exe = aiperf.executable(server.get("aiperf"))
            self.aiperf_version = aiperf.version(self.aiperf_exe)

    def load_generator(self) -> dict:
        """The manifest's `backend.load_generator`: which sent the timed requests, its version and settings."""
        if self.aiperf_exe is None:
            return aiperf.OURS
        return {"name": "aiperf", "version": self.aiperf_version, "executable": self.aiperf_exe,
                "requests": "streamed completions of our prompt ids (AIPerf inputs_json payloads, sent verbatim)",
                "settings": aiperf.template(),
                "timings": "AIPerf's own per request (time_to_first_token, inter_chunk_latency = ITL, request_start_ns)",
                "artifacts": "aiperf/ in the run folder, one folder per wave"}

    def base_url(self, prepared: Prepared) -> str: ...

    def served_model(self, prepared: Prepared) -> str: ...

    def dead(self, prepared: Prepared) -> str | None:
        """Why the server no longer serves (None: it does)."""
        ...

    def generate(self, prepared: Prepared, prompt: list[int], spec: RequestSpec) -> RequestResult:
        """One request outside any wave (the warm-up), under the default time limit, not the run's."""
        box: list[RequestResult] = []
        asyncio.run(self._wave(prepared, [prompt], [spec], Schedule(), lambda i, r: box.append(r), REQUEST_S))
        if box[0].error is not None:
            raise DSparkError(f"system '{prepared.system.name}': a request failed ({box[0].error})")
        return box[0]

    def generate_many(self, prepared: Prepared, prompts: list[list[int]], specs: list[RequestSpec],
                      schedule: Schedule, on_result: OnResult) -> dict:
        """Send the wave; returns what the server's counters grew by during it (`spec_counters`, where it
        has them) and whether its requests' own acceptance adds up to that (`acceptance_check`, where
        they carry any)."""
        why = self.dead(prepared)
        if why is not None:
            raise self._died(prepared, why)
        url = self.base_url(prepared)
        totals: list[dict | None] = []

        def kept(i: int, result: RequestResult) -> None:
            on_result(i, result)
            totals.append(result.acceptance_totals)

        before = spec_counters(fetch(url))
        artifacts = None
        if self.aiperf_exe is None:
            asyncio.run(self._wave(prepared, prompts, specs, schedule, kept, self.request_timeout_s))
        else:
            what = f"{prepared.system.name}-c{schedule.concurrency}"
            try:
                done, artifacts = aiperf.run(self.aiperf_exe, url, self.served_model(prepared), str(self.tokenizer_path), prompts,
                                  specs, schedule, self.run_dir / "aiperf", what, self.request_timeout_s)
            except DSparkError:
                why = self.dead(prepared)  # (the server's death, not AIPerf's: say so, and that a resume goes on)
                if why is not None:
                    raise self._died(prepared, why) from None
                raise
            for i in sorted(done):
                kept(i, self._result(prepared, prompts[i], done[i]))
        counters, said = delta(before, spec_counters(fetch(url))), {}
        if artifacts is not None:  # (AIPerf's own scrapes of the counters, held against ours)
            counters, said = aiperf.wave_counters(counters, artifacts)
        check = wave_check(totals, counters)
        return ({} if counters is None else {"spec_counters": counters}) | said | ({} if check is None else
                                                                                    {"acceptance_check": check})

    async def _wave(self, prepared: Prepared, prompts, specs, schedule: Schedule, on_result: OnResult,
                    timeout_s: float) -> None:
        import aiohttp

        limit = asyncio.Semaphore(schedule.concurrency)
        url = self.base_url(prepared) + ("/v1/completions" if self.sends_ids else "/v1/chat/completions")
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def one(i: int, at: float, spec: RequestSpec) -> tuple[int, StreamResult]:
            await asyncio.sleep(max(0.0, start + at - loop.time()))
            body = completion_body(self.served_model(prepared), prompts[i], spec.max_new_tokens, spec.temperature,
                                   spec.seed, list(spec.stop_token_ids)) if self.sends_ids else chat_body(
                self.served_model(prepared), list(spec.messages), spec.max_new_tokens, spec.temperature, spec.seed,
                list(spec.stop_token_ids), self.vllm_extensions)
            async with limit:
                return i, await stream_chat(session, url, body, timeout_s)

        connector = aiohttp.TCPConnector(limit=0)  # the semaphore is the only limit, as in vllm bench serve
        async with aiohttp.ClientSession(connector=connector) as session:
            tasks = [asyncio.create_task(one(i, at, s)) for i, (at, s) in enumerate(zip(schedule.arrivals(len(specs)),
                                                                                       specs))]
            try:
                for done in asyncio.as_completed(tasks):
                    i, streamed = await done
                    on_result(i, self._result(prepared, prompts[i], streamed))
            finally:
                for task in tasks:
                    task.cancel()
                with contextlib.suppress(BaseException):
                    await asyncio.gather(*tasks, return_exceptions=True)

    def _result(self, prepared: Prepared, prompt: list[int], r: StreamResult) -> RequestResult:
        if r.error is not None:
            why = self.dead(prepared)
            if why is not None:  # not the request's fault: stop, and let a resume send it again
                raise self._died(prepared, why)
            return RequestResult(tokens=[], prefill_s=r.ttft_s, decode_s=r.e2el_s - (r.ttft_s or 0.0),
                                 stop_reason="failed", acceptance_source=None, start_utc=r.start_utc, error=r.error)
        if r.prompt_token_ids is not None and r.prompt_token_ids != list(prompt):
            raise DSparkError("the server's prompt ids differ from ours (its chat template or tokenizer differs); "
                              "the engines would not see the same input")
        ttft = r.ttft_s or 0.0
        tokens = list(r.token_ids) if r.token_ids is not None else []
        return RequestResult(
            tokens=tokens, prefill_s=r.ttft_s, decode_s=r.e2el_s - ttft,
            stop_reason="stop_token" if r.finish_reason == "stop" else "max_new_tokens",
            **request_acceptance(r.spec_decode), start_utc=r.start_utc, text=None if r.token_ids is not None else r.text,
            extra={"itl_ms": [round(1e3 * x, 3) for x in r.itl_s], "usage_output_tokens": r.output_tokens,
                   "usage_prompt_tokens": r.prompt_tokens, "server_prompt_ids_checked": r.prompt_token_ids is not None})

    def _died(self, prepared: Prepared, why: str) -> DSparkError:
        return DSparkError(f"the server of system '{prepared.system.name}' stopped serving ({why}); the finished "
                           "requests are kept: resume the run")

    def reset_peak_memory(self) -> None:
        pass

    def peak_memory(self) -> int | None:
        return None  # the server's memory is its own

    def capture(self, kind: str | None, run_dir: Path):
        return contextlib.nullcontext()  # (a served run is never profiled: refused at construction)

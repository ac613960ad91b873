"""One streamed chat completion (or a completion of token ids) against an OpenAI-compatible server, timed
from the stream: what a serving benchmark measures per request (the definitions of `vllm bench serve`).

- TTFT: request sent to the first chunk that carries output (text or token ids);
- ITL: the gaps between later chunks that carry output (under speculative decoding one chunk may
  carry several tokens, so ITL is not TPOT);
- E2EL: request sent to the last chunk that carries output (as `vllm bench serve` measures it; the
  usage chunk and `[DONE]` after it are not part of the latency);
- tokens: `usage.completion_tokens` (asked for with `stream_options.include_usage`), and the token
  ids themselves where the server returns them (vLLM's `return_token_ids`), with the prompt's ids
  as the server tokenised them, so the input can be held against ours;
- a vLLM server started with `--per-request-spec-decode-metrics detailed` puts the request's own
  speculative metrics (per-step drafted and accepted) on the final usage chunk, at any concurrency.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field


@dataclass
class StreamResult:
    text: str = ""
    token_ids: list[int] | None = None  # where the server returns them
    prompt_token_ids: list[int] | None = None
    output_tokens: int | None = None  # usage.completion_tokens
    prompt_tokens: int | None = None
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    e2el_s: float = 0.0
    finish_reason: str | None = None
    spec_decode: dict | None = None  # vLLM's per-request speculative metrics (the final usage chunk's)
    error: str | None = None  # the request failed: what the server or the connection said
    start_utc: float = 0.0  # when it was sent (wall clock)


def get(url: str, timeout_s: float = 5.0) -> bytes | None:
    """The body of a plain GET of one of the server's endpoints (`/v1/models`, `/metrics`, `/version`), or
    None where it does not answer, has no such endpoint, or breaks off mid-answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.read()
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException):
        return None


def healthy(base_url: str) -> bool:
    """Whether the server's engine lives: vLLM's `/health` answers 503 once its EngineCore died, while
    the server itself goes on answering everything else."""
    return get(base_url + "/health") is not None


def models(base_url: str) -> dict | None:
    """The server's `/v1/models`, or None while it does not answer."""
    body = get(base_url + "/v1/models")
    try:
        return None if body is None else json.loads(body)
    except ValueError:
        return None


def chat_body(model: str, messages: list[dict], max_tokens: int, temperature: float, seed: int,
              stop_token_ids: list[int], vllm_extensions: bool) -> dict:
    """The request: streamed, usage included; vLLM's own fields (token ids back, the stop tokens, or
    none with ignore_eos, the chat template's thinking switch) only for a vLLM server."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": temperature,
            "seed": seed, "stream": True, "stream_options": {"include_usage": True}}
    if vllm_extensions:
        body |= {"return_token_ids": True, "ignore_eos": not stop_token_ids, "stop_token_ids": stop_token_ids,
                 "chat_template_kwargs": {"enable_thinking": False}}
    return body


def completion_body(model: str, prompt: list[int], max_tokens: int, temperature: float, seed: int,
                    stop_token_ids: list[int]) -> dict:
    """A streamed completion of the prompt's token ids (a vLLM server started without a tokenizer, for a
    random-weight target: the chat template was applied on our side), the token ids returned."""
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature, "seed": seed,
            "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True,
            "ignore_eos": not stop_token_ids, "stop_token_ids": stop_token_ids}


def read_chunk(out: StreamResult, chunk: dict) -> bool:
    """One server-sent event's JSON into `out`; whether it carries output (text or token ids: the chunks
    the latencies are timed by). vLLM's per-request speculative metrics ride on the final usage chunk
    (`metrics.speculative_decoding`, where the server was started with `--per-request-spec-decode-metrics`
    and the request asked for usage); an error event (vLLM: its engine died after the 200) sets `out.error`."""
    if chunk.get("error"):
        error = chunk["error"]
        out.error = f"error event: {error.get('message', error) if isinstance(error, dict) else error}"[:300]
        return False
    if chunk.get("prompt_token_ids") is not None:
        out.prompt_token_ids = list(chunk["prompt_token_ids"])
    spec = (chunk.get("metrics") or {}).get("speculative_decoding")
    if spec:
        out.spec_decode = spec
    usage = chunk.get("usage")
    if usage:
        out.output_tokens = usage.get("completion_tokens")
        out.prompt_tokens = usage.get("prompt_tokens")
    carries = False
    for choice in chunk.get("choices") or []:
        text = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
        ids = choice.get("token_ids")
        if ids is not None:
            out.token_ids = (out.token_ids or []) + list(ids)
        carries = carries or bool(text or ids)
        out.text += text
        if choice.get("finish_reason"):
            out.finish_reason = choice["finish_reason"]
    return carries


async def stream_chat(session, url: str, body: dict, timeout_s: float) -> StreamResult:
    """POST `body` to `url` (an aiohttp session) and read its server-sent events to the end."""
    import aiohttp

    out = StreamResult(start_utc=time.time())
    start = last = time.perf_counter()
    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                out.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                return out
            async for raw in resp.content:
                line = raw.decode("utf-8", errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                if read_chunk(out, json.loads(data)):
                    if out.ttft_s is None:
                        out.ttft_s = now - start
                    else:
                        out.itl_s.append(now - last)
                    last = now
                if out.error is not None:
                    break
    except TimeoutError:
        out.error = f"timed out after {timeout_s:g} s"
    except (aiohttp.ClientError, ValueError) as exc:  # ValueError: a chunk that is not JSON
        out.error = f"{type(exc).__name__}: {exc}"[:300]
    # aiohttp's limit misses a request whose end we see late: it drops its timer once the response's last byte
    # is read, and the event loop reads sockets before it runs the timers that fell due. A client descheduled
    # past the limit (a loaded machine) while the server finished reads all the rest at once: the timer never
    # fires, and the request would be a success that took longer than it may. The end we saw decides.
    if out.error is None and time.perf_counter() - start > timeout_s:
        out.error = f"timed out after {timeout_s:g} s"
    out.e2el_s = (last if out.ttft_s is not None else time.perf_counter()) - start
    return out

"""A served request past `--request-timeout` is failed however late the client sees its end.

Found as a flaky `tests/test_server.py::test_a_request_past_its_time_limit_is_recorded_as_failed` on a loaded
2-core CI machine: aiohttp drops a request's total-time timer once the response's last byte is read, and the
event loop reads sockets before it runs the timers that fell due. A client that was descheduled past the limit
while the server finished reads the whole rest of the stream at once, the timer never fires, and the request
came back a success that took longer than it may. Here the descheduling is the client's event loop held (the
same for the loop as a process the machine does not run), from the moment the response's headers are read
until a real aiohttp server, past the limit, has sent the rest and ended the stream.
"""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

aiohttp = pytest.importorskip("aiohttp")
from aiohttp import web

from harness.backends.served.stream import chat_body, stream_chat

TOKENS = 40
LIMIT_S = 0.2


def _chunk(i: int) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": f"t{i} "}, "token_ids": [i],
                                                 "finish_reason": "length" if i == TOKENS - 1 else None}]}).encode() + b"\n\n"


class Server:
    """A real streaming chat server on 127.0.0.1 (its own thread and loop): the headers and the first chunk at
    once, then (where `hold`: once `go` is set and `LIMIT_S` + 0.1 s more have passed) the other chunks, the usage
    chunk and `[DONE]`, the stream ended, and `sent` set."""

    def __init__(self):
        self.go, self.sent, ready = threading.Event(), threading.Event(), threading.Event()
        self.hold = False
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(ready),), daemon=True)
        self._thread.start()
        assert ready.wait(60)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_chunk(0))
        if self.hold:
            await asyncio.get_running_loop().run_in_executor(None, self.go.wait, 60)
            await asyncio.sleep(LIMIT_S + 0.1)  # (the client started before `go`: its limit has passed)
        # the rest and the stream's end in one write: the client reads them at once, as one that was not run
        # while a server finished reads what queued up meanwhile
        usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": TOKENS}}
        await resp.write_eof(b"".join(map(_chunk, range(1, TOKENS))) + b"data: " + json.dumps(usage).encode()
                             + b"\n\ndata: [DONE]\n\n")
        self.sent.set()
        return resp

    async def _serve(self, ready: threading.Event) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port, self._loop, self._stop = runner.addresses[0][1], asyncio.get_running_loop(), asyncio.Event()
        ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.close()


def _request(server: Server, timeout_s: float, held: bool):
    """One `stream_chat` against the server; where `held`, the client's loop is held from the moment the
    response's headers are read until the server has sent the whole rest (aiohttp's `on_request_end` signal)."""

    def hold_loop() -> None:
        server.go.set()
        server.sent.wait(60)

    async def headers_read(session, context, params) -> None:
        if held:
            asyncio.get_running_loop().call_soon(hold_loop)

    async def main():
        trace = aiohttp.TraceConfig()
        trace.on_request_end.append(headers_read)
        async with aiohttp.ClientSession(trace_configs=[trace]) as session:
            body = chat_body("m", [{"role": "user", "content": "hi"}], TOKENS, 0.0, 0, [], True)
            return await stream_chat(session, f"http://127.0.0.1:{server.port}/v1/chat/completions", body, timeout_s)

    server.hold, server.go, server.sent = held, threading.Event(), threading.Event()
    return asyncio.run(main())


def test_a_stream_that_ends_past_the_limit_while_the_client_was_held_is_timed_out(server):
    result = _request(server, LIMIT_S, held=True)
    assert server.sent.is_set()  # the server sent every token and ended the stream ...
    assert result.error == f"timed out after {LIMIT_S:g} s"  # ... past the limit: failed, not a success


def test_a_stream_that_ends_within_its_limit_is_a_success(server):
    result = _request(server, 600.0, held=False)
    assert result.error is None and result.output_tokens == TOKENS and result.token_ids == list(range(TOKENS))
    assert result.finish_reason == "length"

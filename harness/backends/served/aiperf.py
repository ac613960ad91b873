"""NVIDIA AIPerf as the load generator of a served run (`run --load-generator aiperf`): the harness starts
(or finds) the server as with its own client, then each wave is one AIPerf process sending the run's own
requests, and AIPerf's per-request records come back as the run's own.

Why this shape:
- AIPerf 0.13.0 pins dozens of packages (rich, pandas, pyzmq, psutil, pillow) below what vLLM 0.32
  installs, so it lives in its own environment; the harness runs its `aiperf` executable (`--aiperf PATH`,
  else `aiperf` on PATH) as a subprocess with an argument list, never imports it.
- Both load generators must send identical requests: each request goes to AIPerf as a verbatim payload, a
  streamed completion of our prompt ids (`completion_body`, the same fields our client sends to a server
  without a tokenizer), in AIPerf's `inputs_json` format, whose session ids (`r<index>`) map AIPerf's
  records back to our requests. (Its `raw_payload` format refuses any line without a `messages` array, so
  a completions body cannot go that way.)
- The timings are AIPerf's own (`profile_export.jsonl`): TTFT, the gaps between chunks, the start. The
  naming trap: AIPerf's `inter_chunk_latency` is vLLM's ITL (our `itl_ms`); its `inter_token_latency` is
  vLLM's TPOT. What the server sent (token ids, the prompt ids it read, vLLM's per-request speculative
  metrics) comes from AIPerf's raw export (`profile_export_raw.jsonl`), read chunk by chunk as our own
  client reads a stream (`read_chunk`), so both load generators' records hold the same fields.
- No AIPerf warm-up: its warm-up requests would fall inside the server counters read around the wave;
  the harness warms each system once with its own client, untimed, as it does for its own runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path

from dspark.errors import DSparkError
from harness.backends.base import RequestSpec, Schedule
from harness.backends.served.metrics import exported_counters
from harness.backends.served.stream import StreamResult, completion_body, read_chunk

INSTALL = ("python3 -m venv ~/.aiperf-venv && ~/.aiperf-venv/bin/pip install aiperf==0.13.0, then give --aiperf "
           "~/.aiperf-venv/bin/aiperf (its pins clash with vLLM's: keep it out of this environment)")
NAMES = ("ours", "aiperf")  # --load-generator: our client (the default) or AIPerf
OURS = {"name": "ours", "client": "dspark-bench's own client (asyncio and aiohttp, vllm bench serve's definitions)"}
RECORDS, RAW, OUTPUT = "profile_export.jsonl", "profile_export_raw.jsonl", "aiperf-output.log"
SERVER_METRICS = "server_metrics_export.json"  # AIPerf's scrapes of the server's /metrics over its run
OUR_SCRAPE = "dspark-bench's reads of /metrics before and after the AIPerf process"
THEIR_SCRAPE = f"AIPerf's {SERVER_METRICS} (its last scrape before its profiling phase to its last in it)"


def executable(given: str | None) -> str:
    """The `aiperf` to run: `given` (--aiperf), else the one on PATH; one line naming the install where
    there is none."""
    found = shutil.which(given or "aiperf")
    if found is None:
        where = f"--aiperf {given}: no aiperf executable there" if given else "no aiperf on PATH"
        raise DSparkError(f"--load-generator aiperf: {where}; install it in its own environment: {INSTALL}")
    return found


def version(exe: str) -> str:
    """What `aiperf --version` says (its last line): recorded in the manifest, and proof it runs at all."""
    try:
        done = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=300)
    except OSError as exc:
        raise DSparkError(f"--aiperf {exe}: it does not run ({exc}); install it: {INSTALL}") from None
    lines = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    if done.returncode != 0 or not lines:
        raise DSparkError(f"--aiperf {exe}: `aiperf --version` failed ({lines[-1] if lines else done.returncode}); "
                          f"install it: {INSTALL}")
    return lines[-1]


def write_payloads(path: Path, model: str, prompts: list[list[int]], specs: list[RequestSpec]) -> None:
    """AIPerf's `inputs_json` file: one session per request (`r<index>`), its one payload the request our
    client would send to a server without a tokenizer."""
    data = [{"session_id": f"r{i}", "payloads": [completion_body(model, list(prompt), spec.max_new_tokens,
                                                                 spec.temperature, spec.seed,
                                                                 list(spec.stop_token_ids))]}
            for i, (prompt, spec) in enumerate(zip(prompts, specs))]
    path.write_text(json.dumps({"data": data}))


def command(exe: str, url: str, model: str, tokenizer: str, inputs: Path, count: int, schedule: Schedule,
            artifacts: Path, timeout_s: float | None = None) -> list[str]:
    """AIPerf's argument list for one wave: every payload once, in order, at most `concurrency` in flight,
    arrivals at the run's request rate (a gamma process of shape `burstiness`, as ours) where it has one;
    each request's limit our client's (`timeout_s`: the run's --request-timeout, else its default; AIPerf's
    own is 6 hours), so a request past it fails under either load generator; token counts from the
    server's usage; every request's records and raw responses exported."""
    args = [exe, "profile", "--model", model, "--url", url, "--endpoint-type", "completions", "--streaming",
            "--input-file", str(inputs), "--custom-dataset-type", "inputs_json", "--dataset-sampling-strategy",
            "sequential", "--request-count", str(count), "--concurrency", str(schedule.concurrency),
            "--random-seed", str(schedule.seed), "--use-server-token-count", "--tokenizer", tokenizer,
            "--export-level", "raw", "--artifact-dir", str(artifacts), "--ui-type", "none"]
    if timeout_s is not None:
        args += ["--request-timeout-seconds", f"{timeout_s:g}"]
    if schedule.request_rate is not None:
        args += ["--request-rate", f"{schedule.request_rate:g}", "--arrival-pattern", "gamma",
                 "--arrival-smoothness", f"{schedule.burstiness:g}"]
    return args


def template() -> list[str]:
    """The manifest's record of AIPerf's arguments: `command` with what differs per wave named, not given."""
    args = command("aiperf", "URL", "MODEL", "TOKENIZER", Path("ARTIFACTS/inputs.json"), 0, Schedule(), Path("ARTIFACTS"),
                   1.0)
    for flag, name in (("--request-count", "REQUESTS"), ("--concurrency", "LEVEL"), ("--random-seed", "WAVE_SEED"),
                       ("--request-timeout-seconds", "REQUEST_TIMEOUT_S")):
        args[args.index(flag) + 1] = name
    return args + ["(with --request-rate: --request-rate RATE --arrival-pattern gamma --arrival-smoothness BURSTINESS)"]


def run(exe: str, url: str, model: str, tokenizer: str, prompts: list[list[int]], specs: list[RequestSpec],
        schedule: Schedule, folder: Path, what: str, timeout_s: float | None = None
        ) -> tuple[dict[int, StreamResult], Path]:
    """One wave through AIPerf, its artifacts in a new folder under `folder`: each request's result by its
    index in the wave (one past `timeout_s` failed, as our client says it), and that folder. AIPerf's
    failure is one line with its log; Ctrl-C stops it with the run."""
    artifacts = folder / f"{what}-{uuid.uuid4().hex[:8]}"
    artifacts.mkdir(parents=True)
    inputs = artifacts / "inputs.json"
    write_payloads(inputs, model, prompts, specs)
    log = artifacts / OUTPUT
    with open(log, "w") as out:
        proc = subprocess.Popen(command(exe, url, model, tokenizer, inputs, len(prompts), schedule, artifacts, timeout_s),
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=environment())
        try:
            code = proc.wait()
        finally:
            if proc.poll() is None:  # (interrupted: stop it, then let the interruption go on)
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    if code != 0 and not all_timed_out(artifacts, len(prompts), timeout_s):
        raise DSparkError(f"AIPerf failed ({what}, exit {code}): {last_line(log)}; its log: {log} (the finished "
                          "waves are kept)")
    results = read_artifacts(artifacts, timeout_s)
    missing = sorted(set(range(len(prompts))) - set(results))
    if missing:
        raise DSparkError(f"AIPerf ({what}) recorded no result for {len(missing)} of the wave's {len(prompts)} "
                          f"requests; its log: {log}; the finished waves are kept: resume the run")
    return results, artifacts


def all_timed_out(artifacts: Path, count: int, timeout_s: float | None) -> bool:
    """Whether AIPerf recorded every request of the wave, each past the run's limit: AIPerf exits 1 when no
    request succeeded, but a wave our client sends where every request times out is a wave of failed
    requests, recorded, not a failed run; any other failure of every request (a dead address) stays one."""
    try:
        results = read_artifacts(artifacts, timeout_s)
    except (ValueError, KeyError):  # (an export AIPerf left torn: its failure stands)
        return False
    said = None if timeout_s is None else f"timed out after {timeout_s:g} s"
    return len(results) == count > 0 and all(r.error == said for r in results.values())


def wave_counters(ours: dict | None, artifacts: Path) -> tuple[dict | None, dict]:
    """The counters a wave of AIPerf's keeps (`spec_counters`), and what its record says of them: ours
    where we read them (our reads bracket the whole AIPerf process, so they hold the wave and nothing of
    AIPerf's is outside them), AIPerf's export kept beside with whether it agrees; AIPerf's alone where we
    read none. AIPerf's window is narrower, from scrape to scrape (about every 0.3-1 s), so it can miss
    the wave's last steps (a final scrape before the server counted them) or, on a shared server, hold
    fewer of another client's requests: a demanding reader needs both figures and where they part, not
    one silently chosen."""
    theirs = exported_counters(read_json(artifacts / SERVER_METRICS))
    if ours is None:
        return theirs, ({} if theirs is None else {"counters_source": THEIR_SCRAPE})
    said: dict = {"counters_source": OUR_SCRAPE}
    if theirs is None:
        return ours, said | {"aiperf_counters": None}
    agrees = theirs == ours
    return ours, said | {"aiperf_counters": {"spec_counters": theirs, "agrees": agrees, **({} if agrees else {
        "why": "AIPerf's scrapes cover less than our reads around its process: a scrape that came before the "
               "server counted the wave's last steps, or another client's requests outside AIPerf's window"})}}


def environment() -> dict[str, str]:
    """AIPerf's environment: ours without the hub's offline switches. AIPerf 0.13.0 in offline mode reads
    every tokenizer name as a hub id (its `_resolve_local_snapshot`), so the local folder we give it fails
    there; a local folder needs no network either way (its alias lookup skips absolute paths)."""
    return {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}


ERROR = re.compile(r"\bERROR\s+(.*?)\s*(\([\w./]+:\d+\))?$")  # AIPerf's log line: time, level, text, (file:line)


def last_line(log: Path) -> str:
    """What AIPerf said last about its failure: its last ERROR line's text, else its last line that says
    something (its boxes' borders stripped)."""
    lines = [line.strip(" │╭╮╰╯─") for line in log.read_text(errors="replace").splitlines()]
    errors = [m.group(1) for m in map(ERROR.search, lines) if m]
    said = errors or [line for line in lines if line]
    return (said[-1] if said else "no output")[:300]


def read_artifacts(artifacts: Path, timeout_s: float | None = None) -> dict[int, StreamResult]:
    """AIPerf's timed requests (its profiling phase) in an artifact folder, by our request index (the
    session id `r<index>` of its payload): AIPerf's timings, and what the server sent as its raw export
    holds it; a request AIPerf gave up on at `timeout_s` failed as our client says it."""
    raw = {m["metadata"]["x_request_id"]: m for m in read_lines(artifacts / RAW) if timed(m)}
    out: dict[int, StreamResult] = {}
    for record in read_lines(artifacts / RECORDS):
        if not timed(record):
            continue
        meta = record["metadata"]
        index = int(str(meta["conversation_id"]).removeprefix("r"))
        out[index] = streamed(record, raw.get(meta["x_request_id"]), timeout_s)
    return out


TIMEOUTS = ("TimeoutError", "ServerTimeoutError", "SocketTimeoutError", "ConnectionTimeoutError")  # AIPerf's error types
# for a request past --request-timeout-seconds (aiohttp's total limit; its type is the exception's class name)


def streamed(record: dict, raw: dict | None, timeout_s: float | None = None) -> StreamResult:
    """One AIPerf record as our client's `StreamResult`: its TTFT and inter-chunk latencies (vLLM's ITL;
    the end-to-end latency to the last chunk with output, as ours), its start; the server's chunks
    through `read_chunk`; its error where it failed, a timeout at `timeout_s` in our client's words, and
    a success that ended past the limit timed out too, as our client holds it (the end decides)."""
    out = StreamResult(start_utc=record["metadata"]["request_start_ns"] / 1e9)
    for response in (raw or {}).get("responses") or []:
        for packet in response.get("packets") or []:
            value = packet.get("value")
            if packet.get("name") == "data" and value and value != "[DONE]":
                chunk = json.loads(value)
                read_chunk(out, chunk)
                for choice in chunk.get("choices") or []:  # (a completion's prompt ids ride on its choice)
                    if choice.get("prompt_token_ids") is not None:
                        out.prompt_token_ids = list(choice["prompt_token_ids"])
    metrics = record.get("metrics") or {}
    ttft = (metrics.get("time_to_first_token") or {}).get("value")
    out.ttft_s = None if ttft is None else ttft / 1e3
    out.itl_s = [x / 1e3 for x in (metrics.get("inter_chunk_latency") or {}).get("value") or []]
    end = (record["metadata"]["request_end_ns"] - record["metadata"]["request_start_ns"]) / 1e9
    out.e2el_s = out.ttft_s + sum(out.itl_s) if out.ttft_s is not None else end
    if out.output_tokens is None:  # (no raw export: AIPerf's own count of the server's usage)
        out.output_tokens = (metrics.get("usage_completion_tokens") or metrics.get("output_token_count") or
                             {}).get("value")
    error = record.get("error")
    if timeout_s is not None and ((error or {}).get("type") in TIMEOUTS or (not error and end > timeout_s)):
        out.error = f"timed out after {timeout_s:g} s"
    elif error:
        out.error = f"AIPerf: {error.get('type') or ''} {error.get('code') or ''} {error.get('message')}".strip()[:300]
    return out


def timed(record: dict) -> bool:
    """A request of AIPerf's profiling phase: its warm-up's are not timed, and a record that names no phase
    (an AIPerf without phases) is one."""
    return (record.get("metadata") or {}).get("benchmark_phase", "profiling") == "profiling"


def read_json(path: Path) -> dict | None:
    """An AIPerf export read whole: None where it is absent or not JSON, so a damaged optional export (the
    server-metrics scrape) costs its figures, never the run or report; a caller that needs the file says so."""
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except ValueError:
        return None


def read_lines(path: Path) -> list[dict]:
    """An AIPerf JSON-lines export (records, raw), blank lines skipped; [] where it is absent. A line that
    is not JSON raises ValueError: a damaged record export is the caller's to refuse, not to read around."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

"""Reading a run folder's records: the file names, a request's key, the manifest, and the finished
requests of `requests.jsonl` (a torn last line skipped). Used by the run that writes the folder and by every
reader of it (report, summaries, profiles, notebooks)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from dspark.errors import DSparkError

MANIFEST, REQUESTS, WAVES = "manifest.json", "requests.jsonl", "waves.jsonl"
UNPROFILED = "unprofiled"  # a profile folder's run of the same requests without a profiler, beside its profiled runs


def not_a_run(path: Path) -> str:
    """Why `path` is no run folder, in words for a one-line refusal: a mistyped path is "no such folder",
    not "no manifest.json" (which sends the reader looking for a file in a folder that is not there)."""
    path = Path(path)
    if not path.exists():
        return "no such folder"
    if not path.is_dir():
        return "a file, not a run folder"
    return f"not a run folder (no {MANIFEST} or {REQUESTS})"


KEY_FIELDS = ("system", "question_id", "turn", "temperature")  # a request's identity (concurrency: 1 if absent)


def request_key(record: dict) -> tuple:
    """(system, question, turn, temperature, concurrency): a request of a sweep is one of these, once."""
    return (record["system"], record["question_id"], record["turn"], float(record["temperature"]),
            int(record.get("max_concurrency", 1)))


def read_manifest(run_dir: Path) -> dict | None:
    """A run folder's manifest (None when it has none): every reader of one reads it here, so a damaged
    file (not JSON, empty, or JSON but not an object) is refused in one line, never a traceback."""
    path = Path(run_dir) / MANIFEST
    if not path.is_file():
        return None
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        raise DSparkError(f"{path}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    try:
        manifest = json.loads(text)
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict):
        what = "empty" if not text.strip() else "not JSON" if manifest is None else "not a JSON object"
        raise DSparkError(f"{path}: damaged ({what}), so the run's record of what produced it is lost; restore the "
                          "file from a copy, or run again into a new folder")
    return manifest


def read_waves(run_dir: Path, repair: bool = False) -> list[dict]:
    """The waves of a served run that finished (their counters read after the last request)."""
    return read_requests(run_dir, repair, WAVES)


class RepeatedRequests(UserWarning):
    """A request recorded more than once in a run's `requests.jsonl` (two processes ran the run at once,
    before a run folder was owned by one: `harness.runs.owner`); each is counted once."""


def read_requests(run_dir: Path, repair: bool = False, name: str = REQUESTS) -> list[dict]:
    """Finished requests, each once. A last line without its newline was torn (the process died while
    writing it): it is skipped, and cut from the file when `repair` (only a resuming run writes)."""
    path = Path(run_dir) / name
    if not path.is_file():
        return []
    data = path.read_bytes()
    records, good = [], 0
    for line in data.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a bad complete line is not an interruption: refuse
            raise DSparkError(f"{path}: a line is not JSON; the file was edited or is not a run") from None
        good += len(line)
    if repair and good < len(data):
        with path.open("r+b") as f:
            f.truncate(good)
    return once(records, path) if name == REQUESTS else records


def once(records: list[dict], path: Path) -> list[dict]:
    """`records` with a request recorded again (the same `request_key`) dropped, the first kept, and a
    warning (`RepeatedRequests`) saying how many were dropped: a request is counted once, never twice. A
    line without a request's identity (`KEY_FIELDS`) is no request to count twice: kept as it is."""
    seen: set[tuple] = set()
    kept = []
    for record in records:
        if isinstance(record, dict) and all(k in record for k in KEY_FIELDS):
            key = request_key(record)
            if key in seen:
                continue
            seen.add(key)
        kept.append(record)
    if len(kept) < len(records):
        again = len(records) - len(kept)
        warnings.warn(RepeatedRequests(
            f"{path}: {again} request{'s' if again > 1 else ''} recorded more than once (two processes ran this "
            f"run at the same time); each counted once ({len(kept)} requests)"), stacklevel=3)
    return kept


def requests_and_notes(run_dir: Path, repair: bool = False) -> tuple[list[dict], list[str]]:
    """A run's finished requests (`read_requests`) and, as lines for its summary's warnings or a resumed
    run's notices, what reading them found (a request recorded more than once): said beside the figures."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RepeatedRequests)
        records = read_requests(run_dir, repair)
    return records, [str(w.message) for w in caught if issubclass(w.category, RepeatedRequests)]


TRACE_SUFFIXES = (".summary.json", ".json.gz", ".json", ".sqlite", ".nsys-rep")  # a trace file: <name><suffix>


def trace_name(path: Path) -> str:
    """A trace or trace-summary file's name without its format's suffix (`a/trace.torch.json.gz`:
    trace.torch, `dspark.sqlite`: dspark)."""
    return next((path.name.removesuffix(s) for s in TRACE_SUFFIXES if path.name.endswith(s)), path.stem)

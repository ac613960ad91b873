"""SPEED-Bench prompts: from the hub, from the local shapes people have, or from our demo suite.

Every shape is normalised to the hub's row schema (`question_id`, `category`, `sub_category`,
`turns`, `source`, `src_id`, `difficulty`, `multiturn`):
- the hub's parquet, and specdec_bench's reconstructed parquet (`turns`);
- NeMo-Skills' JSONL (`messages`: the user messages become the turns), as vLLM and AIPerf read it;
- any JSONL with `turns` (DeepSpec's evaluation sets); without `category` the file's stem is the category.
Rows whose text is still the hub's placeholder must be rebuilt from their sources first.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from dspark.errors import DSparkError

HUB_ID = "nvidia/SPEED-Bench"
SPLITS = ("qualitative", "throughput_1k", "throughput_2k", "throughput_8k", "throughput_16k", "throughput_32k")
QUALITATIVE = ("coding", "humanities", "math", "multilingual", "qa", "rag", "reasoning", "roleplay", "stem",
               "summarization", "writing")
THROUGHPUT = ("low_entropy", "mixed", "high_entropy")
SENTINEL = "FULL BENCHMARK DATA SHOULD BE FETCHED FROM THE SOURCE USING SPECDEC_BENCH"
REBUILD = ("rebuild them from their sources with the official scripts, e.g. in NVIDIA/Model-Optimizer "
           "examples/specdec_bench: `python3 prepare_data.py --dataset speed --config all` (writes "
           "data/speed/<config>/test.parquet), or NeMo-Skills' nemo_skills/dataset/speed-bench/prepare.py "
           "(writes <config>.jsonl); then pass that folder with --dataset-path")


@dataclass(frozen=True)
class Row:
    question_id: str
    category: str
    turns: tuple[str, ...]
    sub_category: str = ""
    source: str = ""
    src_id: str = ""
    difficulty: str = ""
    multiturn: bool = False

    def to_dict(self) -> dict:
        return asdict(self) | {"turns": list(self.turns)}


@dataclass
class Dataset:
    rows: list[Row]
    origin: dict  # what was read: hub id and revision, or files and their sha256


def demo_suite_dir():
    return resources.files("harness").joinpath("data/speed_demo")


def categories_of(split: str) -> tuple[str, ...]:
    return QUALITATIVE if split == "qualitative" else THROUGHPUT


def check_split(split: str) -> None:
    """Refuse a split that is not one of SPEED-Bench's configs (before any data is read)."""
    if split not in SPLITS:
        raise DSparkError(f"unknown split '{split}'; use one of {', '.join(SPLITS)}")


def check_revision(revision: str, source: str, experiment: str | None = None) -> None:
    """Refuse a dataset revision where nothing would read it: only the hub has revisions; the demo suite
    ships with the package and local files are read as they are (a revision given there was silently ignored).
    `source`: the data the run reads (hub, demo, or files: --dataset-path, whatever the experiment says);
    `experiment`: the file the revision came from (None: --dataset-revision)."""
    if source == "hub":
        return
    where = "--dataset-path reads local files as they are" if source == "files" else \
        "the demo suite ships with the package"
    given, drop = ((f"--dataset-revision {revision}", "--dataset-revision") if experiment is None else
                   (f"{experiment}: dataset_revision = {json.dumps(revision)}",
                    "dataset_revision from the experiment" + (" (or --dataset-path)" if source == "files" else "")))
    raise DSparkError(f"{given}: a revision applies only to hub datasets ({HUB_ID}); {where}: drop {drop}")


def load(split: str, dataset_path: Path | None = None, source: str = "hub", revision: str | None = None) -> Dataset:
    """The rows of one SPEED-Bench config (`split`), from `dataset_path`, the demo suite or the hub."""
    check_split(split)
    if dataset_path is not None:
        files = _local_files(Path(dataset_path), split)
    elif source == "demo":
        path = demo_suite_dir().joinpath(f"{split}.jsonl")
        if not path.is_file():
            have = sorted(p.name.removesuffix(".jsonl") for p in demo_suite_dir().iterdir() if p.name.endswith(".jsonl"))
            raise DSparkError(f"the demo suite has no '{split}' split (it has {', '.join(have)}); "
                              "give --dataset-path with SPEED-Bench data for it")
        files = [Path(str(path))]
    elif source == "hub":
        return _load_hub(split, revision)
    else:
        raise DSparkError(f"unknown dataset source '{source}'; use hub or demo")
    rows: list[Row] = []
    for f in files:
        rows += [normalise(r, f.stem if f.stem not in ("test", split) else split, f"{f}:{i + 1}")
                 for i, r in enumerate(read_records(f))]
    if not rows:
        raise DSparkError(f"{dataset_path or files[0]}: no rows")
    _unique_ids(rows)
    return Dataset(rows, {"kind": "demo" if dataset_path is None else "files", "split": split,
                          "files": {str(f): file_sha256(f) for f in files}})


def _local_files(path: Path, split: str) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise DSparkError(f"--dataset-path {path}: no such file or folder")
    for candidate in (path / f"{split}.jsonl", path / f"{split}.parquet"):
        if candidate.is_file():
            return [candidate]
    if (path / split).is_dir():
        found = sorted((path / split).glob("*.parquet")) or sorted((path / split).glob("*.jsonl"))
        if found:
            return found
    raise DSparkError(f"--dataset-path {path}: found neither {split}.jsonl, {split}.parquet nor {split}/*.parquet; "
                      "give the file itself or a folder holding one of those")


def read_records(path: Path) -> list[dict]:
    """Rows of a .jsonl, .json (a list) or .parquet file as dicts (any other name is read as JSONL)."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pandas as pd

        try:
            frame = pd.read_parquet(path)
        except Exception as exc:  # pyarrow raises many types for a bad file
            raise DSparkError(f"{path}: unreadable parquet ({type(exc).__name__}: {exc})") from None
        return frame.to_dict("records")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DSparkError(f"{path}: not UTF-8 text; give SPEED-Bench rows as a JSONL, JSON (a list) or parquet "
                          "file") from None
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DSparkError(f"{path}: not JSON ({exc.msg}); give a JSON list of rows or a JSONL file") from None
        if not isinstance(data, list):
            raise DSparkError(f"{path}: a JSON file must hold a list of rows")
        return data
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DSparkError(f"{path}:{n}: not JSON ({exc.msg}); one JSON object per line") from None
    return rows


def _strings(value) -> list | None:
    if value is None or isinstance(value, str):
        return None
    try:
        return list(value)  # lists, tuples and the numpy arrays pandas gives for list columns
    except TypeError:
        return None


def normalise(record: dict, default_category: str, where: str) -> Row:
    """One row in the hub's schema; DSparkError names the row and the problem."""
    if not isinstance(record, dict):
        raise DSparkError(f"{where}: a row must be an object")
    turns = _strings(record.get("turns"))
    if turns is None and "messages" in record:
        messages = _strings(record["messages"]) or []
        turns = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    if turns is None:
        raise DSparkError(f"{where}: no 'turns' (list of user messages) or 'messages' column; "
                          "SPEED-Bench rows hold one of them")
    if not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        raise DSparkError(f"{where}: 'turns' must be a non-empty list of non-empty strings")
    category = record.get("category", default_category)
    if not isinstance(category, str) or not category:
        raise DSparkError(f"{where}: 'category' must be a non-empty string")
    qid = record.get("question_id")
    if qid is None:
        qid = hashlib.sha256(json.dumps([category, turns]).encode()).hexdigest()[:32]
    return Row(question_id=str(qid), category=category, turns=tuple(turns),
               sub_category=str(record.get("sub_category") or ""), source=str(record.get("source") or ""),
               src_id=str(record.get("src_id") or ""), difficulty=str(record.get("difficulty") or ""),
               multiturn=bool(record.get("multiturn", len(turns) > 1)))


def _unique_ids(rows: list[Row]) -> None:
    seen: set[str] = set()
    for r in rows:
        if r.question_id in seen:
            raise DSparkError(f"question_id '{r.question_id}' appears twice; results are keyed by it")
        seen.add(r.question_id)


def _load_hub(split: str, revision: str | None) -> Dataset:
    try:
        from datasets import load_dataset

        data = load_dataset(HUB_ID, split, split="test", revision=revision)
    except Exception as exc:  # network, auth, missing revision: one message for the user
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise DSparkError(f"could not load {HUB_ID} config '{split}' from the hub ({first}); "
                          "give a local copy with --dataset-path") from None
    rows = [normalise(r, split, f"{HUB_ID}/{split}:{i + 1}") for i, r in enumerate(data)]
    _unique_ids(rows)
    fingerprint = getattr(data, "_fingerprint", None)
    return Dataset(rows, {"kind": "hub", "id": HUB_ID, "split": split, "revision": revision,
                          "fingerprint": fingerprint})


def select(rows: list[Row], split: str, categories: list[str] | None, num_prompts: int | None, seed: int,
           shuffle: bool) -> list[Row]:
    """Rows of the given categories (all when None); `num_prompts` of them, a seeded shuffle picking
    the subset unless `shuffle` is off (then file order). Placeholder rows stop the run."""
    present = sorted({r.category for r in rows})
    if categories:
        unknown = [c for c in categories if c not in present]
        if unknown:
            official = categories_of(split)
            valid = present if set(present) - set(official) else [c for c in official if c in present]
            raise DSparkError(f"unknown category '{unknown[0]}' for {split}; valid: {', '.join(valid)}")
        rows = [r for r in rows if r.category in categories]
    if shuffle:
        rows = list(rows)
        random.Random(seed).shuffle(rows)
    if num_prompts is not None:
        if num_prompts < 1:
            raise DSparkError(f"--num-prompts is {num_prompts}; give at least 1")
        rows = rows[:num_prompts]
    unresolved = [r for r in rows if any(t.startswith(SENTINEL) for t in r.turns)]
    if unresolved:
        raise DSparkError(f"{len(unresolved)} selected row(s) (e.g. {unresolved[0].question_id}, source "
                          f"{unresolved[0].source or '?'}) still hold the hub's placeholder text; {REBUILD}")
    return rows


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()

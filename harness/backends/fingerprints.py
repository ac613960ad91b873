"""What a model folder and a tokenizer are, as hashes: recorded in every run's manifest, compared on
resume, so a run never mixes weights or templates."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path


def file_fingerprint(path: Path) -> dict:
    """sha256 of a file; for files over 1 GB, of its safetensors header and size (fast, and any
    change of tensor names, shapes, dtypes or offsets shows)."""
    size = path.stat().st_size
    if size <= 1 << 30:
        return {"size": size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = f.read(n)
    return {"size": size, "header_sha256": hashlib.sha256(header).hexdigest()}


def model_record(path: Path) -> dict:
    """Where a model came from: its folder, the hub snapshot revision when it is one, its weights' hashes."""
    files = sorted(path.glob("*.safetensors")) + sorted(path.glob("*.pt"))
    rec = {"path": str(path), "files": {f.name: file_fingerprint(f) for f in files}}
    marker = path / "random-weights.json"  # (dspark.checkpoint.RANDOM_MARKER: weights drawn at load, none stored)
    if marker.is_file():
        rec["random_weights"] = json.loads(marker.read_text())
    if path.parent.name == "snapshots":  # a hub cache snapshot folder is named by its commit
        rec["revision"] = path.name
    return rec


def tokenizer_record(path: Path, tokenizer) -> dict:
    """The tokenizer's files and chat template as hashes, and, in a `random:` folder, where its files were copied
    from (the hub cache, or the npm copy of Qwen3's in our cache): which tokenizer counted the prompts."""
    files = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.glob("tokenizer*.json"))}
    template = getattr(tokenizer, "chat_template", None) or ""
    rec = {"files": files, "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest()}
    source = path / "random-tokenizer-source.json"  # (dspark.checkpoint.RANDOM_TOKENIZER)
    return rec | ({"source": json.loads(source.read_text())} if source.is_file() else {})

"""Backends serve the systems of a run. `native` is our own engine, one request at a time; a batched
backend and vLLM plug in here with the same three calls: `prepare`, `warmup`, `generate`.

Every system of a native run shares one loaded target, and plain decoding runs on the same engine,
step code and CUDA-graph path as the drafters (its graph is the one-token verify).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from dspark.checkpoint import LoadedTarget, check_draft, load_draft, load_draft_config, load_target
from dspark.config import TargetConfig
from dspark.drafters import BlockDrafter, NgramDrafter
from dspark.engine import Engine, GenerationConfig, GenerationResult
from dspark.errors import DSparkError
from harness.experiments import System


@dataclass
class Prepared:
    system: System
    engine: Engine
    method: str  # what actually runs (from the draft's config), checked against the experiment's


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
    if path.parent.name == "snapshots":  # a hub cache snapshot folder is named by its commit
        rec["revision"] = path.name
    return rec


class NativeBackend:
    name = "native"

    def __init__(self, target: str, device: str, dtype: str, revision: str | None = None):
        self.loaded: LoadedTarget = load_target(target, device, dtype, revision)
        self.target_name = target

    @property
    def model(self):
        return self.loaded.model

    def prepare(self, system: System) -> Prepared:
        if system.method == "plain":
            drafter, method = None, "plain"
        elif system.method == "ngram":
            drafter, method = NgramDrafter(system.num_speculative_tokens or 7), "ngram"
        else:
            draft = load_draft(system.draft, self.model)
            drafter, method = BlockDrafter(draft.model), draft.config.method
            if method != system.method:
                raise DSparkError(f"system '{system.name}': {system.draft} is a {method} draft, but the experiment "
                                  f"says {system.method}; fix the experiment's method")
            k = draft.config.num_drafts
            if system.num_speculative_tokens not in (None, k):
                raise DSparkError(f"system '{system.name}': {system.draft} proposes {k} tokens per round, but the "
                                  f"experiment says {system.num_speculative_tokens}; fix num_speculative_tokens")
        return Prepared(system, Engine(self.model, drafter, timing=True), method)

    def warmup(self, prepared: Prepared, max_len: int, cfg: GenerationConfig, prompt: list[int]) -> None:
        """Caches for the longest request and graph capture, then one short request, all untimed."""
        prepared.engine.warmup(max_len, cfg)
        prepared.engine.generate(prompt, replace(cfg, max_new_tokens=min(16, cfg.max_new_tokens)))

    def generate(self, prepared: Prepared, prompt: list[int], cfg: GenerationConfig) -> GenerationResult:
        return prepared.engine.generate(prompt, cfg)

    def models(self) -> dict:
        return {"target": model_record(self.loaded.path)}


def tokenizer_record(path: Path, tokenizer) -> dict:
    files = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.glob("tokenizer*.json"))}
    template = getattr(tokenizer, "chat_template", None) or ""
    return {"files": files, "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest()}


def resolve_system(system: System, target_cfg: TargetConfig) -> dict:
    """What a system would run, from configs and tensor headers alone (no weights read): the dry run."""
    info = {"system": system.name, "declared_method": system.method, "draft": system.draft}
    if system.method in ("plain", "ngram"):
        k = system.num_speculative_tokens or (7 if system.method == "ngram" else 0)
        return info | {"method": system.method, "format": None, "num_speculative_tokens": k, "fits_target": True,
                       "problem": None}
    try:
        path, cfg = load_draft_config(system.draft)
        check_draft(path, cfg, f"draft {system.draft}", target_cfg)
    except DSparkError as exc:
        return info | {"method": None, "format": None, "fits_target": False, "problem": str(exc)}
    problem = None
    if cfg.method != system.method:
        problem = f"the draft is a {cfg.method} draft; the experiment says {system.method}"
    elif system.num_speculative_tokens not in (None, cfg.num_drafts):
        problem = (f"the draft proposes {cfg.num_drafts} tokens per round; "
                   f"the experiment says {system.num_speculative_tokens}")
    return info | {"method": cfg.method, "format": cfg.format, "path": str(path), "block_size": cfg.block_size,
                   "num_speculative_tokens": cfg.num_drafts, "taps": list(cfg.target_layer_ids),
                   "markov_rank": cfg.markov_rank, "vllm_method": cfg.vllm_method, "fits_target": problem is None,
                   "problem": problem}


def peak_memory(device: str) -> int | None:
    if device.startswith("cuda") and torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    return None


def reset_peak_memory(device: str) -> None:
    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()

"""What produced a result: versions, device, git revision. Recorded with every figure we print or save."""

from __future__ import annotations

import hashlib
import os
import platform
import re
import subprocess
from datetime import datetime, timezone
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from harness.runs.threads import usable_cores

PACKAGES = ("dspark-bench", "torch", "transformers", "safetensors", "tokenizers", "vllm")


def _version(name: str) -> str | None:
    if name == "torch":  # the build tag (+cu130, +cpu) matters and only torch itself reports it
        import torch

        return torch.__version__
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@lru_cache(maxsize=1)
def git_revision() -> dict:
    """The source tree's commit and whether it had uncommitted changes (None outside a checkout).

    A copy of the tree without its .git folder (a remote GPU machine) can name its commit in
    DSPARK_GIT_REVISION.
    """
    if os.environ.get("DSPARK_GIT_REVISION"):
        return {"commit": os.environ["DSPARK_GIT_REVISION"], "dirty": None}
    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if rev.returncode != 0:
            return {"commit": None, "dirty": None}
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5)
        return {"commit": rev.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": None, "dirty": None}


def device_info(device: str) -> dict:
    import torch

    from harness.backends.timing import cpu_name

    info = {"device": device, "cpu": platform.processor() or platform.machine(), "cpu_model": cpu_name(),
            "cores": usable_cores(),
            "threads": torch.get_num_threads(), "load_avg": list(os.getloadavg())}
    if device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(index)
        info |= {"gpu": props.name, "gpu_memory_gb": round(props.total_memory / 1e9, 1),
                 "cuda": torch.version.cuda, "driver_capability": f"{props.major}.{props.minor}",
                 "gpus_visible": torch.cuda.device_count()}
        if info["gpus_visible"] > 1:  # a tensor-parallel run: the GPUs and how they connect, as the run saw them
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(info["gpus_visible"])]
            info["interconnect"] = gpu_topology()
    return info


@lru_cache(maxsize=1)
def source_sha256() -> str:
    """A digest of the code that ran (every .py file of dspark/ and harness/, by relative path and content):
    it names the code even where the git revision cannot, e.g. a copy of the tree on a GPU machine that
    holds some other commit's .git, which then reports that commit with uncommitted changes."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for path in sorted(p for package in ("dspark", "harness") for p in (root / package).rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def gpu_topology() -> str | None:
    """`nvidia-smi topo -m` (NVLink, PCIe or NUMA between each pair of GPUs), or None where it cannot answer."""
    try:
        out = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return re.sub(r"\x1b\[[0-9;]*m", "", out.stdout).strip() if out.returncode == 0 else None  # (no terminal styling)


def provenance(device: str) -> dict:
    return {
        "time_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git": git_revision() | {"source_sha256": source_sha256()},
        "versions": {name: _version(name) for name in PACKAGES} | {"python": platform.python_version()},
        "host": platform.node(),
        # Triton kernels (ours, vLLM's V2 runner's) interpreted in Python: times that say nothing of the engine
        "triton_interpreter": os.environ.get("TRITON_INTERPRET") == "1",
        **device_info(device),
    }

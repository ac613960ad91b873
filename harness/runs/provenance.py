"""What produced a result: versions, device, git revision. Recorded with every figure we print or save."""

from __future__ import annotations

import os
import platform
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

    info = {"device": device, "cpu": platform.processor() or platform.machine(), "cores": usable_cores(),
            "threads": torch.get_num_threads(), "load_avg": list(os.getloadavg())}
    if device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(index)
        info |= {"gpu": props.name, "gpu_memory_gb": round(props.total_memory / 1e9, 1),
                 "cuda": torch.version.cuda, "driver_capability": f"{props.major}.{props.minor}"}
    return info


def provenance(device: str) -> dict:
    return {
        "time_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git": git_revision(),
        "versions": {name: _version(name) for name in PACKAGES} | {"python": platform.python_version()},
        "host": platform.node(),
        **device_info(device),
    }

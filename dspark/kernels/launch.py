"""Whether the Triton kernels run at all (else their PyTorch references), and the device facts they size grids by."""

from __future__ import annotations

import os
from contextlib import contextmanager
from functools import lru_cache

import torch
from torch import Tensor

try:  # Triton ships with CUDA builds of PyTorch; CPU builds run the references.
    import triton
    import triton.language as tl  # noqa: F401  (re-exported to the kernel modules)
except ImportError:  # pragma: no cover - depends on the install
    triton = None
    tl = None


# Read once: a check per operator would cost a microsecond each, a hundred times a CPU step.
_SETTINGS = {"kernels": os.environ.get("DSPARK_KERNELS", "1") != "0",
             "interpret": os.environ.get("TRITON_INTERPRET") == "1",
             # products launched as programmatic dependents on Hopper (a product starting in the tail of the one
             # before it: benchmarks/launch_probe.py); DSPARK_OVERLAP=0 launches them plainly
             "overlap": os.environ.get("DSPARK_OVERLAP", "1") != "0"}


def kernels_on() -> bool:
    """False under `DSPARK_KERNELS=0` or inside `references()`: every operation runs its PyTorch reference."""
    return _SETTINGS["kernels"]


@contextmanager
def _setting(name: str, value: bool):
    before = _SETTINGS[name]
    _SETTINGS[name] = value
    try:
        yield
    finally:
        _SETTINGS[name] = before


@contextmanager
def references():
    """Run the PyTorch references inside (the eager reference the fused and CPU forms are held equal to)."""
    with _setting("kernels", False):
        yield


def overlap_mode(on: bool):
    """Steps traced or captured inside launch their products as programmatic dependents or not (DSPARK_OVERLAP for
    one block): for timing both in one process (benchmarks/launch_probe.py)."""
    return _setting("overlap", on)


def overlap(t: Tensor) -> bool:
    """Whether a product on `t`'s device launches as a programmatic dependent: never off a Hopper-or-later GPU."""
    return t.is_cuda and not _SETTINGS["interpret"] and _SETTINGS["overlap"] and _hopper(t.device.index or 0)


@lru_cache(maxsize=None)
def _hopper(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def use_triton(t: Tensor) -> bool:
    """Triton kernels serve inference (no autograd through them): with gradients on, the references run."""
    return (triton is not None and _SETTINGS["kernels"] and (t.is_cuda or _SETTINGS["interpret"])
            and t.dtype in (torch.float32, torch.bfloat16, torch.float16) and not torch.is_grad_enabled())


def sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count

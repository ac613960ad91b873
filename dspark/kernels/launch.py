"""How the kernels are launched: whether Triton runs at all, and with programmatic dependent launch."""

from __future__ import annotations

import functools
import os

import torch
from torch import Tensor

try:  # Triton ships with CUDA builds of PyTorch; CPU builds run the references.
    import triton
    import triton.language as tl  # noqa: F401  (re-exported to the kernel modules)
except ImportError:  # pragma: no cover - depends on the install
    triton = None
    tl = None


def use_triton(t: Tensor) -> bool:
    """Triton kernels serve inference (no autograd through them): with gradients on, the references run."""
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    return (triton is not None and os.environ.get("DSPARK_KERNELS", "1") != "0" and (t.is_cuda or interpret)
            and t.dtype in (torch.float32, torch.bfloat16, torch.float16) and not torch.is_grad_enabled())


def pdl(t: Tensor) -> bool:
    """Programmatic dependent launch, with `DSPARK_PDL=1` (CUDA compute capability 9 and newer, not in the
    interpreter). Off by default: on the H200 it saved about 1 us per call in a chain of products, but
    the whole decode step ran 0.1 ms slower with it and the round 0.3 ms (benchmarks/RESULTS.md)."""
    return (t.is_cuda and os.environ.get("DSPARK_PDL") == "1" and os.environ.get("TRITON_INTERPRET") != "1"
            and _capability(t.device.index if t.device.index is not None else torch.cuda.current_device()) >= 9)


@functools.cache
def _capability(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def launch_options(t: Tensor) -> dict:
    """Launch options of a kernel that waits (`gdc_wait`) before its first read of another kernel's output."""
    return {"launch_pdl": True} if pdl(t) else {}


def sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count

"""Whether the Triton kernels run at all (else their PyTorch references), and the device facts they size grids by."""

from __future__ import annotations

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


def sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count

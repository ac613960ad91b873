"""NVTX ranges pushed on the host around each engine step (around the graph replay when graphs run).

Through the `nvtx` package when it is installed, else `torch.cuda.nvtx`; a no-op without CUDA.
Range names (spelt in `dspark.engine.steps`): warmup, prefill, <method>_propose, target_verify,
decode_sample, ar_decode.
While `torch_ranges(True)` is on (profiling with the PyTorch profiler), the same names are also
recorded as `record_function` ranges, on the CPU too.
"""

from __future__ import annotations

import contextlib

import torch

try:  # pragma: no cover - depends on the environment
    import nvtx as _nvtx
except ImportError:  # pragma: no cover
    _nvtx = None

DOMAIN = None  # the default domain, where nsys stats and our trace parser look first
_TORCH_RANGES = [False]


def torch_ranges(on: bool) -> None:
    """Also emit every range as a PyTorch profiler `record_function` (off by default: it costs time)."""
    _TORCH_RANGES[0] = on


@contextlib.contextmanager
def _both(first, second):
    with first, second:
        yield


class Ranges:
    """`with ranges("target_verify"): ...` marks that host span when enabled."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled and torch.cuda.is_available()
        self._domain = _nvtx.get_domain(DOMAIN) if (self.enabled and _nvtx is not None) else None
        self._attrs: dict[str, object] = {}

    def __call__(self, name: str):
        if _TORCH_RANGES[0]:
            return _both(self._nvtx(name), torch.profiler.record_function(name))
        return self._nvtx(name)

    def _nvtx(self, name: str):
        if not self.enabled:
            return contextlib.nullcontext()
        if self._domain is not None:
            attr = self._attrs.get(name)
            if attr is None:
                attr = self._attrs[name] = self._domain.get_event_attributes(message=name)
            return _DomainRange(self._domain, attr)
        return torch.cuda.nvtx.range(name)


class _DomainRange:
    __slots__ = ("domain", "attr")

    def __init__(self, domain, attr):
        self.domain, self.attr = domain, attr

    def __enter__(self):
        self.domain.push_range(self.attr)

    def __exit__(self, *exc):
        self.domain.pop_range()

"""The environment a tensor-parallel vLLM engine needs on this machine (`--tensor-parallel-size`): on GPUs
NVLink multicast off, on vLLM's CPU build each rank's threads bound to cores of its own."""

from __future__ import annotations

import os


def parallel_environment(tensor_parallel_size, on_cpu: bool) -> dict[str, str]:
    """Variables to set for an engine of `tensor_parallel_size` ranks: on GPUs NCCL_NVLS_ENABLE=0 (these machines
    need NVLink multicast off); on vLLM's CPU build VLLM_CPU_OMP_THREADS_BIND, each rank's OpenMP threads on its
    share of the usable cores (vLLM binds a rank per NUMA node and refuses more ranks than nodes), unless the
    user bound them. Nothing for one rank."""
    if not isinstance(tensor_parallel_size, int) or tensor_parallel_size <= 1:
        return {}
    if not on_cpu:
        return {"NCCL_NVLS_ENABLE": "0"}
    if os.environ.get("VLLM_CPU_OMP_THREADS_BIND"):
        return {}
    return {"VLLM_CPU_OMP_THREADS_BIND": cpu_binding(sorted(os.sched_getaffinity(0)), tensor_parallel_size)}


def cpu_binding(cores: list[int], ranks: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for `ranks` CPU ranks: the cores split into as many contiguous shares (the
    first ranks one core more where they do not divide), e.g. "0,1|2,3"."""
    size, extra = divmod(len(cores), ranks)
    shares, start = [], 0
    for rank in range(ranks):
        end = start + size + (rank < extra)
        shares.append(",".join(map(str, cores[start:end])))
        start = end
    return "|".join(shares)

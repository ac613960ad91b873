"""Test-only, on PYTHONPATH of the test's vLLM processes alone: lets vLLM's V2 model runner (which
runs vLLM's `dspark` method) start on a CPU machine with no triton-cpu.

vLLM's CPU build enables Triton only when Triton lists a `cpu` backend; with `TRITON_INTERPRET=1`
Triton's interpreter runs the kernels on CPU tensors, so listing an always-active driver under `cpu`
is all that is missing. Product code never patches vLLM; this file is imported only by processes
started with `tests/vllm_shim` on their path (`sitecustomize` runs at interpreter start, so vLLM's
EngineCore and worker processes get it too)."""

import os

if os.environ.get("TRITON_INTERPRET") == "1":
    try:
        from triton.backends import Backend, backends
    except ImportError:  # no Triton: vLLM refuses V2 in its own words
        pass
    else:

        class InterpreterDriver:
            """Active on any machine: the interpreter needs no device."""

            @staticmethod
            def is_active() -> bool:
                return True

        backends.setdefault("cpu", Backend(compiler=None, driver=InterpreterDriver))

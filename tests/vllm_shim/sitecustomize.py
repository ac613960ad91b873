"""Test-only, on PYTHONPATH of the test's vLLM processes alone: lets vLLM's V2 model runner (which
runs vLLM's `dspark` method) start on a CPU machine with no triton-cpu.

vLLM's CPU build enables Triton only when Triton lists a `cpu` backend; with `TRITON_INTERPRET=1`
Triton's interpreter runs the kernels on CPU tensors, so listing an always-active driver under `cpu`
is all that is missing. Product code never patches vLLM; this file is imported only by processes
started with `tests/vllm_shim` on their path (`sitecustomize` runs at interpreter start, so vLLM's
EngineCore and worker processes get it too).

One gap of the interpreter itself is filled: a load or store whose mask is an integer block (vLLM's DFlash 2
candidate walk masks with `offsets_mask & (req_state >= 0)`, which the interpreter makes int32) is refused by
its C loader ("mask has unsupported dtype"), where a compiled kernel reads any non-zero lane as on. The mask
is read so here, and a boolean mask passes as it was."""

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

        from triton.runtime import interpreter

        def _on(mask):
            """An integer mask as a compiled kernel reads it: a lane is on where it is non-zero."""
            return mask if mask.data.dtype == bool else interpreter.TensorHandle(mask.data != 0, mask.dtype)

        _load = interpreter.InterpreterBuilder.create_masked_load
        _store = interpreter.InterpreterBuilder.create_masked_store

        def create_masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
            return _load(self, ptrs, _on(mask), other, cache_policy, is_volatile)

        def create_masked_store(self, ptrs, value, mask, cache_policy):
            return _store(self, ptrs, value, _on(mask), cache_policy)

        interpreter.InterpreterBuilder.create_masked_load = create_masked_load
        interpreter.InterpreterBuilder.create_masked_store = create_masked_store

"""Backends by name, imported only when a run uses one: choosing a backend, or the CLI's help, must not
load torch or vLLM."""

from __future__ import annotations

from importlib import import_module

from harness.specs.experiments import BACKENDS

CLASSES = {"native": ("harness.backends.native", "NativeBackend"), "vllm": ("harness.backends.vllm.offline", "VllmBackend"),
           "vllm-server": ("harness.backends.vllm.server", "VllmServerBackend"),
           "openai": ("harness.backends.served.openai", "OpenAIBackend")}
assert set(CLASSES) == set(BACKENDS), "every backend an experiment may name has a class"


def backend_class(name: str):
    module, cls = CLASSES[name]
    return getattr(import_module(module), cls)

"""Backends by name, imported only when a run uses one: choosing a backend, or the CLI's help, must not
load torch or vLLM."""

from __future__ import annotations

from importlib import import_module

from harness.specs.experiments import BACKENDS

CLASSES = {"native": ("harness.backends.native", "NativeBackend"), "vllm": ("harness.backends.vllm", "VllmBackend"),
           "vllm-server": ("harness.backends.server", "VllmServerBackend"),
           "openai": ("harness.backends.remote", "OpenAIBackend")}
assert set(CLASSES) == set(BACKENDS), "every backend an experiment may name has a class"


def backend_class(name: str):
    module, cls = CLASSES[name]
    return getattr(import_module(module), cls)

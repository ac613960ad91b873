"""A script of `benchmarks/` or `tools/` (not a package module) loaded by its path, so a test can call its
functions as the script itself would."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(path: Path, name: str | None = None) -> ModuleType:
    """The module the file at `path` (relative to the repository's root, or absolute) defines, under `name`
    (default: the file's stem)."""
    path = ROOT / path
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

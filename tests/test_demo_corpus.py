"""The demo corpus builder: pairs from documented functions, and a pin that refuses changed files."""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("demo_corpus", ROOT / "experiments" / "demo" / "corpus.py")
corpus = importlib.util.module_from_spec(spec)
spec.loader.exec_module(corpus)

SOURCE = '''
def documented(a, b=2):
    """Add two numbers.

    Longer explanation that stays out of the instruction.
    """
    total = a + b
    return total


def undocumented(x):
    y = x
    return y


def _private(x):
    """Hidden."""
    y = x
    return y


class Box:
    def size(self) -> int:
        """How many items the box holds."""
        n = len(self.items)
        return n
'''


def test_pairs_come_from_documented_public_functions_and_methods():
    pairs = corpus.function_pairs(SOURCE, "m.py")
    assert [p["name"] for p in pairs] == ["documented", "Box.size"]
    first = pairs[0]
    assert first["instruction"] == "Write a Python function `documented(a, b=2)`. Add two numbers."
    assert first["answer"] == "def documented(a, b=2):\n    total = a + b\n    return total\n"
    assert "Longer explanation" not in first["answer"] + first["instruction"]
    assert pairs[1]["answer"].startswith("def size(self) -> int:\n")
    for p in pairs:
        ast.parse(p["answer"])


def test_the_pin_refuses_a_changed_file(tmp_path):
    (tmp_path / "a.py").write_text(SOURCE)
    pin = corpus.make_pin(["a.py", "absent.py"], tmp_path)
    assert list(pin["files"]) == ["a.py"]
    assert [p["name"] for p in corpus.build(pin, tmp_path)["pairs"]] == ["documented", "Box.size"]
    (tmp_path / "a.py").write_text(SOURCE + "\n# edited\n")
    with pytest.raises(corpus.PinError, match="a.py differs from the pinned file"):
        corpus.build(pin, tmp_path)


def test_the_shipped_pin_names_its_python_and_files():
    pin = json.loads((ROOT / "experiments" / "demo" / "corpus_pin.json").read_text())
    assert pin["python"].count(".") == 2 and len(pin["files"]) >= 40
    assert all(len(d) == 64 for d in pin["files"].values())


def test_the_test_suites_are_pretraining_text_only_with_tests(tmp_path):
    """--with-tests adds the library's tests (files that parse as UTF-8 only) as text, never as pairs."""
    (tmp_path / "test").mkdir()
    (tmp_path / "idlelib" / "idle_test").mkdir(parents=True)
    (tmp_path / "a.py").write_text(SOURCE)
    (tmp_path / "test" / "test_a.py").write_text(SOURCE)
    (tmp_path / "test" / "badsyntax.py").write_text("def broken(:\n")
    (tmp_path / "test" / "latin1.py").write_bytes("# -*- coding: latin-1 -*-\nname = '\xe9'\n".encode("latin-1"))
    (tmp_path / "idlelib" / "idle_test" / "test_x.py").write_text(SOURCE)
    assert corpus.library_modules(tmp_path) == ["a.py"]
    assert corpus.library_modules(tmp_path, with_tests=True) == ["a.py", "test/test_a.py"]
    built = corpus.build(corpus.make_pin(corpus.library_modules(tmp_path, with_tests=True), tmp_path), tmp_path)
    assert sorted(built["files"]) == ["a.py", "test/test_a.py"]
    assert {p["module"] for p in built["pairs"]} == {"a.py"}


def test_the_default_pin_leaves_the_tests_out():
    pin = json.loads(corpus.PIN.read_text())
    assert not any(corpus.is_test(rel) for rel in pin["files"])
    with_tests = json.loads(corpus.PIN_WITH_TESTS.read_text())
    assert set(pin["files"]) < set(with_tests["files"]) and pin["python"] == with_tests["python"]
    assert not any(part in ("idlelib", "tkinter") for rel in with_tests["files"] for part in Path(rel).parts)

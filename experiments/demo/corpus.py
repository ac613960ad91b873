"""The demo target's training corpus: the Python standard library's own source.

Every Python install ships the same standard library for a given version, so the corpus needs no
download. Two parts: the files' text (pretraining), and instruction/answer pairs (instruction
tuning), where the instruction is a function's signature and the first paragraph of its docstring
and the answer its body (docstring removed). The files are pinned (`corpus_pin.json`: Python
version, relative path and sha256 of each file) and the build refuses to run on files that differ,
so a rebuild sees exactly the same text.

    python experiments/demo/corpus.py --out corpus.json    # check the pin, write {python, files, pairs}
    python experiments/demo/corpus.py --repin               # pin this interpreter's files

`--with-tests` adds the library's own test suites to the pretraining text (three times the code;
`corpus_pin_with_tests.json`), for a target that has read more Python. The instruction pairs stay
those of the library itself.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import json
import platform
import sys
import sysconfig
import textwrap
from pathlib import Path

PIN = Path(__file__).with_name("corpus_pin.json")
# Every module of the library itself: no tests, GUI or packaging helpers, data tables or vendored code.
TESTS = ("test", "tests")  # the library's test suites, pretraining text with --with-tests
EXCLUDED = (*TESTS, "idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip", "site-packages",
            "__pycache__", "pydoc_data", "encodings", "venv", "__phello__")
PIN_WITH_TESTS = Path(__file__).with_name("corpus_pin_with_tests.json")
MIN_BODY_LINES, MAX_BODY_LINES = 2, 40


class PinError(Exception):
    pass


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


class CorpusFileError(ValueError):
    """A --corpus file that is not a corpus written by `main`; the message names the file and the fix."""


def load(path: Path) -> tuple[dict, str]:
    """A corpus written by `main` (corpus.json, or corpus.json.gz compressed) and its JSON text, whose
    sha256 a build records."""
    try:
        raw = path.read_bytes()
        text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode("utf-8")
        corpus = json.loads(text)
        if not isinstance(corpus, dict) or not {"files", "pairs"} <= corpus.keys():
            raise ValueError("no files and pairs in it")
    except (OSError, EOFError, ValueError) as exc:  # gzip, UTF-8 and JSON errors are OSError or ValueError
        raise CorpusFileError(f"{path}: not a corpus ({exc}); write one with "
                              "experiments/demo/corpus.py --out corpus.json.gz") from None
    return corpus, text


def load_or_refuse(ap: argparse.ArgumentParser, path: Path) -> tuple[dict, str]:
    """`load`, or the parser's one-line refusal of --corpus (exit code 2), for every script taking one."""
    try:
        return load(path)
    except CorpusFileError as exc:
        ap.error(f"--corpus {exc}")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def library_modules(root: Path, with_tests: bool = False) -> list[str]:
    """Relative paths of the library's own .py files (and its tests), sorted; only files that read as
    UTF-8 and parse (some test files are broken or in other encodings on purpose)."""
    excluded = set(EXCLUDED) - (set(TESTS) if with_tests else set())
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py")
                  if not any(part in excluded or part.startswith("config-") for part in p.relative_to(root).parts)
                  and _parses(p))


def _parses(path: Path) -> bool:
    try:
        ast.parse(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, SyntaxError, ValueError):
        return False
    return True


def is_test(rel: str) -> bool:
    return any(part in TESTS for part in Path(rel).parts)


def make_pin(modules: list[str], root: Path) -> dict:
    files = {m: sha256(root / m) for m in dict.fromkeys(modules) if (root / m).is_file()}
    return {"python": platform.python_version(), "files": files}


def check_pin(pin: dict, root: Path) -> list[Path]:
    """The pinned files, after checking each one's sha256; PinError names the first difference."""
    if not pin.get("files"):
        raise PinError("the pin lists no files; run with --repin")
    paths = []
    for rel, digest in pin["files"].items():
        path = root / rel
        if not path.is_file():
            raise PinError(f"{rel} is missing from {root} (pinned for Python {pin['python']})")
        if sha256(path) != digest:
            raise PinError(f"{rel} differs from the pinned file (pinned for Python {pin['python']}, "
                           f"this is {platform.python_version()}); build with that version or repin")
        paths.append(path)
    return paths


def _functions(tree: ast.Module):
    """Public top-level functions, and public methods of top-level classes, with their class name."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield None, node
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            yield from ((node.name, item) for item in node.body if isinstance(item, ast.FunctionDef))


def function_pairs(source: str, module: str) -> list[dict]:
    """One pair per documented function or method whose body has a sensible length."""
    tree = ast.parse(source)
    lines = source.splitlines()
    pairs = []
    for owner, node in _functions(tree):
        if node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node)
        if not doc or len(node.body) < 2:
            continue
        body = node.body[1:]  # the docstring is the instruction, not the answer
        start, end = body[0].lineno - 1, node.end_lineno
        if not MIN_BODY_LINES <= end - start <= MAX_BODY_LINES:
            continue
        signature = f"{node.name}({ast.unparse(node.args)})"
        returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
        decorators = "".join(f"@{ast.unparse(d)}\n" for d in node.decorator_list)
        body_src = textwrap.dedent("\n".join(lines[start:end]))
        summary = doc.strip().split("\n\n")[0].replace("\n", " ")
        what = f"the method `{signature}` of class `{owner}`" if owner else f"a Python function `{signature}`"
        pairs.append({
            "module": module, "name": f"{owner}.{node.name}" if owner else node.name,
            "instruction": f"Write {what}. {summary}",
            "answer": f"{decorators}def {signature}{returns}:\n{textwrap.indent(body_src, '    ').rstrip()}\n",
        })
    return pairs


def build(pin: dict, root: Path) -> dict:
    """{"python", "files": {path: text}, "pairs": [...]} from the pinned files."""
    files = {path.relative_to(root).as_posix(): path.read_text(encoding="utf-8") for path in check_pin(pin, root)}
    pairs = [pair for rel, text in files.items() if not is_test(rel) for pair in function_pairs(text, rel)]
    return {"python": pin["python"], "files": files, "pairs": pairs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="JSON file to write the corpus to (.json.gz: compressed)")
    ap.add_argument("--repin", action="store_true", help="pin this interpreter's standard library files")
    ap.add_argument("--with-tests", action="store_true", help="the library's test suites too (their own pin)")
    args = ap.parse_args(argv)
    root, pin_path = stdlib_dir(), PIN_WITH_TESTS if args.with_tests else PIN
    if args.repin:
        pin_path.write_text(json.dumps(make_pin(library_modules(root, args.with_tests), root), indent=1) + "\n")
        print(f"pinned {len(json.loads(pin_path.read_text())['files'])} files of Python {platform.python_version()}")
        return 0
    try:
        corpus = build(json.loads(pin_path.read_text()), root)
    except PinError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.out:  # a name ending in .gz is written compressed
        data = json.dumps(corpus).encode("utf-8")
        args.out.write_bytes(gzip.compress(data, mtime=0) if args.out.suffix == ".gz" else data)
    chars = sum(map(len, corpus["files"].values()))
    print(f"{len(corpus['files'])} files ({chars / 1e6:.1f} M characters), {len(corpus['pairs'])} pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main())

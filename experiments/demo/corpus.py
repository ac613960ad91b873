"""The demo target's training corpus: instruction/answer pairs from the Python standard library.

Every Python install ships the same standard library for a given version, so the corpus needs no
download. The instruction is a function's signature and the first paragraph of its docstring; the
answer is its body (docstring removed). The module files are pinned (`corpus_pin.json`: Python
version, relative path and sha256 of each file) and the build refuses to run on files that differ,
so a rebuild sees exactly the same text.

    python experiments/demo/corpus.py --out corpus.jsonl          # check the pin, write the pairs
    python experiments/demo/corpus.py --repin                      # pin this interpreter's files
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import platform
import sys
import sysconfig
import textwrap
from pathlib import Path

PIN = Path(__file__).with_name("corpus_pin.json")
MODULES = [
    "textwrap.py", "string.py", "shlex.py", "fnmatch.py", "glob.py", "posixpath.py", "genericpath.py", "ntpath.py",
    "heapq.py", "bisect.py", "statistics.py", "fractions.py", "colorsys.py", "calendar.py", "difflib.py",
    "base64.py", "quopri.py", "html/__init__.py", "json/encoder.py", "json/decoder.py", "urllib/parse.py",
    "email/utils.py", "email/_parseaddr.py", "csv.py", "tokenize.py", "random.py", "copy.py", "functools.py",
    "collections/__init__.py", "operator.py", "pprint.py", "reprlib.py", "inspect.py", "dataclasses.py",
    "ast.py", "argparse.py", "gettext.py", "mimetypes.py", "shutil.py", "tempfile.py", "zipfile.py",
    "configparser.py", "datetime.py", "_pydecimal.py", "ipaddress.py", "uuid.py", "hmac.py", "platform.py",
    "sysconfig.py", "os.py", "subprocess.py", "queue.py", "sched.py", "contextlib.py", "weakref.py",
    "warnings.py", "traceback.py", "linecache.py", "codecs.py", "filecmp.py", "plistlib.py", "wave.py",
    "locale.py", "netrc.py", "pathlib.py", "keyword.py", "numbers.py", "abc.py", "secrets.py",
]
MIN_BODY_LINES, MAX_BODY_LINES = 2, 40


class PinError(Exception):
    pass


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


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


def build(pin: dict, root: Path) -> list[dict]:
    pairs = []
    for path in check_pin(pin, root):
        rel = path.relative_to(root).as_posix()
        pairs += function_pairs(path.read_text(encoding="utf-8"), rel)
    return pairs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="JSONL file to write the pairs to")
    ap.add_argument("--repin", action="store_true", help="pin this interpreter's standard library files")
    args = ap.parse_args(argv)
    root = stdlib_dir()
    if args.repin:
        PIN.write_text(json.dumps(make_pin(MODULES, root), indent=1) + "\n")
        print(f"pinned {len(json.loads(PIN.read_text())['files'])} files of Python {platform.python_version()}")
        return 0
    try:
        pairs = build(json.loads(PIN.read_text()), root)
    except PinError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.out:
        with args.out.open("w") as f:
            for pair in pairs:
                f.write(json.dumps(pair) + "\n")
    print(f"{len(pairs)} pairs from {len({p['module'] for p in pairs})} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())

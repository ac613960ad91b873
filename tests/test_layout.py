"""The tree's architecture, held: no import cycles (lazy imports included), imports that point one way
(cli -> runs/profiling -> backends -> dspark; analysis needing neither torch nor rich), no module
over 450 lines, and every package folder installed."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dspark", "harness")
MAX_LINES = 450


def _modules() -> dict[str, Path]:
    out = {}
    for top in PACKAGES:
        for f in sorted((ROOT / top).rglob("*.py")):
            parts = f.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `name` imports anywhere in its file (a function's lazy imports included);
    `from pkg import x` counts as pkg.x when that is a module, else as pkg."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in modules and t != name}
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_no_import_cycles():
    graph = _graph()
    assert len(graph) > 40
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == [], " ; ".join(" -> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_cycle(tmp_path, monkeypatch):
    """The checker itself: two modules importing each other lazily are a cycle."""
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "dspark" / "a.py").write_text("def f():\n    from dspark import b\n")
    (tmp_path / "dspark" / "b.py").write_text("from dspark.a import f\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    graph = _graph()
    assert graph["dspark.a"] == {"dspark.b"} and graph["dspark.b"] == {"dspark.a"}


# What each layer may import from the project (a prefix matches a package and its modules).
ALLOWED = {
    "dspark": ("dspark",),
    "harness.specs": ("dspark", "harness.specs"),
    "harness.analysis": ("dspark.errors", "dspark.dtypes", "dspark.synthetic.acceptance", "harness.analysis"),  # (torch-free)
    "harness.backends": ("dspark", "harness.specs", "harness.backends"),
    "harness.runs": ("dspark", "harness.specs", "harness.backends", "harness.analysis", "harness.runs"),
    # (and the capture window's protocol with the child it profiles: its file names and variables; and how a
    # child in a process group of its own is stopped, as the vLLM servers are; a profile folder owned as a run's)
    "harness.profiling": ("dspark.errors", "harness.analysis", "harness.runs.folder", "harness.runs.owner",
                          "harness.backends.capture",
                          "harness.backends.process_group", "harness.profiling"),
    # (and, for engine-bench --against vllm, the one probe of vLLM, what starts a vLLM engine and reads its counters;
    # the step timing and round-cost measurement it shares with the native backend, which measures the scheduler's
    # costs at start)
    "harness.engine_bench": ("dspark", "harness.backends.vllm.offline", "harness.backends.vllm.checks",
                             "harness.backends.vllm.drafts", "harness.backends.served.metrics", "harness.backends.timing",
                             "harness.backends.round_costs", "harness.engine_bench"),
}


def test_imports_point_one_way():
    graph = _graph()
    wrong = []
    for name, targets in graph.items():
        layer = next((p for p in sorted(ALLOWED, key=len, reverse=True) if name == p or name.startswith(p + ".")),
                     None)
        for t in targets:
            if layer is not None and not any(t == a or t.startswith(a + ".") for a in ALLOWED[layer]):
                wrong.append(f"{name} -> {t}")
            if not name.startswith("harness.cli") and t.startswith("harness.cli"):
                wrong.append(f"{name} -> {t} (only the CLI imports the CLI)")
    assert wrong == []


def test_the_command_line_loads_no_torch_until_a_command_needs_it():
    """`dspark-bench --help`, `report` and `trace` stay quick: importing the CLI imports no torch (nor vLLM)."""
    code = "import sys\nimport harness.cli\nprint(sorted(m for m in ('torch', 'vllm') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr[-1000:]


def test_analysis_imports_neither_torch_nor_rich():
    code = ("import sys\nimport harness.analysis.summary, harness.analysis.metrics, harness.analysis.records, "
            "harness.analysis.run_figures\nprint(sorted(m for m in ('torch', 'rich') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr[-1000:]


def test_no_module_is_over_450_lines():
    long = {str(p.relative_to(ROOT)): n for p in _modules().values() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_every_package_folder_is_installed():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {name for name, path in _modules().items() if path.name == "__init__.py"}
    assert set(config["packages"]) == folders | set(config["package-dir"])

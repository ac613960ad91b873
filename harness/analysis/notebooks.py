"""The report notebooks (`notebooks/*.ipynb`, installed as `harness.notebooks`): which exist, what each
needs, executing them on given inputs, and one self-contained HTML report of the results (figures
embedded as data, nbconvert).

A notebook takes its inputs from environment variables, so it runs alike in Jupyter, under nbclient
and in papermill-less CI: `DSPARK_RUNS` (run folders, separated by the path separator; default: the
newest under `results/`), `DSPARK_PROFILES` (profile folders or trace files), `DSPARK_ENGINE_BENCH`
(an `engine-bench --json` file), `DSPARK_PARITY` (two run folders).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from importlib import resources
from pathlib import Path

from dspark.errors import DSparkError

# name -> the input it cannot run without (None: runs on the run folders alone)
NOTEBOOKS = {"acceptance": None, "speed": None, "where_time_goes": "DSPARK_PROFILES", "engines": "DSPARK_PARITY"}
INSTALL = "the report needs the notebook tools; install them: pip install 'dspark-bench[report]'"


def notebook_dir() -> Path:
    """The shipped notebooks: the installed package data, else the checkout's `notebooks/`."""
    try:
        installed = Path(str(resources.files("harness.notebooks")))
        if (installed / "acceptance.ipynb").is_file():
            return installed
    except ModuleNotFoundError:
        pass
    return Path(__file__).resolve().parents[2] / "notebooks"


@contextlib.contextmanager
def _inputs(env: dict[str, str]):
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def inputs(runs: list[Path], profiles: list[Path] = (), engine_bench: Path | None = None,
           parity: tuple[Path, Path] | None = None) -> dict[str, str]:
    env = {"DSPARK_RUNS": os.pathsep.join(str(Path(p).resolve()) for p in runs)}
    if profiles:
        env["DSPARK_PROFILES"] = os.pathsep.join(str(Path(p).resolve()) for p in profiles)
    if engine_bench is not None:
        env["DSPARK_ENGINE_BENCH"] = str(Path(engine_bench).resolve())
    if parity is not None:
        env["DSPARK_PARITY"] = os.pathsep.join(str(Path(p).resolve()) for p in parity)
    return env


def execute(name: str, env: dict[str, str], timeout_s: int = 600):
    """The notebook `name`, executed top to bottom with `env` as its inputs (a failing cell raises)."""
    try:
        import nbformat
        from jupyter_client import KernelManager
        from nbclient import NotebookClient
    except ImportError:
        raise DSparkError(INSTALL) from None
    nb = nbformat.read(notebook_dir() / f"{name}.ipynb", as_version=4)
    with _inputs(env), tempfile.TemporaryDirectory(prefix="dspark-kernel-") as sockets:  # (the kernel gets env)
        km = KernelManager(kernel_name="python3", transport="ipc", ip=str(Path(sockets) / "kernel"))  # no network
        NotebookClient(nb, km=km, timeout=timeout_s, resources={"metadata": {"path": str(Path.cwd())}}).execute()
    return nb


def report_html(env: dict[str, str], out: Path, progress=None) -> list[str]:
    """Every notebook whose inputs are given, executed, written as one HTML file with its figures
    embedded; returns the notebooks it holds."""
    try:
        from nbconvert import HTMLExporter
    except ImportError:
        raise DSparkError(INSTALL) from None
    names = [n for n, needs in NOTEBOOKS.items() if needs is None or needs in env]
    merged = None
    for name in names:
        if progress is not None:
            progress(name)
        nb = execute(name, env)
        if merged is None:
            merged = nb
        else:
            merged.cells += nb.cells
    body, _ = HTMLExporter(exclude_input=True, embed_images=True).from_notebook_node(merged)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(body, encoding="utf-8")
    return names

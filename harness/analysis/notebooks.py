"""The report notebooks (`notebooks/*.ipynb`, installed as `harness.notebooks`): which exist, what each
needs, executing them on given inputs, and one self-contained HTML report of the results (figures
embedded as data, nbconvert).

A notebook takes its inputs from environment variables, so it runs alike in Jupyter, under nbclient
and in papermill-less CI: `DSPARK_RUNS` (run folders, separated by the path separator; default: the
newest under `results/`), `DSPARK_PROFILES` (profile folders or trace files), `DSPARK_ENGINE_BENCH`
(an `engine-bench --json` file), `DSPARK_PARITY` (two run folders).
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import os
import signal
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


def _run(nb, env: dict[str, str], timeout_s: int, allow_errors: bool = False, on_cell_start=None):
    """Execute `nb` in a fresh kernel with `env` as its inputs. The kernel's own output streams (its
    start-up and shut-down chatter: IPKernelApp warnings) go to a file, shown only if the kernel dies."""
    try:
        from jupyter_client import KernelManager
        from nbclient import NotebookClient
        from nbclient.exceptions import DeadKernelError
    except ImportError:
        raise DSparkError(INSTALL) from None
    with _inputs(env), tempfile.TemporaryDirectory(prefix="dspark-kernel-") as sockets:  # (the kernel gets env)
        km = KernelManager(kernel_name="python3", transport="ipc", ip=str(Path(sockets) / "kernel"))  # no network
        client = NotebookClient(nb, km=km, timeout=timeout_s, allow_errors=allow_errors,
                                resources={"metadata": {"path": str(Path.cwd())}}, on_cell_start=on_cell_start)
        log = Path(sockets) / "kernel.log"
        ours = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        failure = None
        loop = _SignalLoop()
        with log.open("w") as chatter:
            try:
                loop.run_until_complete(client.async_execute(stdout=chatter, stderr=chatter))
            except Exception as exc:
                failure = exc
            finally:  # (nbclient leaves Python's default handlers behind, not the ones it found)
                loop.close()
                for sig, handler in ours.items():
                    if handler is not None:
                        signal.signal(sig, handler)
        if loop.first_signal is not None:  # the program's own handler says it, with the signal that came first
            signal.raise_signal(loop.first_signal)  # (the command line's: 130 or 143, later ones ignored)
            raise KeyboardInterrupt
        if isinstance(failure, DeadKernelError):
            tail = " ".join(log.read_text().split()[-40:])
            raise DSparkError(f"the notebook kernel died ({tail or 'no message'}); reinstall the report "
                              "extra: pip install 'dspark-bench[report]'") from None
        if failure is not None:
            raise failure
    return nb


class _SignalLoop(asyncio.SelectorEventLoop):
    """The event loop nbclient runs the notebook on, noting the first signal that came. nbclient takes SIGINT
    and SIGTERM over while it runs (the loop's signal handlers): it shuts the kernel down and then fails its
    own way (an AssertionError, its kernel client gone), or finishes the cells with the kernel's
    KeyboardInterrupt as a cell's error; its handler is not told which signal came, and the exit code must
    follow the first one (130 for SIGINT, 143 for SIGTERM)."""

    first_signal: int | None = None

    def add_signal_handler(self, sig, callback, *args) -> None:
        def noted(*a) -> None:
            if self.first_signal is None:
                self.first_signal = sig
            callback(*a)

        super().add_signal_handler(sig, noted, *args)

    def default_exception_handler(self, context: dict) -> None:
        """After a signal, nbclient's tasks it broke off (pending, or failed with the kernel client gone)
        are what the signal did: the user sees `interrupted`, not asyncio's report of each task."""
        if self.first_signal is None:
            super().default_exception_handler(context)


def execute(name: str, env: dict[str, str], timeout_s: int = 600):
    """The notebook `name`, executed top to bottom with `env` as its inputs (a failing cell raises)."""
    try:
        import nbformat
    except ImportError:
        raise DSparkError(INSTALL) from None
    return _run(nbformat.read(notebook_dir() / f"{name}.ipynb", as_version=4), env, timeout_s)


NOTEBOOK_ONLY = "notebook-only"  # a cell's tag: the report leaves it out (markdown) or shows nothing of it (code)
INPUTS = "inputs"  # a cell's tag: it loads its notebook's inputs; where it fails, the rest of the notebook is left out

# the report's page: JupyterLab's template, with no script fetched from the network (require.js, MathJax),
# alt text on every figure, and a readable width, tables and headline
TEMPLATE = r"""{%- extends 'index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{% block data_png scoped %}
<div class="jp-RenderedImage jp-OutputArea-output {{ extra_class }}">
<img src="data:image/png;base64,{{ output.data['image/png'] | escape_html }}"
 alt="{{ ((output | get_metadata('alt', 'image/png')) or 'figure') | escape_html }}">
</div>
{%- endblock data_png %}
{% block extra_css %}
<style type="text/css">
body.jp-Notebook { max-width: 1180px; margin: 0 auto; padding: 1.5em 2em 4em; }
.jp-RenderedHTMLCommon h1 { font-size: 1.7em; margin: 1.6em 0 0.4em; padding-bottom: 0.2em; border-bottom: 1px solid #ddd; }
.jp-RenderedHTMLCommon h2 { font-size: 1.25em; margin: 1.3em 0 0.3em; }
.jp-RenderedImage img { max-width: 100%; height: auto; }
.jp-RenderedHTMLCommon table.dspark { border-collapse: collapse; margin: 0.6em 0 1em; font-size: 13px;
  font-variant-numeric: tabular-nums; border: none; }
.jp-RenderedHTMLCommon table.dspark th, .jp-RenderedHTMLCommon table.dspark td { padding: 3px 12px;
  border: none; border-bottom: 1px solid #e3e3e3; text-align: left; vertical-align: top; max-width: 40em; }
.jp-RenderedHTMLCommon table.dspark th { border-bottom: 2px solid #bbb; font-weight: 600; white-space: nowrap; }
.jp-RenderedHTMLCommon table.dspark th.num, .jp-RenderedHTMLCommon table.dspark td.num { text-align: right;
  white-space: nowrap; }
.jp-RenderedHTMLCommon table.dspark tbody tr:nth-child(odd) { background: none; }
.jp-RenderedHTMLCommon table.dspark tbody tr:nth-child(even) { background: #f6f7f9; }
.jp-RenderedHTMLCommon table.dspark tbody tr:hover { background: #eaf1fb; }
p.dspark-note { color: #555; font-style: italic; margin: 0.3em 0 0.8em; }
p.dspark-failed { color: #a33; }
header.dspark-headline h1 { font-size: 2em; margin-top: 0.2em; border: none; }
p.dspark-where { margin: 0.15em 0; color: #333; }
p.dspark-verdict { font-size: 1.1em; line-height: 1.6; background: #eef5ff; border-left: 4px solid #3b7dd8;
  padding: 0.6em 0.9em; margin: 0.8em 0; }
p.dspark-verdict strong { font-weight: 600; }
span.dspark-label { display: block; font-size: 0.75em; letter-spacing: 0.08em; text-transform: uppercase;
  color: #3b7dd8; font-weight: 700; }
ul.dspark-warnings { background: #fff6e0; border-left: 4px solid #e0a100; padding: 0.5em 0.9em 0.5em 2em;
  margin: 0.8em 0; }
p.dspark-legend { color: #666; font-size: 0.9em; }
</style>
{% endblock extra_css %}
"""


def _failure(output) -> dict:
    """An error output as the one line a report shows in its place."""
    from nbformat.v4 import new_output

    text = f"this section could not be drawn: {output.get('ename')}: {output.get('evalue')}"
    return new_output("display_data", data={"text/plain": text, "text/html": (
        f'<p class="dspark-note dspark-failed">{html.escape(text)}</p>')})


def report_html(env: dict[str, str], out: Path, progress=None) -> tuple[list[str], list[str]]:
    """Every notebook whose inputs are given, run in one kernel, written as one HTML file with its
    figures embedded, under a headline (`present.Headline`) of the runs: no code, no prompts, no cell
    the report leaves out (`notebook-only`), no warnings on stderr, and a cell that failed as one line
    (where the cell loading a notebook's inputs failed, the rest of that notebook left out).
    Returns the notebooks it holds and the failures."""
    try:
        import nbformat
        from nbconvert import HTMLExporter
        from nbformat.v4 import new_code_cell, new_notebook, new_output
    except ImportError:
        raise DSparkError(INSTALL) from None
    from harness.analysis.frames import load_runs
    from harness.analysis.report_text import TITLE, Headline

    names = [n for n, needs in NOTEBOOKS.items() if needs is None or needs in env]
    merged = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    for name in names:
        for cell in nbformat.read(notebook_dir() / f"{name}.ipynb", as_version=4).cells:
            cell.metadata["dspark_notebook"] = name
            merged.cells.append(cell)

    firsts = {}
    for i, cell in enumerate(merged.cells):
        firsts.setdefault(cell.metadata["dspark_notebook"], i)

    def started(cell, cell_index):
        if progress is not None and firsts.get(cell.metadata.get("dspark_notebook")) == cell_index:
            progress(cell.metadata["dspark_notebook"])

    _run(merged, env, 600, allow_errors=True, on_cell_start=started)
    failures, cells, broken = [], [], set()
    for cell in merged.cells:
        name = cell.metadata["dspark_notebook"]
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if name in broken:  # (its inputs failed to load: the rest of it would only fail again)
            continue
        failures += [f"{name}: {o.get('ename')}: {o.get('evalue')}" for o in errors]
        tags = cell.metadata.get("tags", [])
        if errors and INPUTS in tags:
            broken.add(name)
        if NOTEBOOK_ONLY in tags:  # shown only where it failed, as one line
            if not errors:
                continue
            cell.outputs = [_failure(errors[0])]
        elif cell.cell_type == "code":
            cell.outputs = [_failure(o) if o.get("output_type") == "error" else o for o in cell.outputs
                            if not (o.get("output_type") == "stream" and o.get("name") == "stderr")]
        cells.append(cell)
    runs = load_runs([Path(p) for p in env["DSPARK_RUNS"].split(os.pathsep) if p])
    headline = Headline(runs)
    cover = new_code_cell("", outputs=[new_output("display_data", data={"text/html": headline._repr_html_(),
                                                                        "text/plain": repr(headline)})])
    merged.cells = [cover, *cells]
    merged.metadata["title"] = f"{TITLE}: {', '.join(runs.meta['run'])}"
    exporter = HTMLExporter(template_name="lab", raw_template=TEMPLATE, exclude_input=True, exclude_input_prompt=True,
                            exclude_output_prompt=True, embed_images=True)
    body, _ = exporter.from_notebook_node(merged)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial")  # (broken off, by Ctrl-C or a full disk: no half page at `out`)
    try:
        partial.write_text(body, encoding="utf-8")
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return names, failures

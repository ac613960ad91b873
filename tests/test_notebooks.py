"""The report notebooks execute top to bottom on a real demo run and a real recorded profile (the nsys
traces of `tests/fixtures/nsys`, laid out as `dspark-bench profile` writes a folder), each producing
its figures with no error cell; `report --html` writes one self-contained file with the images
embedded; the notebooks are stored without outputs; the analysis layer imports neither torch nor
rich, and a folder that is not a run or a profile is one line."""

from __future__ import annotations

import importlib.util
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import run_cli

from dspark.checkpoint import DEMO_DIR
from dspark.errors import DSparkError

ROOT = Path(__file__).resolve().parents[1]
NSYS = Path(__file__).parent / "fixtures" / "nsys"
needs_tools = pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("nbclient", "nbconvert",
                                                                                   "ipykernel")),
                                 reason="the report extra is not installed (CI installs it with dev)")
needs_demo = pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(),
                                reason="the demo models are not built")
# figures each notebook draws on these inputs (the confidence and sweep figures have nothing to show
# for a native run without them, and say so)
FIGURES = {"acceptance": 3, "speed": 3, "where_time_goes": 3, "engines": 1}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    from rich.console import Console

    from harness.runs.plan import RunOptions
    from harness.runs.runner import run

    root = tmp_path_factory.mktemp("notebooks")
    runs = []
    for name in ("a", "b"):  # two runs of the same prompts: the engines notebook's pair
        run(RunOptions(categories=["coding"], num_prompts=3, output_len=24, systems=["plain", "dspark", "ngram"],
                       threads=1, out=str(root / name)), Console(file=io.StringIO()))
        runs.append(root / name)
    profile = root / "profile"  # a profile folder: <system>.sqlite per system
    profile.mkdir()
    for system in ("plain", "dspark"):
        shutil.copy(NSYS / f"engine_{system}.sqlite", profile / f"{system}.sqlite")
    return {"runs": runs, "profile": profile, "root": root}


@needs_tools
@needs_demo
@pytest.mark.parametrize("name", list(FIGURES))
def test_each_notebook_runs_top_to_bottom_and_draws_its_figures(inputs, name):
    from harness.analysis.notebooks import execute
    from harness.analysis.notebooks import inputs as notebook_inputs

    env = notebook_inputs(inputs["runs"][:1], [inputs["profile"]], None, tuple(inputs["runs"]))
    nb = execute(name, env)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == FIGURES[name], name
    text = json.dumps([o.get("data", {}).get("text/plain", "") for o in outputs])
    if name == "where_time_goes":
        assert "dspark" in text and "plain" in text  # the launches table names both systems


@needs_tools
@needs_demo
def test_the_html_report_of_a_demo_run_embeds_its_images(inputs, monkeypatch, capfd):
    out = inputs["root"] / "report.html"
    code, _, err = run_cli(monkeypatch, capfd, "report", inputs["runs"][0], "--html", out)
    assert code == 0, err
    html = out.read_text()
    assert html.count("data:image/png;base64,") >= FIGURES["acceptance"] + FIGURES["speed"]
    assert "src=\"http" not in html.replace("src=\"https://cdn", "")  # the figures are in the file, not linked
    assert "the acceptance, speed notebooks" in err and inputs["runs"][0].name in html  # what produced them


def test_the_notebooks_are_stored_without_outputs():
    books = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert {b.stem for b in books} == {"acceptance", "speed", "where_time_goes", "engines"}
    for book in books:
        cells = json.loads(book.read_text())["cells"]
        assert all(not c.get("outputs") and c.get("execution_count") is None for c in cells if c["cell_type"] == "code")


def test_the_analysis_layer_needs_neither_torch_nor_rich():
    code = ("import sys; import harness.analysis.frames, harness.analysis.figures, harness.analysis.notebooks; "
            "bad = [m for m in ('torch', 'rich') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_folder_that_is_not_a_run_or_profile_is_one_line(tmp_path, monkeypatch, capfd):
    from harness.analysis.frames import load_profiles, load_runs

    with pytest.raises(DSparkError, match="not a run folder"):
        load_runs([tmp_path])
    with pytest.raises(DSparkError, match="not a profile folder"):
        load_profiles([tmp_path])
    code, _, err = run_cli(monkeypatch, capfd, "report", tmp_path, "--html", tmp_path / "r.html")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "not" in err

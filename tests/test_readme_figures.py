"""benchmarks/readme_figures.py: the README's figures blocks, each naming the machine and the revision it came
from, written between their markers from a real run and profile folder; the committed README agrees with the
committed figures; a README without the markers is refused before any work."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "readme_figures.py"
CLI = [sys.executable, "-m", "harness.cli"]


def readme_figures():
    return load_script(SCRIPT)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A small run and a small PyTorch profile of the demo pair, as the tool writes them."""
    base = tmp_path_factory.mktemp("figures")
    run, profile = base / "run", base / "profile"
    common = ["--category", "coding", "--num-prompts", "2", "--output-len", "8", "--temperature", "0"]
    subprocess.run([*CLI, "run", *common, "--systems", "plain,dspark", "--out", str(run)], cwd=ROOT, check=True,
                   capture_output=True)
    subprocess.run([*CLI, "profile", "--torch", *common, "--systems", "plain", "--no-overhead", "--out", str(profile)],
                   cwd=ROOT, check=True, capture_output=True)
    return run, profile


def blocks(text: str) -> dict[str, str]:
    figures = readme_figures()
    found = {}
    for name in figures.BLOCKS:
        start, end = figures.marker(name), figures.marker(name, end=True)
        assert start in text and end in text, f"README lacks {start} ... {end}"
        found[name] = text[text.index(start) + len(start):text.index(end)].strip("\n")
    return found


def flat(text: str) -> str:
    return " ".join(text.split())


def test_the_readme_blocks_are_the_recorded_figures_and_name_machine_and_revision():
    figures = readme_figures()
    recorded = json.loads(figures.FIGURES.read_text())
    written = blocks((ROOT / "README.md").read_text())
    assert written == figures.render(recorded)  # not edited by hand, nor left behind by the figures
    for name, made in (("table", recorded), ("profile", recorded["profile"])):
        commit, cores = made["revision"]["commit"][:12], made["machine"]["cores"]
        assert f"git {commit}" in flat(written[name]) and f"{cores} cores" in flat(written[name])
    assert "┏" in written["table"] and "dspark" in written["table"]
    assert recorded["main"]["wall_s"] > 0 and recorded["profile"]["trace_bytes"] > 0


def test_skip_run_writes_both_blocks_from_the_folders_with_their_captions(folders, tmp_path):
    run, profile = folders
    readme, out = tmp_path / "README.md", tmp_path / "figures.json"
    readme.write_text((ROOT / "README.md").read_text())
    args = [sys.executable, str(SCRIPT), "--skip-run", str(run), "--profile-dir", str(profile), "--readme", str(readme),
            "--json", str(out)]
    subprocess.run(args, cwd=ROOT, check=True, capture_output=True)
    written = blocks(readme.read_text())
    manifest = json.loads((run / "manifest.json").read_text())
    caption = flat(written["table"].split("```")[0])
    assert caption.startswith("One run of the main command")
    assert manifest["provenance"]["git"]["commit"][:12] in caption and f"{manifest['provenance']['cores']} cores" in caption
    assert "torch " in caption and "wall time not measured" in caption  # nothing was timed: the caption says so
    table = written["table"].split("```")[1]
    assert "plain" in table and "dspark" in table and table.strip().startswith("┏")
    child = json.loads((profile / "plain" / "manifest.json").read_text())["provenance"]  # its own revision
    said = flat(written["profile"])
    assert child["git"]["commit"][:12] in said and f"{child['cores']} cores" in said and "MB of gzipped traces" in said
    recorded = json.loads(out.read_text())
    assert recorded["revision"]["commit"] == manifest["provenance"]["git"]["commit"]
    assert recorded["profile"]["trace_bytes"] > 0
    # a second rendering replaces the blocks rather than adding to them
    once = readme.read_text()
    subprocess.run(args, cwd=ROOT, check=True, capture_output=True)
    assert readme.read_text().count("One run of the main command") == once.count("One run of the main command") == 1


def test_a_readme_without_the_markers_is_refused_in_one_line_before_any_work(tmp_path):
    figures = readme_figures()
    readme = tmp_path / "README.md"
    text = (ROOT / "README.md").read_text().replace(figures.marker("profile", end=True), "")
    readme.write_text(text)
    out = subprocess.run([sys.executable, str(SCRIPT), "--readme", str(readme), "--work", str(tmp_path / "w")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and figures.marker("profile") in out.stderr
    assert readme.read_text() == text and not (tmp_path / "w").exists()  # nothing ran, nothing written

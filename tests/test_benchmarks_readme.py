"""benchmarks/README.md: every script in benchmarks/ is listed with its command, and every removed probe it names
is gone from the folder and readable at the commit it names, so a newcomer finds what to run and where the rest went."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
TEXT = (BENCH / "README.md").read_text() if (BENCH / "README.md").exists() else ""
LISTED, _, HISTORY = TEXT.partition("## Removed probes")


def test_every_script_in_benchmarks_is_listed_before_the_history():
    scripts = sorted(p.name for p in BENCH.iterdir() if p.suffix in (".py", ".sh"))
    assert scripts and [s for s in scripts if s not in LISTED] == []
    commands = set(re.findall(r"(?:python3?|bash) benchmarks/([a-z0-9_]+\.(?:py|sh))", LISTED))
    runnable = [s for s in scripts if s != "stage.sh"]  # sourced by the device scripts, never run alone
    assert [s for s in runnable if s not in commands] == [] and [c for c in commands if not (BENCH / c).exists()] == []


def test_every_removed_probe_is_gone_and_at_the_commit_named():
    commit = re.search(r"removed after commit ([0-9a-f]{7,40})", HISTORY)
    assert commit, "the history section names the last commit that had the probes"
    probes = re.findall(r"^\| `(\w+\.py)` \|", HISTORY, flags=re.M)
    assert probes and [p for p in probes if (BENCH / p).exists()] == []
    missing = [p for p in probes if subprocess.run(["git", "cat-file", "-e", f"{commit[1]}:benchmarks/{p}"], cwd=ROOT,
                                                   capture_output=True).returncode != 0]
    assert missing == []

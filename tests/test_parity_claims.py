"""What the README and docs/ claim of DSpark's parity with vLLM (issue 54 review): vLLM's CPU build as shipped
norms every draft layer's context keys with the first layer's `k_norm`, so its DSpark rounds equal ours only
with the tests' per-layer fix (`tests/vllm_knorm_shim`, which `tests/test_markov_topk.py` runs). Every passage
that cites `test_markov_topk` for vLLM's rounds equalling ours must say so, and the shim it names must exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIM = "vllm_knorm_shim"


def _passages(path: Path) -> list[str]:
    """A Markdown file's paragraphs, each table row one passage (a row is one system's claim)."""
    out = []
    for block in re.split(r"\n\s*\n", path.read_text()):
        out += block.splitlines() if block.lstrip().startswith("|") else [block]
    return out


def test_every_claim_that_vllms_dspark_rounds_equal_ours_names_the_knorm_fix():
    claims = [(path.relative_to(ROOT), p) for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
              for p in _passages(path) if "test_markov_topk" in p and re.search(r"round by round|rounds equal", p)]
    assert {str(path) for path, _ in claims} >= {"README.md", "docs/drafts.md", "docs/run.md"}
    unqualified = [f"{path}: {' '.join(p.split())[:160]}" for path, p in claims if SHIM not in p]
    assert not unqualified, unqualified
    assert (ROOT / "tests" / SHIM).is_dir()

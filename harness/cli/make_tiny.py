"""`dspark-bench make-tiny`: random tiny pairs in every real format (timing and smoke tests)."""

from __future__ import annotations

from pathlib import Path

import typer

from harness.cli import paths
from harness.cli.render import out


def make_tiny_cmd(
    out_dir: Path = typer.Argument(..., help="Folder to write the tiny target and drafts into: new, empty, or an "
                                   "earlier make-tiny's."),
    seed: int = typer.Option(0, help="Seed of the random weights."),
):
    """Save a small random-weight Qwen3 target and drafts in every real format (smoke tests, timing)."""
    from dspark.synthetic.tiny import made_by_make_tiny, make_tiny

    paths.output_folder(out_dir, "OUT_DIR")
    paths.own_folder(out_dir, "OUT_DIR", "an earlier make-tiny output", made_by_make_tiny, "/tmp/dspark-tiny")
    written = make_tiny(out_dir, seed)
    for name, path in written.items():
        out.print(f"{name:20s} {path}", highlight=False, soft_wrap=True)


"""`dspark-bench make-tiny`: random tiny pairs in every real format (timing and smoke tests)."""

from __future__ import annotations

from pathlib import Path

import typer

from dspark.errors import DSparkError
from harness.cli import paths
from harness.cli.render import out


def make_tiny_cmd(
    out_dir: Path = typer.Argument(..., help="Folder to write the tiny target and drafts into: new, empty, or an "
                                   "earlier make-tiny's."),
    seed: int = typer.Option(0, help="Seed of the random weights."),
):
    """Save a small random-weight Qwen3 target and drafts in every real format (smoke tests, timing)."""
    paths.output_folder(out_dir, "OUT_DIR")
    _check_own_folder(out_dir)
    from dspark.tiny import make_tiny

    written = make_tiny(out_dir, seed)
    for name, path in written.items():
        out.print(f"{name:20s} {path}", highlight=False, soft_wrap=True)


def _check_own_folder(out_dir: Path) -> None:
    """Refuse a folder whose files the nine models would mix with (they overwrite config.json,
    model.safetensors, README.txt and manifest.json): one holding anything but an earlier make-tiny
    output, and any folder in a Python package (its `__init__.py`'s folder or below, site-packages), where
    the models would be taken for the package's own files; `make-tiny .` from the repository root wrote a
    config.json and model.safetensors into dspark/."""
    from dspark.tiny import made_by_make_tiny

    place = out_dir.expanduser().resolve()
    for folder in (place, *place.parents):
        if (folder / "__init__.py").is_file() or folder.name in ("site-packages", "dist-packages"):
            raise DSparkError(f"OUT_DIR {out_dir}: inside the Python package {folder}, whose files the models would "
                              "overwrite or join; give a folder of their own, e.g. /tmp/dspark-tiny")
    if place.is_dir() and any(place.iterdir()) and not made_by_make_tiny(place):
        raise DSparkError(f"OUT_DIR {out_dir}: the folder holds other files, not an earlier make-tiny output; give a "
                          "new or empty folder, e.g. /tmp/dspark-tiny")

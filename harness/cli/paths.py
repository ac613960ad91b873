"""Output paths checked before any work: a command that would fail to write its result after minutes of
work (or with a traceback) is refused at once instead, in one line naming the path, the problem and the
fix. The check is real, not a reading of permission bits (which say nothing to root, to a read-only
mount or to /proc): a file is created and removed in the nearest folder that exists. Nothing else is
made; missing folders are created later by the command that writes there."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from dspark.errors import DSparkError


# The suffixes a file of each kind may end in, which decide its format: a figure's, those matplotlib writes without
# extra software (its Agg canvas; pgf needs LaTeX, raw and rgba are bare pixels); a page's, HTML.
FIGURE_SUFFIXES = (".png", ".pdf", ".svg", ".svgz", ".jpg", ".jpeg", ".tif", ".tiff", ".webp", ".eps", ".ps")
HTML_SUFFIXES = (".html", ".htm")


def output_file(path: str | Path, flag: str, example: str = "out", fix: str | None = None,
                suffixes: tuple[str, ...] = ()) -> Path:
    """`path`, a file the command will write (`flag` names where it came from), refused unless it can be:
    not a folder, under no file, in a folder that exists or can be made, where files can be created, and
    named with one of `suffixes` when given (the file's format: a figure's, a page's). `example`: a file
    name to suggest when a folder is given; `fix`: what to do instead (default: choose another `flag`)."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise DSparkError(f"{flag} {path}: is a folder; {fix or f'give a file name, e.g. {path / example}'}")
    if suffixes and path.suffix.lower() not in suffixes:
        what = f"the suffix {path.suffix} names no format {flag} writes" if path.suffix else "the name has no suffix"
        raise DSparkError(f"{flag} {path}: {what}; end the name in {', '.join(suffixes)}, e.g. "
                          f"{path.with_name(path.stem + Path(example).suffix)}")
    if path.exists() and not os.access(path, os.W_OK):
        raise DSparkError(f"{flag} {path}: the file exists and cannot be written; {fix or f'choose another {flag}'}")
    _check_place(path.parent, path, flag, fix)
    return path


def output_folder(path: str | Path, flag: str, fix: str | None = None) -> Path:
    """`path`, a folder the command will write into (made if missing), refused unless it can be: not a
    file, under no file, in a place where files can be created. `fix`: what to do instead (default:
    choose another `flag`)."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise DSparkError(f"{flag} {path}: is a file, not a folder; {fix or f'give a folder path to {flag}'}")
    _check_place(path, path, flag, fix)
    return path


def own_folder(path: str | Path, flag: str, whose: str, is_own: Callable[[Path], bool], example: str) -> None:
    """Refuse a folder whose files a command's output would overwrite or mix with: any folder in a Python
    package (its `__init__.py`'s folder or below, site-packages), where the output would be taken for the
    package's own files (`make-tiny .` from the repository root wrote a config.json and model.safetensors into
    dspark/; `train-draft --out dspark/data/demo/dspark` overwrote the shipped demo draft), and one holding
    anything but `whose` (`is_own`: an earlier output of the same command), such as a run folder. `example`:
    a folder to suggest instead."""
    place = Path(path).expanduser().resolve()
    for folder in (place, *place.parents):
        if (folder / "__init__.py").is_file() or folder.name in ("site-packages", "dist-packages"):
            raise DSparkError(f"{flag} {path}: inside the Python package {folder}, whose files this would overwrite "
                              f"or join; give a folder of its own, e.g. {example}")
    if place.is_dir() and any(place.iterdir()) and not is_own(place):
        raise DSparkError(f"{flag} {path}: the folder holds other files, not {whose}; give a new or empty folder, "
                          f"e.g. {example}")


def _check_place(folder: Path, path: Path, flag: str, fix: str | None = None) -> None:
    """Refuse `path` unless `folder` (its own folder, or itself for a folder output) is or can become a
    folder where files can be created: its nearest existing ancestor must be a folder that takes a file."""
    fix = fix or f"choose another {flag}"
    where = f"{flag} {path}" if flag else str(path)
    base = folder.absolute()
    while not os.path.exists(base) and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise DSparkError(f"{where}: {base} is a file, so no folder can be made under it; {fix}")
    try:
        fd, probe = tempfile.mkstemp(dir=base, prefix=".dspark-bench-write-check-")
    except OSError as exc:
        raise DSparkError(f"{where}: cannot create files in {base} ({exc.strerror or type(exc).__name__}); "
                          f"{fix}") from None
    os.close(fd)
    os.unlink(probe)


def out_folder(out: str | None) -> Path:
    """The folder given to `--out`, else `results/`, where a default one goes (made in the working folder):
    checked as `output_folder`."""
    from harness.runs.plan import RESULTS

    if out:
        return output_folder(out, "--out")
    return output_folder(RESULTS, "", "run from a folder where files can be created, or give --out")


def run_folder(out: str | None, resume: str | None) -> None:
    """`run`'s folder, before anything loads: `--resume DIR` must take files; `--out DIR` must be a folder
    that can be made and is new or empty (`RunFolder.check_new`); without either, `results/` must be
    possible (`out_folder`)."""
    from harness.runs.folder import RunFolder

    if resume:
        output_folder(resume, "--resume", "give the folder of the run to finish")
        return
    folder = out_folder(out)
    if out:
        RunFolder(folder).check_new(named=True)

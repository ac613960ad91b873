"""Where dspark-bench keeps what it makes for the user between runs (random-weight folders, compiled steps)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$DSPARK_CACHE, default ~/.cache/dspark-bench."""
    return Path(os.environ.get("DSPARK_CACHE") or Path.home() / ".cache" / "dspark-bench")

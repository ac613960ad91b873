"""torch.compile for the CPU steps: inductor's C++ backend, its cache kept where the user's cache is.

On a CPU no graph replays the steps; compiling one makes its few hundred small operators a handful of
generated loops around the matrix products (the demo's plain step: 4.25 ms eager, 2.17 ms compiled, 95 %
of the copy-rate floor: benchmarks/results/cpu_compile_probe.json). A step's first compile costs about
20 s on 2 cores and one per step and settings (benchmarks/cpu_targets.py measures both): it pays on long
runs, not on the demo's main command, so it is asked for (`--compile`), never implied.

Settings made once per process, before the first compile:
- inductor's cache under `$DSPARK_CACHE/inductor` (default ~/.cache/dspark-bench/inductor) unless
  `TORCHINDUCTOR_CACHE_DIR` is set; where that folder cannot be written, a fresh temporary one (the run says
  which) so that a read-only home never breaks a run;
- random draws through the same ATen generators as the eager steps (`fallback_random`), so a compiled
  step samples the tokens the eager one does;
- room for one compiled form per step, settings and engine (dynamo's recompile limit is 8 per function).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from dspark.user_cache import cache_root

RECOMPILE_LIMIT = 256
_PREPARED: dict[str, str] = {}
# the user's own choice, read before anything imports inductor (whose config sets the variable on import)
_GIVEN_CACHE_DIR = os.environ.get("TORCHINDUCTOR_CACHE_DIR")


def _writable(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def choose_cache_dir(given: str | None, root: Path) -> tuple[Path, str]:
    """(inductor's cache folder, why): `given` (TORCHINDUCTOR_CACHE_DIR) as it is, else root/inductor; either, if it
    cannot be written, replaced by a fresh temporary folder."""
    folder, why = (Path(given), "TORCHINDUCTOR_CACHE_DIR") if given else (root / "inductor", "the user's cache")
    if not _writable(folder):
        folder, why = Path(tempfile.mkdtemp(prefix="dspark-inductor-")), f"{folder} is not writable: a fresh one"
    return folder, why


def prepare() -> dict[str, str]:
    """Set the process up for compiled steps (once); returns where inductor's cache is and why."""
    if _PREPARED:
        return dict(_PREPARED)
    import torch._dynamo
    import torch._inductor.config as inductor

    folder, why = choose_cache_dir(_GIVEN_CACHE_DIR, cache_root())
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    inductor.fallback_random = True
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit,
                                                           RECOMPILE_LIMIT)
    _PREPARED.update(cache_dir=str(folder), cache_dir_from=why)
    return dict(_PREPARED)

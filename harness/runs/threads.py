"""How many intra-op threads a CPU run uses, chosen on purpose and recorded.

PyTorch's default is one thread per core. For a model as small as the demo pair each decode step
is a few hundred tiny operations, and a second thread buys nothing on an idle 2-core machine and
costs many times over when another process competes for the cores (its threads wait on each
other at every operation): `benchmarks/threads.py` measures it, `benchmarks/RESULTS.md` records
it. So, in order:

1. `--threads N` is used as given, from 1 to the cores this process may use (`os.sched_getaffinity`):
   more threads than cores wait on each other at every operation (TPOT 100 times worse on the demo), so
   more is refused in one line before anything loads;
2. a thread count the user set in the environment (OMP_NUM_THREADS, MKL_NUM_THREADS) is respected:
   torch has already read it;
3. on the CPU, a target whose weights are at most `SMALL_MODEL_BYTES` runs on one thread, a larger
   one on every core this process may use;
4. on a GPU, torch's default stays (the host threads only launch work).

A resumed run keeps the count its manifest recorded (its requests so far were timed at it): a
different count from `--threads` or from the environment is refused, naming both and the fix.
"""

from __future__ import annotations

import os
from pathlib import Path

from dspark.errors import DSparkError

SMALL_MODEL_BYTES = 200_000_000  # the demo target is 13.6 MB; a 50 M-parameter float32 model is 200 MB
ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


class Recorded(int):
    """A thread count read from a resumed run's manifest: used as `--threads` is, and said to be the run's."""


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def check(requested: int) -> None:
    """Refuse a `--threads` count below 1 or above the usable cores (the rule above, step 1)."""
    if requested < 1:
        raise DSparkError(f"--threads is {requested}; give at least 1")
    cores = usable_cores()
    if requested > cores:
        raise DSparkError(f"--threads is {requested}, but this process may use {cores} core(s); give at most {cores} "
                          "(more threads than cores wait on each other at every step)")


def weights_bytes(folder: Path) -> tuple[int, str]:
    """(bytes, what they are) of the target's weights: its .safetensors files' size; for a `random:` target,
    which has none, its parameter count times its config's dtype size ("random target weights")."""
    import torch

    from dspark.checkpoint import random_weights, read_config
    from dspark.models.config import TargetConfig
    from dspark.models.target import weights_bytes as counted

    if random_weights(Path(folder)) is None:
        return sum(f.stat().st_size for f in Path(folder).glob("*.safetensors")), "target weights"
    config = read_config(Path(folder))
    dtype = getattr(torch, str(config.get("torch_dtype") or config.get("dtype") or "float32"), torch.float32)
    return counted(TargetConfig.from_hf(config, str(folder)), dtype), "random target weights"


def choose(requested: int | None, device: str, target_folder: Path | None) -> tuple[int, str]:
    """(thread count, why): the rule above. Reads no weights, only their files' sizes."""
    import torch

    if isinstance(requested, Recorded):
        return int(requested), "as the run recorded"
    if requested is not None:
        check(requested)
        return requested, "--threads"
    set_vars = [f"{var}={os.environ[var]}" for var in ENV_VARS if os.environ.get(var)]
    if set_vars:
        return torch.get_num_threads(), f"{', '.join(set_vars)} (torch uses {torch.get_num_threads()})"
    if not device.startswith("cpu"):
        return torch.get_num_threads(), "torch default (GPU run)"
    size, what = weights_bytes(target_folder) if target_folder is not None else (None, "")
    if size is not None and size <= SMALL_MODEL_BYTES:
        shown = f"{size / 1e6:.0f}" if size >= 1e6 else f"{size / 1e6:.2g}"  # (no size below 0.5 MB shows as 0)
        return 1, f"auto: {what} {shown} MB <= {SMALL_MODEL_BYTES / 1e6:.0f} MB"
    return usable_cores(), "auto: every usable core (a large target)"


def environment_count() -> tuple[int, str] | None:
    """(count, `VAR=value`) of the first thread variable the environment sets to a whole number, else None."""
    for var in ENV_VARS:
        value = os.environ.get(var, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value), f"{var}={value}"
    return None


def resumed(count: int, given: int | None, run_dir: Path) -> Recorded:
    """The recorded `count` of a run resumed from `run_dir`, checked against what this invocation asks
    for: `given` (--threads, already held against the record by the caller) or else the environment."""
    env = environment_count() if given is None else None
    if env is not None and env[0] != count:
        var = env[1].split("=")[0]
        raise DSparkError(f"--resume {run_dir}: the run was timed on {count} thread(s), {env[1]} asks for {env[0]}; "
                          f"unset {var} (or set it to {count}) to continue the run as it was started")
    return Recorded(count)


def apply(count: int) -> None:
    import torch

    if torch.get_num_threads() != count:
        torch.set_num_threads(count)

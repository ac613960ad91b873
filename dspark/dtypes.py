"""The dtype names the models load in, checked without torch (this module imports none), so that a
mistyped --dtype answers before torch loads; `dspark.checkpoint.pick_dtype` turns one into torch's."""

from __future__ import annotations

from dspark.errors import DSparkError

# our names -> torch's name of each ("auto" besides: bfloat16 on a GPU, float32 on the CPU)
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16",
          "fp16": "float16", "float64": "float64"}


def dtype_name(name: str, flag: str = "dtype") -> str:
    """torch's name for the dtype `name` ("auto" stays), refused in one line (naming `flag`) when it is
    none of ours."""
    if name != "auto" and name not in DTYPES:
        raise DSparkError(f"{flag} {name}: unknown dtype; use one of auto, {', '.join(DTYPES)}")
    return DTYPES.get(name, name)


def resolved_dtype(name: str, device: str) -> str:
    """torch's name for the dtype a run of `--dtype name` on `device` computes in: auto is bfloat16 on a
    GPU (cuda), float32 elsewhere."""
    name = dtype_name(name)
    if name != "auto":
        return name
    return "bfloat16" if str(device).split(":")[0] == "cuda" else "float32"

"""The native engine: batch-size-1 generation, plain or speculative, on one target path.

`single` holds Engine and its request types; `steps` names each decode-loop step once (NVTX range,
round_ms key, graph key) and holds the target's tensor code for them (the drafters hold theirs); `graphs`
captures and replays the steps' CUDA graphs, or runs their compiled forms on a CPU, whose settings `compile`
makes; `timing` times them; `nvtx` puts a range around each.
"""

from dspark.engine.graphs import StepRunner
from dspark.engine.single import Engine, GenerationConfig, GenerationResult
from dspark.engine.steps import ACCEPT, DECODE, VERIFY, Step, propose_step
from dspark.engine.timing import StepTimer, synchronize

__all__ = ["ACCEPT", "DECODE", "VERIFY", "Engine", "GenerationConfig", "GenerationResult", "Step", "StepRunner",
           "StepTimer", "propose_step", "synchronize"]

"""The Triton kernels the engine launches, in order with their grids, for the demo pair on a CPU through Triton's
interpreter: the prefill and one plain decode step, then the prefill and one speculative round (propose, verify,
accept), at temperature 0 and 1. Each line is `<engine step> <kernel> <grid>`. Twice: as a CPU dispatches (its
CPU forms take the norms and attention), then as a GPU dispatches (the CPU forms off, so the q/k norms and split-KV
attention launch their kernels as on a GPU; the grids sized for 4 SMs).

Why: a change to the kernels' plumbing (a launch removed, a module renamed) that must leave the default path's
kernels as they were can be shown to on a machine without a GPU: record the list before and after and diff them
(issue 53 did: benchmarks/results/kernel_sequence_issue53/). The interpreter runs float32 only; a GPU launches the
same kernels, except that there the products and the CPU forms' operations differ by device, not by this list.

    python benchmarks/kernel_sequence.py > sequence.txt
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are defined: before dspark is imported

import sys  # noqa: E402
from contextlib import contextmanager  # noqa: E402

import torch  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from dspark.checkpoint import load_draft, load_target  # noqa: E402
from dspark.drafters import drafter_for  # noqa: E402
from dspark.engine import Engine, GenerationConfig  # noqa: E402

PROMPT = [5, 17, 300, 42, 9, 1000, 77, 12]


def record() -> list[str]:
    """Run the two engines with every kernel launch and engine step logged; the lines in launch order."""
    lines: list[str] = []
    label = ["prefill"]
    launch, run_step = InterpretedFunction.run, Engine.run_step

    def logged_launch(self, *args, grid, warmup, **kwargs):
        if not warmup:
            lines.append(f"{label[0]} {self.fn.__name__} {tuple(grid) if not callable(grid) else grid}")
        return launch(self, *args, grid=grid, warmup=warmup, **kwargs)

    def labelled_step(self, step, cfg):
        label[0] = step.range
        try:
            return run_step(self, step, cfg)
        finally:
            label[0] = "host"

    InterpretedFunction.run, Engine.run_step = logged_launch, labelled_step
    try:
        target = load_target("demo", "cpu", torch.float32).model
        drafter = drafter_for(load_draft("demo-dspark", target).model)
        for dispatch in ("cpu", "gpu"):
            with cpu_forms(dispatch == "cpu"):
                for temperature in (0.0, 1.0):
                    for name, engine in (("plain", Engine(target, None)), ("dspark", Engine(target, drafter))):
                        lines.append(f"# {dispatch} dispatch, {name} engine, temperature {temperature}: "
                                     "the prefill and one step or round")
                        label[0] = "prefill"
                        engine.generate(PROMPT, GenerationConfig(max_new_tokens=2, temperature=temperature))
    finally:
        InterpretedFunction.run, Engine.run_step = launch, run_step
    return lines


@contextmanager
def cpu_forms(on: bool):
    """Off: every dspark module's `use_cpu_forms`/`use_cpu_norm_forms` answers False, so CPU tensors take the
    branches a GPU takes (the kernels, under the interpreter)."""
    saved = []
    if not on:
        for mod in [m for name, m in sys.modules.items() if name.startswith("dspark")]:
            for attr in ("use_cpu_forms", "use_cpu_norm_forms"):
                if callable(getattr(mod, attr, None)):
                    saved.append((mod, attr, getattr(mod, attr)))
                    setattr(mod, attr, lambda t: False)
    try:
        yield
    finally:
        for mod, attr, fn in saved:
            setattr(mod, attr, fn)


if __name__ == "__main__":
    with torch.inference_mode():
        print("\n".join(record()))

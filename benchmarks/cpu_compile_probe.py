"""Issue 43's first measurement: where the demo's plain step goes on a CPU, and what torch.compile makes of it.

The demo target's plain decoding step, on one thread, float32, in our engine (the `ar_decode` step at context
100): the eager step's median milliseconds and how many aten operators it runs, how long they take
themselves, and the same step compiled by torch.compile (inductor's CPU backend): its graphs and graph
breaks, the compile's seconds, the compiled step's median. The weights' bytes give the step's floor at the
machine's copy rate (`harness.backends.timing.copy_bandwidth_tbps`, as engine-bench measures it). A probe: the engine's own CPU
path does not compile yet.

    python benchmarks/cpu_compile_probe.py [--out benchmarks/results/cpu_compile_probe.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from dspark.checkpoint import load_target
from dspark.engine import Engine, GenerationConfig
from harness.backends.timing import copy_bandwidth_tbps, host_times_ms
from harness.runs.provenance import provenance

POSITION = 100  # the step's context: a demo request's middle
CPU = torch.device("cpu")


def timed(fn, state) -> dict:
    """Median and range of `fn`'s wall milliseconds (300 runs after warm-up), the anchor reset to POSITION
    before each (untimed)."""
    times = host_times_ms(fn, 300, lambda: state.position.fill_(POSITION), CPU)
    return {"median_ms": statistics.median(times), "range_ms": [min(times), max(times)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    target = load_target("demo", "cpu", "float32").model
    engine = Engine(target)
    engine.warmup(256, GenerationConfig(max_new_tokens=64))
    steps, state = engine._target_steps, engine.state  # (a probe: the step itself, as the engine runs it)
    result = {"weights_mb": sum(p.numel() * p.element_size() for p in target.parameters()) / 1e6}
    with torch.inference_mode():
        eager = timed(lambda: steps.ar_decode(0.0), state)
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(10):
                state.position.fill_(POSITION)
                steps.ar_decode(0.0)
        ops = [e for e in prof.key_averages() if e.key.startswith("aten::")]
        result["eager"] = eager | {"aten_ops_per_step": sum(e.count for e in ops) / 10,
                           "aten_self_ms_per_step": sum(e.self_cpu_time_total for e in ops) / 10 / 1e3,
                           "top": [{"op": e.key, "per_step": e.count / 10, "self_ms": e.self_cpu_time_total / 1e4}
                                   for e in sorted(ops, key=lambda e: -e.self_cpu_time_total)[:6]]}
        import torch._dynamo as dynamo

        state.position.fill_(POSITION)
        explained = dynamo.explain(steps.ar_decode)(0.0)
        start = time.perf_counter()
        compiled = torch.compile(steps.ar_decode)
        state.position.fill_(POSITION)
        compiled(0.0)
        compile_s = time.perf_counter() - start
        result["compiled"] = {"graphs": explained.graph_count, "graph_breaks": explained.graph_break_count,
                              "compile_s": compile_s} | timed(lambda: compiled(0.0), state)
    gbps = copy_bandwidth_tbps(0.25, 20, CPU) * 1e3
    result["copy_gbps"] = gbps
    result["floor_ms"] = result["weights_mb"] / gbps  # (MB over GB/s: milliseconds)
    for kind in ("eager", "compiled"):
        result[kind]["fraction_of_floor"] = result["floor_ms"] / result[kind]["median_ms"]
    result["provenance"] = provenance("cpu")
    text = json.dumps(result, indent=1, default=str)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()

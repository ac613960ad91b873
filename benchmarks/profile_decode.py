"""Per-kernel GPU time of one plain decode step and one speculative round at Qwen3-8B shapes.

Random weights, 1k context, CUDA graphs replayed under the PyTorch profiler; prints the kernels
grouped by name with their share of the step. Usage: python benchmarks/profile_decode.py [--steps 20]
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from dspark.drafters import BlockDrafter
from dspark.engine import Engine, GenerationConfig
from dspark.synthetic.presets import DRAFTS, QWEN3_8B, build_random


def kernel_table(prof, steps: int, top: int = 25) -> str:
    rows = [(e.key, e.device_time_total / steps, e.count // steps) for e in prof.key_averages()
            if e.device_time_total > 0 and e.device_type == torch.autograd.DeviceType.CUDA]
    rows.sort(key=lambda r: -r[1])
    total = sum(r[1] for r in rows)
    lines = [f"{'us/step':>9} {'share':>6} {'n':>4}  kernel", "-" * 100]
    for name, us, n in rows[:top]:
        lines.append(f"{us:9.1f} {us / total:6.1%} {n:4d}  {name[:110]}")
    lines.append(f"{total:9.1f} 100.0%       all kernels ({len(rows)} names)")
    return "\n".join(lines)


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--context", type=int, default=1024)
    args = ap.parse_args()
    target, draft = build_random(QWEN3_8B, DRAFTS["dspark-qwen3-8b-block7"](), "cuda", torch.bfloat16)
    prompt = torch.randint(0, 1000, (args.context,), generator=torch.Generator().manual_seed(0)).tolist()
    cfg = GenerationConfig(max_new_tokens=8, temperature=1.0)
    for name, drafter in (("plain decode step", None), ("speculative round", BlockDrafter(draft))):
        engine = Engine(target, drafter)
        engine.generate(prompt, cfg)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                engine.state.position.fill_(args.context)
                for step in engine.steps:
                    engine.run_step(step, cfg)
            torch.cuda.synchronize()
        print(f"\n== {name}: kernels per step (GPU time averaged over {args.steps})")
        print(kernel_table(prof, args.steps))


if __name__ == "__main__":
    main()

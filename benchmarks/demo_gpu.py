"""The demo pair on one GPU: plain decoding against DSpark at T = 0, with the kernels each launches per
generated token (CUDA graphs on, as the engine runs by default).

Both engines warm up on the held-out coding prompts (graphs captured), then run them timed, alternated
prompt by prompt (plain, DSpark on one prompt, DSpark, plain on the next) for `--passes` passes, so drift
in the machine's state falls on both; each pass's speedup is printed, so one lucky pass does not stand
for the result. A last pass under the PyTorch profiler counts the kernels each decode loop launched
(graph replays included) per generated token, the prefill's left out.

    python benchmarks/demo_gpu.py [--prompts 8] [--tokens 128] [--passes 3] [--draft demo-dspark]
"""

from __future__ import annotations

import argparse
import json

import torch
from torch.profiler import ProfilerActivity, profile

from dspark.checkpoint import load_draft, load_target
from dspark.drafters import BlockDrafter
from dspark.engine import Engine, GenerationConfig
from dspark.tokenizer import chat_prompt_ids, conversation
from harness.runs.provenance import provenance
from harness.specs.datasets import load


def timed_passes(engines: dict[str, Engine], prompts: list[list[int]], cfg: GenerationConfig, passes: int) -> dict:
    """Every engine on every prompt, alternated (the order flips from prompt to prompt); per engine and
    pass the decoded tokens, decode seconds and acceptance lengths."""
    for engine in engines.values():
        for ids in prompts:  # warm-up: graphs captured, caches allocated
            engine.generate(ids, cfg)
    out = {name: [] for name in engines}
    for _ in range(passes):
        totals = {name: {"tokens": 0, "decode_s": 0.0, "rounds": []} for name in engines}
        for i, ids in enumerate(prompts):
            for name in (list(engines) if i % 2 == 0 else list(reversed(engines))):
                result = engines[name].generate(ids, cfg)
                totals[name]["tokens"] += len(result.tokens) - 1  # the prefill's token is not decoded
                totals[name]["decode_s"] += result.decode_s
                totals[name]["rounds"] += result.acceptance_lengths
        for name, t in totals.items():
            out[name].append({"decoded_tokens": t["tokens"], "decode_tok_s": t["tokens"] / t["decode_s"],
                              "acceptance_length": sum(t["rounds"]) / len(t["rounds"]) if t["rounds"] else None})
    return out


def kernels_per_token(engine: Engine, prompts: list[list[int]], cfg: GenerationConfig) -> float:
    tokens = 0
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for ids in prompts:
            tokens += len(engine.generate(ids, cfg).tokens) - 1
        torch.cuda.synchronize()
    kernels = sum(e.count for e in prof.key_averages()
                  if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0)
    return (kernels - _prefill_kernels(engine, prompts, cfg)) / tokens


def _prefill_kernels(engine: Engine, prompts: list[list[int]], cfg: GenerationConfig) -> int:
    """Kernels of the same requests cut to one token: the prefill (and the request's setup) alone."""
    one = GenerationConfig(max_new_tokens=1, temperature=cfg.temperature, stop_token_ids=cfg.stop_token_ids)
    for ids in prompts:
        engine.generate(ids, one)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for ids in prompts:
            engine.generate(ids, one)
        torch.cuda.synchronize()
    return sum(e.count for e in prof.key_averages()
               if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0)


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--draft", default="demo-dspark")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    target = load_target("demo", device="cuda")
    draft = load_draft(args.draft, target.model)
    tok = AutoTokenizer.from_pretrained(target.path)
    rows = [r for r in load("qualitative", source="demo").rows if r.category == "coding"][: args.prompts]
    prompts = [chat_prompt_ids(tok, conversation([r.turns[0]])) for r in rows]
    cfg = GenerationConfig(max_new_tokens=args.tokens, temperature=0.0, stop_token_ids=target.stop_token_ids)
    engines = {"plain": Engine(target.model), "dspark": Engine(target.model, BlockDrafter(draft.model))}
    passes = timed_passes(engines, prompts, cfg, args.passes)
    speedups = [s["decode_tok_s"] / p["decode_tok_s"] for p, s in zip(passes["plain"], passes["dspark"])]
    print(json.dumps({"provenance": provenance("cuda"), "draft": args.draft, "prompts": len(prompts),
                      "max_new_tokens": args.tokens, "dtype": str(target.model.lm_head.weight.dtype),
                      "order": "alternated prompt by prompt, the order flipping each prompt",
                      "passes": passes, "speedup_per_pass": speedups,
                      "kernels_per_token": {name: kernels_per_token(e, prompts, cfg) for name, e in engines.items()}},
                     indent=2))


if __name__ == "__main__":
    main()

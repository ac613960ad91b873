"""The demo pair on one GPU: plain decoding against DSpark at T = 0, with the kernels each launches per
generated token (CUDA graphs on, as the engine runs by default).

Each system runs the held-out coding prompts through the chat template once to warm up (graphs captured),
then again timed; a third pass under the PyTorch profiler counts the kernels the decode loop launched
(graph replays included) per generated token, the prefill's left out.

    python benchmarks/demo_gpu.py [--prompts 8] [--tokens 128] [--draft demo-dspark]
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
from harness.specs.datasets import load


def run(engine: Engine, prompts: list[list[int]], cfg: GenerationConfig) -> dict:
    for ids in prompts:  # warm-up: graphs captured, caches allocated
        engine.generate(ids, cfg)
    tokens, decode_s, rounds = 0, 0.0, []
    for ids in prompts:
        out = engine.generate(ids, cfg)
        tokens += len(out.tokens) - 1  # the prefill's token is not decoded
        decode_s += out.decode_s
        rounds += out.acceptance_lengths
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for ids in prompts:
            engine.generate(ids, cfg)
        torch.cuda.synchronize()
    kernels = sum(e.count for e in prof.key_averages()
                  if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0)
    prefill_kernels = _prefill_kernels(engine, prompts, cfg)
    return {"decoded_tokens": tokens, "decode_tok_s": tokens / decode_s,
            "acceptance_length": sum(rounds) / len(rounds) if rounds else None,
            "kernels_per_token": (kernels - prefill_kernels) / tokens}


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
    ap.add_argument("--draft", default="demo-dspark")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    target = load_target("demo", device="cuda")
    draft = load_draft(args.draft, target.model)
    tok = AutoTokenizer.from_pretrained(target.path)
    rows = [r for r in load("qualitative", source="demo").rows if r.category == "coding"][: args.prompts]
    prompts = [chat_prompt_ids(tok, conversation([r.turns[0]])) for r in rows]
    cfg = GenerationConfig(max_new_tokens=args.tokens, temperature=0.0, stop_token_ids=target.stop_token_ids)
    plain = run(Engine(target.model), prompts, cfg)
    spec = run(Engine(target.model, BlockDrafter(draft.model)), prompts, cfg)
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "draft": args.draft,
                      "prompts": len(prompts), "max_new_tokens": args.tokens, "dtype": str(target.model.lm_head.weight.dtype),
                      "plain": plain, "dspark": spec, "speedup": spec["decode_tok_s"] / plain["decode_tok_s"]},
                     indent=2))


if __name__ == "__main__":
    main()

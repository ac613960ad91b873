"""Eager (no CUDA graphs) step times of the reference engine at real shapes, random weights.

The baseline the fast-engine work improves on. Builds a Qwen3-8B-shaped target and the
dspark_qwen3_8b_block7-shaped draft (5 layers, block 7, taps [1,9,17,25,33], Markov rank 256)
with normal(0, 0.02) weights, fills 1k tokens of context, then times with CUDA events (median of
repeats): a plain decode step, a verify step of 8 tokens, a draft step (4 new context rows + block
+ Markov sampling), and a whole speculative round. Usage:
    python benchmarks/eager_step.py [--context 1024] [--repeats 30] [--small]
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace

import torch

from dspark.config import BackboneConfig, DraftConfig, TargetConfig
from dspark.draft import DraftModel
from dspark.drafters import BlockDrafter
from dspark.engine import Engine, GenerationConfig
from dspark.sampling import Streams
from dspark.target import Qwen3Target

QWEN3_8B = BackboneConfig(hidden_size=4096, intermediate_size=12288, num_layers=36, num_heads=32, num_kv_heads=8,
                          head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6, vocab_size=151936)


def build(backbone: BackboneConfig, device: str, dtype: torch.dtype):
    tcfg = TargetConfig(backbone=backbone, tie_word_embeddings=False, max_position_embeddings=40960)
    taps = tuple(round(1 + i * (backbone.num_layers - 4) / 4) for i in range(5))
    dcfg = DraftConfig(format="deepspec", backbone=replace(backbone, num_layers=5), block_size=7,
                       target_layer_ids=taps, sample_from_anchor=True, mask_token_id=backbone.vocab_size - 1,
                       markov_rank=256, markov_head_type="vanilla", confidence_head=True,
                       confidence_head_with_markov=True)
    with torch.device("meta"):
        target, draft = Qwen3Target(tcfg), DraftModel(dcfg, with_embeddings=False)
    target = target.to_empty(device=device).to(dtype)
    draft = draft.to_empty(device=device).to(dtype)
    torch.manual_seed(0)
    target.init_random(0.02)
    draft.init_random(0.02)
    draft.share_embeddings(target.model.embed_tokens, target.lm_head)
    return target.eval().requires_grad_(False), draft.eval().requires_grad_(False)


def timed(fn, repeats: int) -> float:
    """Median milliseconds of `fn` over `repeats` runs, device-synchronised, after 3 warm-up runs."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--small", action="store_true", help="a 4-layer, hidden-512 model (a smoke run)")
    args = ap.parse_args()
    device, dtype = "cuda", torch.bfloat16
    backbone = replace(QWEN3_8B, num_layers=8, hidden_size=512, intermediate_size=1024, num_heads=8,
                       num_kv_heads=2, head_dim=64, vocab_size=4096) if args.small else QWEN3_8B
    target, draft = build(backbone, device, dtype)
    n = args.context
    cache = target.new_cache(n + 64)
    ids = torch.randint(0, 1000, (1, n), device=device)
    drafter = BlockDrafter(draft)
    _, feats = target(ids, torch.arange(n, device=device)[None], cache, n, drafter.taps)
    drafter.start(ids[0], feats, n + 64)
    streams = Streams.from_seed(0, device)
    anchor = torch.tensor([5], device=device)
    pos1 = torch.tensor([[n]], device=device)
    pos8 = torch.arange(n, n + 8, device=device)[None]

    def plain_step():
        h, _ = target(anchor[None], pos1, cache, n + 1)
        return target.logits(h[:, -1]).argmax(-1)

    def verify_step():
        h, f = target(ids[:, :8], pos8, cache, n + 8, drafter.taps)
        return target.logits(h)

    new_rows = feats[:, :4]

    def draft_step():
        drafter.commit(ids[0, n - 4 : n], new_rows, n - 4)  # 4 newly accepted rows, then the block
        return drafter.propose(anchor, n, 1.0, streams.draft)

    figures = {
        "shape": "small" if args.small else "qwen3-8b", "context": n, "dtype": str(dtype),
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "plain_step_ms": timed(plain_step, args.repeats),
        "verify8_ms": timed(verify_step, args.repeats),
        "draft_step_ms": timed(draft_step, args.repeats),
    }
    engine = Engine(target, drafter)
    prompt = ids[0, :n].tolist()
    cfg = GenerationConfig(max_new_tokens=65, temperature=1.0, seed=0)
    engine.generate(prompt, cfg)  # warm-up
    torch.cuda.synchronize()
    r = engine.generate(prompt, cfg)
    figures["round_ms"] = 1e3 * r.decode_s / r.num_rounds
    plain_engine = Engine(target)
    r0 = plain_engine.generate(prompt, GenerationConfig(max_new_tokens=65, temperature=1.0))
    figures["plain_engine_tok_s"] = 64 / r0.decode_s
    figures["weights_gb"] = sum(p.numel() * p.element_size() for p in target.parameters()) / 1e9
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()

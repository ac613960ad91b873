"""vLLM's top-k Markov projection (`dspark_draft_topk`, vLLM #49969) in our engine (issue 44): what it does to
acceptance, and what it saves in the draft step.

    python benchmarks/markov_topk.py acceptance [--topk 0 8 32 128 512] [--out FILE]   # the demo pair, CPU
    PYTHONPATH=$PWD python3 benchmarks/markov_topk.py timing [--topk 0 64 256] [--target qwen3-8b] [--out FILE]

`acceptance`: the demo DSpark draft over the demo suite's 18 coding prompts, 128 tokens, at T = 0 and T = 1,
once per k (0: the full head, DeepSpec's): acceptance length, accepted share, and whether every greedy output
equals plain decoding's (it must: verification is exact whatever the draft proposes). Real weights, real
acceptance. `timing`: random weights at a preset's shapes (bf16 on a GPU), the draft step and a whole round
for each k, alternated in passes (k0, k1, ..., k0, k1, ...), each the median of its pass medians with their
range; random weights time the engine and say nothing of any draft's quality.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dspark.checkpoint import load_draft, load_target  # noqa: E402
from dspark.drafters import BlockDrafter  # noqa: E402
from dspark.engine import Engine, GenerationConfig  # noqa: E402
from harness.runs.provenance import provenance  # noqa: E402
from harness.specs.datasets import load  # noqa: E402


def acceptance(topks: list[int], tokens: int) -> dict:
    import transformers

    target = load_target("demo")
    draft = load_draft("demo-dspark", target.model)
    tok = transformers.AutoTokenizer.from_pretrained(target.path)
    rows = [r for r in load("qualitative", source="demo").rows if r.category == "coding"]
    prompts = [tok.apply_chat_template([{"role": "user", "content": r.turns[0]}], add_generation_prompt=True,
                                       enable_thinking=False, tokenize=True, return_dict=False) for r in rows]
    out = {"prompts": len(prompts), "tokens": tokens, "by_topk": {}}
    with torch.inference_mode():
        greedy = GenerationConfig(max_new_tokens=tokens, temperature=0.0, stop_token_ids=target.stop_token_ids)
        plain = [Engine(target.model).generate(p, greedy).tokens for p in prompts]
        for k in topks:
            engine = Engine(target.model, BlockDrafter(draft.model, markov_topk=k))
            figures = {}
            for t in (0.0, 1.0):
                cfg = GenerationConfig(max_new_tokens=tokens, temperature=t, seed=0, stop_token_ids=target.stop_token_ids)
                runs = [engine.generate(p, cfg) for p in prompts]
                lengths = [n for r in runs for n in r.acceptance_lengths]
                accepted, proposed = sum(sum(r.accepted_counts) for r in runs), sum(sum(r.proposal_lengths) for r in runs)
                figures[f"T{t:g}"] = {"acceptance_length": sum(lengths) / len(lengths), "rounds": len(lengths),
                                      "accepted_share": accepted / proposed}
                if t == 0.0:
                    figures["greedy_equals_plain"] = [r.tokens for r in runs] == plain
            out["by_topk"][str(k)] = figures
            print(json.dumps({"topk": k} | figures), flush=True)
    return out


def timing(topks: list[int], target_name: str, context: int, passes: int, repeats: int) -> dict:
    from dspark.presets import DRAFTS, TARGETS, build_random
    from harness.microbench.step_timers import SpeculativeTimer

    draft_name = {"qwen3-8b": "dspark-qwen3-8b-block7"}.get(target_name, target_name)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.inference_mode():
        target, draft = build_random(TARGETS[target_name], DRAFTS[draft_name](), device, dtype)
        prompt = torch.randint(0, 1000, (context,), generator=torch.Generator().manual_seed(0)).tolist()
        timers = {k: SpeculativeTimer(target, draft, prompt, markov_topk=k) for k in topks}
        times = {k: {"draft_ms": [], "round_ms": []} for k in topks}
        for _ in range(passes):
            for k, timer in timers.items():
                for name, value in timer.measure(repeats).items():
                    times[k][name].append(value)
    return {"target": target_name, "draft": draft_name, "context": context, "dtype": str(dtype), "device": device,
            "weights": "random normal(0, 0.02)", "order": "k alternated within each pass",
            "by_topk": {str(k): {n: {"median": statistics.median(v), "range": [min(v), max(v)]} for n, v in f.items()}
                        for k, f in times.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["acceptance", "timing"])
    ap.add_argument("--topk", type=int, nargs="+")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--target", default="qwen3-8b")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.what == "acceptance":
        result = acceptance(args.topk or [0, 8, 32, 128, 512], args.tokens)
    else:
        result = timing(args.topk or [0, 64, 256], args.target, args.context, args.passes, args.repeats)
    result = {"provenance": provenance("cuda" if args.what == "timing" and torch.cuda.is_available() else "cpu"),
              "what": args.what} | result
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

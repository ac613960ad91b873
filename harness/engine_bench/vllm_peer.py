"""`engine-bench --against vllm`: our engine and vLLM on the same shapes, measured the same way, in one call.

Both engines get random weights of the same target config (ours normal(0, 0.02), vLLM's
`load_format="dummy"`) and, for DSpark, the same draft config (vLLM reads it from a DeepSpec-format
`config.json`, written as the installed version reads it). Each figure is one long request that
ignores the end-of-sequence token, timed on the host's clock around the whole call, minus a short
request of the same prompt: `(t(long) - t(short)) / (steps(long) - steps(short))` cancels prefill,
start-up and tail, and leaves the cost of a decode step (plain) or a speculative round (DSpark).
Rounds are counted by each engine (ours from its result, vLLM's from its own counters), so
whatever random weights accept is counted, and reported, never read as acceptance.

The two engines alternate (ours, vLLM, then vLLM, ours, ...) over the repeats, and every repeat is
kept: the figures are medians with their range, and the ratio's range is taken pair by pair.
vLLM's batch sizes (`concurrency`) are measured the same way with that many requests at once: the
step and round costs per level, the output rate beside the memory-bandwidth limit, and the speedup
a published acceptance length would give at each level (tokens per round over the round's cost
against the plain step's).
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from dspark.checkpoint import target_hf_config
from dspark.drafters import BlockDrafter
from dspark.engine import Engine, GenerationConfig, synchronize
from dspark.errors import DSparkError
from dspark.formats import deepspec
from dspark.models.config import DraftConfig, TargetConfig
from harness.backends.served.metrics import delta, engine_counters
from harness.backends.vllm.checks import installed_version, version_problem
from harness.backends.vllm.drafts import as_vllm_reads
from harness.backends.vllm.offline import (
    CPU_DEFAULTS,
    CPU_KV_GIB,
    engine_record,
    environment,
    in_one_line,
    logging_environment,
    v2_runner,
)

# published acceptance lengths of the official Qwen3-8B draft (../shared/docs/anchors.md §0), for the
# speedup each would give at a measured level; never our own acceptance (random weights accept nothing real)
PUBLISHED_AL = {"official draft, SPEED-Bench coding, vLLM, T = 1 (Dogacel/Qwen3-8B-DSpark card)": 3.41,
                "DSpark paper, Qwen3-8B macro over 9 sets, T = 1 (Table 1)": 4.81}


@dataclass
class PeerArgs:
    context_len: int
    tokens: tuple[int, int] = (16, 528)  # the short and the long request, in output tokens
    repeats: int = 3  # of each engine and system, alternated
    concurrency: tuple[int, ...] = ()  # vLLM's levels, each with that many requests at once
    level_tokens: tuple[int, int] = (16, 272)
    level_repeats: int = 2
    memory_fraction: float = 0.3  # of the GPU, per vLLM engine (two at once beside ours)


def write_models(tcfg: TargetConfig, dcfg: DraftConfig, version: str, dtype: torch.dtype,
                 out: Path) -> tuple[Path, Path, str | None]:
    """Config-only folders for vLLM's dummy loader: the target's and the draft's (as this vLLM reads
    it), with the note of what the draft's config gained for it."""
    target, draft = out / "target", out / "draft"
    target.mkdir(parents=True, exist_ok=True)
    draft.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(json.dumps(target_hf_config(tcfg, dtype), indent=2))
    cfg, note = as_vllm_reads(deepspec.hf_config(dcfg, tcfg.backbone.num_layers), version)
    (draft / "config.json").write_text(json.dumps(cfg | {"torch_dtype": str(dtype).removeprefix("torch.")}, indent=2))
    return target, draft, note


def _prompt(length: int, vocab: int, seed: int) -> list[int]:
    return torch.randint(0, min(1000, vocab), (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def time_ours(engine: Engine, prompt: list[int], new_tokens: int) -> dict:
    """One request through our engine: wall seconds, steps (rounds; decode steps for plain decoding),
    drafts proposed and accepted."""
    cfg = GenerationConfig(max_new_tokens=new_tokens, temperature=0.0)
    synchronize(engine.device)
    start = time.perf_counter()
    result = engine.generate(prompt, cfg)
    synchronize(engine.device)
    seconds = time.perf_counter() - start
    steps = len(result.acceptance_lengths) if engine.drafter else len(result.tokens) - 1
    return {"seconds": seconds, "steps": steps, "drafted": sum(result.proposal_lengths),
            "accepted": sum(result.accepted_counts)}


def time_vllm(llm, prompts: list[list[int]], new_tokens: int, spec: bool) -> dict:
    """`prompts` at once through vLLM: wall seconds, steps (from its counters for drafts: drafts over
    requests), drafts proposed and accepted."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True, detokenize=False)
    before = engine_counters(llm.get_metrics()) if spec else None
    start = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    produced = [len(o.outputs[0].token_ids) for o in outs]
    if min(produced) != new_tokens:
        raise DSparkError(f"vLLM produced {min(produced)} tokens where {new_tokens} were asked (ignore_eos set)")
    if not spec:
        return {"seconds": seconds, "steps": new_tokens - 1, "drafted": 0, "accepted": 0}
    grown = delta(before, engine_counters(llm.get_metrics())) or {}
    return {"seconds": seconds, "steps": (grown.get("num_spec_steps") or 0) / len(prompts),
            "drafted": grown.get("num_draft_tokens") or 0, "accepted": grown.get("num_accepted_draft_tokens") or 0}


def per_step_ms(short: dict, long: dict) -> float | None:
    """Milliseconds per step between the two requests (None where the long one took no more steps)."""
    steps = long["steps"] - short["steps"]
    return (long["seconds"] - short["seconds"]) / steps * 1e3 if steps > 0 else None


def start_vllm(model: Path, draft: Path | None, dcfg: DraftConfig, on_cpu: bool, dtype: torch.dtype,
               max_len: int, memory_fraction: float, log_dir: Path):
    """A vLLM engine on dummy weights (`draft`: DSpark with it, else plain decoding), and its record."""
    from vllm import LLM  # (present: `run_against_vllm` asked `installed_version` first)

    sc = None if draft is None else {"method": "dspark", "model": str(draft), "num_speculative_tokens": dcfg.num_drafts}
    args = (dict(CPU_DEFAULTS) if on_cpu else {"gpu_memory_utilization": memory_fraction}) | {
        "dtype": str(dtype).removeprefix("torch."), "load_format": "dummy", "skip_tokenizer_init": True,
        "max_model_len": max_len, "enable_prefix_caching": False, "seed": 0, "disable_log_stats": False}
    try:
        with environment(VLLM_USE_V2_MODEL_RUNNER=v2_runner(sc), VLLM_CPU_KVCACHE_SPACE=CPU_KV_GIB,
                         **logging_environment(log_dir)):
            llm = LLM(model=str(model), speculative_config=sc, **args)
    except Exception as exc:  # its own words, in one line
        raise DSparkError(f"vLLM could not start {'DSpark' if sc else 'plain decoding'} on dummy weights: "
                          f"{in_one_line(exc)}") from None
    return llm, engine_record(llm, sc, log_dir) | {"engine_args": args}


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


@dataclass
class Limit:
    """What bounds a decode step at batch size c: `weights + c * kv_per_token * context` bytes at `copy_tbps`."""
    copy_tbps: float
    weights: int
    kv_per_token: int


@torch.inference_mode()
def run_against_vllm(target, draft, tcfg: TargetConfig, dcfg: DraftConfig, args: PeerArgs, limit: Limit) -> dict:
    """Both engines' plain decode step and DSpark round at the shapes of `target` and `draft` (our
    random models, already built), alternated; vLLM's levels."""
    device, dtype = target.lm_head.weight.device, target.lm_head.weight.dtype
    log_dir = Path(tempfile.mkdtemp(prefix="dspark-engine-bench-vllm-"))
    with environment(**logging_environment(log_dir)):  # (vLLM logs as it is imported)
        version = installed_version()  # the one probe: one line naming the extra where vLLM is missing
    on_cpu = device.type == "cpu"
    if not on_cpu:  # what engine-bench's own engines left cached goes back, for vLLM's free-memory check
        gc.collect()
        torch.cuda.empty_cache()
    systems = ("plain",) if on_cpu else ("plain", "dspark")  # vLLM's DSpark needs its V2 runner's Triton kernels
    problem = version_problem(version, [s for s in systems if s != "plain"])
    if problem:
        raise DSparkError(f"engine-bench --against vllm: {problem}")
    model, draft_dir, note = write_models(tcfg, dcfg, version, dtype, log_dir / "models")
    short, long = args.tokens
    max_len = args.context_len + max(long, args.level_tokens[1]) + dcfg.block_size + 8
    ours = {"plain": Engine(target, None), "dspark": Engine(target, BlockDrafter(draft))}
    engines, records = {}, {}
    for system in systems:
        engines[system], records[system] = start_vllm(model, draft_dir if system == "dspark" else None, dcfg,
                                                      on_cpu, dtype, max_len, args.memory_fraction, log_dir)
    prompt = _prompt(args.context_len, tcfg.backbone.vocab_size, 0)
    for system in systems:  # warm-up, untimed: our graphs captured, vLLM's first requests served
        time_ours(ours[system], prompt, short)
        time_vllm(engines[system], [prompt], short, system == "dspark")
    samples = []
    for i in range(args.repeats):
        for system in systems:
            order = ("ours", "vllm") if i % 2 == 0 else ("vllm", "ours")
            for who in order:
                timed = [time_ours(ours[system], prompt, n) if who == "ours" else
                         time_vllm(engines[system], [prompt], n, system == "dspark") for n in (short, long)]
                samples.append({"engine": who, "system": system, "repeat": i, "short": timed[0], "long": timed[1],
                                "ms": per_step_ms(*timed), "load_avg": os.getloadavg()[0]})
    out = {"vllm_version": version, "engines": records, "draft_config": note or "as written",
           "log_dir": str(log_dir), "tokens": list(args.tokens), "context_len": args.context_len,
           "weights": "ours random normal(0, 0.02); vLLM load_format=dummy", "samples": samples,
           "figures": figures(samples, systems)}
    if args.concurrency:
        out["levels"] = levels(engines, systems, tcfg, args, limit)
    for llm in engines.values():
        llm.llm_engine.engine_core.shutdown()
    return out


def figures(samples: list[dict], systems: tuple[str, ...]) -> dict:
    """Per engine and system the median step with its range, drafts accepted by random weights, and
    ours over vLLM's (the medians' ratio, and its range pair by pair, repeat by repeat)."""
    out = {}
    for system in systems:
        mine = [s for s in samples if s["system"] == system and s["ms"] is not None]
        rows = {who: [s for s in mine if s["engine"] == who and s["ms"] > 0] for who in ("ours", "vllm")}
        if not rows["ours"] or not rows["vllm"]:
            continue
        fig = {who: spread([s["ms"] for s in rs]) | {
            "accepted": sum(s["long"]["accepted"] for s in rs), "drafted": sum(s["long"]["drafted"] for s in rs)}
            for who, rs in rows.items()}
        vllm_by_repeat = {b["repeat"]: b["ms"] for b in rows["vllm"]}  # pairs of one repeat (one may be left out)
        pairs = [a["ms"] / vllm_by_repeat[a["repeat"]] for a in rows["ours"] if a["repeat"] in vllm_by_repeat]
        fig["ours_over_vllm"] = fig["ours"]["median"] / fig["vllm"]["median"]
        fig["ours_over_vllm_range"] = [min(pairs), max(pairs)] if pairs else None
        # a long request no slower than its short one measured noise, not a step: left out, and counted
        fig["samples_swamped_by_noise"] = sum(s["ms"] <= 0 for s in mine)
        out[system] = fig
    if "plain" in out and "dspark" in out:
        for who in ("ours", "vllm"):
            out["dspark"][who]["round_over_decode"] = out["dspark"][who]["median"] / out["plain"][who]["median"]
    return out


def levels(engines: dict, systems: tuple[str, ...], tcfg: TargetConfig, args: PeerArgs, limit: Limit) -> list[dict]:
    """vLLM at each level of `args.concurrency`: the plain step and the DSpark round (medians over
    `level_repeats`, alternated), output rate beside the bandwidth limit, and the speedup each
    published acceptance length would give there."""
    short, long = args.level_tokens
    rows = []
    for c in args.concurrency:
        prompts = [_prompt(args.context_len, tcfg.backbone.vocab_size, 1 + j) for j in range(c)]
        ms = {s: [] for s in systems}
        swamped = {s: 0 for s in systems}  # pairs whose long request was no slower than the short: noise, not a step
        accepted = {s: [0, 0] for s in systems}
        for i in range(args.level_repeats):
            for system in systems if i % 2 == 0 else systems[::-1]:
                timed = [time_vllm(engines[system], prompts, n, system == "dspark") for n in (short, long)]
                step_ms = per_step_ms(*timed)
                if step_ms is not None and step_ms > 0:
                    ms[system].append(step_ms)
                elif step_ms is not None:
                    swamped[system] += 1
                accepted[system][0] += timed[1]["accepted"]
                accepted[system][1] += timed[1]["drafted"]
        context = args.context_len + (short + long) / 2  # the mean context of the steps timed
        bound = c * limit.copy_tbps * 1e12 / (limit.weights + c * limit.kv_per_token * context)
        row = {"concurrency": c, "tokens": [short, long], "mean_context": context, "limit_tok_s": bound,
               "pairs_swamped_by_noise": swamped}
        if ms["plain"]:
            step = statistics.median(ms["plain"])
            row |= {"plain_ms": spread(ms["plain"]), "plain_tok_s": c * 1e3 / step,
                    "plain_fraction_of_limit": c * 1e3 / step / bound}
        if ms.get("dspark"):
            rnd = statistics.median(ms["dspark"])
            row |= {"dspark_round_ms": spread(ms["dspark"]),
                    "dspark_accepted_of_drafted": accepted["dspark"]}
            if ms["plain"]:
                row["round_over_decode"] = rnd / step
                row["speedup_at_published_al"] = {name: al * step / rnd for name, al in PUBLISHED_AL.items()}
        rows.append(row)
    return rows


def peer_tables(peer: dict) -> list[tuple[str, list[list[str]]]]:
    """The tables `engine-bench` prints for `--against vllm`: (title, header row + rows)."""
    modes = ", ".join(f"{s}: {r['model_runner']} runner, {r['compilation_mode']}, graphs {r['cudagraph_mode']}, "
                      f"{r['attention_backend']}" for s, r in peer["engines"].items())
    rows = [["system", "ours ms", "vLLM ms", "ours/vLLM", "pairwise range", "round/decode ours", "round/decode vLLM",
             "accepted (random weights) ours, vLLM"]]
    for system, fig in peer["figures"].items():
        rows.append([system, _ms(fig["ours"]), _ms(fig["vllm"]), f"{fig['ours_over_vllm']:.3f}",
                     "{:.3f}-{:.3f}".format(*fig["ours_over_vllm_range"]) if fig["ours_over_vllm_range"] else "-",
                     _x(fig["ours"].get("round_over_decode")), _x(fig["vllm"].get("round_over_decode")),
                     f"{fig['ours']['accepted']}/{fig['ours']['drafted']}, {fig['vllm']['accepted']}/{fig['vllm']['drafted']}"])
    out = [(f"ours against vLLM {peer['vllm_version']} (ms per step or round: median (min to max) of alternated "
            f"repeats; {modes})", rows)]
    if peer.get("levels"):
        names = list(PUBLISHED_AL)
        lv = [["requests", "plain ms", "tok/s", "of limit", "DSpark round ms", "round/decode",
               *[f"speedup at AL {PUBLISHED_AL[n]}" for n in names]]]
        for r in peer["levels"]:
            speed = r.get("speedup_at_published_al") or {}
            lv.append([str(r["concurrency"]), _ms(r.get("plain_ms")), f"{r.get('plain_tok_s', float('nan')):.0f}",
                       f"{r.get('plain_fraction_of_limit', float('nan')):.1%}", _ms(r.get("dspark_round_ms")),
                       _x(r.get("round_over_decode")), *[_x(speed.get(n)) for n in names]])
        out.append((f"vLLM {peer['vllm_version']} by batch size (dummy weights; the speedups are what the published "
                    "acceptance lengths would give at these costs, not measured acceptance)", lv))
    return out


def _ms(fig: dict | None) -> str:
    return "-" if not fig else f"{fig['median']:.3f} ({fig['min']:.3f} to {fig['max']:.3f})"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"

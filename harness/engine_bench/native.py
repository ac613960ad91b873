"""`dspark-bench engine-bench`: step costs of the native engine at real shapes against the bandwidth limit.

At batch size 1 a decode step must read every weight once (all but the input embedding table, of
which it gathers one row) plus the KV cache, so copy bandwidth / step bytes bounds tokens per second.
Everything is timed after warm-up, in alternated passes (`step_timers`: each figure the median of its
passes' medians, their range beside it): on a GPU with CUDA events (the steps replayed from their graphs),
on a CPU with the wall clock (the steps run eagerly, as a CPU run does, or compiled with `--compile`),
each against its own copy bandwidth (device-to-device on a GPU, memory-to-memory on a CPU). A model
as small as the demo pair may sit in the CPU's caches, so its decode step can beat the memory limit.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from dspark.checkpoint import DEMO_DIR, DEMO_MODELS, RANDOM_INIT, pick_dtype, read_config
from dspark.drafters import DraftModelDrafter
from dspark.engine import synchronize
from dspark.errors import DSparkError
from dspark.models.config import AnyDraftConfig, DraftConfig, TargetConfig, draft_config_from_hf, draft_kind
from dspark.synthetic.presets import DRAFTS, TARGETS, build_random, random_draft_for
from harness.backends.timing import copy_bandwidth_tbps, cpu_name
from harness.engine_bench.step_timers import NEW_TOKENS, SpeculativeTimer, device_of, graph_and_nvtx_costs, step_figures


@dataclass
class BenchArgs:
    target: str = "qwen3-8b"
    draft: str = "dspark-qwen3-8b-block7"
    context_len: int = 1024
    dtype: str = "bfloat16"
    repeats: int = 50
    copy_gib: float = 4.0
    hf_new_tokens: int = 32
    skip_hf: bool = False
    sweep_context: tuple[int, ...] = ()  # more context lengths: decode, verify, draft and round at each
    device: str = "cuda"
    eagle3: str | None = None  # an EAGLE-3 draft timed beside the block draft, on the same target and context
    draft_model: str | None = None  # a draft model (draft_model) timed beside the block draft, likewise
    draft_model_tokens: int = 3  # its tokens a round
    against: str | None = None  # "vllm": vLLM beside our engine on the same shapes (vllm_peer)
    concurrency: tuple[int, ...] = ()  # vLLM's batch sizes, with --against vllm
    peer_repeats: int = 3
    compile: bool = False  # a CPU's steps compiled (torch.compile), as `run --compile` runs them


# the defaults where the bench runs: the published pair on a GPU, the demo pair (the one a CPU run uses) on a CPU
GPU_DEFAULTS = {"target": "qwen3-8b", "draft": "dspark-qwen3-8b-block7", "eagle3": "eagle3-qwen3-8b",
                "context_len": 1024, "repeats": 50, "copy_gib": 4.0}
CPU_DEFAULTS = {"target": "demo", "draft": "demo-dspark", "context_len": 128, "repeats": 50, "copy_gib": 0.25}


def model_folder(name: str) -> Path:
    """A demo model's folder by its short name (demo, demo-dspark, demo-dflash), else the path given."""
    path = DEMO_DIR / DEMO_MODELS[name] if name in DEMO_MODELS else Path(name)
    return path.parent if path.is_file() else path


def _target_config(name: str) -> TargetConfig:
    if name in TARGETS:
        return TARGETS[name]
    path = model_folder(name)
    if path.is_dir():
        return TargetConfig.from_hf(read_config(path), str(name))
    if len(Path(name).parts) > 1 or Path(name).suffix == ".json":  # a path, not a preset's name
        raise DSparkError(f"--target {name}: no such folder or config.json; give a model folder, a config.json or "
                          f"one of {', '.join(TARGETS)}, demo")
    raise DSparkError(f"unknown target preset '{name}'; use one of {', '.join(TARGETS)}, demo or a config.json")


def _draft_config(name: str, target: TargetConfig, option: str = "--draft") -> AnyDraftConfig:
    if name in DRAFTS:
        cfg = DRAFTS[name]()
    else:
        path = model_folder(name)
        if not path.is_dir() and (len(Path(name).parts) > 1 or Path(name).suffix == ".json"):  # a path, not a name
            raise DSparkError(f"{option} {name}: no such folder or config.json; give a draft's folder or config.json, "
                              f"or one of {', '.join(DRAFTS)}, demo-dspark, demo-dflash, demo-eagle3")
        if not path.is_dir():
            raise DSparkError(f"{option} {name}: unknown draft preset; use one of {', '.join(DRAFTS)}, a demo draft "
                              f"({', '.join(k for k in DEMO_MODELS if k != 'demo')}) or a config.json")
        cfg = draft_config_from_hf(read_config(path), str(name))
    if (option == "--eagle3") != (cfg.method == "eagle3"):
        raise DSparkError(f"{option} {name}: a {cfg.method} draft; --draft takes a block draft (DSpark, DFlash), "
                          "--eagle3 an EAGLE-3 one")
    cfg.check_target(target, f"draft {name}")
    return cfg


def bench_configs(args: BenchArgs, defaulted: tuple[str, ...] = ()) -> tuple[TargetConfig, AnyDraftConfig]:
    """The target's and the block draft's configs, checked before any model is built: every context length
    fits the target with the tokens each timed engine generates (`NEW_TOKENS`; the engine's own refusal, met
    after building, named `--max-new-tokens`, an option engine-bench lacks), and each draft fits the target.
    `defaulted`: the drafts ("draft", "eagle3") the device's defaults chose, not the user: one that does not fit
    is named as the default, with a preset that fits (a CPU's demo-dspark against qwen3-8b was "the draft was
    trained for another target", where no draft had been given)."""
    tcfg = _target_config(args.target)
    most = tcfg.max_position_embeddings - NEW_TOKENS
    for option, n in [("--context-len", args.context_len)] + [("--sweep-context", n) for n in args.sweep_context]:
        if n > most:
            raise DSparkError(f"{option} {n}: past the target's context, {tcfg.max_position_embeddings} positions "
                              f"(max_position_embeddings of {args.target}) less the {NEW_TOKENS} tokens each timed "
                              f"engine generates; give at most {most}")
    chosen = [("--draft", args.draft, "draft" in defaulted)]
    if args.eagle3:
        chosen.append(("--eagle3", args.eagle3, "eagle3" in defaulted))
    found = []
    for option, name, by_default in chosen:
        try:
            found.append(_draft_config(name, tcfg, option))
        except DSparkError as exc:
            if not by_default:
                raise
            fit = next((n for n, make in DRAFTS.items() if _fits(make(), tcfg, option)), None)
            where = "a GPU" if args.device.startswith("cuda") else "a CPU"
            instead = f"{option} {fit}" if fit else f"{option} a draft of this target (its folder or config.json)"
            raise DSparkError(f"--target {args.target}: no {option} given, and its default on {where}, {name}, does "
                              f"not fit it ({str(exc).removeprefix(f'draft {name}: ')}); give {instead}") from None
    if args.draft_model:
        draft_model_config(args.draft_model, tcfg)
    return tcfg, found[0]


def draft_model_config(name: str, target: TargetConfig) -> TargetConfig:
    """A draft model's shape (`--draft-model`): a target preset (qwen3-0.6b) or a Qwen3 folder or config.json, of
    the target's vocabulary (its ids are verified as the target's)."""
    cfg = TARGETS[name] if name in TARGETS else None
    if cfg is None:
        path = model_folder(name)
        if not path.is_dir():
            raise DSparkError(f"--draft-model {name}: no such preset or folder; give one of {', '.join(TARGETS)}, "
                              "demo-draft-model, or a Qwen3 model's folder or config.json")
        hf = read_config(path)
        kind = draft_kind(hf)
        if kind is not None:  # (a DFlash config is a flat Qwen3 one: it was timed as a draft model of its shape)
            option = "--eagle3" if kind.startswith("eagle3") else "--draft"
            raise DSparkError(f"--draft-model {name} is a {kind}, not a draft model; give it as {option}, and as "
                              "--draft-model a Qwen3 model of the target's tokenizer")
        cfg = TargetConfig.from_hf(hf, f"--draft-model {name}")
    theirs, ours = cfg.backbone.vocab_size, target.backbone.vocab_size
    if theirs != ours:
        raise DSparkError(f"--draft-model {name} scores {theirs} tokens and the target {ours}: a draft model must have "
                          "the target's vocabulary; give a smaller model of its family (qwen3-0.6b for qwen3-8b)")
    return cfg


def _fits(cfg: AnyDraftConfig, target: TargetConfig, option: str) -> bool:
    """Whether a draft preset's config can stand as `option` for `target`."""
    if (option == "--eagle3") != (cfg.method == "eagle3"):
        return False
    try:
        cfg.check_target(target, "preset")
    except DSparkError:
        return False
    return True


def step_bytes(target: torch.nn.Module, context_len: int) -> int:
    """Bytes one decode step must read: every weight but the embedding table (one row of it), plus KV."""
    b = target.config.backbone
    embed = target.model.embed_tokens.weight
    weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in target.parameters()}.values())
    if embed.data_ptr() != target.lm_head.weight.data_ptr():  # an untied table is only gathered from
        weights -= embed.numel() * embed.element_size() - embed.shape[1] * embed.element_size()
    kv = 2 * b.num_layers * b.num_kv_heads * b.head_dim * context_len * embed.element_size()
    return weights + kv


def draft_step_bytes(target: torch.nn.Module, draft: torch.nn.Module) -> int:
    """Bytes one draft step must read: every draft weight, and the target's output head it projects
    through (the draft's few new context rows and its KV are small beside them)."""
    params = {id(p): p for p in draft.parameters()}
    params.setdefault(id(target.lm_head.weight), target.lm_head.weight)
    return sum(p.numel() * p.element_size() for p in params.values())


def shapes(tcfg: TargetConfig, dcfg: DraftConfig, args: BenchArgs, dtype: torch.dtype) -> dict:
    """The shapes timed, for the record: the target's and draft's dimensions, the context and dtype."""
    def dims(b) -> dict:
        return {"hidden_size": b.hidden_size, "intermediate_size": b.intermediate_size, "num_layers": b.num_layers,
                "num_heads": b.num_heads, "num_kv_heads": b.num_kv_heads, "head_dim": b.head_dim,
                "vocab_size": b.vocab_size}

    return {"target": {"name": args.target, **dims(tcfg.backbone)},
            "draft": {"name": args.draft, **dims(dcfg.backbone), "block_size": dcfg.block_size,
                      "num_drafts": dcfg.num_drafts, "markov_rank": dcfg.markov_rank,
                      "target_layer_ids": list(dcfg.target_layer_ids)},
            "context_len": args.context_len, "dtype": str(dtype).replace("torch.", ""), "weights": "random normal(0, 0.02)"}


def device_record(device: torch.device, copy_gib: float) -> dict:
    """Where the figures come from: the device's kind and name, how steps were timed, what the limit is."""
    if device.type == "cuda":
        return {"device": "cuda", "is_cpu": False, "device_name": torch.cuda.get_device_name(device),
                "timer": "CUDA events, steps replayed from their graphs",
                "limit_from": f"device-to-device copy of {copy_gib:g} GiB"}
    return {"device": "cpu", "is_cpu": True, "device_name": cpu_name(),
            "timer": "wall clock, steps run eagerly (no graphs on a CPU)",
            "limit_from": f"memory-to-memory copy of {copy_gib:g} GiB on {torch.get_num_threads()} thread(s)"}


@torch.inference_mode()
def run_engine_bench(args: BenchArgs) -> dict:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DSparkError("--device cuda: no CUDA device is visible; use --device cpu (the demo pair's shapes)")
    dtype = pick_dtype(args.dtype, device)
    tcfg, dcfg = bench_configs(args)
    target, draft = build_random(tcfg, dcfg, str(device), dtype)
    ctx, reps = args.context_len, args.repeats
    high = min(1000, tcfg.backbone.vocab_size)
    prompt = torch.randint(0, high, (ctx,), generator=torch.Generator().manual_seed(0)).tolist()
    out: dict = device_record(device, args.copy_gib) | {"shapes": shapes(tcfg, dcfg, args, dtype)}
    out["copy_tbps"] = copy_bandwidth_tbps(args.copy_gib, reps, device)
    out["step_bytes"] = step_bytes(target, ctx)
    out["limit_tok_s"] = out["copy_tbps"] * 1e12 / out["step_bytes"]
    figures, timer = step_figures(target, draft, dcfg.target_layer_ids, prompt, reps, args.compile)
    out |= figures
    if device.type == "cuda":
        out |= graph_and_nvtx_costs(target, prompt, reps)
    out["decode_tok_s"] = 1e3 / out["decode_ms"]
    out["decode_fraction_of_limit"] = out["decode_tok_s"] / out["limit_tok_s"]
    out["verify8_over_decode"] = out["verify8_ms"] / out["decode_ms"]
    if getattr(draft, "confidence_head", None) is not None:  # the prefix scheduler's cost table at these shapes
        from harness.backends.round_costs import round_costs

        out["round_by_verified_ms"] = round_costs(timer.engine, timer.cfg, reps)
    out["draft_over_decode"] = out["draft_ms"] / out["decode_ms"]
    out["round_over_decode"] = out["round_ms"] / out["decode_ms"]
    out["draft_step_bytes"] = draft_step_bytes(target, draft)
    out["draft_floor_ms"] = out["draft_step_bytes"] / (out["copy_tbps"] * 1e12) * 1e3
    out["draft_fraction_of_floor"] = out["draft_floor_ms"] / out["draft_ms"]
    if args.eagle3:
        out["eagle3"] = measure_eagle3(target, draft, args.eagle3, tcfg, prompt, reps, out, args.compile)
    if args.draft_model:
        out["draft_model"] = measure_draft_model(target, draft, args, prompt, out)
    if args.sweep_context:
        out["sweep"] = [measure_context(target, draft, dcfg, n, reps, out["copy_tbps"], high, args.compile)
                        for n in args.sweep_context]
    if not args.skip_hf:
        out["hf_generate_tok_s"] = hf_generate_tok_s(target, prompt, args.hf_new_tokens)
    if args.against == "vllm":
        from harness.engine_bench.vllm_peer import Limit, PeerArgs, run_against_vllm

        weights = step_bytes(target, 0)
        limit = Limit(out["copy_tbps"], weights, step_bytes(target, 1) - weights)
        peer = PeerArgs(ctx, repeats=args.peer_repeats, concurrency=args.concurrency)
        if device.type == "cpu":  # the demo's shapes: short requests (the CPU is slow, the demo's context small)
            peer.tokens, peer.level_tokens = (8, 40), (8, 24)
        out["against_vllm"] = run_against_vllm(target, draft, tcfg, dcfg, peer, limit)
    return out


def measure_eagle3(target, block_draft, name: str, tcfg: TargetConfig, prompt: list[int], reps: int,
                   out: dict, compile: bool = False) -> dict:
    """An EAGLE-3 draft (random weights) on the same target and context as the block draft: its propose
    step (four newly committed rows, then the chain) and a whole round, timed alternately with the
    block draft's (block, EAGLE-3, block, EAGLE-3, half the repeats each), against the plain decode
    step; its propose step against its floor (`eagle3_step_bytes`)."""
    cfg = _draft_config(name, tcfg, "--eagle3")
    timer = SpeculativeTimer(target, random_draft_for(target, cfg), prompt, compile)
    floor_bytes = eagle3_step_bytes(timer.engine.drafter.model, cfg.num_drafts)
    return {"name": name, "num_tokens": cfg.num_drafts, "draft_vocab_size": cfg.vocab_size,
            "target_layer_ids": list(cfg.target_layer_ids), "qk_norm": cfg.qk_norm,
            **beside_block("eagle3", timer, target, block_draft, prompt, reps, out, floor_bytes, compile)}


def measure_draft_model(target, block_draft, args: BenchArgs, prompt: list[int], out: dict) -> dict:
    """A draft model (`--draft-model`, random weights at its shape, e.g. Qwen3-0.6B's at Qwen3-8B's) as EAGLE-3 is
    timed: its propose step (the catch-up and anchor rows, then one row a forward) and a whole round, alternated
    with the block draft's; its floor is k of its own decode steps at the context (`step_bytes`)."""
    cfg = draft_model_config(args.draft_model, target.config)
    weight, k = target.lm_head.weight, args.draft_model_tokens
    model = build_random(cfg, None, str(weight.device), weight.dtype, seed=RANDOM_INIT["draft_seed"])[0]
    timer = SpeculativeTimer(target, None, prompt, args.compile, drafter=DraftModelDrafter(model, k))
    b = cfg.backbone
    return {"name": args.draft_model, "num_tokens": k, "hidden_size": b.hidden_size, "num_layers": b.num_layers,
            **beside_block("draft_model", timer, target, block_draft, prompt, args.repeats, out,
                           k * step_bytes(model, len(prompt)), args.compile)}


def beside_block(who: str, timer: SpeculativeTimer, target, block_draft, prompt: list[int], reps: int, out: dict,
                 floor_bytes: int, compile: bool = False) -> dict:
    """Another drafter's propose step and round timed alternately with the block draft's (block, it, block, it,
    half the repeats each), against the plain decode step, and its propose step against its floor."""
    timers = {"block": SpeculativeTimer(target, block_draft, prompt, compile), who: timer}
    passes = [(name, t.measure(max(3, reps // 2))) for _ in range(2) for name, t in timers.items()]
    figures = {name: {k: statistics.median(p[k] for w, p in passes if w == name) for k in ("draft_ms", "round_ms")}
               for name in timers}
    e, b = figures[who], figures["block"]
    return {**e, "block_draft_ms": b["draft_ms"], "block_round_ms": b["round_ms"], "passes": passes,
            "order": f"block, {who}, block, {who}",
            "draft_over_decode": e["draft_ms"] / out["decode_ms"], "round_over_decode": e["round_ms"] / out["decode_ms"],
            "round_over_block_round": e["round_ms"] / b["round_ms"], "draft_step_bytes": floor_bytes,
            "draft_fraction_of_floor": floor_bytes / (out["copy_tbps"] * 1e12) * 1e3 / e["draft_ms"]}


def eagle3_step_bytes(draft: torch.nn.Module, num_tokens: int) -> int:
    """Bytes an EAGLE-3 propose step must read: `fc` once, and per chained token the layer, the final
    norm and the head (the embedding rows it gathers are small beside them)."""
    def size(module: torch.nn.Module) -> int:
        return sum(p.numel() * p.element_size() for p in module.parameters())

    return size(draft.fc) + num_tokens * (size(draft.midlayer) + size(draft.norm) + size(draft.lm_head))


def measure_context(target, draft, dcfg: DraftConfig, context_len: int, reps: int, copy_tbps: float,
                    high: int, compile: bool = False) -> dict:
    """A sweep row: the decode step (graph replay), verify of 8, the draft step and a whole round at one
    context length (alternated, `step_figures`), each against its floor or the decode step."""
    prompt = torch.randint(0, high, (context_len,), generator=torch.Generator().manual_seed(0)).tolist()
    spec, _ = step_figures(target, draft, dcfg.target_layer_ids, prompt, reps, compile)
    row = {"context_len": context_len, "step_bytes": step_bytes(target, context_len), "decode_ms": spec["decode_ms"]}
    row["decode_fraction_of_limit"] = (1e3 / row["decode_ms"]) / (copy_tbps * 1e12 / row["step_bytes"])
    row["verify8_over_decode"] = spec["verify8_ms"] / row["decode_ms"]
    row["draft_over_decode"] = spec["draft_ms"] / row["decode_ms"]
    row["round_over_decode"] = spec["round_ms"] / row["decode_ms"]
    row["draft_fraction_of_floor"] = draft_step_bytes(target, draft) / (copy_tbps * 1e12) * 1e3 / spec["draft_ms"]
    return row


def hf_generate_tok_s(target, prompt: list[int], new_tokens: int) -> float | None:
    """The same random weights through transformers' own `generate` (greedy, fixed length): the peer."""
    try:
        import transformers
    except ImportError:
        return None
    b = target.config.backbone
    hf_cfg = transformers.Qwen3Config(**{k: v for k, v in b.hf_fields().items() if k not in ("model_type",)},
                                      tie_word_embeddings=target.config.tie_word_embeddings,
                                      max_position_embeddings=target.config.max_position_embeddings)
    with torch.device("meta"):
        hf = transformers.Qwen3ForCausalLM(hf_cfg)
    # our tensors, shared where transformers would lay them out alike (a CPU's products are column-major in our
    # engine: `dspark.models.layers.device_layout`; the peer gets them row-major, as transformers loads them)
    hf.load_state_dict({k: v.contiguous() for k, v in target.state_dict().items()}, assign=True, strict=False)
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    device = device_of(target)
    with device:
        hf.model.rotary_emb = Qwen3RotaryEmbedding(hf_cfg)  # a buffer no state dict carries
    hf = hf.eval()
    ids = torch.tensor([prompt], device=device)
    gen = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    hf.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)  # warm-up
    synchronize(device)
    t = time.perf_counter()
    hf.generate(ids, **gen)
    synchronize(device)
    return new_tokens / (time.perf_counter() - t)


def table_rows(out: dict) -> list[tuple[str, str]]:
    fmt = {"copy_tbps": "{:.3g} TB/s", "step_bytes": "{:,} B", "limit_tok_s": "{:.1f} tok/s", "decode_ms": "{:.3f} ms",
           "decode_tok_s": "{:.1f} tok/s", "decode_fraction_of_limit": "{:.1%}", "graphs_off_decode_ms": "{:.3f} ms",
           "verify8_ms": "{:.3f} ms", "verify16_ms": "{:.3f} ms", "verify8_over_decode": "{:.2f}x",
           "draft_ms": "{:.3f} ms", "draft_over_decode": "{:.2f}x", "round_ms": "{:.3f} ms",
           "round_over_decode": "{:.2f}x", "draft_step_bytes": "{:,} B", "draft_floor_ms": "{:.3f} ms",
           "draft_fraction_of_floor": "{:.1%}", "hf_generate_tok_s": "{:.1f} tok/s", "nvtx_overhead_pct": "{:+.2f} %"}
    ranges = out.get("ranges_ms") or {}

    def text(k: str) -> str:  # a timed figure: its passes' range beside the median
        lo_hi = ranges.get(k)
        return fmt[k].format(out[k]) + (f" ({lo_hi[0]:.3f}-{lo_hi[1]:.3f} over passes)" if lo_hi else "")

    return [(k, text(k)) for k in fmt if out.get(k) is not None]


SWEEP = [("context", "context_len", "{:,}"), ("decode ms", "decode_ms", "{:.3f}"),
         ("of limit", "decode_fraction_of_limit", "{:.1%}"), ("verify 8", "verify8_over_decode", "{:.2f}x"),
         ("draft", "draft_over_decode", "{:.2f}x"), ("round", "round_over_decode", "{:.2f}x"),
         ("draft of floor", "draft_fraction_of_floor", "{:.1%}")]


def sweep_rows(out: dict) -> list[list[str]]:
    """The context sweep's table: one row per context length (SWEEP's columns)."""
    return [[fmt.format(row[key]) for _, key, fmt in SWEEP] for row in out.get("sweep") or []]


EAGLE3_ROWS = [("draft step", "draft_ms", "{:.3f} ms"), ("draft step / decode", "draft_over_decode", "{:.2f}x"),
               ("round", "round_ms", "{:.3f} ms"), ("round / decode", "round_over_decode", "{:.2f}x"),
               ("round / block draft's round", "round_over_block_round", "{:.2f}x"),
               ("block draft's round (same passes)", "block_round_ms", "{:.3f} ms"),
               ("draft step of its floor", "draft_fraction_of_floor", "{:.1%}")]


def eagle3_rows(out: dict, key: str = "eagle3") -> list[tuple[str, str]]:
    """The EAGLE-3 draft's figures (`measure_eagle3`), or under `key` = "draft_model" the draft model's
    (`measure_draft_model`: the same figures), for the table; none when it was not timed."""
    e = out.get(key)
    return [(label, fmt.format(e[key])) for label, key, fmt in EAGLE3_ROWS] if e else []


def dumps(out: dict) -> str:
    return json.dumps(out, indent=2, default=str)

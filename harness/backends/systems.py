"""A system of an experiment against what its draft really is: one validator (used by the dry run,
from configs alone, and by the native backend once the draft is loaded) and one drafter factory (used
by the backend and by `generate`)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dspark.checkpoint import (
    check_draft,
    check_tensors,
    load_draft,
    load_draft_config,
    load_target,
    random_weights,
    read_config,
    resolve_path,
    shapes,
    weight_shapes,
)
from dspark.drafters import Drafter, DraftModelDrafter, NgramDrafter, drafter_for
from dspark.errors import DSparkError
from dspark.models.config import AnyDraftConfig, TargetConfig, draft_kind
from dspark.models.target import Qwen3Target
from harness.specs.experiments import METHODS, System

NGRAM_TOKENS = 7  # an n-gram proposal's length when the experiment does not set one
# what makes two tokenizers one: tokenizer.json's vocabulary, merges and added tokens (its other fields, the
# normaliser or decoder, come with them), else the slow tokenizer's vocab.json and merges.txt
TOKENIZER_PARTS = ("tokenizer.json", "vocab.json", "merges.txt")


def check_system(system: System, cfg: AnyDraftConfig) -> str | None:
    """Why `cfg` (the draft's own config) does not run as `system` says, or None. A block draft proposes
    its block; an EAGLE-3 chain is as long as the system asks."""
    if cfg.method != system.method:
        return f"{system.draft} is a {cfg.method} draft, but the experiment says {system.method}; fix its method"
    if cfg.method != "eagle3" and system.num_speculative_tokens not in (None, cfg.num_drafts):
        return (f"{system.draft} proposes {cfg.num_drafts} tokens per round, but the experiment says "
                f"{system.num_speculative_tokens}; fix num_speculative_tokens")
    if system.markov_topk is not None and cfg.markov_head_type != "vanilla":  # (vLLM's dspark has only that head)
        return (f"markov_topk = {system.markov_topk}: {system.draft}'s Markov head is {cfg.markov_head_type}, and "
                "the top-k restriction is for the vanilla head (ours and vLLM's); drop markov_topk")
    if system.markov_topk is not None and system.markov_topk > cfg.vocab_size:  # (vLLM's bound)
        return (f"markov_topk = {system.markov_topk} is more than {system.draft}'s draft vocabulary "
                f"({cfg.vocab_size} tokens); give 1 to {cfg.vocab_size}, or drop it for the whole vocabulary")
    return None


def model_tensors_problem(path: Path, cfg: TargetConfig, where: str) -> str | None:
    """Why the weights of the model folder at `path` do not match its config `cfg`, or None, from the safetensors
    headers alone (no weights read), as `load_target` checks them once read; a `random:` folder has none."""
    if random_weights(path):
        return None
    with torch.device("meta"):
        model = Qwen3Target(cfg)
    try:
        check_tensors(shapes(model), weight_shapes(path), where, ("lm_head.",) if cfg.tie_word_embeddings else ())
    except DSparkError as exc:
        return str(exc)
    return None


def is_model(hf: dict) -> bool:
    """Whether a config.json is a causal LM's (a target's layout: a target, or a draft model), not a draft's."""
    return draft_kind(hf) is None and any(str(a).endswith("ForCausalLM") for a in hf.get("architectures") or [])


def draft_model_problem(system: System, target_path: Path, target_cfg: TargetConfig) -> str | None:
    """Why a `draft_model` system cannot run as the experiment says, or None (`draft_model_fit`, and its
    proposal's length given)."""
    if system.num_speculative_tokens is None:  # (a model folder says nothing of a proposal's length; vLLM refuses too)
        return "method draft_model drafts num_speculative_tokens tokens a round; give num_speculative_tokens (e.g. 3)"
    return draft_model_fit(system.draft, target_path, target_cfg)


def draft_model_fit(draft: str, target_path: Path, target_cfg: TargetConfig) -> str | None:
    """Why the draft model `draft` cannot draft for the target, or None, from config, tokenizer files and tensor
    headers alone (no weights read): it must be a Qwen3 target-format folder (not a draft of another method) scoring
    the target's vocabulary with the target's tokenizer, since its token ids are verified as the target's, and its
    weights must match its config."""
    path = resolve_path(draft)
    hf = read_config(path)
    kind = draft_kind(hf)
    if kind is not None:
        method = kind.split()[0]
        return (f"{draft} is a {kind}, not a draft model; set method {method}" if method in METHODS else
                f"{draft} is a {kind}, not a draft model; give a Qwen3 model of the target's tokenizer")
    cfg = TargetConfig.from_hf(hf, f"draft model {draft}")
    theirs, ours = cfg.backbone.vocab_size, target_cfg.backbone.vocab_size
    if theirs != ours:
        return (f"draft model {draft} scores {theirs} tokens and the target {ours}: a draft model must have "
                "the target's vocabulary (a smaller model of its family with its tokenizer, e.g. Qwen3-0.6B for "
                "Qwen3-8B); give such a draft")
    for name in TOKENIZER_PARTS:
        mine, target = path / name, target_path / name
        if mine.is_file() and target.is_file():
            if _tokenizer_part(mine) != _tokenizer_part(target):
                return (f"draft model {draft} has another tokenizer than the target ({name} differs): its ids "
                        "would mean other tokens; give a draft of the target's tokenizer")
            break
    return model_tensors_problem(path, cfg, f"draft model {draft}")


def draft_model_room(draft: str, positions: int, option: str) -> str | None:
    """Why the draft model `draft` cannot draft through a request of `positions` (prompt + new tokens), or None:
    our engine would run it past its `max_position_embeddings` without a word, on positions it never saw (vLLM
    stops drafting there). `option`: the one that sets the new tokens. A draft that does not resolve is named by
    the system's own checks."""
    try:
        cfg = TargetConfig.from_hf(read_config(resolve_path(draft)), f"draft model {draft}")
    except DSparkError:
        return None
    if positions <= cfg.max_position_embeddings:
        return None
    return (f"draft model {draft}'s context is {cfg.max_position_embeddings} positions (max_position_embeddings), and "
            f"the longest request needs {positions} (its prompt + {option}); give a smaller {option}, or a draft model "
            "of a longer context")


def _tokenizer_part(path: Path):
    """What of a tokenizer file decides which id is which token (tokenizer.json: its model and added tokens)."""
    if path.name != "tokenizer.json":
        return path.read_bytes()
    data = json.loads(path.read_text())
    return data.get("model"), data.get("added_tokens")


def make_drafter(method: str, draft: str | None, target, num_speculative_tokens: int | None = None,
                 margins: bool = False, markov_topk: int | None = None
                 ) -> tuple[Drafter | None, str, AnyDraftConfig | None]:
    """(drafter, the method that runs, the draft's config): none for plain decoding, n-gram lookup, or
    the draft model at `draft` (its method read from its config) on `target`, recording its greedy
    top-2 margins when `margins`, its Markov head restricted to each slot's `markov_topk` best base
    logits when given (`check_system` holds that against the draft)."""
    if method == "plain":
        return None, "plain", None
    if method == "ngram":
        return NgramDrafter(num_speculative_tokens or NGRAM_TOKENS), "ngram", None
    if method == "draft_model":  # a Qwen3 of the target's tokenizer, in the target's dtype, on its device
        weight = target.lm_head.weight
        model = load_target(draft, weight.device, weight.dtype).model
        return DraftModelDrafter(model, num_speculative_tokens, margins), "draft_model", None
    loaded = load_draft(draft, target)
    return (drafter_for(loaded.model, num_speculative_tokens, margins, markov_topk or 0), loaded.config.method,
            loaded.config)


def resolve_system(system: System, target_cfg: TargetConfig, target_path: Path) -> dict:
    """What a system would run, from configs and tensor headers alone (no weights read): the dry run."""
    info = {"system": system.name, "declared_method": system.method, "draft": system.draft,
            "markov_topk": system.markov_topk}
    if system.method in ("plain", "ngram"):
        k = system.num_speculative_tokens or (NGRAM_TOKENS if system.method == "ngram" else 0)
        return info | {"method": system.method, "format": None, "num_speculative_tokens": k, "fits_target": True,
                       "problem": None}
    if system.method == "draft_model":
        try:
            problem = draft_model_problem(system, target_path, target_cfg)
            path = str(resolve_path(system.draft))
        except DSparkError as exc:
            return info | {"method": None, "format": None, "fits_target": False, "problem": str(exc)}
        return info | {"method": "draft_model", "format": "qwen3", "path": path, "vllm_method": "draft_model",
                       "num_speculative_tokens": system.num_speculative_tokens, "fits_target": problem is None,
                       "problem": problem}
    if system.method not in METHODS:  # one of vLLM's: its draft (if any) is a model vLLM reads, not one of ours
        try:
            path = None if system.draft is None else str(resolve_path(system.draft))
        except DSparkError as exc:
            return info | {"method": system.method, "format": None, "fits_target": False, "problem": str(exc)}
        k = {} if system.num_speculative_tokens is None else {"num_speculative_tokens": system.num_speculative_tokens}
        return info | {"method": system.method, "format": None, "path": path, "vllm_method": system.method, **k,
                       "fits_target": True, "problem": None}
    try:
        path, cfg = load_draft_config(system.draft)
        check_draft(path, cfg, f"draft {system.draft}", target_cfg)
    except DSparkError as exc:
        return info | {"method": None, "format": None, "fits_target": False, "problem": str(exc)}
    problem = check_system(system, cfg)
    k = system.num_speculative_tokens if cfg.method == "eagle3" and system.num_speculative_tokens else cfg.num_drafts
    return info | {"method": cfg.method, "format": cfg.format, "path": str(path), "block_size": cfg.block_size,
                   "num_speculative_tokens": k, "taps": list(cfg.target_layer_ids),
                   "markov_rank": cfg.markov_rank, "vllm_method": cfg.vllm_method, "fits_target": problem is None,
                   "problem": problem}

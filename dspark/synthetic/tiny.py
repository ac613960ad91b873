"""Small random-weight target/draft pairs saved in the real formats: smoke tests, CI, and timing.

Random drafts accept little; these pairs show that every path runs, never what acceptance to expect.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch

from dspark.checkpoint import save_draft, save_target
from dspark.models.block_draft import DraftModel
from dspark.models.config import BackboneConfig, DraftConfig, Eagle3Config, TargetConfig
from dspark.models.eagle3_draft import Eagle3Draft
from dspark.models.target import Qwen3Target
from dspark.tokenizer import SPECIALS, build_tokenizer, save_tokenizer

BYTE_VOCAB = 256
MASK_TOKEN_ID = BYTE_VOCAB + len(SPECIALS)  # first row no token uses, as Qwen3's 151669


def tiny_target_config(vocab_size: int = 272, hidden: int = 64, layers: int = 4, heads: int = 4, kv_heads: int = 2,
                       head_dim: int = 16, intermediate: int = 128, tie: bool = False,
                       eos: tuple[int, ...] = (BYTE_VOCAB + 2, BYTE_VOCAB)) -> TargetConfig:
    backbone = BackboneConfig(hidden_size=hidden, intermediate_size=intermediate, num_layers=layers, num_heads=heads,
                              num_kv_heads=kv_heads, head_dim=head_dim, rms_norm_eps=1e-6, rope_theta=10000.0,
                              vocab_size=vocab_size)
    return TargetConfig(backbone=backbone, tie_word_embeddings=tie, max_position_embeddings=4096, eos_token_ids=eos)


def tiny_draft_config(target: TargetConfig, layers: int = 2, block_size: int = 7, taps: tuple[int, ...] = (0, 1, 2),
                      markov_rank: int = 16, markov_head_type: str = "vanilla", confidence: bool = True,
                      sample_from_anchor: bool = True, mask_token_id: int = MASK_TOKEN_ID,
                      draft_vocab_size: int | None = None, fmt: str = "deepspec",
                      intermediate_size: int | None = None) -> DraftConfig:
    backbone = replace(target.backbone, num_layers=layers,
                       intermediate_size=intermediate_size or target.backbone.intermediate_size)
    return DraftConfig(
        format=fmt, backbone=backbone, block_size=block_size,
        target_layer_ids=taps, sample_from_anchor=sample_from_anchor, mask_token_id=mask_token_id,
        markov_rank=markov_rank, markov_head_type=markov_head_type if markov_rank else None,
        confidence_head=confidence, confidence_head_with_markov=confidence and markov_rank > 0,
        draft_vocab_size=draft_vocab_size, num_target_layers=target.backbone.num_layers,
    )


def random_target(cfg: TargetConfig, seed: int = 0, std: float = 0.02, dtype=torch.float32) -> Qwen3Target:
    torch.manual_seed(seed)
    model = Qwen3Target(cfg)
    model.init_random(std)
    return model.to(dtype).eval().requires_grad_(False).fuse()


def random_draft(cfg: DraftConfig, target: Qwen3Target, seed: int = 1, std: float = 0.02) -> DraftModel:
    """Random backbone and heads; embedding and LM head copied from the target, as DeepSpec initialises.
    Fused (`DraftModel.fuse`) like a loaded draft."""
    torch.manual_seed(seed)
    model = DraftModel(cfg)
    model.init_random(std)
    model.embed_tokens.weight.data.copy_(target.model.embed_tokens.weight)
    if cfg.reduced_vocab:
        # Keep every target id reachable the simple way: draft ids map to the first draft_vocab_size ids.
        model.d2t = torch.zeros(cfg.vocab_size, dtype=torch.long)
    model.lm_head.weight.data.copy_(target.lm_head.weight[model.target_ids()])
    return model.to(target.lm_head.weight.dtype).eval().requires_grad_(False).fuse()


def random_draft_model(target: Qwen3Target, layers: int, seed: int = 1, intermediate_size: int | None = None,
                       std: float = 0.02) -> Qwen3Target:
    """A classic draft model (`draft_model`) to train for `target`: a Qwen3 of its tokenizer, width and head
    layout with `layers` random layers (MLP `intermediate_size`, default the target's), starting from the
    target's embedding and head as the other drafts do. Unlike theirs, its copies are its own to train: at
    run time it shares nothing with the target."""
    cfg = target.config
    cfg = replace(cfg, backbone=replace(cfg.backbone, num_layers=layers,
                                        intermediate_size=intermediate_size or cfg.backbone.intermediate_size))
    model = random_target(cfg, seed, std, target.lm_head.weight.dtype)
    model.model.embed_tokens.weight.data.copy_(target.model.embed_tokens.weight)
    if not cfg.tie_word_embeddings:
        model.lm_head.weight.data.copy_(target.lm_head.weight)
    return model


def tiny_eagle3_config(target: TargetConfig, taps: tuple[int, ...] = (0, 1, 2), num_tokens: int = 5,
                       qk_norm: bool = False, norm_before_residual: bool = False,
                       draft_vocab_size: int | None = None, fmt: str = "eagle",
                       intermediate_size: int | None = None) -> Eagle3Config:
    backbone = replace(target.backbone, num_layers=1,
                       intermediate_size=intermediate_size or target.backbone.intermediate_size)
    return Eagle3Config(format=fmt, backbone=backbone, target_layer_ids=taps, num_speculative_tokens=num_tokens,
                        qk_norm=qk_norm, norm_before_residual=norm_before_residual,
                        draft_vocab_size=draft_vocab_size, num_target_layers=target.backbone.num_layers)


def random_eagle3(cfg: Eagle3Config, target: Qwen3Target, seed: int = 1, std: float = 0.02,
                  d2t: torch.Tensor | None = None) -> Eagle3Draft:
    """A random EAGLE-3 draft embedding tokens with the target's table (as every EAGLE-3 draft does), its
    head started from the target's rows of its vocabulary: `d2t` (target id = draft id + d2t[draft id]),
    by default the first draft_vocab_size target ids. Fused like a loaded draft."""
    torch.manual_seed(seed)
    model = Eagle3Draft(cfg)
    model.init_random(std)
    model.embed_tokens.weight.data.copy_(target.model.embed_tokens.weight)
    if cfg.reduced_vocab:
        model.d2t = torch.zeros(cfg.vocab_size, dtype=torch.long) if d2t is None else d2t.long()
    model.lm_head.weight.data.copy_(target.lm_head.weight[model.target_ids()])
    return model.to(target.lm_head.weight.dtype).eval().requires_grad_(False).fuse()


# The folders `make_tiny` writes, one model each; its manifest.json lists them (how a folder it made is known again).
TINY_MODELS = ("target", "dspark", "dspark-speculators", "dflash", "dflash-zlab", "eagle3", "eagle3-speculators",
               "eagle3-deepspec")


def made_by_make_tiny(folder: Path) -> bool:
    """Whether `folder` holds an earlier `make_tiny` output (its manifest.json names exactly `TINY_MODELS`), which
    a new one may overwrite: writing over anything else would mix random models into someone's files."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and sorted(manifest) == sorted(TINY_MODELS)


def make_tiny(out: str | Path, seed: int = 0) -> dict[str, Path]:
    """Save a random tiny target with a tokenizer and drafts in every real format. Returns their folders."""
    out = Path(out)
    tcfg = tiny_target_config()
    target = random_target(tcfg, seed)
    paths = {name: out / name for name in TINY_MODELS}
    save_target(target, paths["target"])
    save_tokenizer(build_tokenizer(), paths["target"])
    dspark = random_draft(tiny_draft_config(tcfg), target, seed + 1)
    save_draft(dspark, paths["dspark"], "deepspec", tcfg)
    save_draft(dspark, paths["dspark-speculators"], "speculators", tcfg, verifier=str(paths["target"]))
    dflash = random_draft(tiny_draft_config(tcfg, markov_rank=0, confidence=False), target, seed + 2)
    save_draft(dflash, paths["dflash"], "deepspec", tcfg)
    zlab = random_draft(tiny_draft_config(tcfg, block_size=8, markov_rank=0, confidence=False,
                                          sample_from_anchor=False, fmt="zlab"), target, seed + 3)
    save_draft(zlab, paths["dflash-zlab"], "zlab", tcfg)
    # EAGLE-3: a Llama-style layer over a reduced vocabulary (the EAGLE authors' layout), a Qwen3-style one
    # with norm_before_residual (speculators'), and DeepSpec's (Qwen3-style, full vocabulary).
    eagle = random_eagle3(tiny_eagle3_config(tcfg, num_tokens=7, draft_vocab_size=200), target, seed + 4)
    save_draft(eagle, paths["eagle3"], "eagle", tcfg)
    spec = random_eagle3(tiny_eagle3_config(tcfg, qk_norm=True, norm_before_residual=True,
                                            fmt="speculators-eagle3"), target, seed + 5)
    save_draft(spec, paths["eagle3-speculators"], "speculators-eagle3", tcfg, verifier=str(paths["target"]))
    deep = random_eagle3(tiny_eagle3_config(tcfg, qk_norm=True, fmt="deepspec-eagle3"), target, seed + 6)
    save_draft(deep, paths["eagle3-deepspec"], "deepspec-eagle3", tcfg)
    (out / "README.txt").write_text("Random-weight tiny Qwen3 target and drafts made by `dspark-bench make-tiny` "
                                    f"(seed {seed}). For smoke tests and timing; acceptance means nothing.\n")
    (out / "manifest.json").write_text(json.dumps({k: str(v) for k, v in paths.items()}, indent=2))
    return paths

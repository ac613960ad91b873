"""`dspark-bench inspect`: what a draft is, whether it fits a target, which vLLM method loads it."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.table import Table

from dspark.errors import DSparkError
from harness.cli.render import out, show


def inspect(
    draft: str = typer.Argument(..., help="Draft model: local folder or hub id."),
    target: Optional[str] = typer.Option(None, help="Check the draft against this target (config and shapes)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
):
    """Show a draft's format, normalised configuration, parameter counts, fit and vLLM method.

    A draft that does not fit the target is a finding, not a mistake: the table says why and the command exits
    1. A mistake in the arguments (a target given as the draft, a draft as the target) is one line, exit 2."""
    from dspark.checkpoint import check_draft

    found_config = _draft_config(draft, target)
    if found_config is None:  # a causal LM with --target: a draft model
        info = _draft_model_facts(draft, target)
        _show(draft, info, as_json)
        if not info["fits_target"]:
            raise typer.Exit(1)
        return
    path, cfg = found_config
    where = f"draft {draft}"
    target_cfg = _target_config(target) if target else None
    try:
        found = check_draft(path, cfg, where, target_cfg)
        fits, problem = True, ""
    except DSparkError as exc:
        if target_cfg is None:
            raise
        fits, problem, found = False, str(exc), None
    info = {"path": str(path), "format": cfg.format, **cfg.to_dict()}
    info.pop("extra", None)
    if cfg.method == "eagle3":
        info |= _eagle3_facts(cfg)
    if found is not None:
        info["parameters"] = _param_counts(found, cfg.method)
        info["ships_embeddings"] = "embed_tokens.weight" in found
    if target_cfg is not None:
        info["fits_target"] = fits
        info["target"] = target
        if problem:
            info["problem"] = problem
    _show(draft, info, as_json)
    if target_cfg is not None and not fits:
        raise typer.Exit(1)


def _show(draft: str, info: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(info, default=str))
        return
    table = Table(title=f"{draft}", show_header=False)
    for k, v in info.items():
        table.add_row(k, json.dumps(v, default=str) if isinstance(v, (dict, list, tuple)) else str(v))
    show(out, table)


def _draft_config(name: str, target: str | None):
    """The draft's folder and config, or None for a causal LM given with --target (a draft model: a target's layout,
    which only the target beside it makes a draft); given alone, it may be a target in the draft's place, and is
    named as both (its config.json was answered "unknown draft format")."""
    from dspark.checkpoint import load_draft_config, read_config, resolve_path
    from harness.backends.systems import is_model

    try:
        return load_draft_config(name)
    except DSparkError as exc:
        try:
            hf = read_config(resolve_path(name))
        except DSparkError:
            raise exc from None
        if not is_model(hf):
            raise
        if target:
            return None
        raise DSparkError(f"{name} is a model ({', '.join(map(str, hf['architectures']))}), not a draft of a block or "
                          "EAGLE-3 format: give it as --target with the draft as the argument, or add --target (the "
                          "model it drafts for) to inspect it as a draft model (method draft_model)") from None


def _draft_model_facts(name: str, target: str) -> dict:
    """A draft model's shape, vocabulary, parameters and whether it fits `target` (`draft_model_fit`: its
    vocabulary, tokenizer and tensor headers, no weights read)."""
    from dataclasses import asdict

    import torch

    from dspark.checkpoint import read_config, resolve_path, shapes
    from dspark.models.config import TargetConfig
    from dspark.models.target import Qwen3Target
    from harness.backends.systems import draft_model_fit

    path = resolve_path(name)
    cfg = TargetConfig.from_hf(read_config(path), f"draft model {name}")
    problem = draft_model_fit(name, resolve_path(target), _target_config(target))
    with torch.device("meta"):
        found = shapes(Qwen3Target(cfg))
    groups = {"embed_tokens": 0, "lm_head": 0, "layers": 0, "norm": 0}
    for key, shape in found.items():
        group = "layers" if key.startswith("model.layers.") else key.split(".")[-2]
        if group == "lm_head" and cfg.tie_word_embeddings:
            continue  # (the embedding's own rows)
        groups[group] += torch.Size(shape).numel()
    groups["total"] = sum(groups.values())
    groups["total_without_embeddings"] = groups["total"] - groups["embed_tokens"] - groups["lm_head"]
    return {"path": str(path), "format": "qwen3", "method": "draft_model", "backbone": asdict(cfg.backbone),
            "tie_word_embeddings": cfg.tie_word_embeddings, "max_position_embeddings": cfg.max_position_embeddings,
            "parameters": groups, "fits_target": problem is None, "target": target} | (
        {"problem": problem} if problem else {})


def _target_config(name: str):
    """The target's config; a draft given as --target is refused as one (it was read as a target: a table of
    misfits, exit 1)."""
    from dspark.checkpoint import read_config, resolve_path
    from dspark.formats import detect_format
    from dspark.models.config import TargetConfig, draft_config_from_hf

    hf = read_config(resolve_path(name))
    try:
        kind = detect_format(hf)
    except DSparkError:  # no draft format claims it: a target
        return TargetConfig.from_hf(hf, f"target {name}")
    try:
        found = draft_config_from_hf(hf, f"--target {name}")
        kind = f"{found.format} {found.method}"
    except DSparkError:
        pass  # (a draft's config with a mistake of its own: named by its format alone)
    raise DSparkError(f"--target {name} is a draft ({kind}), not a target; give the target model it drafts for")


def _eagle3_facts(cfg) -> dict:
    """What running an EAGLE-3 draft takes: its taps in both conventions, its vocabulary, its layer."""
    return {
        "taps (ours: outputs of target layers)": list(cfg.target_layer_ids),
        "taps (vLLM eagle_aux_hidden_state_layer_ids)": list(cfg.vllm_aux_layer_ids),
        "draft_vocabulary": cfg.vocab_size,
        "layer_style": "qwen3 (q/k norm)" if cfg.qk_norm else "llama",
    }


def _param_counts(found: dict[str, tuple], method: str) -> dict[str, int]:
    groups = {"embed_tokens": 0, "lm_head": 0, "layers": 0, "fc+norms": 0}
    if method != "eagle3":
        groups |= {"markov_head": 0, "confidence_head": 0}
    if method == "dflash2":  # (its convolutions count with the layers)
        groups["candidate_selector"] = 0
    for key, shape in found.items():
        n = 1
        for s in shape:
            n *= s
        group = "layers" if key.startswith("midlayer.") else key.split(".")[0]  # (the EAGLE-3 layer's name)
        if group in ("d2t", "t2d"):
            continue
        groups[group if group in groups else "fc+norms"] += n
    groups["total"] = sum(groups.values())
    groups["total_without_embeddings"] = groups["total"] - groups["embed_tokens"] - groups["lm_head"]
    return groups

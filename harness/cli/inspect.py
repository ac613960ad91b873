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

    path, cfg = _draft_config(draft)
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
    if as_json:
        print(json.dumps(info, default=str))
    else:
        table = Table(title=f"{draft}", show_header=False)
        for k, v in info.items():
            table.add_row(k, json.dumps(v, default=str) if isinstance(v, (dict, list, tuple)) else str(v))
        show(out, table)
    if target_cfg is not None and not fits:
        raise typer.Exit(1)


def _draft_config(name: str):
    """The draft's folder and config; a target given in its place is called one (its config.json, a plain
    causal LM, was answered "unknown draft format")."""
    from dspark.checkpoint import load_draft_config, read_config, resolve_path

    try:
        return load_draft_config(name)
    except DSparkError as exc:
        try:
            architectures = read_config(resolve_path(name)).get("architectures") or []
        except DSparkError:
            raise exc from None
        if any(str(a).endswith("ForCausalLM") for a in architectures):
            raise DSparkError(f"{name} is a target model ({', '.join(map(str, architectures))}), not a draft; give it "
                              "as --target, and the draft as the argument") from None
        raise


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

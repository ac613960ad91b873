"""A draft folder as the installed vLLM reads it.

DeepSpec's EAGLE-3 drafts (`Qwen3Eagle3Model`) are given as a copy whose config names vLLM's class of
the same layer and the taps in vLLM's convention (`dspark.formats.eagle3.deepspec.vllm_config`).

vLLM's DFlash/DSpark loader has read the draft's tap list (`target_layer_ids`) from two places over
its versions: 0.26 reads it only from `dflash_config` (or `eagle_config`) and otherwise assumes as
many taps as draft layers, so a DeepSpec-format draft whose tap count differs from its layer count
(the demo draft: 3 layers, 5 taps) fails to load its `fc` there; 0.32 reads the top-level list,
which the DeepSpec format has. Where the installed version needs it, the draft is given to vLLM as
a copy of its folder: the config with `dflash_config: {target_layer_ids, mask_token_id}` added (the
values it already has at the top level, so nothing about the draft changes) and every other file
linked, not copied. The copy lives in the run folder, and the engine's record says it was used.

vLLM also infers a method from a draft's path: asked for any method but eagle, eagle3, dflash and dspark
(draft_model, medusa, ...), 0.32 switches to the method a draft's path names ("eagle-", "eagle3",
"dflash", "dspark" anywhere in it), so the demo target under the package's `dspark/data/` folder, given as
a draft_model's draft, ran as DSpark. Such a draft is given to vLLM as a folder of links at a path that
names no method (`neutral_folder`); the engine's record says so, and the method vLLM ran is read back.

z-lab's DFlash 2 drafts (`DFlash2DraftModel`) run on vLLM's `dflash` method, its DFlash 2 speculator chosen by
that architecture. vLLM 0.32's model reads its convolution and selector fields and the embedding and logit
scalars from `dflash_config` alone (a field at the top level, which z-lab's code reads next, is a KeyError or,
for a scalar, silently ignored), and its codebooks as bare parameters (`candidate_selector.predecessor_codebook`,
as z-lab's releases store them): z-lab's own `save_pretrained` writes them with `.weight`, which vLLM refuses
to load ("Attempted to load nested weight"). Such a draft is given as a copy: those fields moved into
`dflash_config` (the values z-lab reads) and the weight files that hold a `.weight` codebook rewritten with it
bare (every other tensor as it was, every other file linked).
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

from dspark.errors import DSparkError
from dspark.formats.common import architecture
from dspark.formats.eagle3 import deepspec as eagle3_deepspec
from dspark.formats.zlab import CODEBOOKS, DFLASH2, DFLASH2_FIELDS

# what vLLM 0.32's `SpeculativeConfig.__post_init__` looks for in a draft's path (lower-cased) to pick a method
PATH_METHODS = ("eagle-", "eagle3", "dflash", "dspark")
TOP_LEVEL_TAPS = (0, 32)  # the first vLLM seen reading `target_layer_ids` at the config's top level (0.26: not)
# what vLLM's DFlash 2 model reads from `dflash_config` alone, where z-lab's code falls back to the top level
DFLASH2_NESTED = (*DFLASH2_FIELDS, "input_embedding_scale", "output_multiplier", "final_logit_softcapping")


def version_tuple(version: str) -> tuple[int, int]:
    """(major, minor) of a vLLM version string ("0.26.0", "0.32.0+cpu", "0.27.0rc1")."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None:
        raise DSparkError(f"vLLM version '{version}' is not MAJOR.MINOR[...]; reinstall vLLM")
    return int(m.group(1)), int(m.group(2))


def nested_taps(cfg: dict, version: str) -> dict | None:
    """The `dflash_config` this vLLM needs added to a draft config `cfg`, or None where it reads the
    config as it is (a newer vLLM, a config that has one already, or one without top-level taps)."""
    if version_tuple(version) >= TOP_LEVEL_TAPS or "dflash_config" in cfg or "eagle_config" in cfg:
        return None
    if "target_layer_ids" not in cfg:
        return None
    nested = {"target_layer_ids": list(cfg["target_layer_ids"])}
    if "mask_token_id" in cfg:
        nested["mask_token_id"] = cfg["mask_token_id"]
    return nested


def nested_dflash2(cfg: dict) -> dict:
    """The DFlash 2 fields `cfg` sets at its top level only (`DFLASH2_NESTED`), which vLLM reads in
    `dflash_config` alone: moved there, z-lab reads the same values (`dflash_config` first)."""
    if architecture(cfg) != DFLASH2:
        return {}
    nested = cfg.get("dflash_config") or {}
    return {key: cfg[key] for key in DFLASH2_NESTED if key in cfg and key not in nested}


def dotted_codebooks(path: Path) -> list[Path]:
    """The weight files of the draft at `path` that store a DFlash 2 codebook with `.weight` (z-lab's
    `save_pretrained` does), which vLLM refuses: its codebooks are bare parameters."""
    from safetensors import safe_open

    dotted = {f"{name}.weight" for name in CODEBOOKS}
    found = []
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            if dotted & set(f.keys()):
                found.append(file)
    return found


def _bare_codebooks(files: list[Path], out: Path) -> None:
    """`out`'s links to `files` replaced by copies whose codebooks are stored bare (a shard index renamed alike)."""
    from safetensors.torch import load_file, save_file

    bare = {f"{name}.weight": name for name in CODEBOOKS}
    for file in files:
        (out / file.name).unlink()
        save_file({bare.get(k, k): v for k, v in load_file(str(file)).items()}, str(out / file.name),
                  metadata={"format": "pt"})
    index = out / "model.safetensors.index.json"
    if index.exists():
        held = json.loads(index.read_text())
        held["weight_map"] = {bare.get(k, k): v for k, v in held.get("weight_map", {}).items()}
        index.unlink()
        index.write_text(json.dumps(held, indent=2))


def as_vllm_reads(cfg: dict, version: str) -> tuple[dict, str | None]:
    """(`cfg` as this vLLM reads it, a line saying what was added, or None when nothing was)."""
    if eagle3_deepspec.detect(cfg, "draft"):  # an architecture vLLM does not register, taps it does not read
        rewritten = eagle3_deepspec.vllm_config(cfg)
        return rewritten, (f"architectures {rewritten['architectures']} and eagle_aux_hidden_state_layer_ids "
                           f"{rewritten['eagle_aux_hidden_state_layer_ids']} (its target_layer_ids + 1) in a copy of "
                           f"the config: vLLM {version} loads DeepSpec's EAGLE-3 layer as that class, with those taps")
    moved = nested_dflash2(cfg)
    if moved:
        rewritten = {k: v for k, v in cfg.items() if k not in moved}
        return rewritten | {"dflash_config": (cfg.get("dflash_config") or {}) | moved}, (
            f"{', '.join(moved)} moved into dflash_config in a copy of the config: vLLM {version}'s DFlash 2 reads them "
            "only there (z-lab's code there first, then at the top level)")
    nested = nested_taps(cfg, version)
    if nested is None:
        return cfg, None
    note = (f"dflash_config {json.dumps(nested)} added to a copy of the config: vLLM {version} reads the draft's taps "
            "only there")
    return cfg | {"dflash_config": nested}, note


def draft_folder(path: Path, version: str, out: Path) -> tuple[Path, str | None]:
    """The folder to give vLLM for the draft at `path`: `path` itself, or `out` holding a rewritten
    config (`as_vllm_reads`), DFlash 2 codebooks stored bare (`dotted_codebooks`) and links to every other file;
    with the note saying what changed."""
    cfg = json.loads((path / "config.json").read_text())
    rewritten, note = as_vllm_reads(cfg, version)
    dotted = dotted_codebooks(path) if architecture(cfg) == DFLASH2 else []
    if note is None and not dotted:
        return path, None
    _linked(path, out)
    if note is not None:
        (out / "config.json").unlink()
        (out / "config.json").write_text(json.dumps(rewritten, indent=2))
    if dotted:
        _bare_codebooks(dotted, out)
        bare = (f"the codebooks stored bare in a copy of {', '.join(f.name for f in dotted)}: vLLM {version} loads no "
                "candidate_selector.*_codebook.weight")
        note = bare if note is None else f"{note}; {bare}"
    return out, note


def names_a_method(path: Path) -> bool:
    """Whether vLLM would read a speculative method in `path` (`PATH_METHODS`)."""
    return any(word in str(path).lower() for word in PATH_METHODS)


def _linked(path: Path, out: Path) -> None:
    """`out` holding a link to every file of `path` (a link already there replaced)."""
    out.mkdir(parents=True, exist_ok=True)
    for item in path.iterdir():
        link = out / item.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(item.resolve())


def neutral_folder(path: Path, out: Path) -> tuple[Path, str | None]:
    """The folder to give vLLM for a draft of one of its own methods: `path`, or, where its path names a
    method vLLM would switch to, a folder of links to its files at `out` (else, where `out` names one too, in
    the system's temporary folder); with the note saying why."""
    path = Path(path).resolve()
    if not names_a_method(path):
        return path, None
    folder = out if not names_a_method(out.resolve()) else Path(tempfile.mkdtemp(prefix="vllm-draft-"))
    if names_a_method(folder):
        raise DSparkError(f"draft {path}: vLLM would read a method in its path ({', '.join(PATH_METHODS)}) and in "
                          f"{folder}'s; set TMPDIR to a folder whose path names none of them")
    _linked(path, folder)
    return folder, (f"given to vLLM as {folder} (links to {path}): vLLM reads a speculative method in a draft's "
                    f"path ({', '.join(PATH_METHODS)}) and would run that method instead")

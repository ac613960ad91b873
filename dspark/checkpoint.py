"""Loading targets and drafts from local folders or hub ids, checking them, and saving them.

What differs between the draft formats (config fields, tensor names, extra files, how to write
one) is in `dspark.formats`, one module per format; this module resolves folders, reads weights,
checks names and shapes, builds the models (a DSpark/DFlash `DraftModel` or an `Eagle3Draft`, fused
once loaded) and dispatches to the format. Weights come from safetensors; the non-safetensors files
a format may carry (z-lab's `mask_embedding.pt`, AngelSlim's EAGLE-3 `pytorch_model.bin` where no
safetensors exist) are read with `torch.load(weights_only=True)`. Every problem a user can cause
(missing file, unreadable config, missing tensor, wrong shape, draft for another target, a draft
whose weights are of another method than its config says) raises a `DSparkError` naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from torch import Tensor, nn

from dspark import formats
from dspark.dtypes import resolved_dtype
from dspark.errors import DSparkError
from dspark.formats.common import KeyTable, save_safetensors
from dspark.formats.eagle3.common import weights_signature
from dspark.models.block_draft import DraftModel
from dspark.models.config import AnyDraftConfig, Eagle3Config, TargetConfig, draft_config_from_hf
from dspark.models.eagle3_draft import Eagle3Draft
from dspark.models.target import Qwen3Target
from dspark.qwen3_tokenizer import preset_tokenizer
from dspark.user_cache import cache_root

HUB_PATTERNS = ["*.json", "*.safetensors", "*.pt", "*.txt", "*.model", "*.jinja"]
CONFIG_PATTERNS = ["*.json", "*.txt", "*.model", "*.jinja"]  # a random: model's source: all but the weights
TARGET_KEYS = KeyTable()  # Hugging Face Qwen3ForCausalLM names are the model's


# Short names of the demo models that ship inside the package (built by experiments/demo/build.py).
DEMO_MODELS = {"demo": "target", "demo-dspark": "dspark", "demo-dflash": "dflash", "demo-eagle3": "eagle3",
               "demo-draft-model": "draft_model", "demo-dflash2": "dflash2"}
DEMO_DIR = Path(__file__).resolve().parent / "data" / "demo"


def resolve_path(name_or_path: str | Path, revision: str | None = None, patterns: list[str] = HUB_PATTERNS) -> Path:
    """A demo short name, a local folder as is, a hub id, downloaded (config, safetensors, tokenizer files),
    or `random:<preset or any of those>`: a folder of that config whose weights are drawn at load (`random_folder`)."""
    if str(name_or_path).startswith(RANDOM):
        return random_folder(str(name_or_path)[len(RANDOM):], revision)
    if str(name_or_path) in DEMO_MODELS:
        path = DEMO_DIR / DEMO_MODELS[str(name_or_path)]
        if not (path / "config.json").is_file():
            raise DSparkError(f"{name_or_path}: the demo models are not in this install ({path}); "
                              "build them with experiments/demo/build.py")
        return path
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise DSparkError(f"{name_or_path}: is a file; give the checkpoint's folder")
    name = str(name_or_path)
    if name.count("/") != 1 or name.startswith((".", "/", "~")):
        raise DSparkError(f"{name}: no such folder, and not a hub id of the form owner/name")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, revision=revision, allow_patterns=patterns))
    except Exception as exc:  # network, auth, missing repo: all one message for the user
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DSparkError(f"{name}: not a local folder and the hub could not provide it ({first}); "
                          "pass a local path or check the id and the network") from None


RANDOM = "random:"  # a model id's prefix: its config with seeded random weights (timing, never quality)
RANDOM_MARKER = "random-weights.json"  # in such a folder: what it is, how its weights are drawn
RANDOM_INIT = {"init": "normal(0, 0.02)", "target_seed": 0, "draft_seed": 1}
RANDOM_TOKENIZER = "random-tokenizer-source.json"  # in such a folder: where its tokenizer files were copied from
RANDOM_COPIED = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "vocab.json", "merges.txt", "chat_template.jinja")


def random_folder(source: str, revision: str | None = None) -> Path:
    """The folder that stands for `random:<source>`: the config of a preset (`dspark.synthetic.presets`: a target such as
    qwen3-8b, a draft such as dspark-qwen3-8b-block7) or of a model folder, demo name or hub id (its config and
    tokenizer files only; the hub's tokenizer where it has one, else Qwen3's from `dspark.qwen3_tokenizer`'s cache, with
    where they came from in RANDOM_TOKENIZER), and a marker saying its weights are drawn
    at load. Written under $DSPARK_CACHE (default ~/.cache/dspark-bench)/random; vLLM reads it with
    load_format="dummy"."""
    import hashlib
    from importlib import metadata

    from dspark.synthetic import presets

    if source in presets.TARGETS:
        cfg = presets.TARGETS[source]
        config, files = target_hf_config(cfg, torch.bfloat16), {}
        if cfg.eos_token_ids:
            files["generation_config.json"] = json.dumps({"eos_token_id": list(cfg.eos_token_ids)})
        src = presets.TOKENIZERS.get(source)
        tokenizer, origin = preset_tokenizer(src) if src else (None, None)
    elif source in presets.DRAFTS:
        dcfg = presets.DRAFTS[source]()
        config = formats.get(dcfg.format).hf_config(dcfg, dcfg.num_target_layers) | {"torch_dtype": "bfloat16"}
        files, tokenizer, origin = {}, None, None
    elif source:
        src_path = resolve_path(source, revision, CONFIG_PATTERNS)  # (from the hub: config and tokenizer, no weights)
        config, tokenizer = read_config(src_path), src_path
        origin = {"from": "the config's folder", "path": str(src_path)}
        files = {}
    else:
        raise DSparkError(f"{RANDOM}: name a preset ({', '.join([*presets.TARGETS, *presets.DRAFTS])}) or a model "
                          "folder or id whose config to use, e.g. random:qwen3-8b")
    marker = {"source": RANDOM + source, **RANDOM_INIT}
    text = json.dumps(config, indent=2, sort_keys=True)
    digest = hashlib.sha256((text + json.dumps(files, sort_keys=True)).encode()).hexdigest()[:12]
    root = cache_root() / "random"
    out = root / f"{Path(source).name.replace(':', '-') or 'model'}-{digest}"
    out.mkdir(parents=True, exist_ok=True)
    # (the transformers that wrote it, as save_pretrained records: without it transformers 5 takes the folder's
    # tokenizer for a Mistral one and warns of wrong tokenization; left out of the digest, the folder's name)
    written = {"transformers_version": metadata.version("transformers")} | config
    (out / "config.json").write_text(json.dumps(written, indent=2, sort_keys=True))
    for name, content in files.items():
        (out / name).write_text(content)
    if tokenizer is not None:
        for name in RANDOM_COPIED:
            if (tokenizer / name).is_file() and name not in files:
                (out / name).write_bytes((tokenizer / name).read_bytes())
        (out / RANDOM_TOKENIZER).write_text(json.dumps(origin, indent=2))
    (out / RANDOM_MARKER).write_text(json.dumps(marker, indent=2))
    return out


def random_weights(path: Path) -> dict | None:
    """The marker of a `random:` folder (how its weights are drawn), None for a real checkpoint."""
    marker = path / RANDOM_MARKER
    return json.loads(marker.read_text()) if marker.is_file() else None


def read_config(path: Path) -> dict:
    file = path / "config.json"
    if not file.is_file():
        raise DSparkError(f"{path}: no config.json; is this a model folder?")
    try:
        cfg = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DSparkError(f"{file}: unreadable config ({type(exc).__name__}: {exc}); re-download the checkpoint") from None
    if not isinstance(cfg, dict):
        raise DSparkError(f"{file}: unreadable config (a JSON object was expected)")
    return cfg


def _bin_files(path: Path, reads_bin: bool) -> list[Path]:
    """The `pytorch_model*.bin` files to read where a folder has no safetensors (formats that allow it),
    else one line: no weights."""
    files = sorted(path.glob("pytorch_model*.bin")) if reads_bin else []
    if not files:
        also = " (nor pytorch_model.bin)" if reads_bin else "; only safetensors checkpoints are loaded"
        raise DSparkError(f"{path}: no .safetensors weights{also}")
    return files


def _read_bins(files: list[Path]) -> dict[str, Tensor]:
    """Pickled tensor files read with `weights_only=True`: plain tensors, no code run."""
    tensors: dict[str, Tensor] = {}
    for f in files:
        try:
            state = torch.load(f, weights_only=True, map_location="cpu")
        except Exception as exc:
            raise DSparkError(f"{f}: not a plain tensor file (torch.load with weights_only refused it: "
                              f"{type(exc).__name__}); convert the checkpoint to safetensors") from None
        if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in state.items()):
            raise DSparkError(f"{f}: expected a dict of named tensors; convert the checkpoint to safetensors")
        tensors.update(state)
    return tensors


def read_weights(path: Path, reads_bin: bool = False) -> dict[str, Tensor]:
    """Every tensor of a checkpoint folder: its safetensors, else (`reads_bin`) its pytorch_model*.bin."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        return _read_bins(_bin_files(path, reads_bin))
    tensors: dict[str, Tensor] = {}
    for f in files:
        try:
            tensors.update(load_file(f))
        except (SafetensorError, OSError) as exc:
            raise DSparkError(f"{f}: unreadable safetensors file ({exc}); re-download the checkpoint") from None
    return tensors


def check_tensors(expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]], where: str,
                  optional: tuple[str, ...] = (), keys: KeyTable = TARGET_KEYS) -> None:
    """Every expected tensor present with its shape, nothing unknown but what the format's key table
    ignores; one line for the first problem. `found` maps stored names to shapes."""
    for key, shape in expected.items():
        if key not in found:
            if key.startswith(optional):
                continue
            raise DSparkError(f"{where}: tensor '{key}' is missing from the checkpoint")
        if tuple(found[key]) != tuple(shape):
            raise DSparkError(f"{where}: tensor '{key}' has shape {list(found[key])}, expected {list(shape)} from its config")
    unknown = [k for k in found if k not in expected and not keys.is_ignored(k)]
    if unknown:
        raise DSparkError(f"{where}: unexpected tensor '{unknown[0]}' (of {len(unknown)}); does the config match the weights?")


def shapes(module: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def weight_shapes(path: Path, reads_bin: bool = False) -> dict[str, tuple[int, ...]]:
    """Tensor shapes from the safetensors headers, without reading the data (a .bin is read whole)."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        return {k: tuple(v.shape) for k, v in _read_bins(_bin_files(path, reads_bin)).items()}
    out = {}
    for f in files:
        try:
            with safe_open(f, "pt") as handle:
                out.update({k: tuple(handle.get_slice(k).get_shape()) for k in handle.keys()})
        except (SafetensorError, OSError) as exc:
            raise DSparkError(f"{f}: unreadable safetensors file ({exc}); re-download the checkpoint") from None
    return out


def _assign(module: nn.Module, tensors: dict[str, Tensor], where: str, optional: tuple[str, ...] = (),
            keys: KeyTable = TARGET_KEYS) -> None:
    """Load `tensors` into `module` after checking every name and shape."""
    expected = module.state_dict()
    check_tensors(shapes(module), {k: tuple(v.shape) for k, v in tensors.items()}, where, optional, keys)
    for key, value in tensors.items():
        if key in expected and expected[key].is_floating_point() and not value.is_floating_point():
            raise DSparkError(f"{where}: tensor '{key}' has dtype {value.dtype}, expected a floating-point weight")
    module.load_state_dict({k: v for k, v in tensors.items() if k in expected}, strict=False, assign=True)


def pick_dtype(dtype: str | torch.dtype, device: torch.device | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    return getattr(torch, resolved_dtype(dtype, torch.device(device).type))


@dataclass
class LoadedTarget:
    model: Qwen3Target
    path: Path
    hf_config: dict
    stop_token_ids: tuple[int, ...]


def load_target(name_or_path: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype = "auto",
                revision: str | None = None) -> LoadedTarget:
    path = resolve_path(name_or_path, revision)
    hf = read_config(path)
    cfg = TargetConfig.from_hf(hf, where=str(name_or_path))
    if random_weights(path):
        from dspark.synthetic.presets import build_random

        model = build_random(cfg, None, str(device), pick_dtype(dtype, device), seed=RANDOM_INIT["target_seed"])[0]
        return LoadedTarget(model, path, hf, _stop_tokens(path, cfg))
    with torch.device("meta"):
        model = Qwen3Target(cfg)
    tensors = read_weights(path)
    optional = ("lm_head.",) if cfg.tie_word_embeddings else ()
    _assign(model, tensors, f"target {name_or_path}", optional)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model = model.to(device=device, dtype=pick_dtype(dtype, device)).eval().requires_grad_(False).fuse()
    return LoadedTarget(model, path, hf, _stop_tokens(path, cfg))


def _stop_tokens(path: Path, cfg: TargetConfig) -> tuple[int, ...]:
    gen = path / "generation_config.json"
    if gen.is_file():
        try:
            eos = json.loads(gen.read_text()).get("eos_token_id")
        except (OSError, json.JSONDecodeError):
            eos = None
        if eos is not None:
            return tuple(eos) if isinstance(eos, list) else (int(eos),)
    return cfg.eos_token_ids


@dataclass
class LoadedDraft:
    model: DraftModel | Eagle3Draft
    path: Path
    config: AnyDraftConfig
    # The embedding (and a block draft's LM head) are the target's: absent, or identical copies. An EAGLE-3
    # draft always embeds with the target's (its head is its own).
    shares_embeddings: bool


def load_draft_config(name_or_path: str | Path, revision: str | None = None) -> tuple[Path, AnyDraftConfig]:
    path = resolve_path(name_or_path, revision)
    return path, draft_config_from_hf(read_config(path), where=f"draft {name_or_path}")


def _meta_model(cfg: AnyDraftConfig) -> DraftModel | Eagle3Draft:
    """The draft model of `cfg` with no storage: its tensor names and shapes."""
    with torch.device("meta"):
        return Eagle3Draft(cfg) if isinstance(cfg, Eagle3Config) else DraftModel(cfg)


def check_draft(path: Path, cfg: AnyDraftConfig, where: str, target: TargetConfig | None = None) -> dict[str, tuple]:
    """Check a draft's tensors (from file headers) against its config, and the config against `target`.
    Returns the stored names and shapes."""
    fmt = formats.get(cfg.format)
    if random_weights(path):  # drawn at load, to the config's own shapes
        if target is not None:
            cfg.check_target(target, where)
        return {fmt.KEYS.stored(k): shape for k, shape in shapes(_meta_model(cfg)).items()}
    found = weight_shapes(path, fmt.READS_BIN)
    eagle3 = weights_signature(found)
    if eagle3 and fmt.KIND != "eagle3":  # the community-draft case: EAGLE-3 weights under a DSpark/DFlash config
        raise DSparkError(f"{where}: its weights are an EAGLE-3 draft ({eagle3}), but its config says "
                          f"{cfg.architecture or cfg.format} ({cfg.method}); run it as method eagle3")
    if target is not None:
        cfg.check_target(target, where)
    found = {fmt.KEYS.canonical(k): shape for k, shape in found.items()}
    if "d2t" in found and not cfg.reduced_vocab:
        raise DSparkError(f"{where}: has a d2t vocabulary map but draft_vocab_size equals the target vocabulary")
    expected = {fmt.KEYS.stored(k): shape for k, shape in shapes(_meta_model(cfg)).items()}
    # An absent embedding (or block head) is the target's; the frozen copies drafts ship are checked like any tensor.
    check_tensors(expected, found, where, _absent_embeddings(found, cfg), fmt.KEYS)
    return found


def _absent_embeddings(found: dict, cfg: AnyDraftConfig) -> tuple[str, ...]:
    """What the target provides when the checkpoint lacks it: the embedding, and a block draft's head (an
    EAGLE-3 draft's head is its own, over its vocabulary, and required)."""
    shared = ("embed_tokens.",) if isinstance(cfg, Eagle3Config) else ("embed_tokens.", "lm_head.")
    return tuple(k for k in shared if k + "weight" not in found)


def load_draft(name_or_path: str | Path, target: Qwen3Target, revision: str | None = None) -> LoadedDraft:
    """Load a draft in any of the formats, check it against `target`, put it on the target's device and
    dtype (d2t stays int64) and fuse it."""
    where = f"draft {name_or_path}"
    path, cfg = load_draft_config(name_or_path, revision)
    fmt = formats.get(cfg.format)
    check_draft(path, cfg, where, target.config)
    if random_weights(path):
        from dspark.synthetic.presets import random_draft_for

        return LoadedDraft(random_draft_for(target, cfg, seed=RANDOM_INIT["draft_seed"]), path, cfg, True)
    tensors = {fmt.KEYS.ours(k): v for k, v in read_weights(path, fmt.READS_BIN).items()}
    has_embed, has_head = "embed_tokens.weight" in tensors, "lm_head.weight" in tensors
    model = _meta_model(cfg)
    _assign(model, tensors, where, _absent_embeddings(tensors, cfg), fmt.KEYS)
    if not has_embed:
        model.embed_tokens = None
    if not has_head:
        model.lm_head = None
    fmt.load_extras(path, model)
    if cfg.reduced_vocab:
        ids = torch.arange(cfg.vocab_size) + model.d2t
        if ids.min() < 0 or ids.max() >= cfg.backbone.vocab_size:
            raise DSparkError(f"{where}: d2t maps draft ids outside the target vocabulary")
    model = model.to(device=target.lm_head.weight.device, dtype=target.lm_head.weight.dtype)
    model = model.eval().requires_grad_(False)  # d2t stays int64
    if isinstance(model, Eagle3Draft):
        _share_target_embedding(model, target, where)
        return LoadedDraft(model.fuse(), path, cfg, True)
    # Share the target's embedding and head when the draft has none or ships identical copies.
    embed_same = not has_embed or _same(model.embed_tokens.weight, target.model.embed_tokens.weight)
    head_same = not has_head or (not cfg.reduced_vocab and _same(model.lm_head.weight, target.lm_head.weight))
    if embed_same and head_same:
        model.share_embeddings(target.model.embed_tokens, target.lm_head)
    else:
        if not has_embed:
            model.embed_tokens = target.model.embed_tokens
        if not has_head:
            model.share_embeddings(model.embed_tokens, target.lm_head)
    return LoadedDraft(model.fuse(), path, cfg, embed_same and head_same)


def _share_target_embedding(model: Eagle3Draft, target: Qwen3Target, where: str) -> None:
    """An EAGLE-3 draft embeds with the target's table: ours feeds its context rows the target's embedding
    output (dspark/drafters/eagle3.py), so a copy that differs is refused, not run wrong."""
    own = model.embed_tokens
    if own is not None and not _same(own.weight, target.model.embed_tokens.weight):
        raise DSparkError(f"{where}: its embed_tokens differ from the target's; this engine's EAGLE-3 drafter embeds "
                          "the context with the target's table, so it cannot run this draft (vLLM can: --backend vllm)")
    model.share_embeddings(target.model.embed_tokens)


def _same(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and bool(torch.equal(a, b))


# ---- saving (the real formats; used by make-tiny, the tests and the trainer) ----------------------

def target_hf_config(cfg: TargetConfig, dtype: torch.dtype) -> dict:
    """The Hugging Face `config.json` of a Qwen3 target of `cfg` stored in `dtype`."""
    return cfg.backbone.hf_fields() | {
        "architectures": ["Qwen3ForCausalLM"],
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "max_position_embeddings": cfg.max_position_embeddings,
        "eos_token_id": list(cfg.eos_token_ids) or None,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def save_target(model: Qwen3Target, out: Path, extra_config: dict | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    hf = target_hf_config(cfg, model.lm_head.weight.dtype) | (extra_config or {})
    (out / "config.json").write_text(json.dumps(hf, indent=2))
    if cfg.eos_token_ids:
        (out / "generation_config.json").write_text(json.dumps({"eos_token_id": list(cfg.eos_token_ids)}, indent=2))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight")
    save_safetensors(state, out / "model.safetensors")


def save_draft(model: DraftModel | Eagle3Draft, out: Path, fmt: str, target_config: TargetConfig | None = None,
               verifier: str = "", with_embeddings: bool = True) -> None:
    """Write `model` in format `fmt`: a block draft as a DeepSpec flat, speculators, or z-lab DFlash
    checkpoint (spec §1), an EAGLE-3 draft as eagle, speculators-eagle3 or deepspec-eagle3 (see
    `dspark.formats`). `with_embeddings=False` leaves out the frozen copies of the target's embedding
    (and a block draft's head; the loader then shares the target's), as z-lab checkpoints always do."""
    cfg = model.config
    module = formats.get(fmt)
    kind = "eagle3" if isinstance(cfg, Eagle3Config) else "block"
    if module.KIND != kind:
        raise DSparkError(f"the {fmt} format holds {module.KIND} drafts, not {kind} ones; use one of "
                          f"{', '.join(formats.names(kind))}")
    if getattr(cfg, "selector_rank", 0) and fmt != "zlab":
        raise DSparkError(f"a DFlash 2 draft is saved in z-lab's format (zlab) only (the {fmt} format has no DFlash 2 fields)")
    out.mkdir(parents=True, exist_ok=True)
    num_target_layers = cfg.num_target_layers or (target_config.backbone.num_layers if target_config else None)
    module.save(model, out, num_target_layers, verifier, with_embeddings)

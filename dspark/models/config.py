"""Normalised configurations: the Qwen3 target and one draft description for all three formats.

The draft formats differ in where they keep the same facts (see ../shared/docs/dspark-spec.md §1);
each format's module in `dspark.formats` reads its config.json into the fields of `DraftConfig`.
Everything downstream sees only `DraftConfig`, whose `target_layer_ids` follow DeepSpec's
convention: the 0-based index of the target decoder layer whose *output* is tapped.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from dspark import formats
from dspark.errors import DSparkError
from dspark.formats.common import require, vllm_ids

MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")
# keys of a draft's config.json that vLLM reads as its speculative options where the run gives none (kept in the
# config's `extra`, so that the harness holds them against the system's own without reading the file again)
VLLM_OWN = ("dspark_draft_topk",)


def _malformed(where: str, exc: Exception) -> DSparkError:
    return DSparkError(f"{where}: malformed config.json ({type(exc).__name__}: {exc}); re-download the checkpoint")


def _rope_theta(cfg: dict, where: str) -> float:
    """RoPE base from `rope_parameters` (transformers 5) or `rope_theta` (older); default type only."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type != "default":
        raise DSparkError(f"{where}: rope type '{rope_type}' is not supported; only default RoPE (Qwen3) is")
    theta = params.get("rope_theta", cfg.get("rope_theta"))
    if theta is None:
        raise DSparkError(f"{where}: config.json has neither rope_parameters.rope_theta nor rope_theta")
    return float(theta)


@dataclass(frozen=True)
class BackboneConfig:
    """The Qwen3 decoder-layer shapes shared by the target and the draft."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    attention_bias: bool = False

    @classmethod
    def from_hf(cls, cfg: dict, where: str) -> "BackboneConfig":
        if cfg.get("hidden_act", "silu") != "silu":
            raise DSparkError(f"{where}: hidden_act '{cfg['hidden_act']}' is not supported (Qwen3 uses silu)")
        if cfg.get("use_sliding_window"):
            raise DSparkError(f"{where}: sliding-window attention is not supported; set use_sliding_window false")
        hidden = int(require(cfg, "hidden_size", where))
        heads = int(require(cfg, "num_attention_heads", where))
        return cls(
            hidden_size=hidden,
            intermediate_size=int(require(cfg, "intermediate_size", where)),
            num_layers=int(require(cfg, "num_hidden_layers", where)),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=_rope_theta(cfg, where),
            vocab_size=int(require(cfg, "vocab_size", where)),
            attention_bias=bool(cfg.get("attention_bias", False)),
        )

    def hf_fields(self) -> dict:
        """The same shapes as Hugging Face Qwen3 config fields (used when saving)."""
        return {
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "vocab_size": self.vocab_size,
            "attention_bias": self.attention_bias,
            "hidden_act": "silu",
            "model_type": "qwen3",
        }


@dataclass(frozen=True)
class TargetConfig:
    backbone: BackboneConfig
    tie_word_embeddings: bool
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...] = ()

    @classmethod
    def from_hf(cls, cfg: dict, where: str = "target") -> "TargetConfig":
        model_type = cfg.get("model_type")
        if model_type != "qwen3":
            raise DSparkError(
                f"{where}: model_type '{model_type}' is not supported by the native backend; it runs Qwen3 targets"
            )
        try:
            eos = cfg.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
            return cls(
                backbone=BackboneConfig.from_hf(cfg, where),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 32768)),
                eos_token_ids=eos_ids,
            )
        except (TypeError, ValueError, AttributeError) as exc:
            raise _malformed(where, exc) from None


class _DraftVocabulary:
    """The vocabulary a draft scores, the same for every kind of draft: `draft_vocab_size` target tokens
    where its checkpoint reduces it (mapped back by `d2t`), else the target's whole vocabulary; and the
    target vocabulary it embeds, which must be its target's."""

    @property
    def vocab_size(self) -> int:
        return self.draft_vocab_size or self.backbone.vocab_size

    @property
    def reduced_vocab(self) -> bool:
        return self.vocab_size != self.backbone.vocab_size

    def check_vocabulary(self, t: BackboneConfig, where: str) -> None:
        """Refuse a target whose vocabulary is not the one the draft embeds (`check_target`)."""
        if self.backbone.vocab_size != t.vocab_size:
            raise DSparkError(f"{where}: draft vocabulary {self.backbone.vocab_size} != target vocabulary "
                              f"{t.vocab_size}; the draft was trained for another target")


@dataclass(frozen=True)
class DraftConfig(_DraftVocabulary):
    """One description of a DSpark or DFlash draft, whatever format it was saved in."""

    format: str  # deepspec | speculators | zlab
    backbone: BackboneConfig  # vocab_size here is the target vocabulary the draft reads
    block_size: int
    target_layer_ids: tuple[int, ...]  # DeepSpec convention: outputs of these 0-based target layers
    sample_from_anchor: bool  # True: anchor-first (slot k predicts p+k+1); False: fill-in (slot k predicts p+k)
    mask_token_id: int
    markov_rank: int = 0
    markov_head_type: str | None = None
    confidence_head: bool = False
    confidence_head_with_markov: bool = False
    draft_vocab_size: int | None = None  # None: the full target vocabulary
    num_target_layers: int | None = None
    architecture: str = ""
    # z-lab's layer kinds (`dspark.formats.zlab`), per draft layer; () where every layer is the default one
    layer_causal: tuple[bool, ...] = ()  # True: a block query sees the block up to its own slot only
    layer_window: tuple[int | None, ...] = ()  # a sliding window: keys fewer than this many positions away
    # z-lab's scalars: the block's embeddings times the first; the logits times the second, then soft-capped
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    # z-lab's DFlash 2 (`dspark.models.dflash2`): each layer's grouped dynamic causal convolutions (taps, channels
    # per group) and the candidate selector (codebook rank, candidates per slot); 0 for every other draft
    conv_kernel_size: int = 0
    conv_group_size: int = 0
    selector_rank: int = 0
    selector_top_k: int = 0
    extra: dict = field(default_factory=dict, compare=False)  # `VLLM_OWN` keys the checkpoint sets

    @property
    def num_drafts(self) -> int:
        """Tokens proposed per block: every slot when anchor-first, all but the anchor slot otherwise."""
        return self.block_size if self.sample_from_anchor else self.block_size - 1

    @property
    def method(self) -> str:
        """dspark when a Markov head corrects the block, dflash2 when z-lab's candidate selector does, dflash
        for a plain parallel block."""
        return "dspark" if self.markov_rank > 0 else "dflash2" if self.selector_rank > 0 else "dflash"

    @property
    def vllm_method(self) -> str:
        """The vLLM speculative method that loads this checkpoint (spec §8): `dspark` for the anchor-first
        block layout (DeepSpec's, with or without a Markov head), `dflash` for z-lab's fill-in layout."""
        return "dspark" if self.sample_from_anchor else "dflash"

    @property
    def vllm_note(self) -> str | None:
        """What a vLLM user must know to load it, where there is something."""
        if self.sample_from_anchor and self.markov_rank == 0:
            return "anchor-first DFlash: set method dspark explicitly (vLLM's name-based auto-detection picks dflash)"
        return None

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(num_drafts=self.num_drafts, method=self.method, vllm_method=self.vllm_method,
                   vllm_note=self.vllm_note)
        return out

    # ---- parsing -------------------------------------------------------------------------------

    @classmethod
    def from_hf(cls, cfg: dict, where: str = "draft") -> "DraftConfig":
        """A draft config.json in any of the formats (`dspark.formats` tells which and reads it)."""
        try:
            out = cls(**formats.parse(cfg, where, BackboneConfig.from_hf))
            out.validate(where)
        except (TypeError, ValueError, AttributeError) as exc:  # a field of the wrong type, e.g. "block_size": "7a"
            raise _malformed(where, exc) from None
        return out

    def validate(self, where: str) -> None:
        if self.block_size < 2:
            raise DSparkError(f"{where}: block_size {self.block_size} is too small; a block needs at least 2 slots")
        ids = self.target_layer_ids
        if not ids or list(ids) != sorted(set(ids)) or ids[0] < -1:
            raise DSparkError(f"{where}: tapped target layers {list(ids)} must be strictly increasing ids >= -1")
        if self.markov_head_type not in (None, *MARKOV_HEAD_TYPES):
            raise DSparkError(
                f"{where}: markov_head_type '{self.markov_head_type}' is unknown; expected one of {MARKOV_HEAD_TYPES}"
            )
        if not 0 <= self.mask_token_id < self.backbone.vocab_size:
            raise DSparkError(
                f"{where}: mask_token_id {self.mask_token_id} is outside the vocabulary of {self.backbone.vocab_size}"
            )

    def check_target(self, target: TargetConfig, where: str = "draft") -> None:
        """Fail with one clear line when this draft cannot run against `target`."""
        t = target.backbone
        if self.backbone.hidden_size != t.hidden_size:
            raise DSparkError(
                f"{where}: draft hidden_size {self.backbone.hidden_size} != target hidden_size {t.hidden_size}; "
                "the draft was trained for another target"
            )
        self.check_vocabulary(t, where)
        bad = [i for i in self.target_layer_ids if i >= t.num_layers - 1]
        if bad:
            raise DSparkError(
                f"{where}: tapped target layer {bad[0]} is too deep for a {t.num_layers}-layer target "
                f"(taps must be below its last layer, {t.num_layers - 1})"
            )
        if self.mask_token_id >= t.vocab_size:
            raise DSparkError(f"{where}: mask_token_id {self.mask_token_id} is outside the target vocabulary")


@dataclass(frozen=True)
class Eagle3Config(_DraftVocabulary):
    """One description of an EAGLE-3 draft, whatever format it was saved in (`dspark.formats.eagle3`).

    One decoder layer whose attention reads [norm(embedding), norm(hidden)] (2H wide), fed at the first
    chain step with `fc` of the target's tapped states and afterwards with its own pre-norm output; a
    final norm and a head over the draft vocabulary (`d2t` maps draft ids to target ids). It has no
    fixed block: `num_speculative_tokens` is the chain length its checkpoint suggests (a run may set
    another)."""

    format: str  # eagle | speculators-eagle3 | deepspec-eagle3
    backbone: BackboneConfig  # the draft layer's shapes; vocab_size is the target vocabulary it embeds
    target_layer_ids: tuple[int, ...]  # DeepSpec convention: outputs of these 0-based target layers
    num_speculative_tokens: int = 7
    qk_norm: bool = False  # per-head q/k RMSNorm before RoPE (Qwen3-style layer); Llama-style without
    norm_before_residual: bool = False  # the residual is the normed hidden input rather than the raw one
    draft_vocab_size: int | None = None  # None: the full target vocabulary
    target_hidden_size: int | None = None  # None: the draft's hidden size
    num_target_layers: int | None = None
    architecture: str = ""
    extra: dict = field(default_factory=dict, compare=False)  # `VLLM_OWN` keys the checkpoint sets

    method = "eagle3"
    vllm_method = "eagle3"
    vllm_note = None
    markov_rank = 0  # (the block drafts' fields a caller may read of any draft)
    confidence_head = False

    @property
    def num_drafts(self) -> int:
        return self.num_speculative_tokens

    @property
    def block_size(self) -> int:
        """Tokens proposed per round (a chain, not a block: the name every drafter answers to)."""
        return self.num_speculative_tokens

    @property
    def feature_size(self) -> int:
        """Width of one tapped target state."""
        return self.target_hidden_size or self.backbone.hidden_size

    @property
    def vllm_aux_layer_ids(self) -> tuple[int, ...]:
        """The taps in vLLM's convention (`eagle_aux_hidden_state_layer_ids`: the state entering layer k),
        ours + 1."""
        return tuple(vllm_ids(self.target_layer_ids))

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(num_drafts=self.num_drafts, method=self.method, vllm_method=self.vllm_method,
                   vllm_note=self.vllm_note, vllm_aux_layer_ids=list(self.vllm_aux_layer_ids))
        return out

    def validate(self, where: str) -> None:
        if self.backbone.num_layers != 1:
            raise DSparkError(f"{where}: an EAGLE-3 draft of {self.backbone.num_layers} layers; only one-layer "
                              "EAGLE-3 drafts (every published one) are supported")
        ids = self.target_layer_ids
        if not ids or list(ids) != sorted(set(ids)) or ids[0] < 0:
            raise DSparkError(f"{where}: tapped target layers {list(ids)} must be strictly increasing ids >= 0")
        if self.num_speculative_tokens < 1:
            raise DSparkError(f"{where}: num_speculative_tokens {self.num_speculative_tokens} must be at least 1")

    def check_target(self, target: TargetConfig, where: str = "draft") -> None:
        """Fail with one clear line when this draft cannot run against `target`."""
        t = target.backbone
        if self.backbone.hidden_size != t.hidden_size:
            raise DSparkError(f"{where}: draft hidden_size {self.backbone.hidden_size} != target hidden_size "
                              f"{t.hidden_size}; the draft was trained for another target (an EAGLE-3 draft embeds "
                              "tokens with its target's table)")
        if self.feature_size != t.hidden_size:
            raise DSparkError(f"{where}: the draft reads target states of width {self.feature_size}, the target's "
                              f"are {t.hidden_size}; the draft was trained for another target")
        self.check_vocabulary(t, where)
        bad = [i for i in self.target_layer_ids if i >= t.num_layers]
        if bad:
            raise DSparkError(f"{where}: tapped target layer {bad[0]} does not exist in a {t.num_layers}-layer target")


AnyDraftConfig = DraftConfig | Eagle3Config


def draft_config_from_hf(cfg: dict, where: str = "draft") -> AnyDraftConfig:
    """A draft config.json in any format, block (DSpark, DFlash) or EAGLE-3, as its normalised config."""
    try:
        kind, fields = formats.parse_any(cfg, where, BackboneConfig.from_hf)
        own = {key: cfg[key] for key in VLLM_OWN if key in cfg}
        out = (Eagle3Config if kind == "eagle3" else DraftConfig)(**fields, extra=own)
        out.validate(where)
    except (TypeError, ValueError, AttributeError) as exc:
        raise _malformed(where, exc) from None
    return out


def draft_kind(hf: dict) -> str | None:
    """What a config.json is as a draft ("dflash2 draft (zlab format)"), or None where no draft format claims it: a
    model (a target, or a draft model). A DFlash draft's config is a flat Qwen3 one too: read as a model, it was run
    as one and failed on its tensors, naming it a target ("tensor 'model.embed_tokens.weight' is missing")."""
    try:
        fmt = formats.detect_format(hf)
    except DSparkError:  # no draft format claims it
        return None
    try:
        return f"{draft_config_from_hf(hf, 'draft').method} draft ({fmt} format)"
    except DSparkError:  # (a draft's config with a mistake of its own: named by its format alone)
        return f"{fmt}-format draft"


__all__ = ["MARKOV_HEAD_TYPES", "AnyDraftConfig", "BackboneConfig", "TargetConfig", "DraftConfig", "Eagle3Config",
           "draft_config_from_hf", "draft_kind"]

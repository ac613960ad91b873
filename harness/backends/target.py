"""A target read from its files alone (config and tokenizer, no weights): what a backend whose engine
loads the model itself (vLLM, a server) still needs on our side, for the prompts and the limits."""

from __future__ import annotations

from pathlib import Path

from dspark.checkpoint import read_config, resolve_path
from dspark.models.config import TargetConfig


class TargetFiles:
    def _read_target(self, target: str, revision: str | None) -> None:
        self.path = resolve_path(target, revision)
        self.config = TargetConfig.from_hf(read_config(self.path), f"target {target}")

    @property
    def tokenizer_path(self) -> Path:
        return self.path

    @property
    def max_context(self) -> int:
        return self.config.max_position_embeddings

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return tuple(self.config.eos_token_ids)

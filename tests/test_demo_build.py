"""The demo rebuild script runs every stage (toy sizes) and leaves loadable models behind."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
transformers = pytest.importorskip("transformers")


def test_smoke_build_produces_loadable_models_and_figures(tmp_path):
    spec = importlib.util.spec_from_file_location("demo_build", ROOT / "experiments" / "demo" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    pin = json.loads(build.corpus_mod.PIN.read_text())
    try:
        build.corpus_mod.check_pin(pin, build.corpus_mod.stdlib_dir())
    except build.corpus_mod.PinError as exc:
        pytest.skip(f"the corpus is pinned to another Python: {exc}")
    # the corpus as the GPU machine gets it: written compressed on the pinned Python, read back by the build
    corpus = build.corpus_mod.build(pin, build.corpus_mod.stdlib_dir())
    packed = tmp_path / "corpus.json.gz"
    packed.write_bytes(gzip.compress(json.dumps(corpus).encode()))
    assert build.main(["--out", str(tmp_path), "--smoke", "--corpus", str(packed)]) == 0

    from dspark.checkpoint import load_draft, load_target

    target = load_target(tmp_path / "target")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "target")  # a standard HF folder
    assert hf.config.vocab_size == target.model.config.backbone.vocab_size
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "target")
    assert tok.chat_template and len(tok) == target.model.config.backbone.vocab_size - 1  # one free row: the mask
    for name, method in (("dspark", "dspark"), ("dflash", "dflash")):
        draft = load_draft(tmp_path / name, target.model)
        assert draft.config.method == method and draft.config.block_size == 7
        assert draft.config.mask_token_id == len(tok)
    figures = json.loads((tmp_path / "figures.json").read_text())
    for key in ("dspark_T0_acceptance_length", "dflash_T0_acceptance_length", "ngram_T0_acceptance_length",
                "dspark_T1_acceptance_length", "target_T0_distinct_4gram"):
        assert figures[key] >= 0
    assert figures["greedy_outputs_equal_plain"] is True
    assert figures["corpus_sha256"] == hashlib.sha256(json.dumps(corpus).encode()).hexdigest()

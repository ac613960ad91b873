"""Tiny models shared by the tests that hold our engine against z-lab's `dflash_generate` (tests/test_zlab_layouts.py,
tests/test_dflash2.py): a transformers Qwen3 target and z-lab drafts on shared random weights, and one run of each
loop recording its tokens, rounds and proposals."""

from __future__ import annotations

import time

import torch
import transformers
from cli_runner import run_cli
from dflash import model as zlab

from dspark.drafters import drafter_for
from dspark.engine import Engine, GenerationConfig

VOCAB, HIDDEN, TARGET_LAYERS, MASK = 12, 64, 5, 11
PROMPT = [3, 10, 5, 9, 1, 8, 0, 7, 7, 2, 4, 6]
NEW_TOKENS = 40
FAVOURITE = 1.5


def qwen3(**extra) -> transformers.Qwen3Config:
    return transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, max_position_embeddings=256,
        rms_norm_eps=1e-6, **extra)


def spread(model, seed: int) -> None:
    """Weights wider than the 0.02 init, so that the argmaxes are not of near-ties."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3 if p.dim() > 1 else torch.rand(p.shape, generator=g) + 0.5)


def lean(model, favourite: float = 0.0) -> None:
    """A lean shared by target and draft, so that drafts are often accepted and the rounds carry information:
    hidden dimension 0 holds the embeddings' constant 3 through every layer (no layer writes it) and, in the
    shared head, `favourite` on token 1 reads it. Random weights alone are almost never accepted."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p[0] = 0
            elif name.endswith("embed_tokens.weight"):
                p[:, 0] = 3.0
            elif name.endswith("lm_head.weight"):
                p[1, 0] = favourite


def build_target(folder) -> transformers.Qwen3ForCausalLM:
    """transformers' target, leaning as `lean` says, saved in `folder` (our loaders read it from there)."""
    torch.manual_seed(0)
    hf = transformers.Qwen3ForCausalLM(qwen3(num_hidden_layers=TARGET_LAYERS, tie_word_embeddings=False)).eval()
    spread(hf, seed=0)
    lean(hf, FAVOURITE)
    hf.save_pretrained(folder)
    return hf


def dry_run(monkeypatch, capfd, tmp_path, target, draft, method: str, backend: str = "native", name: str = "sys"
            ) -> tuple[int, str]:
    """`run --dry-run` of an experiment of one system (`draft` under `method` for `target`, on `backend`): its exit
    code and the last line it wrote to stderr."""
    experiment = tmp_path / f"{name}.toml"
    experiment.write_text(f'name = "{name}"\ntarget = "{target}"\nbackend = "{backend}"\ndataset = "demo"\n'
                          'sampling = {temperatures = [0.0], output_len = 8, num_prompts = 1, turns = "first"}\n'
                          f'systems = [{{name = "{name}", draft = "{draft}", method = "{method}"}}]\n')
    code, _, err = run_cli(monkeypatch, capfd, "run", "--experiment", experiment, "--device", "cpu", "--dry-run")
    return code, err.strip().splitlines()[-1]


def cpu_clock(monkeypatch) -> None:
    """z-lab's loop times its rounds with torch.cuda.synchronize (for `return_stats`, which gives the rounds):
    the same clock without the synchronize on a CPU; nothing else of the loop is touched."""
    monkeypatch.setattr(zlab, "_cuda_time", time.perf_counter)


def zlab_run(draft, target, prompt: list[int] = PROMPT, new_tokens: int = NEW_TOKENS, temperature: float = 0.0
             ) -> tuple[list[int], list[int], list[list[int]]]:
    """z-lab's tokens, tokens per round and each round's proposal: at T = 0 the argmax of a DFlash draft's logits
    (which its loop takes), a DFlash 2 draft's selector path (`propose`)."""
    proposals = []
    if isinstance(draft, zlab.DFlash2DraftModel):
        propose = draft.propose

        def recorded(*args):
            out = propose(*args)
            proposals.append(out[0][0].tolist())
            return out

        draft.propose = recorded
    else:
        logits_of = draft.compute_logits

        def recorded(hidden, head):
            logits = logits_of(hidden, head)
            proposals.append(logits.argmax(-1)[0].tolist())
            return logits

        draft.compute_logits = recorded
    out = zlab.dflash_generate(draft, target, torch.tensor([prompt]), new_tokens, None, temperature=temperature,
                               return_stats=True)
    return out.output_ids[0, len(prompt):].tolist(), out.acceptance_lengths, proposals


def our_run(target, model, prompt: list[int] = PROMPT, new_tokens: int = NEW_TOKENS
            ) -> tuple[list[int], list[int], list[list[int]]]:
    """Our engine's tokens, tokens per round and proposals at T = 0, with the drafter `drafter_for` gives."""
    drafter, proposals = drafter_for(model), []
    propose = drafter.propose

    def recorded(state, *args, **kwargs):
        propose(state, *args, **kwargs)
        proposals.append(state.draft_tokens[0].tolist())

    drafter.propose = recorded
    result = Engine(target, drafter).generate(prompt, GenerationConfig(max_new_tokens=new_tokens, temperature=0.0))
    return result.tokens, result.acceptance_lengths, proposals

"""`dspark-bench generate`: one prompt, plainly or speculatively, and its rounds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from dspark.errors import DSparkError
from harness.cli import options
from harness.cli.render import err
from harness.runs.provenance import provenance
from harness.runs.threads import apply as apply_threads
from harness.runs.threads import choose as choose_threads


def generate(
    target: str = typer.Option(..., help="Target model: local folder or hub id (Qwen3)."),
    draft: Optional[str] = typer.Option(
        None, help="Draft (DeepSpec, speculators or z-lab format), or a Qwen3 model of the target's tokenizer (draft_model)."),
    ngram: bool = typer.Option(False, "--ngram", help="Draft with n-gram prompt lookup instead of a model."),
    no_draft: bool = typer.Option(False, "--no-draft", help="Plain autoregressive decoding (the baseline)."),
    prompt: Optional[str] = typer.Option(None, help="Prompt text, tokenized with the target's tokenizer."),
    prompt_ids: Optional[str] = typer.Option(None, help="Prompt token ids '1,2,3', used exactly as given."),
    chat: bool = typer.Option(False, "--chat", help="Wrap --prompt in the target's chat template (thinking off)."),
    max_new_tokens: int = typer.Option(128, min=1, help="Tokens to generate, the prefill token included."),
    temperature: float = typer.Option(0.0, min=0.0, help="0 is greedy; applied to target and draft alike."),
    seed: int = typer.Option(0, help="Seeds the independent draft, acceptance and target random streams."),
    confidence_threshold: float = typer.Option(
        0.0, min=0.0, max=1.0, help="Cut each proposal at the first slot whose confidence is below this."),
    num_speculative_tokens: int = typer.Option(
        7, min=1, help="Tokens an n-gram proposal may hold, or a draft model drafts a round."),
    ignore_eos: bool = typer.Option(False, "--ignore-eos", help="Do not stop at the target's stop tokens."),
    device: str = typer.Option("auto", help="auto, cpu, cuda, cuda:N."),
    dtype: str = typer.Option("auto", help="auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16."),
    no_cuda_graphs: bool = typer.Option(False, "--no-cuda-graphs", help="Run every step eagerly (the reference)."),
    threads: Optional[int] = typer.Option(None, help=options.THREADS_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of text."),
):
    """Generate from one prompt, plainly or speculatively, and report the rounds."""
    from dspark.checkpoint import load_target, read_config, resolve_path
    from dspark.dtypes import dtype_name
    from dspark.engine import Engine, GenerationConfig
    from dspark.models.config import TargetConfig
    from dspark.tokenizer import chat_prompt_ids, conversation
    from harness.backends.systems import draft_model_fit, draft_model_room, is_model, make_drafter

    if sum([draft is not None, ngram, no_draft]) != 1:
        raise DSparkError("choose exactly one of --draft D, --ngram, --no-draft")
    if (prompt is None) == (prompt_ids is None):
        raise DSparkError("give exactly one of --prompt TEXT or --prompt-ids 1,2,3")
    if chat and prompt is None:
        raise DSparkError("--chat applies to --prompt text; --prompt-ids are used exactly as given")
    if confidence_threshold > 0 and (no_draft or ngram):  # (plain decoding would ignore it without a word)
        raise DSparkError(f"--confidence-threshold {confidence_threshold:g} cuts a draft's proposals by its confidence "
                          f"head; {'--no-draft has no draft' if no_draft else 'n-gram lookup has no confidence head'}:"
                          " leave it out, or give a DSpark --draft")
    dev = options.device(device)
    dtype_name(dtype, "--dtype")
    # the prompt, from the target's config.json and tokenizer, checked against its vocabulary and context before
    # the weights are read
    target_path = resolve_path(target)
    tcfg = TargetConfig.from_hf(read_config(target_path), str(target))
    tokenizer = options.load_tokenizer(target_path, needed=prompt is not None)
    if prompt_ids is not None:
        ids = options.token_ids(prompt_ids)
        vocab = tcfg.backbone.vocab_size
        if max(ids) >= vocab or min(ids) < 0:
            raise DSparkError(f"--prompt-ids holds an id outside the target vocabulary (0..{vocab - 1})")
    elif chat:
        if not getattr(tokenizer, "chat_template", None):
            raise DSparkError(f"{target}: the tokenizer has no chat template; drop --chat")
        ids = chat_prompt_ids(tokenizer, conversation([prompt]))
    else:
        ids = tokenizer.encode(prompt, add_special_tokens=False)
    limit = tcfg.max_position_embeddings
    if ids and len(ids) + max_new_tokens > limit:
        room = f"give --max-new-tokens {limit - len(ids)} or less" if len(ids) < limit else "give a shorter prompt"
        raise DSparkError(f"--max-new-tokens {max_new_tokens}: with the prompt's {len(ids)} tokens, past the target's "
                          f"context of {limit} (max_position_embeddings); {room}")
    method = "ngram" if ngram else "plain" if no_draft else "draft"
    if draft is not None and is_model(read_config(resolve_path(draft))):  # a Qwen3 causal LM: the classic draft model
        problem = draft_model_fit(draft, target_path, tcfg) or draft_model_room(draft, len(ids) + max_new_tokens,
                                                                                "--max-new-tokens")
        if problem:
            raise DSparkError(problem)
        method = "draft_model"
    loaded = load_target(target, dev, dtype)
    n_threads, _ = choose_threads(threads, dev, loaded.path)
    apply_threads(n_threads)
    drafter, method, _ = make_drafter(method, draft, loaded.model, num_speculative_tokens)
    cfg = GenerationConfig(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                           stop_token_ids=() if ignore_eos else loaded.stop_token_ids,
                           confidence_threshold=confidence_threshold)
    use_graphs = False if no_cuda_graphs else None  # None: graphs on CUDA, eager on CPU
    result = Engine(loaded.model, drafter, use_graphs=use_graphs).generate(ids, cfg)
    text = tokenizer.decode(result.tokens) if tokenizer is not None else None
    if as_json:
        print(json.dumps({"method": method, "prompt_tokens": len(ids), "text": text, **result.to_dict(),
                          "settings": {"target": target, "draft": draft, "ngram": ngram, "temperature": temperature,
                                       "seed": seed, "max_new_tokens": max_new_tokens, "device": dev,
                                       "dtype": str(loaded.model.lm_head.weight.dtype).removeprefix("torch."),
                                       "confidence_threshold": confidence_threshold, "ignore_eos": ignore_eos,
                                       "threads": n_threads,
                                       "cuda_graphs": dev.startswith("cuda") and not no_cuda_graphs},
                          "provenance": provenance(dev)}))
        return
    # Plain print: Rich would wrap long output at the console width and expand tabs.
    print(text if text is not None else ",".join(map(str, result.tokens)))
    seconds = result.prefill_s + result.decode_s
    summary = f"{method}: {len(result.tokens)} tokens in {seconds:.2f} s ({len(result.tokens) / seconds:.1f} tok/s)"
    if result.num_rounds:
        summary += f", {result.num_rounds} rounds, acceptance length {result.acceptance_length:.2f}"
    err.print(summary + f", stop: {result.stop_reason}", highlight=False, soft_wrap=True)
    note = _toy_target_note(loaded)
    if note:
        err.print(note, style="dim", highlight=False, soft_wrap=True)


def _toy_target_note(loaded) -> str | None:
    """The line that says the text above means nothing where the target is the demo model (a few million
    parameters trained on a small corpus) or has random weights: a reader of the README's example saw
    nonsense and took it for a fault. What such a run shows is the accounting (tokens, rounds, acceptance)."""
    from dspark.checkpoint import DEMO_DIR, DEMO_MODELS, random_weights

    params = sum(p.numel() for p in loaded.model.parameters()) / 1e6
    if random_weights(Path(loaded.path)) is not None:
        return f"(random weights, {params:.1f} M parameters: the text means nothing; the rounds and timing are " \
               "the point)"
    if Path(loaded.path).resolve() == (DEMO_DIR / DEMO_MODELS["demo"]).resolve():
        return (f"(the demo target is a tiny {params:.1f} M-parameter model trained on a small corpus: its text is not "
                "meant to make sense; the point is the accounting: tokens, rounds, acceptance length)")
    return None

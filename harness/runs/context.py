"""Whether the run's requests fit the target's context, answered before any model loads.

A request is its prompt (the chat template over the user turns so far, and the replies before them) and up
to `output_len` generated tokens; the engine refuses one whose prompt + output_len passes the target's
`max_position_embeddings`. Found there, the mistake surfaced only after loading and warm-up, named an option
`run` does not have, and came back on every `--resume` of a run that can therefore never finish. So the
longest request is measured here, from the target's config.json and tokenizer (no weights): every selected
prompt's turns through the chat template, earlier replies counted at output_len tokens where --ignore-eos
makes them that long (else at none: a lower bound, so nothing that could fit is refused).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dspark.errors import DSparkError


@dataclass(frozen=True)
class Longest:
    positions: int  # prompt + output_len of the longest request
    prompt: int  # its prompt's tokens
    question_id: str | None  # its prompt (None: the prompts are not known)
    limit: int  # the target's context
    replies: int = 0  # earlier replies counted in its prompt (each output_len tokens)


def limit(settings: dict, positions: int) -> int:
    """The context the run's requests meet: the target's `positions` (max_position_embeddings), or vLLM's
    `max_model_len` where the run's engine arguments set it lower. Before any model loads (`check`) and for
    each later turn of a conversation (the runner), the one rule: a request within it is never refused."""
    cap = (settings.get("engine_args") or {}).get("max_model_len")
    if isinstance(cap, int) and not isinstance(cap, bool) and 0 < cap < positions:
        return cap
    return positions


def longest(settings: dict, rows: list | None, turns_of: dict[str, list[str]] | None) -> Longest:
    """The run's longest request against the target's context. `rows` None: the prompts are not known (the
    hub out of reach), counted as one token."""
    from dspark.checkpoint import read_config, resolve_path
    from dspark.models.config import TargetConfig
    from dspark.tokenizer import chat_prompt_ids, conversation
    from harness.specs.shaped import run_tokenizer

    path = resolve_path(settings["target"])
    most = limit(settings, TargetConfig.from_hf(read_config(path), f"target {settings['target']}")
                 .max_position_embeddings)
    out_len = settings["output_len"]
    if not rows:
        return Longest(1 + out_len, 1, None, most)
    tokenizer = run_tokenizer(Path(path), settings["target"], settings["split"])
    reply = "x" if settings["ignore_eos"] else ""  # (a placeholder: counted as out_len tokens below)
    best = Longest(0, 0, None, most)
    for row in rows:
        turns = turns_of[row.question_id]
        for k in range(len(turns)):
            prompt = len(chat_prompt_ids(tokenizer, conversation(turns[: k + 1], [reply] * k)))
            if reply:
                prompt += k * (out_len - 1)  # each earlier reply out_len tokens (the placeholder counted one)
            if prompt + out_len > best.positions:
                best = Longest(prompt + out_len, prompt, row.question_id, most, k if reply else 0)
    return best


def check(settings: dict, rows: list | None, turns_of: dict[str, list[str]] | None, resume: str | None
          ) -> Longest | None:
    """Refuse, in one line naming the limit and the fix, a run whose longest request cannot fit the context;
    on `--resume`, say that the run can never finish. The openai backend's server has its own model and limit
    (None); else the longest request, which fits."""
    if settings["backend"] == "openai":
        return None
    found = longest(settings, rows, turns_of)
    if found.positions <= found.limit:
        return found
    source = ("vLLM's max_model_len, as the run's engine arguments set it"
              if (settings.get("engine_args") or {}).get("max_model_len") == found.limit
              else f"max_position_embeddings of {settings['target']}")
    need = (f"its longest request needs {found.positions:,} positions (a prompt of {found.prompt:,} tokens"
            + (f", {found.question_id}" if found.question_id else "") + f", + --output-len {settings['output_len']})"
            f", past the target's context of {found.limit:,} ({source})")
    room = found.limit - found.prompt
    fix = ("a smaller --output-len (each earlier reply of the conversation is that long too)" if found.replies else
           f"--output-len {room} or less" if room >= 1 else
           "other prompts (--category, --num-prompts) or a target with a longer context")
    if resume:
        raise DSparkError(f"--resume {resume}: this run can never finish: {need}; start a new run with {fix}")
    raise DSparkError(f"the run cannot fit: {need}; give {fix}")

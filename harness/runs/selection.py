"""What a profile runs when the user does not say: a few prompts at one temperature, since a trace
grows with every token (the demo's CPU trace holds about 2,400 host events, 0.6 MB of JSON, per
token), and the sentence that names them and the flags that ask for more."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from harness.runs.plan import RunOptions, resolve_settings
from harness.specs import datasets
from harness.specs.experiments import Experiment

DEFAULT_PROMPTS = 2


@dataclass
class Selection:
    opts: RunOptions  # the run options with the profile's defaults filled in
    question_ids: list[str]
    available: int  # prompts of the split and categories
    requests_per_system: int
    note: str  # the sentence that says which, and how to get more


def choose(opts: RunOptions, exp: Experiment) -> Selection:
    """`opts` with DEFAULT_PROMPTS prompts where no --num-prompts was given and the experiment's first
    temperature where no --temperature was; the prompts picked (as the run will pick them: the same
    seeded shuffle) and a sentence naming them."""
    defaults = {}
    if opts.num_prompts is None:
        defaults["num_prompts"] = DEFAULT_PROMPTS
    if opts.temperatures is None:
        defaults["temperatures"] = [exp.temperatures[0]]
    opts = replace(opts, **defaults)
    settings = resolve_settings(opts, exp)
    data = datasets.load(opts.split, Path(opts.dataset_path) if opts.dataset_path else None, exp.dataset,
                         settings["dataset_revision"])
    rows = datasets.select(data.rows, opts.split, settings["categories"], settings["num_prompts"], settings["seed"],
                           settings["shuffle"])  # (as the run will select them)
    available = sum(not settings["categories"] or r.category in settings["categories"] for r in data.rows)
    temps = settings["temperatures"]
    turns = sum(len(r.turns) if settings["turns"] == "all" else 1 for r in rows)
    requests = turns * len(temps)
    where = f"{opts.split} {', '.join(settings['categories'] or ['(all categories)'])}"
    which = f"all {available}" if len(rows) == available else f"{len(rows)} of {available}"
    more = []
    if "num_prompts" in defaults and len(rows) < available:
        more.append(f"--num-prompts N for more (up to {available})")
    if "temperatures" in defaults and len(exp.temperatures) > 1:
        more.append(f"--temperature {','.join(f'{t:g}' for t in exp.temperatures)} for the experiment's others")
    note = (f"profiling {which} {where} prompts at T = {', '.join(f'{t:g}' for t in temps)} (question ids "
            f"{', '.join(r.question_id for r in rows)}): {requests} request{'s' if requests > 1 else ''} per system, "
            f"at most {settings['output_len']} tokens each" + (f"; {', '.join(more)}" if more else ""))
    return Selection(opts, [r.question_id for r in rows], available, requests, note)

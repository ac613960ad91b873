"""vLLM's speculative methods and their options, read from the installed vLLM itself (never a list copied
into our code: each release adds methods, and renames or drops some), in this one place:

- `vllm_methods`: the names vLLM's `SpeculativeConfig.method` takes (its `SpeculativeMethod` Literal);
- `speculative_fields`: the options its `SpeculativeConfig` takes, each with the type vLLM validates;
- `method_problem` / `option_problem`: a method or an option the installed vLLM lacks, or a value it refuses,
  in one line naming vLLM's version and what it has (a close match first), before any model loads;
- `method_option_problem`: an option of one method's (`prompt_lookup_*` n-gram's, `suffix_decoding_*`
  suffix's, `dspark_*` DSpark's: `method_options`, over vLLM's own field names) given to another method, which
  vLLM ignores or silently resets (a draft_model's prompt_lookup_max becomes 0), refused in one line;
- `changed_method`: vLLM replaces the method it was given in a few cases (MTP's per-model names become
  "mtp"; a draft_model whose path or architecture names another method becomes that method): whether the
  method an engine ran (read back from its config, or a server's log: `logged_method`) is another than
  the one asked for, refused in one line (`ran_problem`);
- `ran_as`: a method vLLM tells apart by the draft's architecture alone, named as ours: its `dflash` runs a
  `DFlash2DraftModel` draft with its DFlash 2 speculator (V2 runner only), which ran as `dflash2`; the
  architecture is read back with the method (the engine's draft config, or a server's log:
  `logged_architecture`), so a DFlash 2 system whose engine ran plain DFlash is refused like any other.
"""

from __future__ import annotations

import difflib
import json
import re
from typing import get_args

from dspark.errors import DSparkError

MTP = "mtp"  # what vLLM runs every per-model MTP method as (qwen3_next_mtp, deepseek_mtp, ...)
# an option name's prefix -> the vLLM methods whose options these are (the names themselves: vLLM's fields)
METHOD_PREFIXES = {"prompt_lookup_": ("ngram", "ngram_gpu"), "suffix_decoding_": ("suffix",), "dspark_": ("dspark",)}
# our method -> (vLLM's method, the draft architecture by which it picks that method's speculator; `init_speculator`)
BY_ARCHITECTURE = {"dflash2": ("dflash", "DFlash2DraftModel")}
V2_METHODS = ("dspark",)  # vLLM's methods it runs only on its V2 model runner


def v2_only(vllm_method: str | None, method: str | None = None) -> bool:
    """Whether vLLM runs our `method` (as its `vllm_method`) only on its V2 model runner: its dspark, and the
    speculators it picks by architecture (DFlash 2's)."""
    return vllm_method in V2_METHODS or method in BY_ARCHITECTURE


def vllm_methods() -> tuple[str, ...]:
    """Every speculative method the installed vLLM knows, from its `SpeculativeMethod` Literal (nested
    Literals flatten under `typing.get_args`)."""
    from vllm.config.speculative import SpeculativeMethod

    return tuple(get_args(SpeculativeMethod))


def mtp_methods() -> tuple[str, ...]:
    """The installed vLLM's MTP methods: each runs as "mtp"."""
    from vllm.config.speculative import MTPModelTypes

    return tuple(get_args(MTPModelTypes))


def speculative_fields() -> dict:
    """The installed vLLM's `SpeculativeConfig` options: name -> its pydantic field (annotation = type)."""
    from vllm.config import SpeculativeConfig

    return dict(SpeculativeConfig.__pydantic_fields__)


def _near(name: str, known: list[str], what: str) -> str:
    """`did you mean X?` for a close match, else the list of what there is."""
    near = difflib.get_close_matches(name, known, n=1)
    return f"did you mean '{near[0]}'?" if near else f"{what}: {', '.join(sorted(known))}"


def method_problem(method: str, version: str) -> str | None:
    """Why the installed vLLM (`version`) cannot run speculative `method`, naming the methods it has."""
    known = list(vllm_methods())
    if method in known:
        return None
    return f"vLLM {version} has no speculative method '{method}'; {_near(method, known, 'its methods are')}"


def option_problem(key: str, value, version: str, where: str) -> str | None:
    """Why vLLM `version` refuses speculative-config option `key` = `value` (given by `where`): not one of
    its `SpeculativeConfig`'s options (a close match named), or a value not of that option's type. `where`
    prefixes the key: "--vllm-arg speculative_config.", "FILE: system 'x': speculative_config."."""
    from pydantic import TypeAdapter, ValidationError

    fields = speculative_fields()
    if key not in fields:
        return (f"{where}{key}: not a key of vLLM {version}'s speculative config; "
                f"{_near(key, list(fields), 'see vllm.config.SpeculativeConfig')}")
    try:
        TypeAdapter(fields[key].annotation).validate_python(value)
    except ValidationError as exc:
        shown = value if isinstance(value, str) else json.dumps(value)
        return f"{where}{key}={shown}: vLLM {version} refuses it ({exc.errors()[0]['msg']})"
    return None


def method_options() -> dict[str, tuple[str, ...]]:
    """The installed vLLM's method-specific speculative options: each field of its `SpeculativeConfig` named
    by a `METHOD_PREFIXES` prefix -> the methods that take it (every other field applies to any method)."""
    return {key: methods for key in speculative_fields() for prefix, methods in METHOD_PREFIXES.items()
            if key.startswith(prefix)}


def method_option_problem(options: dict, method: str, version: str, where: str) -> str | None:
    """Why vLLM `version` running `method` would not take one of `options` (given by `where`): an option of
    another method's, which vLLM ignores there or silently resets (a draft_model's prompt_lookup_max to 0), so
    the run would measure something other than what the system says."""
    takes = method_options()
    key = next((k for k in sorted(options) if k in takes and method not in takes[k]), None)
    if key is None:
        return None
    return (f"{where}{key}: an option of method {' and '.join(takes[key])} alone; vLLM {version} runs this system as "
            f"'{method}', which does not take it (vLLM would ignore or reset it): drop it here")


def options_problem(options: dict, version: str, where: str) -> str | None:
    """The first option of `options` vLLM `version` does not take (`option_problem`), or None."""
    return next(filter(None, (option_problem(k, options[k], version, where) for k in sorted(options))), None)


def check_options(options: dict, version: str, where: str) -> None:
    """Refuse, in one line, the first option of `options` vLLM `version` does not take."""
    problem = options_problem(options, version, where)
    if problem:
        raise DSparkError(problem)


def changed_method(asked: str, ran: str | None) -> bool:
    """Whether an engine asked for method `asked` ran another (`ran`, read back from vLLM's config); an
    MTP method's per-model name running as "mtp" is the same method."""
    return ran != asked and not (ran == MTP and asked in mtp_methods())


def ran_problem(system: str, asked: str, ran: str | None, version: str, draft: str | None) -> str | None:
    """One line refusing a system whose engine ran another method than the one asked for (`changed_method`):
    measured, its figures would be labelled with a method that never ran."""
    if not changed_method(asked, ran):
        return None
    return (f"system '{system}': vLLM {version} ran speculative method '{ran}' where the experiment asks for "
            f"'{asked}' (vLLM infers a method from the draft's path and architecture"
            + (f": draft {draft}" if draft else "") + f"); the run stops rather than label {ran}'s figures {asked}: give "
            f"the system method = \"{ran}\", or a draft vLLM reads as {asked}")


def ran_as(method: str | None, architectures) -> str | None:
    """The method an engine ran (`method`, vLLM's name, read back), by our name where vLLM tells it by the
    draft's `architectures` alone (`BY_ARCHITECTURE`)."""
    return next((ours for ours, (theirs, arch) in BY_ARCHITECTURE.items()
                 if method == theirs and arch in (architectures or ())), method)


def asked_method(ours: str, vllm_method: str) -> str:
    """The method a system's engine must be read back as: ours where vLLM tells it by architecture, else
    the one its speculative config names."""
    return ours if ours in BY_ARCHITECTURE else vllm_method


def logged_architecture(log: str) -> str | None:
    """The draft's architecture in an engine's log: the last `Resolved architecture: X` line (vLLM resolves the
    target's, then the draft's)."""
    found = re.findall(r"Resolved architecture: (\w+)", log)
    return found[-1] if found else None


def logged_method(log: str) -> str | None:
    """The speculative method an engine ran, from its log's config line (`... with config: ...
    speculative_config=SpeculativeConfig(method='ngram', ...)`, the last one: a served engine's)."""
    found = re.findall(r"speculative_config=SpeculativeConfig\(method='([^']+)'", log)
    return found[-1] if found else None

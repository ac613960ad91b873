"""The engine arguments a user gives vLLM (`--vllm-arg KEY=VALUE`, an experiment's `[engine_args]`), checked
before anything starts, the same way in the run and in `run --dry-run`:

- keys the harness sets itself are refused, naming what sets them (`owned_problem`, no vLLM needed): a
  `port` or `host` given to `vllm serve` lands after the harness's own `--host 127.0.0.1 --port N` and wins,
  so the server bound every interface, or the harness polled a port nobody served;
- the rest must be vLLM's own arguments, of vLLM's own types (`check_engine_args`): judged by the parser of
  the installed vLLM's command line (its `vllm serve` parser for the served backend, whose command the
  harness builds from these very flags; its engine arguments' parser for the offline engine), so that
  `max_model_len=abc` is refused before any model loads, not by a server that exits after its start;
- a speculative-config key of one method's alone (`methods.method_options`: prompt_lookup_*, suffix_decoding_*)
  is refused here, pointing to the system's own table: given here it would land on every system, a
  draft_model's or suffix's included, where vLLM ignores or resets it.
"""

from __future__ import annotations

import json

from dspark.errors import DSparkError
from harness.backends.vllm.methods import check_options, method_options
from harness.backends.vllm.process import cli_args

SPEC = "speculative_config."  # an engine argument naming one key of the speculative config
TARGET = "the target is the experiment's (its `target`; pick another experiment with --experiment)"
SYSTEM = "each system builds its own from the experiment (its method, draft and num_speculative_tokens)"
OWN_SERVER = ("the harness starts vllm serve on 127.0.0.1 at a free port and polls it; to measure a server you "
              "start yourself, run --backend openai --base-url http://HOST:PORT")
SYNTHETIC = ("the harness sets synthetic acceptance from --acceptance or a system's acceptance in the experiment "
             "file (resolved per system, labelled and checked on every table)")
SYNTHETIC_KEYS = ("rejection_sample_method", "synthetic_acceptance_rates", "synthetic_acceptance_length")
# key -> (the backends on which the harness sets it, what sets it instead)
OWNED = {
    "model": (("vllm", "vllm-server"), TARGET),
    "model_tag": (("vllm-server",), TARGET),
    "speculative_config": (("vllm", "vllm-server"), SYSTEM + "; set one key with speculative_config.KEY"),
    SPEC + "method": (("vllm", "vllm-server"), SYSTEM + ("; given here it would run every system as that method "
                                                         "under its own name: set a system's method in the experiment")),
    SPEC + "model": (("vllm", "vllm-server"), SYSTEM + ("; given here it would swap every system's draft under its "
                                                        "own name: set a system's draft in the experiment")),
    SPEC + "dspark_draft_topk": (("vllm", "vllm-server"), "a DSpark system's markov_topk = k in the experiment file "
                                                          "sets it, for that system alone"),
    SPEC + "num_speculative_tokens": (("vllm", "vllm-server"), SYSTEM + ("; given here it would run every system at "
                                                                         "that k while its records show its own: set "
                                                                         "a system's num_speculative_tokens")),
    **{SPEC + key: (("vllm", "vllm-server"), SYNTHETIC) for key in SYNTHETIC_KEYS},
    SPEC + "enable_adaptive_verification": (("vllm", "vllm-server"), ("a DSpark system's confidence = \"schedule\" "
                                                                      "in the experiment file sets it, for that "
                                                                      "system alone")),
    "per_request_spec_decode_metrics": (("vllm", "vllm-server"), "the harness asks for \"detailed\": each request's "
                                                                 "rounds come from it"),
    "profiler_config": (("vllm",), "dspark-bench profile --backend vllm sets it (--torch or --nsys)"),
    "served_model_name": (("vllm-server",), "every request names the model by the target's path, as the harness "
                                            "serves it"),
    "host": (("vllm-server",), OWN_SERVER),
    "port": (("vllm-server",), OWN_SERVER),
    "uds": (("vllm-server",), OWN_SERVER),
    "api_key": (("vllm-server",), OWN_SERVER + " (its requests send no key)"),
    "ssl_keyfile": (("vllm-server",), OWN_SERVER + " (over http)"),
    "ssl_certfile": (("vllm-server",), OWN_SERVER + " (over http)"),
}


def owned_problem(engine_args: dict, backend: str, where: str) -> str | None:
    """Why `engine_args` (given by `where`: --vllm-arg or an experiment's table) sets a key the harness sets
    itself on `backend`, naming what sets it; None where no key does. Dashes read as underscores, as
    vLLM's command line reads them."""
    for key in engine_args:
        backends, why = OWNED.get(key.replace("-", "_"), ((), ""))
        if backend in backends:
            return f"{where} {key}: the harness sets it itself: {why}"
    return None


class _Refused(Exception):
    """vLLM's parser refusing the flags (argparse would print its usage and exit)."""


def _parser(served: bool):
    """The installed vLLM's command-line parser: `vllm serve`'s (served), else its engine arguments'."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class Parser(FlexibleArgumentParser):
        def error(self, message: str):
            raise _Refused(message)

    parser = Parser(prog="vllm serve" if served else "vllm.LLM")
    if served:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser

        return make_arg_parser(parser)
    return EngineArgs.add_cli_args(parser)


def check_engine_args(engine_args: dict, served: bool, version: str) -> None:
    """Refuse an engine argument the installed vLLM (`version`, imported by now) does not have, or a value its
    own parser refuses; a speculative-config key (`speculative_config.KEY`, merged into each system's config)
    must be one of vLLM's `SpeculativeConfig`, its value of that key's type. The
    offline engine takes every field of vLLM's `EngineArgs` (a few have no command-line flag: their values
    go unparsed); `vllm serve` takes its parser's flags, server options included."""
    from vllm.engine.arg_utils import EngineArgs

    spec = {k[len(SPEC):]: v for k, v in engine_args.items() if k.startswith(SPEC)}
    check_options(spec, version, f"--vllm-arg {SPEC}")
    own = next((k for k in sorted(spec) if k in method_options()), None)
    if own is not None:
        raise DSparkError(f"--vllm-arg {SPEC}{own}: an option of method {' and '.join(method_options()[own])} alone, "
                          "and --vllm-arg sets every system's speculative config: give it in that system's "
                          f"speculative_config table in the experiment file ({own} = ...)")
    given = {k: v for k, v in engine_args.items() if not k.startswith(SPEC)}
    parser = _parser(served)
    flags = {a.dest for a in parser._actions if a.option_strings}
    known = flags if served else set(EngineArgs.__dataclass_fields__)
    unknown = sorted(k for k in given if (k.replace("-", "_") if served else k) not in known)
    if unknown:
        near = unknown[0].replace("-", "_")
        hint = f" (did you mean {near}?)" if near in known else ""
        raise DSparkError(f"--vllm-arg {unknown[0]}: not an engine argument of vLLM {version}{hint} (see "
                          f"{'vllm serve --help' if served else 'vllm.engine.arg_utils.EngineArgs'}); a "
                          "speculative-config key is speculative_config.KEY")
    for key, value in given.items():
        if key.replace("-", "_") not in flags:
            continue
        try:
            found, extra = parser.parse_known_args(cli_args({key: value}))
            extra += [found.model_tag] if getattr(found, "model_tag", None) else []  # (vllm serve's model, else)
        except _Refused as exc:
            why = str(exc).split(" [type=")[0]  # (pydantic's tail: its type code and a link)
            raise DSparkError(f"--vllm-arg {key}={_shown(value)}: vLLM {version} refuses it ({why}); give a value of its "
                              "type (vllm serve --help lists each argument's)") from None
        if extra:  # (a value a flag takes none of, as true/false for a number: argparse leaves it over)
            raise DSparkError(f"--vllm-arg {key}={_shown(value)}: vLLM {version} takes no value {extra[0]!r} there "
                              "(a switch takes true or false)")


def _shown(value) -> str:
    """A value as the user wrote it: text as it is, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value)

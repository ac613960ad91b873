"""`dspark-bench`: the command line, one module per command. Bad input exits 2 with one line; results
go to stdout, progress and notices to stderr."""

from __future__ import annotations

import re
import sys

import typer
import typer.core

from dspark.errors import DSparkError
from harness.cli.calibrate import calibrate as calibrate_command
from harness.cli.engine_bench import engine_bench as engine_bench_command
from harness.cli.empty_values import refuse_empty
from harness.cli.fetch_tokenizer import fetch_tokenizer as fetch_tokenizer_command
from harness.cli.generate import generate as generate_command
from harness.cli.inspect import inspect as inspect_command
from harness.cli.make_tiny import make_tiny_cmd
from harness.cli.parity import parity as parity_command
from harness.cli.profile import profile as profile_command
from harness.cli.render import err, error_line, one_line_warnings
from harness.cli.report import report as report_command
from harness.cli.signals import FirstSignal, first_signal_interrupts
from harness.cli.run import run as run_command
from harness.cli.trace import trace_app
from harness.runs.progress import Interrupted
from harness.cli.train_draft import train_draft as train_draft_command

# typer re-exports BadParameter; its base is the usage error, of click or of the copy of click that newer typer ships.
UsageError = typer.BadParameter.__mro__[1]

class _Listed(typer.core.TyperGroup):
    """The program's command group, its commands listed in `COMMANDS`' order (typer puts groups last)."""

    def list_commands(self, ctx) -> list[str]:
        return [name for name in COMMANDS if name in self.commands]

    def resolve_command(self, ctx, args):
        """The command named, once no option or argument of it is given an empty value (`empty_values`)."""
        name, command, rest = super().resolve_command(ctx, args)
        refuse_empty(command, list(rest), name, parent=ctx)
        return name, command, rest


# Plain (click) help: flags read as `--ngram` or `--ignore-eos / --no-ignore-eos`, and it reads in a log. `-h` is
# `--help` on every command (click hands help_option_names down to each subcommand's context).
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  cls=_Listed, context_settings={"help_option_names": ["-h", "--help"]},
                  help="Measure how much DSpark speculative decoding speeds up a model, and where GPU time goes.")


def version_text() -> str:
    """`dspark-bench --version`: the installed package's version, and the commit of the checkout it runs
    from (with a mark when that has uncommitted changes), as every run's provenance records it."""
    from importlib import metadata

    from harness.runs.provenance import git_revision

    try:
        text = f"dspark-bench {metadata.version('dspark-bench')}"
    except metadata.PackageNotFoundError:
        text = "dspark-bench (not installed: run from its source tree)"
    git = git_revision()
    if git["commit"]:
        text += f", git {git['commit'][:12]}" + (" with uncommitted changes" if git["dirty"] else "")
    return text


def _print_version(given: bool) -> None:
    if given:
        print(version_text())
        raise typer.Exit()


@app.callback()
def _program(version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                          help="Print the version (and a checkout's git commit) and exit.")):
    """(The program's own options; each command has its own.) `--version` belongs to the program alone, as
    `git --version`: a command's options say what it does."""


# The commands in the order a user needs them, as `--help` lists them: measure, read, profile, compare, then the
# tools. (The imported names keep the command modules reachable as harness.cli.<name>.)
COMMANDS = {"run": run_command, "report": report_command, "profile": profile_command, "trace": trace_app,
            "parity": parity_command, "calibrate": calibrate_command, "generate": generate_command,
            "engine-bench": engine_bench_command, "train-draft": train_draft_command, "inspect": inspect_command,
            "make-tiny": make_tiny_cmd, "fetch-tokenizer": fetch_tokenizer_command}
for _name, _command in COMMANDS.items():
    if isinstance(_command, typer.Typer):
        app.add_typer(_command, name=_name)
    else:
        app.command(_name)(_command)


def main() -> None:
    """Every refusal is one line on stderr and exit code 2: our own (DSparkError) and click's usage errors
    (a bad value, an unknown option), which click would print as three. SIGTERM (`timeout`, a batch
    scheduler) takes Ctrl-C's path: finished results kept, the vLLM servers and profilers this process
    started stopped (left to run, a server holds its GPU memory after we are gone); signals after the
    first are ignored (`signals`), and the exit code is the first one's, 130 or 143. The project's own
    warnings are one `warning:` line each (`one_line_warnings`)."""
    with first_signal_interrupts() as signals, one_line_warnings():
        _main(signals)


def _main(signals: FirstSignal) -> None:
    try:
        code = app(standalone_mode=False, prog_name="dspark-bench")
        if code == 130:  # typer's own word for a Ctrl-C it caught
            raise KeyboardInterrupt
    except DSparkError as exc:
        _refuse(str(exc))
    except UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # a bare command: its help, as click shows it
            exc.show()
            sys.exit(exc.exit_code)
        command = exc.ctx.command_path if exc.ctx is not None else "dspark-bench"
        hint = ""
        if exc.format_message().startswith("No such option: --version"):  # (click would suggest another option)
            _refuse(f"--version is the program's option, not {command}'s: give it alone, dspark-bench --version")
        if "unexpected extra argument" in exc.format_message() and re.search(r"\((true|false|yes|no|1|0)\b",
                                                                           exc.format_message(), re.I):
            hint = "; a flag takes no value (write --ignore-eos, not --ignore-eos true)"
        _refuse(f"{exc.format_message()}{hint} (see {command} --help)")
    except Interrupted:  # the command has said what it kept
        sys.exit(signals.exit_code())
    except (KeyboardInterrupt, typer.Abort):
        err.print("interrupted", highlight=False)
        sys.exit(signals.exit_code())
    except Exception:
        if signals.first is None:
            raise
        # a library broken off by the signal fails its own way on the way out (nbclient, its kernel gone, with an
        # AssertionError): the signal is what happened
        err.print("interrupted", highlight=False)
        sys.exit(signals.exit_code())
    sys.exit(code if isinstance(code, int) else 0)


def _refuse(message: str) -> None:
    error_line(message)
    sys.exit(2)

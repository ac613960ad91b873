"""An empty value on the command line is refused before the command starts, whatever the option.

Why here and not per command: the command line parser turns "" given for a path into `Path("")`, which
is the current folder, and "" given for an optional text into a value that reads as "not given". So
`make-tiny ""` wrote nine models into the working folder, `run --resume ""` started a new run and
`train-draft --out ""` saved its draft in the working folder. An empty value is nearly always a shell
variable left unset (`--out "$OUT"`); it names nothing, so it is refused in one line naming the option.
An option whose default is the empty text takes it (it means the default)."""

from __future__ import annotations

from dspark.errors import DSparkError


def refuse_empty(command, args: list[str], path: str, parent=None) -> None:
    """Raise DSparkError when `args`, the words after `path` (the command's name, e.g. `trace summarize`)
    that `command` (a click command or group) will parse, give an empty or blank value to an option or
    argument. A group's subcommand named in `args` is followed; words the parser cannot read are left to
    the real parse, which says what is wrong with them. `parent` is the context the real parse will run under:
    click builds a command's help option once, from the first context it sees, so a context without the
    parent's `help_option_names` would leave the command without `-h`."""
    while isinstance(getattr(command, "commands", None), dict) and args and args[0] in command.commands:
        parent = command.context_class(command, info_name=path, parent=parent)
        path, command, args = f"{path} {args[0]}", command.commands[args[0]], args[1:]
    if not hasattr(command, "make_parser"):
        return
    try:
        given, _, order = command.make_parser(command.context_class(command, info_name=path, parent=parent)).parse_args(list(args))
    except Exception:  # the real parse refuses these words, in its own one line
        return
    for param in order:
        value = given.get(param.name)
        values = value if isinstance(value, (list, tuple)) else [value]
        if param.default == "" or not any(isinstance(v, str) and not v.strip() for v in values):
            continue
        label = param.name.upper() if param.param_type_name == "argument" else param.opts[0]
        fix = "give a value" if param.required or param.param_type_name == "argument" else \
            f"give a value, or drop {label} for its default"
        raise DSparkError(f"{path} {label} is empty: an empty value names nothing (a shell variable left unset?); "
                          f"{fix} (see dspark-bench {path} --help)")

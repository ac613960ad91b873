"""The one exception type users see: a one-line message that names the problem and the fix."""


class DSparkError(Exception):
    """Bad input (checkpoint, config, option). The CLI prints it on one line and exits 2."""

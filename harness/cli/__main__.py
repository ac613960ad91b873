"""`python -m harness.cli`: the `dspark-bench` command in a fresh interpreter (how `profile` starts its children)."""

from harness.cli import main

main()

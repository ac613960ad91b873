"""`dspark-bench engine-bench`: step costs at real shapes against the memory-bandwidth limit (GPU)."""

from __future__ import annotations

import typer
from rich.table import Table

from dspark.errors import DSparkError
from harness.cli.render import out, show
from harness.runs.provenance import provenance


def engine_bench(
    target: str = typer.Option("qwen3-8b", help="Target preset (qwen3-8b, qwen3-4b) or a config.json / folder."),
    draft: str = typer.Option("dspark-qwen3-8b-block7", help="Draft preset or a draft config.json / folder."),
    context_len: int = typer.Option(1024, min=1, help="Tokens of context in the KV cache."),
    dtype: str = typer.Option("bfloat16", help="bfloat16, float16 or float32."),
    repeats: int = typer.Option(50, min=5, help="Timed repeats per figure (the median is reported)."),
    skip_hf: bool = typer.Option(False, "--skip-hf", help="Skip the transformers generate peer."),
    sweep_context: str = typer.Option("", help="Also these context lengths, comma-separated (e.g. 1024,4096,16384): "
                                      "decode against its limit, verify, draft and round against decode, and the draft "
                                      "step against its floor, at each."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
):
    """Step costs of the native engine at real shapes (random weights) against the bandwidth limit.

    Needs a CUDA GPU (it times device kernels against the GPU's own copy bandwidth); exits 2 without one."""
    from harness.cli.options import number_list
    from harness.microbench.engine import SWEEP, BenchArgs, dumps, run_engine_bench, sweep_rows, table_rows

    contexts = tuple(number_list(sweep_context or None, "--sweep-context", int, "whole numbers", "context length",
                                 "1024,4096,16384") or ())
    if any(c < 1 for c in contexts):
        raise DSparkError(f"--sweep-context {sweep_context}: every context length must be at least 1")
    args = BenchArgs(target=target, draft=draft, context_len=context_len, dtype=dtype, repeats=repeats,
                     skip_hf=skip_hf, sweep_context=contexts)
    result = run_engine_bench(args)
    result["provenance"] = provenance("cuda") | {"arguments": vars(args), "weights": "random normal(0, 0.02)"}
    if as_json:
        print(dumps(result))
        return
    table = Table(title=f"engine-bench {target} + {draft}, {context_len}-token context, {dtype}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for name, value in table_rows(result):
        table.add_row(name, value)
    show(out, table)
    if result.get("sweep"):
        sweep = Table(title="by context length (ratios against that context's decode step)")
        for header, _, _ in SWEEP:
            sweep.add_column(header, justify="right")
        for row in sweep_rows(result):
            sweep.add_row(*row)
        show(out, sweep)

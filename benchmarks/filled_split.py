"""A SPEED-Bench split file with N rows made from the demo suite's own prompts, for served sweeps whose
concurrency is above what the suite holds (58 qualitative prompts: concurrency 256 needs 256 in flight
and more to keep them there). Each copy of a prompt opens with its copy number, so no two rows are the
same request (no prefix-cache hit across copies beyond the chat template) and every row keeps its
category. Only for random weights with synthetic acceptance, where a prompt's text decides nothing but its
length: the rows are said to be copies in their `source`, which the run's manifest keeps with the file's
sha256.

    python benchmarks/filled_split.py --split qualitative --rows 512 --out /tmp/filled/qualitative.jsonl
    dspark-bench run ... --split qualitative --dataset-path /tmp/filled/qualitative.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from harness.specs.datasets import demo_suite_dir, read_records


def filled(rows: list[dict], n: int) -> list[dict]:
    """`n` rows cycling through `rows`, copy k of a prompt opening with "(k) " from the second pass on."""
    out = []
    for i in range(n):
        row, copy = dict(rows[i % len(rows)]), i // len(rows)
        if copy:
            row["turns"] = [f"({copy}) {row['turns'][0]}", *row["turns"][1:]]
            row["question_id"] = hashlib.md5(f"{row['question_id']}:{copy}".encode()).hexdigest()
            row["source"] = f"copy {copy} of {row['source']}"
        out.append(row)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--split", default="qualitative")
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    rows = list(read_records(Path(str(demo_suite_dir().joinpath(f"{args.split}.jsonl")))))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in filled(rows, args.rows)))
    print(f"{args.rows} rows from the demo suite's {len(rows)} {args.split} prompts: {args.out}")


if __name__ == "__main__":
    main()

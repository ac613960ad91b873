"""The measured history of the engine: each commit that touches `dspark/kernels/`, `dspark/engine/steps.py` or
`dspark/engine/` timed with `engine-bench --json` beside its parent, alternated in one call on the GPU
(parent, commit, parent, commit, ...), one line per commit in `benchmarks/results/engine_history.jsonl`.

    # here: the trees of the revisions to time (code only, no demo weights), into a carried folder
    python benchmarks/engine_history.py prepare PARENT REV1 REV2 ... --out .carry/trees
    # on the GPU machine (carry .carry): every tree in turn, `--rounds` times, then a line per pair
    python3 benchmarks/engine_history.py measure --trees .carry/trees --pair REV1:PARENT --pair REV2:REV1 \\
        --rounds 2 --out $OUT/history.jsonl
    # here: cat the lines onto benchmarks/results/engine_history.jsonl

A pair's line holds both revisions' figures of every pass, their medians and the change in percent;
the passes' order and the machine's load at each are recorded, so a reader sees the noise.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

FIGURES = ("decode_ms", "verify8_ms", "draft_ms", "round_ms", "decode_fraction_of_limit", "draft_over_decode",
           "round_over_decode", "copy_tbps")
CODE = ("dspark", "harness", "experiments", "pyproject.toml")  # what engine-bench runs on (not the demo weights)


def prepare(revisions: list[str], out: Path) -> None:
    for rev in revisions:
        full = subprocess.run(["git", "rev-parse", "--short", rev], capture_output=True, text=True, check=True).stdout.strip()
        tree = out / full
        if tree.exists():
            shutil.rmtree(tree)
        tree.mkdir(parents=True)
        blob = subprocess.run(["git", "archive", full, *CODE], capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            tar.extractall(tree, filter="data")
        shutil.rmtree(tree / "dspark" / "data" / "demo", ignore_errors=True)
        for blob_file in (tree / "experiments").rglob("*.xz"):  # training data: 4 MB engine-bench never reads
            blob_file.unlink()
        print(f"{full}: {tree}")


def bench(tree: Path, rev: str, extra: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree.resolve()), DSPARK_GIT_REVISION=rev)
    # trees from before EAGLE-3 (issue 30) time no EAGLE-3 step and have no option to skip it
    skip = ["--eagle3", "none"] if "eagle3" in (tree / "harness" / "cli" / "engine_bench.py").read_text() else []
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "engine-bench", "--skip-hf", *skip,
                           "--json", *extra], capture_output=True, text=True, cwd=tree, env=env, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"engine-bench at {rev} failed: {proc.stderr[-2000:]}")
    out = json.loads(proc.stdout)
    return {k: out.get(k) for k in FIGURES} | {"seconds": round(time.time() - t0, 1),
                                               "load_avg": os.getloadavg()[0], "device": out.get("device_name")}


def measure(trees: Path, pairs: list[tuple[str, str]], rounds: int, out: Path, extra: list[str]) -> None:
    order = list(dict.fromkeys(r for pair in pairs for r in reversed(pair)))  # each parent before its commit
    passes: dict[str, list[dict]] = {r: [] for r in order}
    for i in range(rounds):
        for rev in order:
            passes[rev].append(bench(trees / rev, rev, extra))
            print(f"round {i + 1} {rev}: " + ", ".join(f"{k} {passes[rev][-1][k]:.4g}" for k in FIGURES[:4]),
                  flush=True)
    lines = []
    for rev, parent in pairs:
        med = {r: {k: statistics.median(p[k] for p in passes[r]) for k in FIGURES} for r in (rev, parent)}
        lines.append({"revision": rev, "parent": parent, "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      "device": passes[rev][0]["device"], "settings": ["--skip-hf", "--eagle3", "none", *extra],
                      "order": " ".join(order) + f" (x{rounds})",
                      "median": med[rev], "parent_median": med[parent],
                      "change_pct": {k: 100 * (med[rev][k] / med[parent][k] - 1) for k in FIGURES if med[parent][k]},
                      "passes": passes[rev], "parent_passes": passes[parent]})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    for line in lines:
        print(f"{line['revision']} vs {line['parent']}: " + ", ".join(f"{k} {v:+.2f} %" for k, v in line["change_pct"].items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("revisions", nargs="+")
    p.add_argument("--out", type=Path, default=Path(".carry/trees"))
    m = sub.add_parser("measure")
    m.add_argument("--trees", type=Path, default=Path(".carry/trees"))
    m.add_argument("--pair", action="append", required=True, help="REV:PARENT")
    m.add_argument("--rounds", type=int, default=2)
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("extra", nargs="*", help="more engine-bench arguments (after --)")
    args = ap.parse_args()
    if args.command == "prepare":
        prepare(args.revisions, args.out)
    else:
        measure(args.trees, [tuple(p.split(":")) for p in args.pair], args.rounds, args.out, args.extra)


if __name__ == "__main__":
    main()

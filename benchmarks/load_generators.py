"""Issue 56's agreement: our client and NVIDIA's AIPerf on ONE server, the same prompts, alternated level by
level (ours, AIPerf, then AIPerf, ours ... `--pairs` times), each wave a real `dspark-bench run --backend openai
--base-url URL --load-generator ours|aiperf` (what users run), so the comparison is interleaved and has pairs
for an interval.

    python benchmarks/load_generators.py --systems ngram,plain --levels 1,4,16 --pairs 3 --output-len 64 \
        --aiperf /work/aiperf-venv/bin/aiperf --out benchmarks/results/aiperf_agreement_cpu
    # the GPU study's shapes (benchmarks/study_h200.sh's serve stage):
    python benchmarks/load_generators.py --experiment qwen3-8b-random --device cuda --split qualitative \
        --systems plain,dspark-official --levels 1,4,16,32 --output-len 128 --min-prompts 8 \
        --budget-s 420 --aiperf ...   # again, until it no longer says "partial": finished runs are reused

Per system the script starts one `vllm serve` through the harness's own server code (the `vllm-server`
backend's `_start`: its engine options, speculative config, per-request metrics) and stops it at the end;
or it measures the server at `--base-url` (`--server-pid` to read its CPU). Per level it prints and records:
requests, output tokens and the server's counter-based acceptance of each pair (a mismatch flagged, never
hidden); TTFT, TPOT, ITL (mean, p50, p99) and output throughput side by side with AIPerf's difference and
its 95 % interval over the pairs; the contention seen during each wave (the client process tree's and the
server's CPU time as cores, the 1-minute load average, AIPerf's process count: its worker count is
max(1, min(int(0.75 x cpus) - 1, 32))); and the cause (`harness/analysis/agreement.py`). No timing is
asserted. Writes results.json, table.csv and table.txt to --out; the run folders under --out/runs.
`--recompute DIR` redoes the analysis of a finished folder from its results.json (measuring nothing).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
from rich.console import Console
from rich.table import Table

from dspark.errors import DSparkError
from harness.analysis.agreement import cause, compare, mismatches, run_figures
from harness.analysis.records import read_requests, read_waves
from harness.runs.provenance import provenance

GENERATORS = ("ours", "aiperf")
FIGURES = "agreement.json"  # a finished run's figures and CPU readings, in its folder: a later call reuses them
START = time.monotonic()
SHOWN = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
         "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "output_throughput", "chunks_per_request", "gaps_together")


def aiperf_workers(cpus: int) -> int:
    """AIPerf 0.13.0's default worker count (its own formula): one on two cores, eleven on sixteen."""
    return max(1, min(int(0.75 * cpus) - 1, 32))


class Sampler:
    """CPU seconds of process trees, read every `period` s while a run goes: per process the last
    cumulative user+system time seen (a process that exits keeps what it used), so a tree's total only
    grows; with the 1-minute load average at each reading."""

    def __init__(self, client: int, server: int | None, period: float = 0.2):
        self.roots, self.period, self.seen = {"client": client, "server": server}, period, {}
        self.samples: list[tuple[float, float, float, float, int]] = []  # (time, client s, server s, load, procs)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _tree(self, name: str) -> tuple[float, int]:
        pid = self.roots[name]
        if pid is None:
            return 0.0, 0
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            procs = []
        for p in procs:
            try:
                t = p.cpu_times()
                self.seen[(name, p.pid, p.create_time())] = t.user + t.system
            except psutil.Error:
                pass
        return sum(v for k, v in self.seen.items() if k[0] == name), len(procs)

    def _loop(self) -> None:
        while not self.stop.is_set():
            client, procs = self._tree("client")
            server, _ = self._tree("server")
            self.samples.append((time.time(), client, server, os.getloadavg()[0], procs))
            self.stop.wait(self.period)

    def window(self, lo: float, hi: float) -> dict:
        """The cores each tree used over [lo, hi] (CPU seconds over wall seconds, from the readings that
        bracket it), the mean load average and the most client processes seen in it."""
        before = [s for s in self.samples if s[0] <= lo] or self.samples[:1]
        after = [s for s in self.samples if s[0] >= hi] or self.samples[-1:]
        a, b = before[-1], after[0]
        inside = [s for s in self.samples if a[0] <= s[0] <= b[0]]
        span = max(b[0] - a[0], 1e-9)
        return {"client_cores": (b[1] - a[1]) / span, "server_cores": (b[2] - a[2]) / span if self.roots["server"]
                else None, "load_avg": sum(s[3] for s in inside) / len(inside), "client_processes": max(
                    s[4] for s in inside), "window_s": hi - lo, "sampled_s": span}


def one_run(args, url: str, system: str, level: int, generator: str, folder: Path, server_pid: int | None) -> dict:
    """One `dspark-bench run` of `system` at `level` by `generator`, its CPU sampled; its figures."""
    cmd = [sys.executable, "-m", "harness.cli", "run", "--experiment", args.experiment, "--backend", "openai",
           "--base-url", url, "--systems", system, "--num-prompts", str(max(args.min_prompts, level)),
           "--output-len", str(args.output_len), "--temperature", "0", "--ignore-eos", "--disable-shuffle",
           "--max-concurrency", str(level), "--json", "--out", str(folder), "--load-generator", generator]
    cmd += (["--aiperf", args.aiperf] if generator == "aiperf" else []) + (["--split", args.split] if args.split else [])
    cmd += ["--category", args.category] if args.category else []
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(folder.with_suffix(".log"), "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        sampler = Sampler(proc.pid, server_pid)
        sampler.thread.start()
        code = proc.wait()
        sampler.stop.set()
        sampler.thread.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code != 0:
        sys.exit(f"{generator} at c={level} failed (exit {code}): see {folder.with_suffix('.log')}")
    summary = json.loads((folder / "summary.json").read_text())
    row = next(r for r in summary["rows"] if r["category"] == "overall" and r["max_concurrency"] == level)
    records = read_requests(folder)
    spans = [(r["start_utc"], r["start_utc"] + r["e2el_ms"] / 1e3) for r in records if r.get("start_utc")]
    cpu = sampler.window(min(s[0] for s in spans), max(s[1] for s in spans))
    run_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return run_figures(row, read_waves(folder), records) | {"cpu": cpu | {"run_cpu_s": run_cpu}, "folder": str(folder)}


def start_server(args, system: str, folder: Path):
    """`vllm serve` for `system` as the `vllm-server` backend starts it (engine options, speculative config,
    per-request metrics, synthetic acceptance), once for every level and both load generators."""
    from harness.backends.vllm.server import VllmServerBackend
    from harness.runs.synthetic import synthetic_settings, with_synthetic
    from harness.specs.experiments import load_experiment

    exp = load_experiment(args.experiment)
    engine_args = dict(exp.engine_args)
    # (as AIPerf's load generator: a random-weight server then starts with the target's tokenizer, for both
    # load generators alike; the prompts stay our ids)
    backend = VllmServerBackend(exp.target, args.device, args.dtype, engine_args=engine_args, run_dir=folder,
                                server={"load_generator": "aiperf", "aiperf": args.aiperf})
    prepared = backend.prepare(with_synthetic(exp.system(system), {"acceptance": synthetic_settings(None, exp,
                                                                                                    [system])}))
    return backend, backend._start(prepared, args.max_model_len)


def level_result(pairs: list[dict], cores: int) -> dict:
    """One level's result from its pairs' figures: the side-by-side comparison, the counts that differ,
    the mean CPU readings (shown in the table) and the verdict with its cause, which reads every pair's
    own readings (a cause must hold pair by pair, not in a mean one pair carries)."""
    ours, theirs = [p["ours"] for p in pairs], [p["aiperf"] for p in pairs]
    comparison = compare(ours, theirs)
    mean_cpu = {g: {k: None if any(p[g]["cpu"][k] is None for p in pairs) else  # (no --server-pid: not read)
                    sum(p[g]["cpu"][k] for p in pairs) / len(pairs) for k in ("client_cores", "server_cores",
                                                                              "load_avg", "run_cpu_s")}
                for g in GENERATORS}
    return {"pairs": pairs, "comparison": comparison, "mismatches": mismatches(ours, theirs), "cpu": mean_cpu,
            "cause": cause(comparison, pairs, cores)}


def run_folder(args, system: str, level: int, pair: int, generator: str) -> Path:
    """Where one run lives, named by system, level, pair and generator: the same command finds it again."""
    return args.out / "runs" / system / f"c{level}-p{pair + 1}-{generator}"


def finished(folder: Path) -> dict | None:
    """A run an earlier call of the same command finished (its figures saved last), else None; a folder
    an interrupted call left is moved aside (kept, never reused: its wave may be cut)."""
    if (folder / FIGURES).is_file():
        return json.loads((folder / FIGURES).read_text())
    if folder.exists():
        folder.rename(folder.with_name(f"{folder.name}-interrupted-{int(time.time())}"))
    return None


def measure(args, system: str, url: str | None, server_pid: int | None, cores: int) -> dict:
    """Every pair of every level, reusing the runs an earlier call finished; past `--budget-s` no new pair
    starts (the levels so far are returned, `args.partial` set: the same command goes on from there). The
    pairs alternate who goes first (ours, AIPerf, AIPerf, ours ...): a wave the server runs slower for a reason
    of its own (on the H100 our c=32 wave, the first at that level after a server start, streamed its tokens
    slower while neither client read late) would otherwise be pinned on whichever generator always goes first."""
    levels = {}
    for level in args.levels:
        pairs = []
        for i in range(args.pairs):
            pair = {g: finished(run_folder(args, system, level, i, g)) for g in GENERATORS}
            if None in pair.values() and (url is None or time.monotonic() - START > args.budget_s):
                args.partial = True
                break
            for generator in (GENERATORS if i % 2 == 0 else GENERATORS[::-1]):  # (ours first, then AIPerf first)
                folder = run_folder(args, system, level, i, generator)
                if pair[generator] is None:
                    folder.parent.mkdir(parents=True, exist_ok=True)
                    pair[generator] = one_run(args, url, system, level, generator, folder, server_pid)
                    (folder / FIGURES).write_text(json.dumps(pair[generator]))
                print(f"{system} c={level} pair {i + 1} {generator}: {pair[generator]['output_throughput']:.1f} "
                      f"out tok/s, TPOT {pair[generator]['mean_tpot_ms']:.2f} ms", flush=True)
            pairs.append(pair)
        if pairs:
            levels[str(level)] = level_result(pairs, cores)
    return levels


def fmt(x, digits: int = 2) -> str:
    """A figure for the table, "-" where it was not read (no drafts, no server pid)."""
    return "-" if x is None else f"{x:.{digits}f}"


def rows(results: dict) -> list[dict]:
    """One row per system, level and figure: ours, AIPerf's, the difference (%), its interval."""
    out = []
    for system, levels in results["systems"].items():
        for level, res in levels.items():
            for k in SHOWN:
                c = res["comparison"][k]
                out.append({"system": system, "level": level, "figure": k, "ours": c["ours"], "aiperf": c["theirs"],
                            "diff": c["diff"], "diff_pct": None if c["rel"] is None else 100 * c["rel"],
                            "ci95_lo": (c["ci95"] or [None])[0], "ci95_hi": (c["ci95"] or [None, None])[1],
                            "pairs": c["pairs"]})
    return out


def table(results: dict) -> Table:
    """The printed table: per system and level the counts that must be equal, each timing as ours | AIPerf
    with the difference and its interval, the CPU readings and the verdict; titled by both generators."""
    t = Table(title=f"Load generators on one server: ours vs AIPerf {results['provenance']['aiperf']} "
                    f"({results['settings']['device']}, {results['cores']} cores)")
    for col in ("system", "c", "requests / out tok / acceptance", "TTFT mean ms", "TPOT mean ms", "TPOT p99 ms",
                "ITL mean ms", "ITL p50 ms", "out tok/s", "chunks/req", "gaps <50us", "client cores", "server cores", "cause"):
        t.add_column(col, overflow="fold")
    for system, levels in results["systems"].items():
        for level, res in levels.items():
            c, first = res["comparison"], res["pairs"][0]
            equal = "MISMATCH: " + "; ".join(res["mismatches"]) if res["mismatches"] else (
                f"equal: {first['ours']['requests']} / {first['ours']['output_tokens']} / "
                f"{first['ours']['counter_acceptance'] or 'no drafts'}")

            def cell(k):
                x = c[k]
                ci = "" if x["ci95"] is None else f" [{fmt(x['ci95'][0])}, {fmt(x['ci95'][1])}]"
                rel = "" if x["rel"] is None else f"{100 * x['rel']:+.1f} %"
                return f"{fmt(x['ours'])} | {fmt(x['theirs'])}\n{rel}{ci}"
            cpu = res["cpu"]
            t.add_row(system, level, equal, *(cell(k) for k in ("mean_ttft_ms", "mean_tpot_ms", "p99_tpot_ms",
                                                               "mean_itl_ms", "median_itl_ms", "output_throughput",
                                                               "chunks_per_request", "gaps_together")),
                      f"{fmt(cpu['ours']['client_cores'])} | {fmt(cpu['aiperf']['client_cores'])}",
                      f"{fmt(cpu['ours']['server_cores'])} | {fmt(cpu['aiperf']['server_cores'])}", res["cause"])
    return t


def checked(args) -> None:
    """The options refused before anything starts (no server, no AIPerf, no folder written): levels that
    are not positive whole numbers, no pair, no token or prompt to send, --base-url for several systems."""
    try:
        levels = [int(x) for x in args.levels.split(",")]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise DSparkError(f"--levels {args.levels!r}: give concurrency levels as positive whole numbers separated "
                          "by commas, e.g. --levels 1,4,16")
    for name in ("pairs", "output_len", "min_prompts"):
        if getattr(args, name) < 1:
            raise DSparkError(f"--{name.replace('_', '-')} {getattr(args, name)}: give at least 1")
    if not all(args.systems.split(",")):
        raise DSparkError(f"--systems {args.systems!r}: give systems separated by commas, e.g. --systems ngram,plain")
    if args.base_url and len(args.systems.split(",")) != 1:
        raise DSparkError("--base-url measures one server: give the one system it serves with --systems")
    args.levels = levels


def write(results: dict, out: Path) -> None:
    """results.json, table.csv and table.txt in `out` (what a measuring or a recomputing call leaves)."""
    (out / "results.json").write_text(json.dumps(results, indent=1))
    flat = rows(results)
    with open(out / "table.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(flat[0]) if flat else ["system"])
        writer.writeheader()
        writer.writerows(flat)
    console = Console(width=220, record=True)
    console.print(table(results))
    console.print("cells: ours | AIPerf, then AIPerf - ours as % of ours [95 % interval of the difference over the "
                  "pairs, in the figure's unit]; cores: CPU seconds / wall seconds during the wave")
    (out / "table.txt").write_text(console.export_text())


def recompute(out: Path) -> None:
    """Every level of `out`/results.json analysed again from the figures and readings its pairs saved
    (what each run's agreement.json holds): the analysis changes, the measurements and their provenance
    (the machine that measured) stay. Starts nothing."""
    path = out / "results.json"
    if not path.is_file():
        raise DSparkError(f"--recompute {out}: no results.json there; give the folder a measuring call wrote (--out)")
    results = json.loads(path.read_text())
    for levels in results["systems"].values():
        for level, res in levels.items():
            levels[level] = level_result(res["pairs"], results["cores"])
    write(results, out)


def main() -> None:
    """The script's one-line refusals: bad options and DSparkError (AIPerf missing, no results to
    recompute) print `error: ...` and exit 2, as the CLI's do, never a traceback."""
    try:
        _main()
    except DSparkError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        sys.exit(2)


def _main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cores = os.cpu_count() or 1
    p.add_argument("--experiment", default="demo")
    p.add_argument("--systems", default="ngram,plain", help="comma list; one server each")
    p.add_argument("--levels", default="1,4,16,32" if cores >= 16 else "1,4,16")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--min-prompts", type=int, default=4, help="prompts a wave: max(this, the level)")
    p.add_argument("--split", default=None)
    p.add_argument("--category", default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-model-len", type=int, default=8192, help="the server's, capped at the target's context")
    p.add_argument("--base-url", default=None, help="measure this server (one system) instead of starting one")
    p.add_argument("--server-pid", type=int, default=None, help="with --base-url: its process, to read its CPU")
    p.add_argument("--budget-s", type=float, default=float("inf"),
                   help="start no new pair past this many seconds (a device call's limit); rerun to go on")
    p.add_argument("--aiperf", default=os.environ.get("AIPERF") or "aiperf")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/aiperf_agreement"))
    p.add_argument("--recompute", type=Path, default=None,
                   help="analyse this --out folder's results.json again (its pairs' saved figures); measure nothing")
    args = p.parse_args()
    if args.recompute:
        return recompute(args.recompute)
    checked(args)
    args.partial, systems = False, args.systems.split(",")
    from harness.backends.served import aiperf
    from harness.backends.vllm.checks import installed_version

    args.aiperf = aiperf.executable(args.aiperf)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "runs").mkdir(exist_ok=True)
    (args.out / "runs" / ".gitignore").write_text("*\n")  # (the run folders: large, kept beside, not committed)
    results = {"provenance": provenance(args.device) | {"aiperf": aiperf.version(args.aiperf),
                                                        "vllm": installed_version()},
               "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "cores": cores, "aiperf_workers": aiperf_workers(cores), "load_generator_definitions": {
                   "ours": aiperf.OURS["client"], "aiperf": "AIPerf's own records (profile_export.jsonl), "
                                                            "its inter_chunk_latency as ITL"},
               "systems": {}}
    for system in systems:
        if args.base_url:
            results["systems"][system] = measure(args, system, args.base_url, args.server_pid, cores)
            continue
        done = measure(args, system, None, None, cores)  # (all finished before: no server to start)
        if not args.partial or time.monotonic() - START > args.budget_s:
            results["systems"][system] = done
            continue
        args.partial = False
        backend, server = start_server(args, system, args.out / "runs" / system)
        try:
            results["systems"][system] = measure(args, system, server.base_url, server.proc.pid, cores)
            results.setdefault("servers", {})[system] = backend.servers[system]
        finally:
            from harness.backends.vllm import process as vllm_process
            vllm_process.stop(server)
    results["partial"] = args.partial
    write(results, args.out)
    if args.partial:
        print(f"partial: --budget-s {args.budget_s:g} s spent before every pair ran; run the same command again "
              "to go on (finished runs are reused)")


if __name__ == "__main__":
    main()

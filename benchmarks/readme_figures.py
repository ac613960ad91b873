"""The README's figures, measured and written in place: its main command's table and what its `profile` example
costs, each with the machine and the revision it came from, so that no figure in the README outlives the code
that made it.

    python benchmarks/readme_figures.py                  # runs both commands (about 3 minutes on 2 cores)
    python benchmarks/readme_figures.py --skip-run RUN [--profile-dir DIR]   # re-render from existing folders
    python benchmarks/readme_figures.py --render-only    # the README's blocks again from the recorded JSON

It runs the README's two commands as a user would, each in a fresh process, one after the other:
`dspark-bench run --split qualitative --category coding` and `dspark-bench profile --torch --category coding`,
into a scratch folder. For each it measures the wall time and the peak resident memory of the command's largest
process (`os.wait4` of the command: Linux reports the maximum over it and every descendant it waited for); for
the profile also the size of the traces it wrote. The table is the one `dspark-bench report RUN` prints for the
run (the renderer `run` itself prints with). The machine (cores usable, CPU model, torch and Python versions)
and the revision (git commit, and whether the tree had uncommitted changes) come from the run's own manifest.

It writes the README's blocks between marker comments (`<!-- readme-figures:NAME:start -->` ... `end`), and the
figures as JSON (default `benchmarks/results/readme_figures.json`, the committed measurements). Run it on a
quiet machine: a run that saw contention says so in its caption. `--skip-run` measures nothing: the caption
then says the times were not measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from harness.backends.timing import cpu_name  # noqa: E402  (the one reader of the CPU's model name)

README = ROOT / "README.md"
FIGURES = ROOT / "benchmarks" / "results" / "readme_figures.json"
CLI = [sys.executable, "-m", "harness.cli"]
MAIN = ["run", "--split", "qualitative", "--category", "coding"]
PROFILE = ["profile", "--torch", "--category", "coding"]
BLOCKS = ("table", "profile")


class Refused(Exception):
    """A problem the user can fix: printed as one line, exit code 2."""


def marker(name: str, end: bool = False) -> str:
    return f"<!-- readme-figures:{name}:{'end' if end else 'start'} -->"


def timed(args: list[str], log: Path) -> dict:
    """Run `args` (stdout and stderr to `log`); its wall seconds, exit code and peak RSS in bytes."""
    with open(log, "wb") as out:
        start = time.monotonic()
        proc = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise Refused(f"`{' '.join(args[2:])}` exited {proc.returncode}: {tail[0]} (log: {log})")
    return {"wall_s": round(wall, 1), "peak_rss_bytes": usage.ru_maxrss * 1024}


def table_text(run_dir: Path) -> str:
    """The run's table as `dspark-bench report RUN` prints it, from its top border to its bottom one."""
    out = subprocess.run([*CLI, "report", str(run_dir)], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "200"})
    if out.returncode != 0:
        raise Refused(f"report {run_dir} exited {out.returncode}: {(out.stderr.strip().splitlines() or [''])[-1]}")
    lines = out.stdout.splitlines()
    top = next((i for i, line in enumerate(lines) if line.startswith("┏")), None)
    bottom = next((i for i, line in enumerate(lines) if line.startswith("└")), None)
    if top is None or bottom is None or bottom < top:
        raise Refused(f"report {run_dir} printed no table")
    return "\n".join(line.rstrip() for line in lines[top:bottom + 1])


def trace_bytes(profile_dir: Path) -> int:
    """The traces a profile wrote: PyTorch's `<system>/trace.torch.json.gz`, nsys' `.nsys-rep` and `.sqlite`."""
    return sum(p.stat().st_size for p in profile_dir.rglob("*")
               if p.is_file() and (p.name.startswith("trace.") or p.suffix in (".nsys-rep", ".sqlite")))


def figures_from(run_dir: Path, profile_dir: Path | None, main: dict | None, profile: dict | None) -> dict:
    """Everything the README's blocks say, from the run folder (its manifest and summary), the profile
    folder and the measured costs (None where nothing was measured)."""
    try:
        manifest = json.loads((run_dir / "manifest.json").read_text())
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError) as e:
        raise Refused(f"{run_dir}: not a finished run folder ({e}); give one `dspark-bench run` wrote") from None
    figures = {
        "measured_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commands": {"table": "dspark-bench " + " ".join(MAIN), "profile": "dspark-bench " + " ".join(PROFILE)},
        **provenance(manifest),
        "threads": (manifest.get("threads") or {}).get("count") if isinstance(manifest.get("threads"), dict)
        else manifest.get("threads"),
        "requests": summary.get("requests_done"),
        "complete": summary.get("complete"),
        "contention": {"measured": summary.get("contention_measured"), "contended": summary.get("contended_requests")},
        "table": table_text(run_dir),
        "main": main,
        "profile": None,
    }
    if profile_dir is not None:
        child = next(iter(sorted(profile_dir.glob("*/manifest.json"))), None)
        if child is None:
            raise Refused(f"{profile_dir}: no child run folder in it; give the folder `dspark-bench profile` wrote")
        figures["profile"] = {**(profile or {}), "trace_bytes": trace_bytes(profile_dir),
                              **provenance(json.loads(child.read_text()))}
    return figures


def provenance(manifest: dict) -> dict:
    """When, on what and from which revision a run ran, as its manifest records it (the CPU model, which
    the manifest does not hold, from this machine)."""
    prov = manifest.get("provenance") or {}
    git, versions = prov.get("git") or {}, prov.get("versions") or {}
    return {"run_utc": prov.get("time_utc"),
            "machine": {"cores": prov.get("cores") or len(os.sched_getaffinity(0)), "cpu": cpu_name(),
                        "arch": prov.get("cpu") or platform.machine(), "device": prov.get("device"),
                        "torch": versions.get("torch"), "python": versions.get("python")},
            "revision": {"commit": git.get("commit"), "dirty": git.get("dirty")}}


def _revision(rev: dict) -> str:
    commit = (rev.get("commit") or "unknown")[:12]
    return f"git {commit}" + (" with uncommitted changes" if rev.get("dirty") else "")


def _machine(m: dict) -> str:
    return f"{m['cores']} cores ({m['cpu']}, {m['arch']}), device {m['device']}, torch {m['torch']}, Python {m['python']}"


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"


def _where(f: dict) -> str:
    when = (f["run_utc"] or "").replace("T", " ")[:16]
    return f"on {_machine(f['machine'])}, at {_revision(f['revision'])}, {when} UTC"


def _wrap(text: str) -> str:
    return textwrap.fill(text, width=112, break_long_words=False, break_on_hyphens=False)


def render(figures: dict) -> dict[str, str]:
    """The text of each README block (without its markers): the caption names the machine and the revision."""
    c = figures["contention"]
    busy = (f"no contention seen ({c['measured']} requests measured)" if not c["contended"]
            else f"CONTENTION: {c['contended']} of {c['measured']} requests timed while other processes "
                 f"competed for the cores")
    main = figures["main"]
    cost = (f"{main['wall_s']:.0f} s wall, loading included, peak RSS {_gb(main['peak_rss_bytes'])} (its largest "
            f"process)" if main else "wall time not measured (rendered from an existing run folder)")
    state = "" if figures["complete"] else ", INCOMPLETE"
    caption = (f"One run of the main command (`{figures['commands']['table']}`: {cost}; `threads: "
               f"{figures['threads']}`; {busy}{state}), {_where(figures)}:")
    table = f"{_wrap(caption)}\n\n```\n{figures['table']}\n```"
    prof = figures["profile"]
    if prof is None:
        profile = "The `profile` example's cost was not measured with this table."
    else:
        spent = (f"took {prof['wall_s']:.0f} s wall (the unprofiled timing included; peak RSS "
                 f"{_gb(prof['peak_rss_bytes'])}, its largest process) and" if "wall_s" in prof
                 else "(time not measured)")
        profile = _wrap(f"`{figures['commands']['profile']}` {spent} wrote {prof['trace_bytes'] / 1e6:.1f} MB of "
                        f"gzipped traces, {_where(prof)}.")
    return {"table": table, "profile": profile}


def update_readme(text: str, blocks: dict[str, str], path: Path) -> str:
    """`text` with each block's lines between its markers replaced; a missing marker is refused."""
    for name, body in blocks.items():
        start, end = marker(name), marker(name, end=True)
        i, j = text.find(start), text.find(end)
        if i < 0 or j < 0 or j < i:
            raise Refused(f"{path}: no `{start}` ... `{end}` pair; put the two comments where the block goes")
        text = text[:i + len(start)] + "\n" + body + "\n" + text[j:]
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--readme", type=Path, default=README)
    ap.add_argument("--json", type=Path, default=FIGURES, help="where the figures are recorded")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--skip-run", type=Path, metavar="RUN", help="render from this run folder, running nothing")
    mode.add_argument("--render-only", action="store_true", help="render from the recorded --json, running nothing")
    ap.add_argument("--profile-dir", type=Path, help="with --skip-run: the profile folder of the README's example")
    ap.add_argument("--work", type=Path, help="folder for the run and the profile (default: a temporary one)")
    args = ap.parse_args()
    try:
        if not args.readme.is_file():
            raise Refused(f"{args.readme}: no such file; give the README with --readme")
        text = args.readme.read_text()
        update_readme(text, {name: "" for name in BLOCKS}, args.readme)  # markers checked before any work
        if args.render_only:
            try:
                figures = json.loads(args.json.read_text())
            except (OSError, ValueError) as e:
                raise Refused(f"{args.json}: no recorded figures ({e}); run without --render-only") from None
        elif args.skip_run:
            figures = figures_from(args.skip_run, args.profile_dir, None, None)
        else:
            work = args.work or Path(tempfile.mkdtemp(prefix="readme-figures-"))
            work.mkdir(parents=True, exist_ok=True)
            run_dir, profile_dir = work / "run", work / "profile"
            for folder in (run_dir, profile_dir):
                if folder.exists():
                    raise Refused(f"{folder} exists; give an empty --work folder")
            print(f"running the main command into {run_dir} ...", file=sys.stderr)
            main_cost = timed([*CLI, *MAIN, "--out", str(run_dir)], work / "run.log")
            print(f"running the profile example into {profile_dir} ...", file=sys.stderr)
            profile_cost = timed([*CLI, *PROFILE, "--out", str(profile_dir)], work / "profile.log")
            figures = figures_from(run_dir, profile_dir, main_cost, profile_cost)
        args.readme.write_text(update_readme(text, render(figures), args.readme))
        if not args.render_only:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(figures, indent=1) + "\n")
    except Refused as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"wrote {args.readme}" + ("" if args.render_only else f" and {args.json}"), file=sys.stderr)


if __name__ == "__main__":
    main()

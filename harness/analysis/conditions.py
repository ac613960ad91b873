"""Whether a profile and the runs read beside it were timed under like conditions.

`report --profile` puts a profile's time shares next to runs' speeds; they describe each other only
where both were timed alike. A profile taken while other processes competed for the cores (16 ms a
token) says little about a quiet run of the same system (5.6 ms). Each side's requests record how they
were timed: their TPOT, and their `contention` (`harness.runs.contention`, counted as the summary counts
it, `summary.contention_figures`). Where either side saw contention, or their TPOTs are more than WIDE
apart either way, the report says so in a note naming both figures.
"""

from __future__ import annotations

from pathlib import Path

from harness.analysis.frames import is_run, profile_files
from harness.analysis.records import read_requests
from harness.analysis.summary import contention_figures

WIDE = 1.5  # TPOTs further apart than this factor, either way: not timed alike (a profiler's overhead included)


def timed(records: list[dict], system: str) -> dict | None:
    """A system's finished requests: their mean TPOT (ms) and how many were timed under contention, of
    how many measured; None without a TPOT."""
    done = [r for r in records if r.get("system") == system and not r.get("failed") and r.get("tpot_ms")]
    if not done:
        return None
    c = contention_figures(done)
    return {"tpot_ms": sum(r["tpot_ms"] for r in done) / len(done), "contended": c["contended_requests"],
            "measured": c["contention_measured"]}


def _how(t: dict) -> str:
    if t["contended"]:
        return f"under contention ({t['contended']} of {t['measured']} requests)"
    return "quiet" if t["measured"] else "contention not measured"


def profile_notes(run_paths: list[Path], profile_paths: list[Path]) -> list[str]:
    """One line per system that a profile folder (its `<system>/` run) and a run both timed, where the two
    were not timed alike; nothing for a trace file alone (it records no requests)."""
    runs = [(Path(p).name, read_requests(Path(p))) for p in run_paths if is_run(Path(p))]
    notes = []
    for path in map(Path, profile_paths):
        systems = profile_files(path) if path.is_dir() else {}
        for system in systems:
            prof = timed(read_requests(path / system), system) if is_run(path / system) else None
            for name, records in runs if prof else ():
                run = timed(records, system)
                if run is None:
                    continue
                ratio = prof["tpot_ms"] / run["tpot_ms"]
                why = [w for w, bad in (("the profile saw contention", prof["contended"]),
                                        ("the run saw contention", run["contended"]),
                                        (f"their TPOTs are {max(ratio, 1 / ratio):.1f}x apart",
                                         not 1 / WIDE <= ratio <= WIDE)) if bad]
                if why:
                    notes.append(f"mixed conditions: profile {path.name}/{system} was timed at {prof['tpot_ms']:.1f} "
                                 f"ms a token (TPOT, profiler on), {_how(prof)}; run {name}'s {system} at "
                                 f"{run['tpot_ms']:.1f} ms, {_how(run)}: {', '.join(why)}, so the profile's time "
                                 "shares may not describe this run.")
    return notes

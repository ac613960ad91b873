"""Does a rebuild of the demo pair reproduce the shipped figures? Compares the figures.json a build
wrote with the shipped one (experiments/demo/figures.json).

GPU training is not bitwise deterministic, so a rebuild is held to the stated tolerance: every
acceptance length (DSpark, DFlash mode, EAGLE-3, the draft model, n-gram; T = 0 and T = 1) within ±0.3 tokens
per round, and greedy speculative output equal to plain decoding. The distinct 4-gram ratios are shown, not held.
Exit code 0 when the rebuild holds, 1 when a figure is out of tolerance, 2 for unusable input.

    python experiments/demo/compare_figures.py build/demo/figures.json [--reference FILE] [--tolerance 0.3]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

SHIPPED = Path(__file__).resolve().parent / "figures.json"
TOLERANCE = 0.3
HELD, SHOWN = "_acceptance_length", "_distinct_4gram"  # the numbers held to the tolerance, and those shown
GREEDY = "greedy_outputs_equal_plain"


def _numbers(figures: dict) -> list[str]:
    return sorted(k for k in figures if k.endswith((HELD, SHOWN)))


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def compare(new: dict, reference: dict, tolerance: float) -> tuple[list[dict], bool]:
    """One row per figure (name, reference, rebuilt, difference, held: True/False, or None where it is
    only shown), and whether the rebuild holds."""
    rows = []
    for key in _numbers(reference):
        held = abs(new[key] - reference[key]) <= tolerance if key.endswith(HELD) else None
        rows.append({"figure": key, "reference": round(reference[key], 3), "rebuilt": round(new[key], 3),
                     "difference": round(new[key] - reference[key], 3), "held": held})
    rows.append({"figure": GREEDY, "reference": reference[GREEDY], "rebuilt": new[GREEDY], "difference": None,
                 "held": new[GREEDY] is True})
    return rows, all(r["held"] is not False for r in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("figures", type=Path, help="the figures.json of the rebuild (in build.py's --out folder)")
    ap.add_argument("--reference", type=Path, default=SHIPPED, help="the figures to reproduce (default: the shipped ones)")
    ap.add_argument("--tolerance", type=float, default=TOLERANCE, help="tokens per round either way")
    args = ap.parse_args(argv)
    if not math.isfinite(args.tolerance) or args.tolerance < 0:
        ap.error(f"--tolerance {args.tolerance}: give a number of tokens per round, 0 or more")
    loaded = []
    for path in (args.figures, args.reference):
        try:
            loaded.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            ap.error(f"{path}: cannot read it as JSON ({exc}); give the figures.json a full build wrote")
        figures = loaded[-1]
        numbers = _numbers(figures) if isinstance(figures, dict) else []
        bad = [k for k in numbers if not _finite(figures[k])]
        if not numbers or bad or GREEDY not in figures:
            ap.error(f"{path}: not the figures.json of a build evaluated to the end "
                     f"({'no number for ' + ', '.join(bad) if bad else 'figures missing'})")
    new, reference = loaded
    missing = [k for k in (*_numbers(reference), GREEDY) if k not in new]
    if missing:
        ap.error(f"{args.figures}: no {', '.join(missing)}; give the figures.json of a build evaluated to the end")
    if new.get("size") != reference.get("size"):
        ap.error(f"{args.figures}: a {new.get('size')} build, the reference is a {reference.get('size')} one")
    rows, ok = compare(new, reference, args.tolerance)
    print(json.dumps({"tolerance": args.tolerance, "holds": ok, "figures": rows}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

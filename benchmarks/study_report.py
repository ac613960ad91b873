"""The write-up's study at Qwen3-8B shapes, from the H200's raw outputs (`benchmarks/study_h200.sh`): per engine
and level, the measured speedup beside the one step costs derive, the kernel mix of the profiles, and the
figures; where the crossover stages ran (issue 57), where each speculative system stops paying as concurrency
rises (`harness/analysis/crossover.py`: a table, the crossovers by TPOT and by throughput, a figure per system).
Random weights, synthetic acceptance: these time systems, never drafts. Stages that did not run are left out.

    python benchmarks/study_report.py benchmarks/results/study_qwen3_8b_h200
        (unpacks raw.tar.xz there into a temporary folder, else reads the stages' folders in FOLDER itself;
        writes study.json, study.md and the PNGs beside it)
"""

from __future__ import annotations

import argparse
import json
import tarfile
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import pandas as pd  # noqa: E402

from harness.analysis.crossover import caption, crossovers, levels, markdown, read_sweeps  # noqa: E402
from harness.analysis.report_figures import speedup_vs_concurrency  # noqa: E402
from harness.analysis.study import bench_costs, measured_vs_derived, vllm_level_costs  # noqa: E402
from harness.analysis.study_figures import crossover_figure, engines_side_by_side, measured_against_derived  # noqa: E402
from harness.analysis.summary import summarize_folder  # noqa: E402

VLLM_BENCH = Path(__file__).resolve().parent / "results" / "vllm026_h200" / "engine_bench_vs_vllm.json"
RUNS = {"native": ("ours", "bench"), "vllm-a": ("vLLM offline", "vllm"), "serve": ("vLLM served", "vllm"),
        "writeup": ("ours, write-up settings (3 prompts, 64 tokens)", "bench")}
# issue 57: plain against one speculative system served in both orders (study_h200.sh's stages), per sweep
CROSSOVERS = {"crossover": ("crossover-ab", "crossover-ba"), "crossover-adaptive": ("adaptive-ab", "adaptive-ba")}
VLLM32_BENCH = "engine_bench_vllm.json"  # the bench-vllm stage's step costs per batch (vLLM 0.32), when it ran
PROFILES = ("plain", "dspark-official")  # the systems both engines were profiled with (vLLM's DSpark did not finish)


def kernel_mix(summary_file: Path, tokens: int) -> dict:
    """A profile's kernel categories (share of GPU kernel time), kernels and GPU ms per output token."""
    s = json.loads(summary_file.read_text())
    total_ns = sum(c["total_ns"] for c in s["categories"])
    return {"shares": {c["category"]: round(c["share"], 4) for c in s["categories"]},
            "kernels_per_token": s["launches"]["kernels"] / tokens, "gpu_ms_per_token": total_ns / 1e6 / tokens,
            "graph_launches_per_token": s["launches"]["graph_launches"] / tokens,
            "kernels_from_graphs_share": s["launches"]["kernels_from_graphs_share"]}


def crossover_sections(raw: Path, out: Path, bench: dict, bench_from: str) -> dict:
    """Per sweep of CROSSOVERS whose run folders are in `raw`: each speculative system's levels against
    plain (`crossover.levels`, derived from `bench`'s per-batch step costs), its two crossovers, the table
    lines and `<sweep>-<system>.png`."""
    found = {}
    for name, folders in CROSSOVERS.items():
        runs = [raw / f for f in folders if (raw / f / "manifest.json").is_file()]
        if not runs:
            continue
        sweeps = read_sweeps(runs)
        text = caption(sweeps)
        systems = dict.fromkeys(r["system"] for sw in sweeps for r in sw.summary["rows"] if r["method"] != "plain")
        for system in systems:
            rows = levels(sweeps, system, bench)
            points = crossovers(rows)
            crossover_figure(system, rows, points, text).savefig(out / f"{name}-{system}.png", dpi=110)
            found[f"{name}: {system}"] = {"rows": rows, "crossovers": points, "caption": text,
                                          "derived_from": bench_from, "runs": [str(r.name) for r in runs],
                                          "markdown": markdown(system, rows, points, text) + [
                                              "", f"Derived from {bench_from}."]}
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    args = ap.parse_args()
    out = args.folder
    with tempfile.TemporaryDirectory() as tmp:
        packed = out / "raw.tar.xz"
        if packed.is_file():
            with tarfile.open(packed) as tar:
                tar.extractall(tmp, filter="data")
        raw = Path(tmp) if packed.is_file() else out  # (else the stages' folders unpacked in `folder` itself)
        bench = raw / "engine_bench.json"
        ours = bench_costs(json.loads(bench.read_text())) if bench.is_file() else {}
        theirs = vllm_level_costs(json.loads(VLLM_BENCH.read_text()))
        rows, summaries = [], {}
        for folder, (engine, costs) in RUNS.items():
            if not (raw / folder / "manifest.json").is_file():
                continue  # (a stage that did not run in this call)
            summaries[folder] = summarize_folder(raw / folder)
            rows += measured_vs_derived(summaries[folder], engine, **({"costs": ours} if costs == "bench" else
                                                                       {"level_costs": theirs}))
        tokens = 2 * 256  # each profile's timed requests: 2 prompts x 256 output tokens
        kernels = {f"{engine} {system}": kernel_mix(raw / folder / f"{system}.summary.json", tokens)
                   for folder, engine in (("profile-native", "ours"), ("profile-vllm", "vLLM"))
                   for system in PROFILES if (raw / folder / f"{system}.summary.json").is_file()}
        label = next((s["label"] for s in summaries.values()), None)
        caption = f"H200, Qwen3-8B shapes, bf16, random weights, synthetic acceptance (each system's profile named)"
        figures = {"measured_vs_derived.png": measured_against_derived(rows, caption),
                   "engines.png": engines_side_by_side(rows, caption)} if rows else {}
        if "serve" in summaries:
            figures["concurrency.png"] = speedup_vs_concurrency(pd.DataFrame(summaries["serve"]["rows"]),
                                                                f"vLLM 0.32 served, H200, Qwen3-8B shapes, bf16, "
                                                                f"{summaries['serve']['label']}")
        for name, fig in figures.items():
            fig.savefig(out / name, dpi=110)
        ours32 = raw / VLLM32_BENCH
        bench_from = (f"{VLLM32_BENCH} (engine-bench --against vllm on vLLM 0.32, this study)" if ours32.is_file()
                      else f"{VLLM_BENCH.name} (vLLM 0.26.0: vLLM 0.32's step costs were not timed)")
        crossing = crossover_sections(raw, out, json.loads((ours32 if ours32.is_file() else VLLM_BENCH).read_text()),
                                      bench_from)
    study = {"label": label, "rows": rows, "kernels": kernels, "crossovers": crossing, "derived_from": {
        "ours": "engine-bench --json in this call (raw engine_bench.json): plain decode step, DSpark block round "
                "(also DFlash's, an upper bound: no Markov head), EAGLE-3 round",
        "vllm": f"{VLLM_BENCH.relative_to(Path(__file__).resolve().parents[1])}: engine-bench --against vllm, vLLM "
                "0.26.0 at 301496e (its plain step and DSpark round per level; vLLM 0.32's were not timed)"}}
    (out / "study.json").write_text(json.dumps(study, indent=1))
    lines = [f"# Qwen3-8B shapes on the H200: {label}" if rows else "# Where the speculative systems stop paying", ""] + ([
             "| engine | system | c | profile | AL | measured | 95 % CI | derived | measured / derived | tok/s ratio |",
             "|---|---|---|---|---|---|---|---|---|---|"] if rows else [])
    for r in rows:
        ci = r["measured_ci95"]
        lines.append(f"| {r['engine']} | {r['system']} | {r['max_concurrency']} | {r['profile']} | "
                     f"{r['realised_al']:.2f} | {r['measured']:.2f} | "
                     f"{'-' if not ci else f'{ci[0]:.2f}-{ci[1]:.2f}'} | "
                     f"{'-' if r['derived'] is None else format(r['derived'], '.2f')} | "
                     f"{'-' if r['measured_over_derived'] is None else format(r['measured_over_derived'], '.3f')} | "
                     f"{'-' if r['throughput_ratio'] is None else format(r['throughput_ratio'], '.2f')} |")
    lines += [] if not kernels else ["", "| profile | GEMM | attention | norm | elementwise | softmax/sampling | kernels / token | GPU ms / token |",
              "|---|---|---|---|---|---|---|---|"]
    for name, k in kernels.items():
        sh = k["shares"]
        lines.append(f"| {name} | " + " | ".join(f"{100 * sh.get(c, 0):.1f} %" for c in (
            "GEMM", "attention", "norm", "elementwise", "softmax/sampling")) +
            f" | {k['kernels_per_token']:.0f} | {k['gpu_ms_per_token']:.2f} |")
    for section in crossing.values():
        lines += [""] + section["markdown"]
    (out / "study.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

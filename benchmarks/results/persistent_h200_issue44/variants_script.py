"""Scratch: the attention halves of all layers, four launches vs persistent variants; a phase trace."""
import functools, json, statistics, sys
import torch
sys.path.insert(0, ".")
from dspark import kernels
from dspark.presets import TARGETS, build_random
from harness.backends.timing import cuda_median_ms
sys.path.insert(0, "benchmarks")
from launch_probe import attention_halves

VARIANTS = {"four": None, "p": {}, "p_nol2": dict(l2_prefetch=False), "p_share2": dict(split_share=2),
            "p_nol2_share2": dict(l2_prefetch=False, split_share=2), "p_share4": dict(split_share=4)}
LABELS = ["start", "ready", "written", "seen", "attended", "all attended", "all merged", "end"]
with torch.inference_mode():
    target, _ = build_random(TARGETS["qwen3-8b"], None, "cuda", torch.bfloat16)
    L = len(target.model.layers)
    graphs, traces = {}, {}
    orig = kernels.attention_block
    for name, kw in VARIANTS.items():
        kernels.attention_block = functools.partial(orig, **(kw or {}))
        with kernels.persistent_mode(kw is not None):
            graphs[name] = attention_halves(target, 1024)
        if kw is not None and name in ("p", "p_nol2", "p_share2"):
            tr = torch.zeros(128, 8, dtype=torch.int64, device="cuda")
            kernels.attention_block = functools.partial(orig, trace=tr, **kw)
            traces[name] = (attention_halves(target, 1024), tr)
    kernels.attention_block = orig
    t = {k: [] for k in graphs}
    for _ in range(5):
        for k, g in graphs.items():
            t[k].append(cuda_median_ms(g, 30) / L * 1000)
    print(json.dumps({k: [round(statistics.median(v), 2), round(min(v), 2), round(max(v), 2)] for k, v in t.items()}))
    for name, (g, tr) in traces.items():
        tr.zero_()
        g()
        torch.cuda.synchronize()
        x = tr.double()
        t0 = x[:, 0].min()
        print("trace", name, "(us from the first program's start: min/median/max over programs)")
        for j, lab in enumerate(LABELS):
            col = x[:, j]
            col = col[col > 0]
            if len(col):
                v = (col - t0) / 1000
                print(f"  {lab:12s} n={len(col):4d} {v.min():7.2f} {v.median():7.2f} {v.max():7.2f}")
    from torch.profiler import profile, ProfilerActivity
    for k in ("four", "p", "p_nol2"):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                graphs[k]()
            torch.cuda.synchronize()
        print("==", k)
        for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:5]:
            print(f"  {e.key[:60]:60s} n={e.count:5d} avg={e.device_time_total / max(e.count,1):8.2f}us")

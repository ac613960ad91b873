"""Seconds per draft training step at the demo build's settings, and where the time goes.

The shipped demo target with a fresh draft of the shipped shape (3 layers, MLP 640, DSpark or DFlash
mode), batches of `--batch` sequences of `--length` random tokens (a quarter prompt), `--anchors`
blocks each: random tokens time the same work as real data (the defaults are the demo build's: nearly
every batch of 64 holds a 512-token source window, so it pads to 512). It reports wall seconds per step
after warm-up, how much of that the host spends before the device has finished (host-bound steps
show up as device-idle time), and with `--profile` the top operators by device (or CPU) time.

    python benchmarks/train_step.py [--device cuda] [--mode dspark] [--steps 20] [--profile]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from dspark.checkpoint import load_target
from dspark.presets import evenly_spaced_taps
from dspark.tiny import random_draft, tiny_draft_config
from dspark.train import LossConfig, TrainArgs, train
from harness.runs.provenance import provenance


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--mode", choices=("dspark", "dflash"), default="dspark")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--intermediate", type=int, default=640)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--anchors", type=int, default=128)
    ap.add_argument("--length", type=int, default=512, help="tokens per sequence (the build's batches pad to 512)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps, after 5 of warm-up")
    ap.add_argument("--tf32", action="store_true", help="TF32 matmuls (the demo build trains with them on a GPU)")
    ap.add_argument("--profile", action="store_true", help="print the top operators of the timed steps")
    args = ap.parse_args()
    if args.steps < 1:
        ap.error("--steps must be at least 1")
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    device = torch.device(args.device)
    target = load_target("demo", device="cpu", dtype="float32").model
    tcfg = target.config
    rank = 64 if args.mode == "dspark" else 0
    dcfg = tiny_draft_config(tcfg, layers=args.layers, block_size=7, taps=evenly_spaced_taps(tcfg.backbone.num_layers),
                             markov_rank=rank, confidence=rank > 0, mask_token_id=tcfg.backbone.vocab_size - 1,
                             intermediate_size=args.intermediate)
    draft = random_draft(dcfg, target, 1).to(device)
    target.to(device)
    gen = torch.Generator().manual_seed(0)
    vocab = tcfg.backbone.vocab_size - 1
    examples = [(torch.randint(0, vocab, (args.length,), generator=gen), torch.arange(args.length) >= args.length // 4)
                for _ in range(256)]
    stamps = []
    warm = 5
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
    profiler = torch.profiler.profile(activities=acts) if args.profile else None

    def on_step(step, stats):
        if step == warm - 1:  # the timed (and profiled) steps start with the warm-up's work finished
            sync()
            if profiler is not None:
                profiler.start()
        stamps.append(time.perf_counter())

    targs = TrainArgs(steps=warm + args.steps, batch=args.batch, lr=1e-3, loss=LossConfig(num_anchors=args.anchors))
    train(target, draft, examples, targs, on_step=on_step)
    host_done = stamps[-1]
    sync()
    device_done = time.perf_counter()
    if profiler is not None:
        profiler.stop()
    per_step = (device_done - stamps[warm - 1]) / args.steps
    print(json.dumps({
        "mode": args.mode, "layers": args.layers, "intermediate": args.intermediate, "batch": args.batch,
        "anchors": args.anchors, "length": args.length, "tf32": args.tf32, "steps": args.steps,
        "seconds_per_step": round(per_step, 4),
        "host_ahead_s": round(device_done - host_done, 4),  # how far the host ran ahead of the device at the end
        "sequences_per_s": round(args.batch / per_step, 1), "profiled": args.profile,
        "provenance": provenance(args.device),
    }, indent=1))
    if profiler is not None:
        key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
        print(profiler.key_averages().table(sort_by=key, row_limit=25))


if __name__ == "__main__":
    main()

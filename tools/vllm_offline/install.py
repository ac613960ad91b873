"""On the GPU host: put `build.py`'s parts back together, check every hash, install the wheels into a
folder, and check that vLLM imports at the pinned version and that its compiled ops load (or, with
`--check aiperf`, that AIPerf runs from its own folder).

    python3 tools/vllm_offline/install.py PART_DIR [PART_DIR ...] [--target /tmp/site]
    export PYTHONPATH=/tmp/site:$PYTHONPATH
    python3 tools/vllm_offline/install.py PART_DIR ... --target /tmp/aiperf --check aiperf   # then:
    dspark-bench run ... --load-generator aiperf --aiperf /tmp/aiperf/bin/aiperf

AIPerf's pins clash with vLLM's, so it gets a folder of its own and an `aiperf` launcher in its `bin/` that puts
only that folder before the image's packages (whatever PYTHONPATH the harness runs under).

Standard library only (it runs before anything is installed). Each PART_DIR holds `part-N` and
`manifest.json` (a part copied to /tmp as it arrives is as good). A missing or altered part, or a vLLM
that does not load, is one line naming it, exit code 2.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shlex
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

CHECK = ("import torch, vllm\n"
         "from vllm.platforms import current_platform\n"
         "current_platform.import_kernels()  # (vLLM's compiled ops: _C_stable_libtorch; no MoE kernels)\n"
         "import vllm.vllm_flash_attn._vllm_fa3_C  # FlashAttention 3, what a Hopper GPU runs\n"
         "ops = [op for op in ('rms_norm', 'fused_add_rms_norm', 'silu_and_mul') if not hasattr(torch.ops._C, op)]\n"
         "assert not ops, f'compiled ops missing: {ops}'\n"
         "print(vllm.__version__, torch.__version__, torch.version.cuda)\n")


def aiperf_launcher(target: Path) -> Path:
    """`TARGET/bin/aiperf` (in place of pip's script): runs AIPerf with TARGET alone before the image's
    packages (vLLM's folder, which the harness's own PYTHONPATH names, holds other versions of its pins)."""
    launcher = target / "bin" / "aiperf"
    launcher.parent.mkdir(parents=True, exist_ok=True)
    folder, python = shlex.quote(str(target)), shlex.quote(sys.executable)
    launcher.write_text(f'#!/bin/sh\nPYTHONPATH={folder} exec {python} -m aiperf "$@"\n')
    launcher.chmod(0o755)
    return launcher


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def assemble(dirs: list[Path]) -> tuple[bytes, dict]:
    found: dict[int, Path] = {}
    manifest = None
    for d in dirs:
        if not (d / "manifest.json").is_file():
            fail(f"{d}: no manifest.json; give the folders build.py wrote")
        manifest = manifest or json.loads((d / "manifest.json").read_text())
        if not isinstance(manifest, dict) or not {"parts", "tar_sha256", "wheels"} <= set(manifest):
            fail(f"{d / 'manifest.json'}: not a manifest build.py wrote (it lacks parts, tar_sha256 or wheels)")
        for part in d.glob("part-*"):
            found[int(part.name.split("-")[1])] = part
    want = range(1, len(manifest["parts"]) + 1)
    missing = [i for i in want if i not in found]
    if missing:
        fail(f"parts {missing} of {len(manifest['parts'])} are missing; carry them too")
    blob = b""
    for i in want:
        data = found[i].read_bytes()
        if hashlib.sha256(data).hexdigest() != manifest["parts"][i - 1]:
            fail(f"{found[i]}: its sha256 is not the manifest's; carry that part again")
        blob += data
    if hashlib.sha256(blob).hexdigest() != manifest["tar_sha256"]:
        fail("the reassembled wheelhouse's sha256 is not the manifest's; build and carry the parts again")
    return blob, manifest


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("parts", type=Path, nargs="+")
    p.add_argument("--target", type=Path, default=None, help="default /tmp/site (vLLM), /tmp/aiperf (AIPerf)")
    p.add_argument("--check", choices=("vllm", "aiperf"), default="vllm", help="what the wheels must run")
    args = p.parse_args()
    args.target = args.target or Path("/tmp/aiperf" if args.check == "aiperf" else "/tmp/site")
    if args.check == "aiperf" and (args.target / "vllm").is_dir():
        fail(f"--target {args.target} holds vLLM; AIPerf's pins clash with its: give AIPerf a folder of its own")
    if sys.version_info[:2] != (3, 12):
        fail(f"the wheels are for CPython 3.12, this is {sys.version.split()[0]}; run it with the host's python3.12")
    blob, manifest = assemble(args.parts)
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            tar.extractall(tmp, filter="data")
        wheels = sorted(Path(tmp).glob("*.whl"))
        for w in wheels:
            if hashlib.sha256(w.read_bytes()).hexdigest() != manifest["wheels"].get(w.name):
                fail(f"{w.name}: its sha256 is not the manifest's")
        pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                              "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(args.target),
                              *map(str, wheels)], capture_output=True, text=True)
        if pip.returncode != 0:
            fail(f"pip could not install the wheels: {(pip.stderr.strip().splitlines() or ['?'])[-1]}")
    if args.check == "aiperf":
        launcher = aiperf_launcher(args.target)
        proc = subprocess.run([str(launcher), "--version"], check=False, capture_output=True, text=True)
        said = (proc.stdout + proc.stderr).strip().splitlines() or ["?"]
        if proc.returncode != 0:
            fail(f"AIPerf does not run from {args.target}: {said[-1]}")
        print(f"installed {len(wheels)} wheels into {args.target}: aiperf {said[-1]}; give --aiperf {launcher}")
        return
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(args.target), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        fail(f"vLLM does not load from {args.target}: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    version, torch_version, cuda = proc.stdout.split()
    print(f"installed {len(wheels)} wheels into {args.target}: vllm {version} on torch {torch_version} (CUDA {cuda}), "
          "compiled ops load; export PYTHONPATH=" + str(args.target) + ":$PYTHONPATH")


if __name__ == "__main__":
    main()

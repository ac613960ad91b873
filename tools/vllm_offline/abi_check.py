"""Can a vLLM wheel's compiled extensions load against another torch build than the one it pins?

vLLM 0.28 and later pin torch 2.13, while the GPU image has torch 2.11.0+cu130; carrying a CUDA torch over is
half a gigabyte. Extensions built on torch's stable C shim (`aoti_torch_*`, `torch_*`) call no C++ symbol of
torch, so they load where the other torch's libraries export every shim function they call. This lists, per
extension of the vLLM wheel, the shim functions it needs that the torch wheel's libtorch libraries lack, and how
many C++ torch symbols it needs (any at all ties it to the torch it was built against). Uses binutils' `nm`.

    python tools/vllm_offline/abi_check.py VLLM.whl TORCH.whl [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

TORCH_LIBS = ("torch/lib/libtorch.so", "torch/lib/libtorch_cpu.so", "torch/lib/libtorch_cuda.so")
CXX_TORCH = ("_ZN3c10", "_ZN5torch", "_ZN2at")  # mangled C++ names in namespaces c10, torch, at


def _symbols(path: Path, undefined: bool) -> set[str]:
    flag = "--undefined-only" if undefined else "--defined-only"
    out = subprocess.run(["nm", "-D", flag, str(path)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def check(vllm_wheel: Path, torch_wheel: Path) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(torch_wheel) as tw, zipfile.ZipFile(vllm_wheel) as vw:
        exported: set[str] = set()
        for name in TORCH_LIBS:
            exported |= _symbols(Path(tw.extract(name, tmp)), undefined=False)
        rows = []
        for name in sorted(n for n in vw.namelist() if n.endswith(".so")):
            needed = _symbols(Path(vw.extract(name, tmp)), undefined=True)
            shim = {s for s in needed if s.startswith(("aoti_", "torch_"))}
            rows.append({"extension": name, "shim_functions": len(shim), "missing": sorted(shim - exported),
                         "cxx_torch_symbols": sum(s.startswith(CXX_TORCH) for s in needed)})
            Path(tmp, name).unlink()
        return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("vllm_wheel", type=Path)
    ap.add_argument("torch_wheel", type=Path)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    for path in (args.vllm_wheel, args.torch_wheel):
        if not path.is_file():
            print(f"{path}: no such wheel; download it with `pip download --no-deps`", file=sys.stderr)
            sys.exit(2)
    rows = check(args.vllm_wheel, args.torch_wheel)
    if args.json:
        print(json.dumps({"vllm_wheel": args.vllm_wheel.name, "torch_wheel": args.torch_wheel.name, "extensions": rows},
                         indent=1))
        return
    for r in rows:
        loads = not r["missing"] and not r["cxx_torch_symbols"]
        print(f"{'loads' if loads else 'BLOCKED':8} {r['extension']}: {r['shim_functions']} shim functions, "
              f"{len(r['missing'])} missing {r['missing'][:3]}, {r['cxx_torch_symbols']} C++ torch symbols")


if __name__ == "__main__":
    main()

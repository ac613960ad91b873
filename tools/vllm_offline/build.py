"""Build vLLM's offline wheelhouse here (where PyPI answers) and split it into parts small enough to travel
to a GPU host with no network, one part per transfer: 0.26.0 by default, 0.32.0 with `--wheels
tools/vllm_offline/wheels-0.32.txt`;
NVIDIA AIPerf 0.13.0 the same way with `--wheels tools/vllm_offline/wheels-aiperf-0.13.txt` (no vLLM wheel in it: nothing
is slimmed; `install.py --check aiperf` puts it in a folder of its own).

    python tools/vllm_offline/build.py [--wheels tools/vllm_offline/wheels-0.26.txt] [--out .carry/vllm]
        [--part-mb 52]

Every pinned wheel is downloaded for CPython 3.12 on x86-64 Linux, without dependencies (the list holds
exactly what the host's image lacks). The vLLM wheel is slimmed (`SLIM`: FlashAttention 2, the `vllm-rs`
binary, the SM100 kernels, the MoE kernels, DeepGEMM, FP4) and its RECORD rewritten, which takes 0.26.0
from 304 MB to about 111 MB and 0.32.0 from 326 MB to 119 MB. The wheels are packed in one uncompressed tar, cut into
`<out>-1/`, `<out>-2/` ... (each a folder to name in one transfer), with `manifest.json` in every part:
each wheel's sha256, the tar's and each part's. `install.py` beside this file puts them back together
on the host.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PLATFORMS = ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_24_x86_64", "manylinux_2_26_x86_64",
             "manylinux_2_27_x86_64", "manylinux_2_28_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64",
             "manylinux_2_35_x86_64", "manylinux1_x86_64", "manylinux_2_5_x86_64")
# what the GPU host does not need of vLLM's wheel (path prefixes inside it): FlashAttention 2 (Hopper runs
# FA3), the Rust front end, the SM100 kernels, the MoE kernels (41 MB; vLLM imports them only if present,
# and a dense model such as Qwen3 calls none), DeepGEMM's bindings for Pythons other than 3.12 (0.26) or
# all of them (0.32's single abi3 one: FP8 only), and 0.32's FP4 (qutlass) and KDA kernels. A path one
# version lacks costs nothing.
SLIM = ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/vllm-rs", "vllm/third_party/fmha_sm100",
        "vllm/_moe_C_stable_libtorch.abi3.so", "vllm/third_party/deep_gemm/_C_extension.abi3.so",
        "vllm/_qutlass_C.abi3.so", "vllm/_flashkda_C.abi3.so",
        *(f"vllm/third_party/deep_gemm/_C.cpython-{v}-x86_64-linux-gnu.so" for v in (310, 311, 313, 314)))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pinned(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares them (`ruamel.yaml` is the wheel `ruamel_yaml-...`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def download(requirements: list[str], into: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "--dest", str(into)]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    subprocess.run(cmd + requirements, check=True)


def slim(wheel: Path) -> Path:
    """The wheel without SLIM's paths, its RECORD without their lines (pip checks RECORD's hashes only for
    the files present)."""
    out = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if info.filename.startswith(SLIM):
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = "".join(line for line in io.StringIO(data.decode()) if not line.startswith(SLIM)).encode()
            dst.writestr(info, data)
    out.replace(wheel)
    return wheel


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wheels", type=Path, default=HERE / "wheels-0.26.txt")
    p.add_argument("--out", type=Path, default=Path(".carry/vllm"))
    p.add_argument("--part-mb", type=float, default=52.0)
    args = p.parse_args()
    wheels_dir = args.out.with_name(args.out.name + "-wheels")
    wheels_dir.mkdir(parents=True, exist_ok=True)
    requirements = pinned(args.wheels)
    download(requirements, wheels_dir)
    files = sorted(wheels_dir.glob("*.whl"))
    names = {canonical(f.name.split("-")[0]) for f in files}
    missing = [r for r in requirements if canonical(r.split("==")[0]) not in names]
    if missing or len(files) != len(requirements):
        raise SystemExit(f"the wheelhouse does not match the list: missing {missing}, {len(files)} wheels for "
                         f"{len(requirements)} pins (remove {wheels_dir} and build again)")
    vllm = next((f for f in files if f.name.startswith("vllm-")), None)  # (AIPerf's list has none)
    if vllm is not None:
        with zipfile.ZipFile(vllm) as z:
            if any(n.startswith(SLIM) for n in z.namelist()):
                slim(vllm)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for f in files:
            tar.add(f, arcname=f.name)
    blob = buf.getvalue()
    size = int(args.part_mb * 1e6)
    parts = [blob[i:i + size] for i in range(0, len(blob), size)]
    manifest = {"wheels": {f.name: sha256(f.read_bytes()) for f in files}, "tar_sha256": sha256(blob),
                "tar_bytes": len(blob), "parts": [sha256(part) for part in parts], "list": args.wheels.name}
    for i, part in enumerate(parts, 1):
        folder = args.out.with_name(f"{args.out.name}-{i}")
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            old.unlink()
        (folder / f"part-{i}").write_bytes(part)
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"{len(files)} wheels, {len(blob) / 1e6:.1f} MB, in {len(parts)} parts: "
          + ", ".join(str(args.out.with_name(f"{args.out.name}-{i}")) for i in range(1, len(parts) + 1)))


if __name__ == "__main__":
    main()

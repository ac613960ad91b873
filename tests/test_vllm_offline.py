"""The offline vLLM wheelhouse (`tools/vllm_offline/`): the slimmed wheel keeps everything but the
dropped paths and a RECORD without them, and the parts put back together only whole and unaltered."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.scripts import load_script

TOOLS = Path(__file__).resolve().parents[1] / "tools" / "vllm_offline"


def _load(name: str):
    return load_script(TOOLS / f"{name}.py", f"vllm_offline_{name}")


def test_the_pinned_list_names_each_package_once_with_vllm_0_26():
    pins = _load("build").pinned(TOOLS / "wheels-0.26.txt")
    names = [p.split("==")[0] for p in pins]
    assert len(names) == len(set(names)) == 49 and "vllm==0.26.0" in pins
    assert "llguidance==1.7.6" in pins and "xgrammar==0.2.7" in pins  # (vLLM's bound; tvm-ffi's pin)


def test_a_slimmed_wheel_drops_the_paths_and_their_record_lines(tmp_path):
    build = _load("build")
    wheel = tmp_path / "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    keep = {"vllm/__init__.py": b"x", "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": b"fa3",
            "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so": b"dg312"}
    drop = {"vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": b"fa2", "vllm/vllm-rs": b"rs",
            "vllm/third_party/fmha_sm100/kernel.so": b"k", "vllm/_moe_C_stable_libtorch.abi3.so": b"moe",
            "vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so": b"dg311"}
    record = "".join(f"{n},sha256=,1\n" for n in [*keep, *drop]) + "vllm-0.26.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in {**keep, **drop, "vllm-0.26.0.dist-info/RECORD": record.encode()}.items():
            z.writestr(name, data)
    build.slim(wheel)
    with zipfile.ZipFile(wheel) as z:
        assert set(z.namelist()) == {*keep, "vllm-0.26.0.dist-info/RECORD"}
        assert all(z.read(n) == data for n, data in keep.items())
        lines = z.read("vllm-0.26.0.dist-info/RECORD").decode().splitlines()
    assert [line.split(",")[0] for line in lines] == [*keep, "vllm-0.26.0.dist-info/RECORD"]


def _parts(tmp_path: Path, blob: bytes, size: int) -> list[Path]:
    parts = [blob[i:i + size] for i in range(0, len(blob), size)]
    manifest = {"tar_sha256": hashlib.sha256(blob).hexdigest(), "parts": [hashlib.sha256(p).hexdigest() for p in parts],
                "wheels": {}}
    dirs = []
    for i, part in enumerate(parts, 1):
        d = tmp_path / f"vllm-{i}"
        d.mkdir()
        (d / f"part-{i}").write_bytes(part)
        (d / "manifest.json").write_text(json.dumps(manifest))
        dirs.append(d)
    return dirs


def test_the_parts_reassemble_only_whole_and_unaltered(tmp_path, capsys):
    install = _load("install")
    blob = bytes(range(256)) * 40
    dirs = _parts(tmp_path, blob, 3000)
    assert len(dirs) == 4 and install.assemble(list(reversed(dirs)))[0] == blob  # in any order given
    with pytest.raises(SystemExit) as missing:
        install.assemble(dirs[:2])
    assert missing.value.code == 2 and "parts [3, 4] of 4 are missing" in capsys.readouterr().err
    (dirs[1] / "part-2").write_bytes(b"altered" + (dirs[1] / "part-2").read_bytes()[7:])
    with pytest.raises(SystemExit) as altered:
        install.assemble(dirs)
    assert altered.value.code == 2 and "part-2: its sha256 is not the manifest's" in capsys.readouterr().err


@pytest.mark.skipif(sys.version_info[:2] == (3, 12), reason="refuses only a Python other than 3.12")
def test_install_refuses_another_python_in_one_line(tmp_path, capsys, monkeypatch):
    install = _load("install")
    monkeypatch.setattr(sys, "argv", ["install.py", str(tmp_path)])
    with pytest.raises(SystemExit) as refused:
        install.main()
    assert refused.value.code == 2 and "the wheels are for CPython 3.12" in capsys.readouterr().err


@pytest.mark.skipif(not (shutil.which("gcc") and shutil.which("nm")), reason="needs gcc and binutils' nm")
def test_abi_check_names_the_shim_functions_the_other_torch_lacks_and_cxx_ties(tmp_path):
    """Two small shared objects stand for libtorch (exporting one shim function) and for extensions: one calling
    it (loads), one calling another (missing), one calling a C++ function in namespace c10 (tied to its torch)."""
    def shared(name: str, source: str) -> Path:
        (tmp_path / f"{name}.c").write_text(source)
        out = tmp_path / f"{name}.so"
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", out, tmp_path / f"{name}.c"], check=True)
        return out

    lib = shared("libtorch_cpu", "int aoti_torch_abi_version(void) { return 1; }\n")
    good = shared("good", "int aoti_torch_abi_version(void);\nint f(void) { return aoti_torch_abi_version(); }\n")
    bad = shared("bad", "int torch_new_stable_ivalue(void);\nint f(void) { return torch_new_stable_ivalue(); }\n")
    cxx = shared("cxx", "int _ZN3c106detail5checkEv(void);\nint f(void) { return _ZN3c106detail5checkEv(); }\n")
    torch_wheel, vllm_wheel = tmp_path / "torch.whl", tmp_path / "vllm.whl"
    with zipfile.ZipFile(torch_wheel, "w") as z:
        for name in ("libtorch.so", "libtorch_cpu.so", "libtorch_cuda.so"):
            z.write(lib, f"torch/lib/{name}")
    with zipfile.ZipFile(vllm_wheel, "w") as z:
        for so in (good, bad, cxx):
            z.write(so, f"vllm/{so.name}")
    rows = {r["extension"]: r for r in _load("abi_check").check(vllm_wheel, torch_wheel)}
    assert rows["vllm/good.so"] == {"extension": "vllm/good.so", "shim_functions": 1, "missing": [],
                                    "cxx_torch_symbols": 0}
    assert rows["vllm/bad.so"]["missing"] == ["torch_new_stable_ivalue"]
    assert rows["vllm/cxx.so"]["cxx_torch_symbols"] == 1 and rows["vllm/cxx.so"]["missing"] == []


def test_a_manifest_build_py_did_not_write_is_one_line(tmp_path, capsys):
    part = tmp_path / "ap-1"
    part.mkdir()
    (part / "manifest.json").write_text(json.dumps({"wheels": {}}))
    with pytest.raises(SystemExit) as refused:
        _load("install").assemble([part])
    assert refused.value.code == 2 and "not a manifest build.py wrote" in capsys.readouterr().err


def test_aiperf_never_goes_into_vllms_folder(tmp_path):
    (tmp_path / "site" / "vllm").mkdir(parents=True)
    done = subprocess.run([sys.executable, str(TOOLS / "install.py"), str(tmp_path), "--check", "aiperf", "--target",
                           str(tmp_path / "site")], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "holds vLLM" in done.stderr and "folder of its own" in done.stderr


def test_a_pin_matches_its_wheel_under_pep_503_names():
    build = _load("build")
    assert build.canonical("ruamel.yaml") == build.canonical("ruamel_yaml") == "ruamel-yaml"
    assert build.canonical("PyYAML") == "pyyaml" and build.canonical("zope.interface") == "zope-interface"
    pins = build.pinned(TOOLS / "wheels-aiperf-0.13.txt")
    names = [build.canonical(p.split("==")[0]) for p in pins]
    assert "aiperf==0.13.0" in pins and len(names) == len(set(names))
    assert not {"vllm", "torch", "numpy"} & set(names)  # (the host image's, or vLLM's folder's, never AIPerf's)


def test_the_aiperf_launcher_runs_aiperf_from_its_own_folder_alone(tmp_path):
    """The launcher `install.py --check aiperf` writes runs the real AIPerf from its folder alone, before
    the interpreter's own packages (vLLM's pins here), whatever PYTHONPATH the caller set."""
    exe = shutil.which(os.environ.get("AIPERF") or "aiperf")
    if exe is None:
        pytest.skip("AIPerf is not installed (CI installs it and names it with AIPERF)")
    sites = sorted(Path(exe).resolve().parents[1].glob(f"lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"))
    if not sites:
        pytest.skip(f"AIPerf's environment ({exe}) is not this Python's version")
    target = tmp_path / "aiperf site"  # (a space: the launcher quotes its paths)
    target.mkdir()
    for entry in sites[0].iterdir():  # (AIPerf's environment as the folder install.py would have filled)
        if entry.name not in ("bin", "__pycache__"):
            (target / entry.name).symlink_to(entry)
    launcher = _load("install").aiperf_launcher(target)
    assert launcher == target / "bin" / "aiperf"
    env = dict(os.environ, PYTHONPATH="/nonexistent")
    done = subprocess.run([str(launcher), "--version"], check=False, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and "0.13.0" in done.stdout + done.stderr, done.stderr[-500:]
    assert launcher.read_text().splitlines()[1] == f"PYTHONPATH='{target}' exec {sys.executable} -m aiperf \"$@\""

"""Run `dspark-bench` inside the test process and capture what a user would see; or run any command as a
process, watched for progress rather than timed."""

from __future__ import annotations

import subprocess
import sys
import threading
import time


def run_cli(monkeypatch, capfd, *args) -> tuple[int, str, str]:
    """`dspark-bench ARGS` in this process: (exit code, stdout, stderr)."""
    from harness import cli

    monkeypatch.setattr(sys, "argv", ["dspark-bench", *map(str, args)])
    capfd.readouterr()
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out, err = capfd.readouterr()
    return code, out, err


def run_watched(cmd: list, quiet_s: float = 300.0, **popen_kw) -> subprocess.CompletedProcess:
    """`cmd` to its end, however long a loaded machine makes it, as long as it keeps printing (a run prints a
    progress line at each step and every 15 s): a hang guard on progress, not on total wall time, which a busy
    machine stretches. No output on stdout or stderr for `quiet_s` seconds is a hang: the process is killed
    and the test fails with the last lines it printed."""
    proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **popen_kw)
    seen = {"out": [], "err": [], "last": time.monotonic()}

    def read(stream, into):
        for line in stream:
            into.append(line)
            seen["last"] = time.monotonic()

    readers = [threading.Thread(target=read, args=(proc.stdout, seen["out"]), daemon=True),
               threading.Thread(target=read, args=(proc.stderr, seen["err"]), daemon=True)]
    for reader in readers:
        reader.start()
    while proc.poll() is None:
        if time.monotonic() - seen["last"] > quiet_s:
            proc.kill()
            proc.wait()
            raise AssertionError(f"no output for {quiet_s:g} s (hung): {''.join(seen['err'][-10:])}")
        time.sleep(0.2)
    for reader in readers:
        reader.join()
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(seen["out"]), "".join(seen["err"]))


def native_and_vllm_runs(common: list, root, env: dict, system: str, shim, **vllm_env: str) -> dict:
    """`dspark-bench run` (`common`: the command and its run options) natively, then `system` alone on vLLM's
    offline backend, its engine in this one process under Triton's interpreter with the test-only `shim` on the
    path; each must exit 0. `env`: the environment from before any test imported vLLM, less OMP_NUM_THREADS and
    TRITON_INTERPRET. Returns {"native": folder, "vllm": folder}."""
    import os

    native = run_watched([*common, "--out", root / "native"], cwd=root, env=env)
    assert native.returncode == 0, native.stderr[-3000:]
    shimmed = env | {"PYTHONPATH": os.pathsep.join(p for p in (str(shim), env.get("PYTHONPATH")) if p),
                     "TRITON_INTERPRET": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                     **vllm_env}
    vllm = run_watched([*common, "--systems", system, "--backend", "vllm", "--vllm-arg",
                        "distributed_executor_backend=uni", "--out", root / "vllm"], cwd=root, env=shimmed)
    assert vllm.returncode == 0, vllm.stderr[-3000:]
    return {"native": root / "native", "vllm": root / "vllm"}

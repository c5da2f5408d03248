"""GPU gates as the build runs them: job payloads, results with their lock, verdict checks.

A gate result records the signatures of every input it was made from (sections, library,
reference, runner code, GPU fingerprint), written atomically together with the verdict,
so a later reader can tell whether it still matches the sources. A gate that could not run
(no GPU) writes nothing: nothing is ever shown as passed that did not run.
"""
from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

from . import config
from .fsutil import sha256_file, write_atomic, write_json_atomic
from .gpu import NO_GPU_HELP, GpuFingerprint

# the code a gate's result depends on, package-relative (perf's verdict is made build-side)
RUNNER_FILES = {
    "validate": ("runners/validate.py", "runners/common.py", "runners/warmpipe.py"),
    "perf": ("runners/perf.py", "runners/timing.py", "runners/common.py", "runners/warmpipe.py",
             "claims.py", "perfcheck.py"),
    "bandwidth": ("runners/bandwidth.py", "runners/common.py", "runners/warmpipe.py"),
}


class GateCannotRun(Exception):
    """The gate could not be run here at all (no GPU, wrong arch): nothing is recorded."""


def runner_files(gate: str) -> list[Path]:
    return [config.PACKAGE_DIR / f for f in RUNNER_FILES[gate]]


def input_lock(root: Path, sources: list[tuple[str, str | Path]]) -> dict:
    """{name: sha256} for files, {name: value} for facts. Names are repo-relative."""
    lock = {}
    for name, item in sources:
        if isinstance(item, Path):
            try:
                lock[name] = sha256_file(item)
            except OSError:
                lock[name] = "missing"
        else:
            lock[name] = item
    return lock


def arch_for(fingerprint: GpuFingerprint, archs: tuple[str, ...], kernel: str) -> str:
    arch = config.ARCH_FOR_CC.get(fingerprint.cc)
    if arch is None or arch not in archs:
        raise GateCannotRun(
            f"{kernel}: this GPU ({fingerprint.name}, compute capability "
            f"{fingerprint.compute_capability}) runs {arch or 'no supported arch'}, and the "
            f"spec targets {', '.join(archs)}")
    return arch


def require_gpu(fingerprint: GpuFingerprint | None, absence: str, kernel: str, stage: str) -> GpuFingerprint:
    if fingerprint is None:
        raise GateCannotRun(NO_GPU_HELP.format(why=absence, kernel=kernel, stage=stage))
    return fingerprint


def record(result: dict, *, gate: str, kernel: str, fingerprint: GpuFingerprint, lock: dict,
           result_path: Path, verdict_path: Path | None) -> dict:
    """Write result + verdict files (each atomic); the verdict file holds only the word."""
    device = result.get("device", {})
    if device and device.get("name") and device["name"] != fingerprint.name:
        result = {"verdict": "crash", "message":
                  f"runner saw GPU {device['name']!r}, the build expected {fingerprint.name!r}"}
    full = {"gate": gate, "kernel": kernel, **result, "gpu": fingerprint.to_json(),
            "gpu_signature": fingerprint.signature(), "inputs": lock,
            "finished": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    write_json_atomic(result_path, full)
    if verdict_path is not None:
        write_atomic(verdict_path, full["verdict"] + "\n", only_if_changed=True)
    return full


def read_result(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def verdict_line(result: dict) -> str:
    msg = (result.get("message") or "").strip().splitlines()
    return f"{result.get('verdict', '?')}: {msg[0] if msg else ''}".rstrip(": ")

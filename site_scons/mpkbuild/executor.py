"""Where GPU gates run. SCons decides *what* runs; an executor only decides *where*.

The local executor runs each gate as a subprocess in its own process group, with a
watchdog: past the timeout the whole group is killed and the verdict is `hang` with the
last lines of output; a runner that dies without writing its result is a `crash` with the
CUDA error text from its output. `executor=module:Class` loads another executor (the tests
use this for a stand-in; remote executors arrive with their own issue).
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import gpu as gpu_mod
from .fsutil import write_json_atomic


@dataclass(frozen=True)
class GateJob:
    gate: str                   # "validate" | "perf" | "bandwidth"
    kernel: str
    payload: dict               # what the runner needs (sections, library, references)
    workdir: Path               # where the job file, result and log live
    timeout_s: float

    @property
    def job_file(self) -> Path:
        return self.workdir / f".{self.gate}.job.json"

    @property
    def result_file(self) -> Path:
        return self.workdir / f".{self.gate}.result.json"

    @property
    def log_file(self) -> Path:
        return self.workdir / f"{self.gate}.log"


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _cuda_error_line(text: str) -> str | None:
    for line in reversed(text.splitlines()):
        low = line.lower()
        if "cuda error" in low or "illegal" in low or "cudaerror" in low or "launch failure" in low:
            return line.strip()
    return None


class LocalExecutor:
    """Subprocess per gate on this machine."""

    name = "local"
    runner_package = "mpkbuild.runners"

    def fingerprint(self) -> gpu_mod.GpuFingerprint | None:
        return gpu_mod.detect()

    def absence(self) -> str:
        return gpu_mod.describe_absence()

    def run(self, job: GateJob, should_stop=lambda: False) -> dict:
        job.workdir.mkdir(parents=True, exist_ok=True)
        job.result_file.unlink(missing_ok=True)
        write_json_atomic(job.job_file, {**job.payload, "gate": job.gate, "kernel": job.kernel,
                                         "result_file": str(job.result_file)})
        cmd = [sys.executable, "-u", "-m", f"{self.runner_package}.{job.gate}", str(job.job_file)]
        # the runner must import the same mpkbuild as the build that launched it
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(Path(__file__).resolve().parent.parent)] + [p for p in [env.get("PYTHONPATH")] if p])
        started = time.monotonic()
        with open(job.log_file, "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                code = _wait(proc, started + job.timeout_s, should_stop)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                return {"verdict": "hang", "message":
                        f"{job.gate} ran past its {job.timeout_s:g} s timeout and was killed "
                        f"(process group); last output:\n{_tail(job.log_file)}",
                        "elapsed_s": round(time.monotonic() - started, 3)}
            except BaseException:
                _kill_group(proc)
                raise
        elapsed = round(time.monotonic() - started, 3)
        if job.result_file.exists():
            result = json.loads(job.result_file.read_text())
            job.result_file.unlink(missing_ok=True)
            result.setdefault("elapsed_s", elapsed)
            return result
        tail = _tail(job.log_file, 40)
        cuda = _cuda_error_line(tail)
        return {"verdict": "crash", "elapsed_s": elapsed,
                "message": (cuda or f"runner exited with status {code} without a result")
                + f"\nlast output:\n{tail}"}


class GateInterrupted(Exception):
    """The build was interrupted (SIGINT/SIGTERM) while a gate ran: it was killed, nothing recorded."""


def _wait(proc: subprocess.Popen, deadline: float, should_stop) -> int:
    while True:
        try:
            return proc.wait(timeout=max(0.0, min(0.25, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                raise
            if should_stop():
                raise GateInterrupted("the build was interrupted; the gate was stopped") from None


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def load(spec: str | None):
    """`local` (default) or `module:Class` for another executor."""
    if not spec or spec == "local":
        return LocalExecutor()
    if ":" not in spec:
        raise ValueError(f"executor={spec!r}: expected 'local' or 'module:Class'")
    module, cls = spec.split(":", 1)
    return getattr(importlib.import_module(module), cls)()

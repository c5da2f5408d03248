"""A gate job and the one watchdog every executor shares.

`GateJob` is what a gate hands an executor: the runner's payload, the folder its job file,
result and log live in, and its timeout. `run_runner` is the cold path (a runner
subprocess in its own session, under a tool wrapper when the job has one) and `supervise` the
watchdog for any child, cold or warm: past the timeout the whole group is killed and the
verdict is `hang` with the last lines of output; a runner that dies without writing its
result is a `crash` with the CUDA error text from its output. `watch` is the one
poll-and-kill loop (the ssh executor waits on its ssh client through it too). The dask
executor's waits are not process waits: its client polls a future (nothing to kill; the
deadline starts when a worker reports the gate started), and the function it ships runs on
a worker where mpkbuild is not importable.
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from mpkbuild.util import config
from mpkbuild.util.fsutil import write_json_atomic

PACKAGE_PARENT = config.PACKAGE_DIR.parent     # the folder holding mpkbuild/
DEFAULT_RUNNERS = "mpkbuild.runners"


class ToolWrapper(Protocol):
    """A tool the runner process runs under (compute-sanitizer, Nsight Compute): a module
    that makes the command, and turns the tool's report into the gate's result. A wrapped
    job always runs cold, in its own process, and its report is a file beside the log."""
    TIMEOUT_FACTOR: float             # the tool slows the runner: the watchdog waits this much longer

    def wrap(self, option: str, cmd: list[str], report: Path, kernel: str) -> list[str]:
        """The command running `cmd` under the tool, its report going to `report`."""

    def finish(self, option: str, report_text: str, exit_code: int, result: dict) -> dict:
        """The gate's result from the runner's own (or its crash) and the tool's report
        ("" when it wrote none)."""


class ExecutorError(Exception):
    """The executor cannot work as configured (bad gpus=, unreachable host, no scheduler):
    the build stops before any gate, nothing is recorded."""


class ToolMissing(ExecutorError):
    """A gate's tool (compute-sanitizer, ncu) is not there: the message says how to get it."""


class GateInterrupted(Exception):
    """The build was interrupted (SIGINT/SIGTERM) while a gate ran: it was killed, nothing recorded."""


@dataclass(frozen=True)
class GateJob:
    gate: str                   # the runner it goes to: a gate's stage name, "bandwidth" or "trial"
    kernel: str
    payload: dict               # what the runner needs (sections, library, references)
    workdir: Path               # where the job file, result and log live
    timeout_s: float
    root: Path | None = None    # the tree the payload's absolute paths point into
    # every file the runner reads, root-relative: what a remote executor ships
    inputs: tuple[str, ...] = ()
    # (module, option): the ToolWrapper the runner runs under, e.g. ("mpkbuild.run.sanitizer",
    # "memcheck"); None runs it bare (and may run it in a warm server)
    wrapper: tuple[str, str] | None = None
    share_gpu: bool = False     # the spec lets this gate share a GPU with other sharing gates
    runner_package: str | None = field(default=None, compare=False)
    # the runner modules a warm server imports once, when this job starts one (the build's
    # gates: stages.runner_names); a runner that acts on import is never among them
    preload: tuple[str, ...] = field(default=(), compare=False)

    @property
    def job_file(self) -> Path:
        return self.workdir / f".{self.gate}.job.json"

    @property
    def result_file(self) -> Path:
        return self.workdir / f".{self.gate}.result.json"

    @property
    def log_file(self) -> Path:
        return self.workdir / f"{self.gate}.log"

    @property
    def tool(self) -> ToolWrapper | None:
        return importlib.import_module(self.wrapper[0]) if self.wrapper else None

    @property
    def report_file(self) -> Path | None:
        """The wrapping tool's report, beside the log."""
        return self.workdir / f"{self.gate}.{self.wrapper[1]}.txt" if self.wrapper else None

    @property
    def watchdog_s(self) -> float:
        return self.timeout_s * (self.tool.TIMEOUT_FACTOR if self.wrapper else 1.0)


def write_job(job: GateJob) -> Path:
    """The job file the runner reads; the stale result of an earlier run goes first."""
    job.workdir.mkdir(parents=True, exist_ok=True)
    job.result_file.unlink(missing_ok=True)
    write_json_atomic(job.job_file, {**job.payload, "gate": job.gate, "kernel": job.kernel,
                                     "result_file": str(job.result_file)})
    return job.job_file


def runner_package(job: GateJob | None = None) -> str:
    return (job and job.runner_package) or os.environ.get("MPK_RUNNER_PACKAGE") or DEFAULT_RUNNERS


def runner_env(extra: dict | None = None) -> dict:
    """The runner imports the same mpkbuild as the build that launched it."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_PARENT)] + [p for p in [env.get("PYTHONPATH")] if p])
    env["PYTHONUNBUFFERED"] = "1"
    env["MPK_LIFELINE_PID"] = str(os.getpid())
    env.update(extra or {})
    return env


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def cuda_error_line(text: str) -> str | None:
    for line in reversed(text.splitlines()):
        low = line.lower()
        if "cuda error" in low or "illegal" in low or "cudaerror" in low or "launch failure" in low:
            return line.strip()
    return None


class _Cold:
    """A runner subprocess in its own session (so its whole group can be killed)."""

    def __init__(self, cmd, env, log_file: Path, pass_fds=()):
        with open(log_file, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         pass_fds=tuple(pass_fds))

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


POLL_S = 0.25


def watch(child, deadline: float, should_stop, interrupted: str) -> int | None:
    """Wait for `child` (wait(timeout) raising TimeoutExpired, kill()) until it ends: its exit
    code, or None once `deadline` (monotonic) passed and it was killed. An interrupt kills
    it and raises GateInterrupted(interrupted); so does any other exception, after the kill."""
    try:
        while True:
            try:
                return child.wait(max(0.0, min(POLL_S, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    child.kill()
                    return None
                if should_stop():
                    child.kill()
                    raise GateInterrupted(interrupted)
    except BaseException:
        child.kill()
        raise


def supervise(child, job: GateJob, should_stop, started: float) -> dict:
    """Wait for a runner (cold or warm) under the watchdog; turn how it ended into a result."""
    code = watch(child, started + job.watchdog_s, should_stop,
                 "the build was interrupted; the gate was stopped")
    if code is None:
        return {"verdict": "hang", "elapsed_s": round(time.monotonic() - started, 3),
                "message": f"{job.gate} ran past its {job.watchdog_s:g} s timeout and was "
                           f"killed (process group); last output:\n{tail(job.log_file)}"}
    return outcome(job, code, round(time.monotonic() - started, 3))


def outcome(job: GateJob, code: int, elapsed: float) -> dict:
    """The runner's own result when it wrote one, else a crash with the CUDA text."""
    result = None
    if job.result_file.exists():
        try:
            result = json.loads(job.result_file.read_text())
        except ValueError:
            result = None
        job.result_file.unlink(missing_ok=True)
    if result is None:
        text = tail(job.log_file, 40)
        cuda = cuda_error_line(text)
        how = f"killed by signal {-code}" if code < 0 else f"exited with status {code}"
        result = {"verdict": "crash", "message": (cuda or f"runner {how} without a result")
                  + f"\nlast output:\n{text}"}
    result.setdefault("elapsed_s", elapsed)
    if job.wrapper:
        report = job.report_file
        text = report.read_text(errors="replace") if report.exists() else ""
        result = job.tool.finish(job.wrapper[1], text, code, result)
        result.setdefault("elapsed_s", elapsed)
    return result


def run_runner(job: GateJob, should_stop=lambda: False, env_extra: dict | None = None,
               pass_fds=()) -> dict:
    """The cold path: `python -m <runners>.<gate> JOB` (under its tool, if it has one)."""
    job_file = write_job(job)
    cmd = [sys.executable, "-u", "-m", "mpkbuild.runners.launch",
           f"{runner_package(job)}.{job.gate}", str(job_file)]
    if job.wrapper:
        job.report_file.unlink(missing_ok=True)
        cmd = job.tool.wrap(job.wrapper[1], cmd, job.report_file, job.kernel)
    started = time.monotonic()
    child = _Cold(cmd, runner_env(env_extra), job.log_file, pass_fds)
    return supervise(child, job, should_stop, started)



"""Where GPU gates run. SCons decides *what* runs; an executor only decides *where*.

Every executor has the same three calls: `fingerprint()` (the GPU its gates will run on,
None when there is none; a bad address or host raises ExecutorError within seconds),
`absence()` (why there is no GPU) and `run(job, should_stop)` (the gate's result dict,
never raising for a gate that hung or crashed). `load()` picks one from the command line:
`local` (default), `ssh` (gpu_host=), `dask` (scheduler=) or `module:Class`.

The local executor runs each gate as a subprocess in its own process group, holding a GPU
lease (leases.py), through a warm per-GPU server when it can (warm.py) and cold otherwise.
With -j2 or more, a perf gate shares its variants with any GPU that is free while it runs
(`_run_shared`); the build judges the figures whoever timed them (perfcheck.py).
`run_runner` is the cold path and the watchdog every backend shares: past the timeout the
whole group is killed and the verdict is `hang` with the last lines of output; a runner that
dies without writing its result is a `crash` with the CUDA error text from its output.
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import gpu as gpu_mod
from .fsutil import write_json_atomic

PACKAGE_PARENT = Path(__file__).resolve().parent.parent     # the folder holding mpkbuild/
DEFAULT_RUNNERS = "mpkbuild.runners"
# compute-sanitizer slows a gate down by an order of magnitude: its watchdog waits longer
SANITIZE_TIMEOUT_FACTOR = 10.0


class ExecutorError(Exception):
    """The executor cannot work as configured (bad gpus=, unreachable host, no scheduler):
    the build stops before any gate, nothing is recorded."""


class GateInterrupted(Exception):
    """The build was interrupted (SIGINT/SIGTERM) while a gate ran: it was killed, nothing recorded."""


@dataclass(frozen=True)
class GateJob:
    gate: str                   # "validate" | "perf" | "bandwidth"
    kernel: str
    payload: dict               # what the runner needs (sections, library, references)
    workdir: Path               # where the job file, result and log live
    timeout_s: float
    root: Path | None = None    # the tree the payload's absolute paths point into
    # every file the runner reads, root-relative: what a remote executor ships
    inputs: tuple[str, ...] = ()
    sanitize: str | None = None  # compute-sanitizer tool for validate, or None
    share_gpu: bool = False     # the spec lets this gate share a GPU with other sharing gates
    runner_package: str | None = field(default=None, compare=False)

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
    def watchdog_s(self) -> float:
        return self.timeout_s * (SANITIZE_TIMEOUT_FACTOR if self.sanitize else 1.0)


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


def supervise(child, job: GateJob, should_stop, started: float) -> dict:
    """Wait for a runner (cold or warm) under the watchdog; turn how it ended into a result."""
    deadline = started + job.watchdog_s
    try:
        while True:
            try:
                code = child.wait(max(0.0, min(0.25, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    child.kill()
                    return {"verdict": "hang", "elapsed_s": round(time.monotonic() - started, 3),
                            "message": f"{job.gate} ran past its {job.watchdog_s:g} s timeout and was "
                                       f"killed (process group); last output:\n{tail(job.log_file)}"}
                if should_stop():
                    child.kill()
                    raise GateInterrupted("the build was interrupted; the gate was stopped")
    except BaseException:
        child.kill()
        raise
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
    if job.sanitize:
        from . import sanitizer
        report = _sanitize_report(job)
        found = sanitizer.verdict(job.sanitize, report.read_text(errors="replace")
                                  if report.exists() else "", code, result)
        if found is not None:
            found.setdefault("elapsed_s", elapsed)
            found["runner_verdict"] = result.get("verdict")
            result = found
        result["sanitize"] = job.sanitize
    return result


def _sanitize_report(job: GateJob) -> Path:
    return job.workdir / f"{job.gate}.{job.sanitize}.txt"


def run_runner(job: GateJob, should_stop=lambda: False, env_extra: dict | None = None,
               pass_fds=()) -> dict:
    """The cold path: `python -m <runners>.<gate> JOB` (under compute-sanitizer if asked)."""
    job_file = write_job(job)
    cmd = [sys.executable, "-u", "-m", "mpkbuild.runners.launch",
           f"{runner_package(job)}.{job.gate}", str(job_file)]
    if job.sanitize:
        from . import sanitizer
        report = _sanitize_report(job)
        report.unlink(missing_ok=True)
        cmd = sanitizer.wrap(job.sanitize, cmd, report, kernel=job.kernel)
    started = time.monotonic()
    child = _Cold(cmd, runner_env(env_extra), job.log_file, pass_fds)
    return supervise(child, job, should_stop, started)


def _flag(options: dict, name: str, default: bool) -> bool:
    value = options.get(name)
    return default if value is None else value not in ("0", "", "no", "false", "off")


class LocalExecutor:
    """Gates on this machine's GPUs: one lease (one GPU) per running gate."""

    name = "local"
    runner_package = None       # a test's stand-in runners; None: $MPK_RUNNER_PACKAGE or ours
    jobs = 1                    # scons -j (set by the tool): GPUs one perf gate may use at once
    # What a gate waits for its CUDA context when the warm server has none made for it: its
    # spares make contexts only beside a validate, so perfs in a row use them up and the
    # next gate's context is made while it waits (~0.2 s on the H200s; a -j1 catalog build
    # with every perf after every validate paid it four times).
    context_wait_s = 0.2
    # A free GPU joins a running perf gate only once no gate of this build has started or
    # ended for this long while a job slot is idle: SCons has had its chance to give that GPU
    # a gate of its own (a helper that took it first kept a validate waiting 0.35 s on the
    # H200s) ...
    helper_grace_s = 0.15
    # ... and only while the unclaimed variants took at least this long last run (a helper's
    # start, fork to first variant, costs ~0.2 s).
    helper_min_work_s = 0.3

    def __init__(self, options: dict | None = None):
        self.options = dict(options or {})
        self.warm = _flag(self.options, "warm", True)
        self.share_perf = _flag(self.options, "share_perf", True)
        self._gpus = None
        self._slots = threading.Lock()
        self._active = 0                   # gates of this build inside run(), leased or waiting
        self._changed_at = time.monotonic()

    def fingerprint(self) -> gpu_mod.GpuFingerprint | None:
        fp = gpu_mod.detect()
        if fp is not None:
            self.gpus(fp)                      # a bad gpus= fails here, before any gate
        elif self.options.get("gpus"):
            raise ExecutorError(f"gpus={self.options['gpus']}: this machine has no GPU "
                                f"({gpu_mod.describe_absence()})")
        return fp

    def absence(self) -> str:
        return gpu_mod.describe_absence()

    def gpus(self, fp=None) -> list:
        """The GPUs this build's gates may lease (gpus=, CUDA_VISIBLE_DEVICES, same model)."""
        if self._gpus is None:
            from . import leases
            fp = fp or gpu_mod.detect()
            try:
                self._gpus = leases.pick(leases.list_gpus(), self.options.get("gpus"),
                                         fp.name if fp else None,
                                         os.environ.get("CUDA_VISIBLE_DEVICES"))
            except leases.LeaseError as exc:
                raise ExecutorError(str(exc)) from None
        return self._gpus

    def run(self, job: GateJob, should_stop=lambda: False) -> dict:
        self._count(+1)
        try:
            return self._run(job, should_stop)
        finally:
            self._count(-1)

    def _count(self, step: int) -> None:
        with self._slots:
            self._active += step
            self._changed_at = time.monotonic()

    def _slot_idle_s(self) -> float:
        """How long a job slot has been idle with no gate starting or ending (0: none idle)."""
        with self._slots:
            if self._active >= self.jobs:
                return 0.0
            return time.monotonic() - self._changed_at

    def _run(self, job: GateJob, should_stop) -> dict:
        from . import leases
        if self.runner_package and not job.runner_package:
            job = _with(job, runner_package=self.runner_package)
        gpus = self.gpus()
        if not gpus:                           # no GPU to lease: the runner reports why
            return self._run_on(job, None, should_stop)
        try:
            lease = leases.acquire(gpus, shared=job.share_gpu, should_stop=should_stop)
        except leases.Interrupted as exc:
            raise GateInterrupted(str(exc)) from None
        started_at = time.time()
        with lease:
            if self._may_share(job, gpus):
                result = self._run_shared(job, lease, gpus, should_stop)
            else:
                result = self._run_on(job, lease, should_stop)
        result.update(gpu_index=lease.gpu.index, lease_wait_s=lease.waited_s,
                      started_at=round(started_at, 3), ended_at=round(time.time(), 3))
        return result

    def _may_share(self, job: GateJob, gpus: list) -> bool:
        variants = (job.payload.get("codegen") or {}).get("codegen", {}).get("variants") or ()
        return (job.gate == "perf" and self.share_perf and self.jobs > 1 and len(gpus) > 1
                and len(variants) > 1 and not job.sanitize)

    def _run_shared(self, job: GateJob, lease, gpus: list, should_stop) -> dict:
        """A perf gate whose variants any free GPU may take: its runners claim variants one
        by one (longest first, by last run) from a claims folder, and while unclaimed ones
        remain, a GPU that is free (a lease taken without waiting, at most -j GPUs in all)
        starts another runner, once SCons has left a job slot idle for `helper_grace_s` and
        the unclaimed variants are worth a runner's start (`helper_min_work_s`). Each
        variant is timed whole on one GPU, kernel and torch baseline in one process; the
        figures are merged and say where they were timed. A hang or crash in any runner
        stops the others claiming and is the gate's verdict."""
        import shutil
        from . import claims as claims_mod
        from . import leases
        began = time.monotonic()
        expected = list(job.payload["codegen"]["codegen"]["variants"])
        claims, helpers = job.workdir / ".perf-claims", job.workdir / ".perf-helpers"
        for folder in (claims, helpers):
            shutil.rmtree(folder, ignore_errors=True)
        claims.mkdir(parents=True)
        took = variant_seconds(job.workdir / "perf.json", expected)
        share = {"claims_dir": str(claims), "order": longest_first(took)}
        primary = _with(job, payload={**job.payload, "share": share})
        parts: list[dict] = []

        def run_part(part):
            part["started_at"] = time.time()
            try:
                part["result"] = self._run_on(part["job"], part["lease"], should_stop)
            except BaseException as exc:            # re-raised below, in the build's thread
                part["error"] = exc
            finally:
                part["ended_at"] = time.time()
                if part.get("result", {}).get("verdict") != "timed":
                    claims_mod.stop(claims)
                if part["lease"] is not lease:
                    part["lease"].release()

        def start(part_job, part_lease):
            part = {"job": part_job, "lease": part_lease, "gpu": part_lease.gpu.index}
            part["thread"] = threading.Thread(target=run_part, args=(part,), daemon=True)
            parts.append(part)
            part["thread"].start()

        def work_left() -> float:
            taken = claims_mod.claimed_names(claims)
            left = [took[v] for v in expected if v not in taken]
            return float("inf") if None in left else sum(left)

        start(primary, lease)
        while parts[0]["thread"].is_alive():
            if (len(parts) < min(self.jobs, len(gpus)) and not claims_mod.stopped(claims)
                    and self._slot_idle_s() >= self.helper_grace_s
                    and work_left() >= self.helper_min_work_s):
                held = {p["lease"].gpu.uuid for p in parts}
                extra = leases.try_acquire([g for g in gpus if g.uuid not in held])
                if extra is not None:
                    folder = helpers / str(len(parts))
                    folder.mkdir(parents=True)
                    start(_with(primary, workdir=folder), extra)
            parts[0]["thread"].join(0.05)
        for part in parts:
            part["thread"].join()
        with open(job.log_file, "a") as log:       # one log holds every runner's output
            for part in parts[1:]:
                log.write(f"\n---- the runner that shared this gate on GPU {part['gpu']} ----\n")
                try:
                    log.write(part["job"].log_file.read_text(errors="replace"))
                except OSError:
                    log.write("(no output)\n")
        shutil.rmtree(claims, ignore_errors=True)
        shutil.rmtree(helpers, ignore_errors=True)
        for part in parts:
            if "error" in part:
                raise part["error"]
        bad = next((p for p in parts if p["result"].get("verdict") != "timed"), None)
        if bad is not None:
            return bad["result"] if bad is parts[0] else \
                {**bad["result"], "message": f"(the runner on GPU {bad['gpu']}) {bad['result'].get('message', '')}"}
        merged = dict(parts[0]["result"])
        merged["variants"] = {name: {**figures, "gpu_index": p["gpu"]}
                              for p in parts for name, figures in p["result"].get("variants", {}).items()}
        merged["shared"] = [{"gpu_index": p["gpu"], "variants": list(p["result"].get("variants", {})),
                             "started_at": round(p["started_at"], 3), "ended_at": round(p["ended_at"], 3)}
                            for p in parts]
        merged["message"] = f"timed {len(merged['variants'])} variants on {len(parts)} GPU(s)"
        merged["elapsed_s"] = round(time.monotonic() - began, 3)
        return merged

    def context_spares(self) -> tuple[int, frozenset] | None:
        """For the plan: contexts the warm server keeps made per GPU and the gates it makes
        them beside; None when every gate makes its own (cold runners: the order changes nothing)."""
        if not self.warm:
            return None
        from . import warm
        return (warm.SPARES, warm.CONTEXT_BESIDE) if warm.SPARE else None

    def _run_on(self, job: GateJob, lease, should_stop) -> dict:
        env = lease.env if lease else {}
        if self.warm and lease is not None and not job.sanitize:
            from . import warm
            try:
                return warm.run(job, lease.gpu.uuid, env, should_stop)
            except warm.WarmUnavailable as exc:
                sys.stderr.write(f"mpk: warm runner unavailable ({exc}); running {job.gate} cold\n")
        return run_runner(job, should_stop, env, pass_fds=(lease.fd,) if lease else ())


def variant_seconds(previous: Path, variants: list[str]) -> dict:
    """{variant: seconds its runner spent on it in the last perf result (its phases), or
    None when unknown}. Claims go longest first (with several GPUs claiming, the long ones
    start early; spec order among equals), and a helper starts only for enough work."""
    try:
        last = json.loads(previous.read_text()).get("variants") or {}
    except (OSError, ValueError):
        last = {}
    return {v: (sum(last[v]["timings_s"].values()) if (last.get(v) or {}).get("timings_s") else None)
            for v in variants}


def longest_first(took: dict) -> list[str]:
    """variant_seconds' variants, longest first (unknown last; stable among equals)."""
    return sorted(took, key=lambda v: -(took[v] or 0.0))


def _with(job: GateJob, **changes) -> GateJob:
    from dataclasses import replace
    return replace(job, **changes)


BACKENDS = {"local": "mpkbuild.executor:LocalExecutor",
            "ssh": "mpkbuild.ssh_executor:SshExecutor",
            "dask": "mpkbuild.dask_executor:DaskExecutor"}


def load(spec: str | None, options: dict | None = None):
    """`local` (default; `ssh` when gpu_host= is given), `ssh`, `dask`, or `module:Class`."""
    options = dict(options or {})
    if not spec:
        spec = "ssh" if options.get("gpu_host") else "local"
    target = BACKENDS.get(spec, spec)
    if ":" not in target:
        raise ValueError(f"executor={spec!r}: expected one of {', '.join(BACKENDS)} or 'module:Class'")
    module, cls = target.split(":", 1)
    factory = getattr(importlib.import_module(module), cls)
    import inspect
    takes_options = bool(inspect.signature(factory).parameters)
    return factory(options) if takes_options else factory()

"""The local executor: gates on this machine's GPUs, one lease (one GPU) per running gate.

Each gate runs as a subprocess in its own process group, holding a GPU lease
(run/leases.py), through the warm per-GPU server when it can (run/warm.py) and cold
otherwise (run/job.py); with -jN SCons runs up to N gates at once and the leases spread
them over the GPUs.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import replace

from mpkbuild import gpu as gpu_mod
from mpkbuild.run.job import ExecutorError, GateInterrupted, GateJob, run_runner

def flag(options: dict, name: str, default: bool) -> bool:
    """A yes/no option of the command line (warm=0, apply=1): 0, no, false, off or empty is no."""
    value = options.get(name)
    return default if value is None else value not in ("0", "", "no", "false", "off")


class LocalExecutor:
    """Gates on this machine's GPUs: one lease (one GPU) per running gate."""

    name = "local"
    runner_package = None       # a test's stand-in runners; None: $MPK_RUNNER_PACKAGE or ours

    def __init__(self, options: dict | None = None, *, model: str | None = None,
                 env: dict | None = None):
        """model: the GPU model to lease (default: the first visible GPU's); env: extra
        variables for every runner (a bundle's own package path, say)."""
        self.options = dict(options or {})
        self.warm = flag(self.options, "warm", True)
        self.model, self.env = model, dict(env or {})
        self._gpus = None

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
            from mpkbuild.run import leases
            gpus = leases.list_gpus()
            model = self.model
            if model is None and gpus:
                fp = fp or gpu_mod.detect()
                model = fp.name if fp else None
            try:
                self._gpus = leases.pick(gpus, self.options.get("gpus"), model,
                                         os.environ.get("CUDA_VISIBLE_DEVICES"))
            except leases.LeaseError as exc:
                raise ExecutorError(str(exc)) from None
        return self._gpus

    def run(self, job: GateJob, should_stop=lambda: False) -> dict:
        from mpkbuild.run import leases
        if self.runner_package and not job.runner_package:
            job = replace(job, runner_package=self.runner_package)
        gpus = self.gpus()
        if not gpus:                           # no GPU to lease: the runner reports why
            return self._run_on(job, None, should_stop)
        try:
            lease = leases.acquire(gpus, shared=job.share_gpu, should_stop=should_stop)
        except leases.Interrupted as exc:
            raise GateInterrupted(str(exc)) from None
        started_at = time.time()
        with lease:
            result = self._run_on(job, lease, should_stop)
        result.update(gpu_index=lease.gpu.index, lease_wait_s=lease.waited_s,
                      started_at=round(started_at, 3), ended_at=round(time.time(), 3))
        return result

    def _run_on(self, job: GateJob, lease, should_stop) -> dict:
        env = {**(lease.env if lease else {}), **self.env}
        if self.warm and lease is not None and not job.wrapper:
            from mpkbuild.run import warm
            try:
                return warm.run(job, lease.gpu.uuid, env, should_stop)
            except warm.WarmUnavailable as exc:
                sys.stderr.write(f"mpk: warm runner unavailable ({exc}); running {job.gate} cold\n")
        return run_runner(job, should_stop, env, pass_fds=(lease.fd,) if lease else ())

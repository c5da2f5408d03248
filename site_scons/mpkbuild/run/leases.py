"""GPU leases: with -jN, each running GPU gate holds one GPU of this machine.

A lease is an flock on one file per GPU (named by the GPU's UUID) in a machine-wide folder,
so two builds, two trees or two users on one box never put two gates on one GPU. The
kernel drops an flock when the last process holding it dies, however it dies: a SIGKILLed
build leaves no stale lease. The gate's runner inherits the lock's file descriptor, so the
GPU stays leased until the runner itself is gone too.

Gates that may share a GPU (a spec's `share_gpu: true`) take the lock shared; every other
gate takes it exclusive, so a sharing gate never runs beside an exclusive one.
"""
from __future__ import annotations

import fcntl
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


class LeaseError(Exception):
    """gpus= names a GPU this machine does not have, or the lease folder is unusable."""


@dataclass(frozen=True)
class Gpu:
    index: int          # nvidia-smi's index (PCI bus order)
    uuid: str           # "GPU-…": what CUDA_VISIBLE_DEVICES gets (no ordering ambiguity)
    name: str


def lease_dir() -> Path:
    """Machine-wide: $MPK_LEASE_DIR, else <tmp>/mpk-gpu-leases (shared by every user)."""
    return Path(os.environ.get("MPK_LEASE_DIR") or Path(tempfile.gettempdir()) / "mpk-gpu-leases")


def list_gpus() -> list[Gpu]:
    """Every GPU nvidia-smi sees on this machine (CUDA_VISIBLE_DEVICES is applied by `pick`)."""
    from mpkbuild.gpu import smi_rows
    return [Gpu(r["index"], r["uuid"], r["name"]) for r in smi_rows()]


def pick(gpus: list[Gpu], wanted: str | None, model: str | None,
         visible: str | None = None) -> list[Gpu]:
    """The GPUs gates may use: gpus=0,1 (nvidia-smi indices), else CUDA_VISIBLE_DEVICES,
    else all; only those of the model the build is judged for (a mixed box stays honest)."""
    by_index = {g.index: g for g in gpus}
    if wanted:
        items = [w.strip() for w in wanted.split(",") if w.strip()]
        bad = [w for w in items if not w.isdigit() or int(w) not in by_index]
        if bad or not items:
            have = ", ".join(f"{g.index} ({g.name})" for g in gpus) or "none"
            raise LeaseError(f"gpus={wanted}: no GPU {', '.join(bad) or '(empty list)'} on this "
                             f"machine (nvidia-smi lists: {have})")
        chosen = [by_index[int(w)] for w in dict.fromkeys(items)]
    elif visible:
        items = [v.strip() for v in visible.split(",") if v.strip()]
        chosen = [g for g in gpus if str(g.index) in items or g.uuid in items]
    else:
        chosen = list(gpus)
    if model is not None:
        other = [g for g in chosen if g.name != model]
        if other and wanted:
            raise LeaseError(f"gpus={wanted}: GPU {other[0].index} is a {other[0].name}, and this "
                             f"build is judged for {model}")
        chosen = [g for g in chosen if g.name == model]
    return chosen


class Lease:
    """One held GPU. `fd` may be passed to the runner so the lock outlives this process."""

    def __init__(self, gpu: Gpu, fd: int, shared: bool, waited_s: float):
        self.gpu, self.fd, self.shared, self.waited_s = gpu, fd, shared, waited_s

    @property
    def env(self) -> dict:
        return {"CUDA_VISIBLE_DEVICES": self.gpu.uuid, "MPK_GPU_INDEX": str(self.gpu.index)}

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)        # closing our descriptor; a runner's copy dies with it
            self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class Interrupted(Exception):
    """should_stop() turned true while waiting for a GPU."""


def _open(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        os.fchmod(fd, 0o666)     # another user's build must be able to lock it too
    except OSError:
        pass
    return fd


def _folder() -> Path:
    folder = lease_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if folder.stat().st_uid == os.getuid():
            os.chmod(folder, 0o1777)
    except OSError as exc:
        raise LeaseError(f"GPU lease folder {folder}: {exc.strerror} (set MPK_LEASE_DIR)") from None
    return folder


def _take_one(folder: Path, gpus: list[Gpu], shared: bool, started: float) -> Lease | None:
    mode = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB
    for gpu in gpus:
        fd = _open(folder / f"{gpu.uuid}.lock")
        try:
            fcntl.flock(fd, mode)
        except BlockingIOError:
            os.close(fd)
            continue
        os.set_inheritable(fd, False)
        return Lease(gpu, fd, shared, round(time.monotonic() - started, 3))
    return None


def acquire(gpus: list[Gpu], *, shared: bool = False, should_stop=lambda: False,
            poll_s: float = 0.05) -> Lease:
    """Block until one of `gpus` is free (for a shared lease: free of exclusive holders)."""
    if not gpus:
        raise LeaseError("no GPU to lease (gpus= and CUDA_VISIBLE_DEVICES leave none of this model)")
    folder = _folder()
    started = time.monotonic()
    while True:
        lease = _take_one(folder, gpus, shared, started)
        if lease is not None:
            return lease
        if should_stop():
            raise Interrupted("interrupted while waiting for a free GPU")
        time.sleep(poll_s)


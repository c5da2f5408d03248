"""A gate process's CUDA context, set up before it exists: it waits for the GPU asleep, not
spinning on a CPU, and opens one hardware work queue.

CUDA's default (CU_CTX_SCHED_AUTO with fewer contexts than CPUs) spins the waiting thread.
A perf gate spends about half its time waiting for graph replays, and with -jN another
gate's Python (captures, inputs, checks) runs beside that spin; on the lent VMs two busy
vCPUs slow each other by up to 1.8x. Blocking sync costs a wake-up per wait (microseconds
of host time, none of the GPU time the events measure).

The flag belongs to the primary context, so it must be set before the context exists:
the warm server's child sets it before it makes its context, a cold runner before torch makes one.
Driver calls only (no torch), so a spare that only loads the driver can use it too.

The same goes for the number of hardware work queues a context opens
(CUDA_DEVICE_MAX_CONNECTIONS, 8 by default): a gate runs one stream at a time, and with one
queue a context is made in ~0.1 s instead of ~0.17 s and torn down in ~0.085 s instead of
~0.125 s on an H200. That driver work is what slows the other GPU's gate at -jN (graph
capture, cudaFree); with one queue the -j2/-j1 throughput rose from 1.66-1.81 to 1.89-1.92
and the timed figures stayed put (bench/RESULTS.md, ninth session). A value the user set
is kept.
"""
from __future__ import annotations

import ctypes
import os

WORK_QUEUES = "CUDA_DEVICE_MAX_CONNECTIONS"
CU_CTX_SCHED_MASK = 0x07
CU_CTX_SCHED_BLOCKING_SYNC = 0x04
SCHED_NAMES = {0x00: "auto", 0x01: "spin", 0x02: "yield", 0x04: "blocking_sync"}


def _driver():
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    return cuda if cuda.cuInit(0) == 0 else None


def _devices(cuda):
    count = ctypes.c_int()
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return []
    devices = []
    for ordinal in range(count.value):
        dev = ctypes.c_int()
        if cuda.cuDeviceGet(ctypes.byref(dev), ordinal) == 0:
            devices.append(dev)
    return devices


def _primary_state(cuda, dev) -> tuple[int, bool] | None:
    """The primary context's flags and whether it is made; None if the driver would not say."""
    flags, active = ctypes.c_uint(), ctypes.c_int()
    if cuda.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active)) != 0:
        return None
    return flags.value, bool(active.value)


def prepare_context(min_queues: int = 1, block: bool = True) -> int:
    """What a gate process sets before its first driver call: `min_queues` work queues (one
    for a gate that runs one stream at a time; the user's value when it is at least that),
    blocking sync. Returns how many GPUs got blocking sync.

    The runtime gate asks for the driver's defaults (8 queues, block=False): MPK's worker
    and scheduler kernels run at the same time on two streams and wait for each other, and
    streams sharing one hardware queue can be serialised behind each other. Its first-launch
    hang on an H200 turned out to be the stack growth of the scheduler kernel's launch
    (megakernel.cu.j2, mpkb_preload); whether one queue and blocking sync would also do
    with that fixed was not measured, so the gate keeps the defaults it passed with."""
    chosen = os.environ.get(WORK_QUEUES, "")
    if not (chosen.isdigit() and int(chosen) >= min_queues):
        os.environ[WORK_QUEUES] = str(min_queues)
    return block_while_waiting() if block else 0


def work_queues() -> str:
    """The work-queue count this process's contexts open, for the gate's result."""
    return os.environ.get(WORK_QUEUES, "8 (driver default)")


def block_while_waiting() -> int:
    """Sets blocking sync on every visible GPU whose primary context is not made yet;
    returns how many it set. No driver (a CPU machine): 0, and the runner meets that itself."""
    cuda = _driver()
    if cuda is None:
        return 0
    set_flags = getattr(cuda, "cuDevicePrimaryCtxSetFlags_v2", None) or cuda.cuDevicePrimaryCtxSetFlags
    done = 0
    for dev in _devices(cuda):
        state = _primary_state(cuda, dev)
        if state is None or state[1]:
            continue            # made by whoever forked us, or already made: leave it
        wanted = (state[0] & ~CU_CTX_SCHED_MASK) | CU_CTX_SCHED_BLOCKING_SYNC
        if set_flags(dev, ctypes.c_uint(wanted)) == 0:
            done += 1
    return done


def wait_mode(ordinal: int = 0) -> str:
    """How the primary context of visible GPU `ordinal` waits, for the gate's result."""
    cuda = _driver()
    devices = _devices(cuda) if cuda is not None else []
    if ordinal >= len(devices):
        return "unknown"
    state = _primary_state(cuda, devices[ordinal])
    if state is None:
        return "unknown"
    sched = state[0] & CU_CTX_SCHED_MASK
    return SCHED_NAMES.get(sched, hex(sched))

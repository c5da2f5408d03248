"""Gate processes wait for the GPU asleep, not spinning on a CPU.

CUDA's default (CU_CTX_SCHED_AUTO with fewer contexts than CPUs) spins the waiting thread.
A perf gate spends about half its time waiting for graph replays, and with -jN another
gate's Python (captures, inputs, checks) runs beside that spin; on the lent VMs two busy
vCPUs slow each other by up to 1.8x. Blocking sync costs a wake-up per wait (microseconds
of host time, none of the GPU time the events measure).

The flag belongs to the primary context, so it must be set before the context exists:
a warm spare sets it before it makes its context, a cold runner before torch makes one.
Driver calls only (no torch), so a spare that only loads the driver can use it too.
"""
from __future__ import annotations

import ctypes

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


def block_while_waiting() -> int:
    """Sets blocking sync on every visible GPU whose primary context is not made yet;
    returns how many it set. No driver (a CPU machine): 0, and the runner meets that itself."""
    cuda = _driver()
    if cuda is None:
        return 0
    set_flags = getattr(cuda, "cuDevicePrimaryCtxSetFlags_v2", None) or cuda.cuDevicePrimaryCtxSetFlags
    done = 0
    for dev in _devices(cuda):
        flags, active = ctypes.c_uint(), ctypes.c_int()
        if cuda.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active)) != 0:
            continue
        if active.value:
            continue            # made by whoever forked us, or already made: leave it
        wanted = (flags.value & ~CU_CTX_SCHED_MASK) | CU_CTX_SCHED_BLOCKING_SYNC
        if set_flags(dev, ctypes.c_uint(wanted)) == 0:
            done += 1
    return done


def wait_mode(ordinal: int = 0) -> str:
    """How the primary context of visible GPU `ordinal` waits, for the gate's result."""
    cuda = _driver()
    devices = _devices(cuda) if cuda is not None else []
    if ordinal >= len(devices):
        return "unknown"
    flags, active = ctypes.c_uint(), ctypes.c_int()
    if cuda.cuDevicePrimaryCtxGetState(devices[ordinal], ctypes.byref(flags), ctypes.byref(active)) != 0:
        return "unknown"
    return SCHED_NAMES.get(flags.value & CU_CTX_SCHED_MASK, hex(flags.value & CU_CTX_SCHED_MASK))

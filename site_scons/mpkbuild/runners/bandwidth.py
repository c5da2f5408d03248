"""The GPU's achievable bandwidth for three read:write mixes, bytes read plus written.

One derived node per GPU, cached like any other: perf gates judge achieved bandwidth
against these measured ceilings, not the datasheet, and against the one for the kernel's
own mix (util.perfspec.ceiling): a 2-read : 1-write stream (silu_mul) or a read-only one
(argmax) can run above a copy's figure (on an H200, Inductor's silu_mul moved 4.3 TB/s
against the copy's 4.18).
- 1:1: a large device-to-device copy (the copy bandwidth, as before);
- 2:1: c = a + b over three buffers;
- read: a full reduction (sum, and max; the faster) of one large buffer.
The streams run eagerly between events, not replayed from a graph: a memcpy node in a CUDA
graph may run on the copy engines, which moved only ~2.7 TB/s on an H200 against ~4.2 TB/s
for the SM copy kernel.
"""
from __future__ import annotations

import statistics

import torch

from .common import device_facts, run_main
from .gpustate import Nvml
from .timing import warm_up

COPY_BYTES = 2 * 2**30
REPEATS = 9


def _time(step) -> dict:
    warm_up([step], 3)
    times = []
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return {"median_us": statistics.median(times), "min_us": min(times), "max_us": max(times),
            "samples_us": times}


def main(job: dict) -> dict:
    torch.cuda.init()
    nvml = Nvml()
    start_state = nvml.snapshot()
    n = COPY_BYTES // 4
    src = torch.randn(n, device="cuda", dtype=torch.float32)
    dst = torch.empty_like(src)
    streams = {"1:1": (2 * COPY_BYTES, [lambda: dst.copy_(src)])}
    third = n // 2                                  # three 1 GiB buffers: 2 GiB read, 1 written
    a, b = src[:third], src[third:2 * third]
    c = torch.empty(third, device="cuda", dtype=torch.float32)
    streams["2:1"] = (3 * third * 4, [lambda: torch.add(a, b, out=c)])
    streams["read"] = (COPY_BYTES, [lambda: src.sum(), lambda: src.amax()])
    timings, ceilings = {}, {}
    for mix, (nbytes, steps) in streams.items():
        best = None
        for i, step in enumerate(steps):
            t = _time(step)
            t["bytes"] = nbytes
            timings[f"{mix}#{i}"] = t
            bps = nbytes / (t["median_us"] * 1e-6)
            best = bps if best is None else max(best, bps)
        ceilings[mix] = best
    bw = ceilings["1:1"]
    return {"verdict": "pass", "device": device_facts(), "copy_bytes": COPY_BYTES,
            "copy_bandwidth_Bps": bw, "ceilings_Bps": ceilings, "timings": timings,
            "gpu_state": {"start": start_state, "end": nvml.snapshot()},
            "message": (f"device-to-device copy {bw / 1e12:.2f} TB/s (read + write); "
                        f"2:1 {ceilings['2:1'] / 1e12:.2f}, read-only {ceilings['read'] / 1e12:.2f} TB/s")}


if __name__ == "__main__":
    run_main(main)

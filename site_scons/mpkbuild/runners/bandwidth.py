"""The GPU's copy bandwidth: a large device-to-device copy, bytes read plus written.

One derived node per GPU, cached like any other: perf gates judge achieved bandwidth
against this measured ceiling, not the datasheet. The copies are timed eagerly between
events, not replayed from a graph: a memcpy node in a CUDA graph may run on the copy
engines, which moved only ~2.7 TB/s on an H200 against ~4.2 TB/s for the SM copy kernel.
"""
from __future__ import annotations

import statistics

import torch

from .common import device_facts, run_main
from .timing import warm_up

COPY_BYTES = 2 * 2**30


def main(job: dict) -> dict:
    torch.cuda.init()
    n = COPY_BYTES // 4
    src = torch.randn(n, device="cuda", dtype=torch.float32)
    dst = torch.empty_like(src)
    warm_up([lambda: dst.copy_(src)], 3)
    times = []
    for _ in range(9):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    t = {"median_us": statistics.median(times), "min_us": min(times), "max_us": max(times),
         "samples_us": times}
    bw = 2 * COPY_BYTES / (t["median_us"] * 1e-6)
    return {"verdict": "pass", "device": device_facts(), "copy_bytes": COPY_BYTES,
            "copy_bandwidth_Bps": bw, "timing": t,
            "message": f"device-to-device copy {bw / 1e12:.2f} TB/s (read + write)"}


if __name__ == "__main__":
    run_main(main)

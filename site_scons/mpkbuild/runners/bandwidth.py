"""The GPU's achievable bandwidth for three read:write mixes, bytes read plus written.

One derived node per GPU, cached like any other: perf gates judge achieved bandwidth
against these measured ceilings, not the datasheet, and against the one for the kernel's
own mix (util.perfspec.ceiling): a 2-read : 1-write stream (silu_mul) or a read-only one
(argmax) can run above a copy's figure.
- 1:1: a large device-to-device copy;
- 2:1: c = a (op) b over three buffers;
- read: a full read of one large buffer.
Each mix is the fastest of torch's stream for it (copy_, add, sum and amax: what the node
measured before) and the blocked streams of streams.cu (each block moves its own contiguous
span, through registers or, for read and copy, a shared-memory ring of cp.async copies;
spans, widths, loads in flight and store hints swept, a few seconds in all), compiled
here with nvcc for this GPU; without nvcc they are left out and the result says so. On an
H200 the blocked read stream reads 2 GiB at 4.60-4.69 TB/s against torch's sum at 4.40, and
the fastest kernels (one CTA per contiguous row: argmax_fp32_v2, linear_v2) at up to 98.7%
of it: a ceiling a kernel exceeds is not a ceiling (bench/stream_ceilings.py;
bench/RESULTS.md §22-23).
The streams run eagerly, not replayed from a graph (a memcpy node in a CUDA graph may run on
the copy engines, which moved only ~2.7 TB/s on an H200 against ~4.2 TB/s for the SM copy
kernel), but timed as the kernels' graph replays are (timing.time_graphs with `prime`): each
sample is LAUNCHES back-to-back launches enqueued behind an untimed one, so the GPU never
waits on the host between the events. Timed as one launch alone between events, the host's
few microseconds of launch (a ctypes call, the attribute check) were inside the figure: ~1%
of a 2 GiB read, which is how argmax_fp32_v2 read 0.6-1.7% above the read ceiling.
"""
from __future__ import annotations

import ctypes
import itertools
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

import torch

from .common import device_facts, run_main
from .gpustate import Nvml
from .timing import warm_up

COPY_BYTES = 2 * 2**30
REPEATS = 9
LAUNCHES = 3           # per timed sample, behind an untimed one
STREAMS_SOURCE = Path(__file__).with_name("streams.cu")
MODES = {"read": 0, "1:1": 1, "2:1": 2}
# the blocked streams' shapes: span per block, threads, 16-byte loads in flight per thread,
# and for the mixes that write, plain or evict-first (st.global.cs) stores
# (505 KiB: a 129280-float row, not a power of two, as argmax_fp32_v2's rows are)
SPANS_KIB, THREADS, LOADS = (16, 32, 128, 505), (256, 512, 1024), (4, 8)
# the same through a shared-memory ring of cp.async copies, argmax_v2's way (argmax_fp32_v2
# keeps 48 per thread in flight); on an H200, timed one launch between events, the ring
# streams read 4.43-4.46 TB/s and the register streams 4.48-4.57 (bench/RESULTS.md §22)
RING_MODES = {"read": 3, "1:1": 4}
RING_SPANS_KIB, RING_THREADS, RING_DEPTHS = (128, 505), (128, 256), (16, 32, 48)


def _time(step) -> dict:
    """Per-launch microseconds of `step` over REPEATS samples of LAUNCHES launches each, every
    sample enqueued while an untimed launch still runs."""
    warm_up([step], 3)
    times = []
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        step()                      # the primer: the timed launches queue up behind it
        start.record()
        for _ in range(LAUNCHES):
            step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / LAUNCHES)
    return {"median_us": statistics.median(times), "min_us": min(times), "max_us": max(times),
            "samples_us": times}


def blocked_streams() -> tuple[object | None, str]:
    """(streams.cu's mpkb_stream, a note): nvcc builds it for this GPU (a few seconds, once
    per bandwidth node); (None, why) where it cannot."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None, "blocked streams not compiled (no nvcc on this host): the ceilings are torch's streams'"
    major, minor = torch.cuda.get_device_capability()
    lib = Path(tempfile.mkdtemp(prefix="mpkb-streams-")) / "libstreams.so"
    try:
        subprocess.run([nvcc, "-O3", f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}",
                        "-shared", "-Xcompiler", "-fPIC", "-o", str(lib), str(STREAMS_SOURCE)],
                       check=True, capture_output=True, text=True, timeout=180)
        fn = ctypes.CDLL(str(lib)).mpkb_stream
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        return None, (f"blocked streams not compiled ({detail.strip()[:300]}): the ceilings are "
                      "torch's streams'")
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                   ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                   ctypes.c_void_p]
    return fn, f"blocked streams compiled for sm_{major}{minor}"


CANNOT_LAUNCH = -3     # streams.cu: the shape's block needs more registers or SMEM than an SM has


def blocked_steps(fn, mix: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
                  sink: torch.Tensor) -> dict:
    """{shape name: step}: one launch of the mix's blocked stream per shape over the buffers
    (read: a; 1:1: out = a; 2:1: out = a op b), each `a.nbytes` a buffer, register streams
    and (read, copy) ring streams. A shape that cannot launch on this GPU (its block needs
    more registers or shared memory than an SM has) is left out."""
    per = a.numel() * a.element_size()
    hints = (0,) if mix == "read" else (0, 1)
    shapes = [(MODES[mix], "blocked", *shape) for shape in itertools.product(SPANS_KIB, THREADS, LOADS, hints)]
    if mix in RING_MODES:
        shapes += [(RING_MODES[mix], "ring", *shape)
                   for shape in itertools.product(RING_SPANS_KIB, RING_THREADS, RING_DEPTHS, hints)]
    steps = {}
    for mode, kind, span_kib, threads, loads, evict in shapes:
        depth = f"{loads} loads" if kind == "blocked" else f"{loads} deep"
        name = f"{kind} {span_kib} KiB, {threads} thr, {depth}{', cs' if evict else ''}"

        def launch(mode=mode, s=span_kib * 1024, t=threads, u=loads, e=evict) -> int:
            return fn(mode, a.data_ptr(), b.data_ptr(), out.data_ptr(), per, s, t, u, e,
                      sink.data_ptr(), torch.cuda.current_stream().cuda_stream)

        def step(launch=launch, name=name):
            code = launch()
            if code:
                raise RuntimeError(f"{mix} stream ({name}): CUDA error {code}")
        if launch() == CANNOT_LAUNCH:
            continue
        steps[name] = step
    return steps


def main(job: dict) -> dict:
    torch.cuda.init()
    nvml = Nvml()
    start_state = nvml.snapshot()
    n = COPY_BYTES // 4
    src = torch.randn(n, device="cuda", dtype=torch.float32)
    dst = torch.empty_like(src)
    third = n // 2                                  # three 1 GiB buffers: 2 GiB read, 1 written
    a, b = src[:third], src[third:2 * third]
    c = torch.empty(third, device="cuda", dtype=torch.float32)
    # mix: (bytes moved per launch, torch's steps, the blocked stream's buffers)
    streams = {"1:1": (2 * COPY_BYTES, {"torch copy_": lambda: dst.copy_(src)}, (src, src, dst)),
               "2:1": (3 * third * 4, {"torch add": lambda: torch.add(a, b, out=c)}, (a, b, c)),
               "read": (COPY_BYTES, {"torch sum": lambda: src.sum(), "torch amax": lambda: src.amax()},
                        (src, src, src))}
    fn, note = blocked_streams()
    sink = torch.zeros(1, dtype=torch.int32, device="cuda")
    timings, ceilings, fastest = {}, {}, {}
    for mix, (nbytes, steps, buffers) in streams.items():
        if fn is not None:
            steps = {**steps, **blocked_steps(fn, mix, *buffers, sink)}
        for name, step in steps.items():
            t = _time(step)
            t["bytes"] = nbytes
            timings[f"{mix}: {name}"] = t
            bps = nbytes / (t["median_us"] * 1e-6)
            if bps > ceilings.get(mix, 0.0):
                ceilings[mix], fastest[mix] = bps, name
    bw = ceilings["1:1"]
    return {"verdict": "pass", "device": device_facts(), "copy_bytes": COPY_BYTES,
            "copy_bandwidth_Bps": bw, "ceilings_Bps": ceilings, "ceiling_streams": fastest,
            "timings": timings, "streams": note,
            "gpu_state": {"start": start_state, "end": nvml.snapshot()},
            "message": (f"copy {bw / 1e12:.2f} TB/s (read + write), 2:1 {ceilings['2:1'] / 1e12:.2f}, "
                        f"read-only {ceilings['read'] / 1e12:.2f}; {note}")}


if __name__ == "__main__":
    run_main(main)

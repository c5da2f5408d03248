"""Does another process starting CUDA on the same GPU move a graph-timed kernel's figure?

    python bench/spare_beside_timing.py [--phase-s 6] [--gpu 0]

The warm runner's spare child starts CUDA while a perf gate may be timing on its GPU. This
times two CUDA graphs (200 launches of a ~1 us kernel, 10 of a DRAM-bound ~130 us one) in
four phases: quiet, while fresh processes loop on `cuInit` (what a spare does beside a
perf gate), while they loop on cuInit + a context + an allocation (what a spare does beside
a validate), quiet again. It prints each phase's median, p90 and max per launch, and what
CUDA start-up costs in a fresh process (cuInit alone, with a context, torch's own steps).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CUINIT = "import ctypes; c=ctypes.CDLL('libcuda.so.1'); assert c.cuInit(0)==0"
CONTEXT = (CUINIT + "; d=ctypes.c_int(); c.cuDeviceGet(ctypes.byref(d),0); x=ctypes.c_void_p(); "
           "assert c.cuDevicePrimaryCtxRetain(ctypes.byref(x),d)==0; c.cuCtxSetCurrent(x); "
           "p=ctypes.c_uint64(); assert c.cuMemAlloc_v2(ctypes.byref(p),1<<20)==0")
PHASES = (("quiet", None), ("cuInit loop", CUINIT), ("context loop", CONTEXT), ("quiet again", None))


def start_costs() -> dict:
    out = {}
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    out["python_process_s"] = round(time.perf_counter() - t, 3)
    for name, code in (("cuInit_process_s", CUINIT), ("context_process_s", CONTEXT)):
        runs = []
        for _ in range(4):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True)
            runs.append(round(time.perf_counter() - t, 3))
        out[name] = runs
    probe = ("import ctypes, json, time, torch\n"
             "t0 = time.perf_counter(); ctypes.CDLL('libcuda.so.1').cuInit(0); t1 = time.perf_counter()\n"
             "torch.cuda.init(); t2 = time.perf_counter()\n"
             "torch.empty(1, device='cuda'); torch.cuda.synchronize(); t3 = time.perf_counter()\n"
             "print(json.dumps({'cuInit_s': round(t1 - t0, 3), 'torch_cuda_init_s': round(t2 - t1, 3),"
             " 'first_tensor_s': round(t3 - t2, 3)}))\n")
    out["in_torch"] = json.loads(subprocess.run([sys.executable, "-c", probe], check=True,
                                                capture_output=True, text=True).stdout)
    return out


def time_phases(phase_s: float) -> dict:
    import torch
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    big = torch.randn(64 << 20, device="cuda")
    work = {"small": (lambda: x.mul_(1.0), 200), "large": (lambda: big.mul_(1.0), 10)}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for fn, _ in work.values():
            fn()
    torch.cuda.synchronize()
    graphs = {}
    for name, (fn, n) in work.items():
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(n):
                fn()
        graphs[name] = (g, n)
    results = {}
    for phase, code in PHASES:
        stop = time.perf_counter() + phase_s
        loop = None
        if code is not None:       # fresh processes, one after another, for the whole phase
            loop = subprocess.Popen([sys.executable, "-c",
                                     f"import subprocess, sys, time\nn = 0\n"
                                     f"end = time.perf_counter() + {phase_s:.2f}\n"
                                     f"while time.perf_counter() < end:\n"
                                     f"    subprocess.run([sys.executable, '-c', {code!r}]); n += 1\n"
                                     f"print(n)"], stdout=subprocess.PIPE, text=True)
            time.sleep(0.4)        # the first process is under way
        samples = {k: [] for k in graphs}
        while time.perf_counter() < stop:
            for k, (g, n) in graphs.items():
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                g.replay()
                e.record()
                e.synchronize()
                samples[k].append(s.elapsed_time(e) * 1000 / n)
        row = {k: {"n": len(v), "median_us": round(statistics.median(v), 4),
                   "p90_us": round(sorted(v)[int(0.9 * len(v))], 4), "max_us": round(max(v), 3)}
               for k, v in samples.items()}
        if loop is not None:
            row["processes"] = int(loop.communicate()[0].strip() or 0)
        results[phase] = row
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase-s", type=float, default=6.0)
    ap.add_argument("--gpu", default="0")
    args = ap.parse_args()
    os.environ["CUDA_VISIBLE_DEVICES"] = args.gpu
    import torch
    name = torch.cuda.get_device_name(0)
    costs = start_costs()
    phases = time_phases(args.phase_s)
    print(json.dumps({"gpu": name, "start_costs": costs, "phases": phases}))
    print(f"\n{name}: CUDA start in a fresh process: python {costs['python_process_s']} s, "
          f"+cuInit {costs['cuInit_process_s']} s, +context {costs['context_process_s']} s; "
          f"inside torch: {costs['in_torch']}")
    print(f"{'phase':<14} {'processes':>9}  {'small med/p90/max us':>26}  {'large med/p90/max us':>28}")
    for phase, row in phases.items():
        cells = [f"{row[k]['median_us']:.3f}/{row[k]['p90_us']:.3f}/{row[k]['max_us']:.2f}" for k in ("small", "large")]
        print(f"{phase:<14} {row.get('processes', '-'):>9}  {cells[0]:>26}  {cells[1]:>28}")


if __name__ == "__main__":
    main()

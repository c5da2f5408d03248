"""A/A test of the perf runner's sampling and intervals: one torch op against itself.

    python bench/aa_test.py [--rounds 30] [--out FILE]

For each decode-sized op (and one large one), `--rounds` rounds; each round captures two
graphs of the same op on the same inputs and times them interleaved with
runners/timing.time_graphs (noise-driven sampling, NVML clocks), as the perf gate times a
kernel and its baseline. The paired ratio's 95% interval (util.stats.ratio_figure) must
cover 1.0 in at least 95% of rounds. Prints per op: coverage, the median and widest
interval widths, samples taken, how sampling stopped, samples rejected by the clock floor.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "site_scons"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from mpkbuild.runners.gpustate import Nvml  # noqa: E402
from mpkbuild.runners.timing import capture, each, time_graphs  # noqa: E402
from mpkbuild.util import stats  # noqa: E402


def ops():
    bf = dict(device="cuda", dtype=torch.bfloat16)
    x8 = torch.randn(8, 2 * 14336, **bf)
    xs = torch.randn(8, 4096, **bf)
    w = torch.randn(4096, **bf)
    xl = torch.randn(8, 4096, **bf)
    wl = torch.randn(4096, 4096, **bf)
    big = torch.randn(4096, 2 * 14336, **bf)
    return {
        "silu_mul r8 i14336 (eager)": (lambda: F.silu(x8[:, :14336]) * x8[:, 14336:], 20),
        "rms_norm r8 h4096": (lambda: F.rms_norm(xs, (4096,), w, 1e-6), 20),
        "linear m8 n4096 k4096": (lambda: F.linear(xl, wl), 20),
        "silu_mul r4096 i14336 (large)": (lambda: F.silu(big[:, :14336]) * big[:, 14336:], 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.cuda.init()
    nvml = Nvml()
    report = {"gpu": torch.cuda.get_device_name(0), "state_start": nvml.snapshot(), "ops": {}}
    for name, (fn, launches) in ops().items():
        rounds = []
        for _ in range(args.rounds):
            started = time.perf_counter()
            graphs = [capture(each(lambda i, s: fn()), launches), capture(each(lambda i, s: fn()), launches)]
            a, b = time_graphs(graphs, launches, args.repeats, 16, prime=True, nvml=nvml)
            c = stats.ratio_figure(a["samples_us"], b["samples_us"])
            smp = a["sampling"]
            rounds.append({"ratio": c["ratio"], "lo": c["lo"], "hi": c["hi"], "n": c["n"],
                           "lo_samples": c["lo_samples"], "hi_samples": c["hi_samples"],
                           "covers": c["lo"] <= 1.0 <= c["hi"], "verdict": c["verdict"],
                           "us": a["median_us"], "stop": smp["stop"], "rejected": len(smp["rejected"]),
                           "s": round(time.perf_counter() - started, 3)})
            del graphs
        widths = [r["hi"] - r["lo"] for r in rounds]
        cov = sum(r["covers"] for r in rounds) / len(rounds)
        summary = {"coverage": cov, "width_median": statistics.median(widths), "width_max": max(widths),
                   "us": statistics.median(r["us"] for r in rounds),
                   "samples_median": statistics.median(r["n"] for r in rounds),
                   "stops": {s: sum(r["stop"] == s for r in rounds) for s in {r["stop"] for r in rounds}},
                   "verdicts": {v: sum(r["verdict"] == v for r in rounds) for v in {r["verdict"] for r in rounds}},
                   "rejected": sum(r["rejected"] for r in rounds),
                   "s_per_round": statistics.median(r["s"] for r in rounds)}
        report["ops"][name] = {"summary": summary, "rounds": rounds}
        print(f"{name:<32} {summary['us']:8.2f} us  covers 1.0 in {cov:.0%} of {len(rounds)}  "
              f"width median {summary['width_median']:.4f} max {summary['width_max']:.4f}  "
              f"n~{summary['samples_median']}  stops {summary['stops']}  verdicts {summary['verdicts']}  "
              f"rejected {summary['rejected']}  {summary['s_per_round']:.2f} s/round", flush=True)
    report["state_end"] = nvml.snapshot()
    print("GPU state start:", json.dumps(report["state_start"]))
    print("GPU state end:  ", json.dumps(report["state_end"]))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

"""A/A test of the perf runner's sampling and intervals: one torch op against itself.

    python bench/aa_test.py [--rounds 30] [--placements] [--out FILE]

For each decode-sized op (and one large one), `--rounds` rounds; each round captures two
graphs of the same op on the same inputs and times them interleaved with
runners/timing.time_graphs (noise-driven sampling, NVML clocks), as the perf gate times a
kernel and its baseline. The paired ratio's 95% interval (util.stats.ratio_figure) must
cover 1.0 in at least 95% of rounds. Prints per op: coverage, the median and widest
interval widths, samples taken, how sampling stopped, samples rejected by the clock floor.

`--placements`: the A/A over buffer placements (runners/placement.py). Side A is the op on
its fresh buffers, side B the same op on copies placed as each other placement places them
(after a large alloc/free; beside a held buffer), timed interleaved as the gate times them.
A placement-insensitive op reads "same" (covers 1.0); the rounds say how often the gate's
worst-of-placements statistic would call a difference that is only noise.
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

from mpkbuild.runners import placement  # noqa: E402
from mpkbuild.runners.gpustate import Nvml  # noqa: E402
from mpkbuild.runners.timing import capture, each, time_graphs  # noqa: E402
from mpkbuild.util import stats  # noqa: E402


def ops():
    """name -> (op over its tensors, the tensors, launches per graph)."""
    bf = dict(device="cuda", dtype=torch.bfloat16)
    return {
        "silu_mul r8 i14336 (eager)": (lambda x: F.silu(x[:, :14336]) * x[:, 14336:],
                                       [torch.randn(8, 2 * 14336, **bf)], 20),
        "rms_norm r8 h4096": (lambda x, w: F.rms_norm(x, (4096,), w, 1e-6),
                              [torch.randn(8, 4096, **bf), torch.randn(4096, **bf)], 20),
        "linear m8 n4096 k4096": (F.linear, [torch.randn(8, 4096, **bf), torch.randn(4096, 4096, **bf)], 20),
        "linear m8 n7168 k2048": (F.linear, [torch.randn(8, 2048, **bf), torch.randn(7168, 2048, **bf)], 20),
        "silu_mul r4096 i14336 (large)": (lambda x: F.silu(x[:, :14336]) * x[:, 14336:],
                                          [torch.randn(4096, 2 * 14336, **bf)], 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--placements", action="store_true",
                    help="side B on copies placed as each other placement places them")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.cuda.init()
    nvml = Nvml()
    report = {"gpu": torch.cuda.get_device_name(0), "state_start": nvml.snapshot(), "ops": {}}
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    sides = ([(p.name, p) for p in placement.PLACEMENTS[1:]] if args.placements else [("a/a", None)])
    cases = [(f"{name} [{side}]" if args.placements else name, fn, tensors, launches, place)
             for name, (fn, tensors, launches) in ops().items() for side, place in sides]
    for name, fn, tensors, launches, place in cases:
        rounds = []
        for _ in range(args.rounds):
            started = time.perf_counter()
            with placement.arranged(place or placement.PLACEMENTS[0], l2, torch):
                other = [t.clone() for t in tensors] if place else tensors
                graphs = [capture(each(lambda i, s: fn(*tensors)), launches),
                          capture(each(lambda i, s: fn(*other)), launches)]
                a, b = time_graphs(graphs, launches, args.repeats, 16, prime=True, nvml=nvml)
                del graphs, other
            c = stats.ratio_figure(a["samples_us"], b["samples_us"])
            smp = a["sampling"]
            rounds.append({"ratio": c["ratio"], "lo": c["lo"], "hi": c["hi"], "n": c["n"],
                           "lo_samples": c["lo_samples"], "hi_samples": c["hi_samples"],
                           "covers": c["lo"] <= 1.0 <= c["hi"], "verdict": c["verdict"],
                           "us": a["median_us"], "stop": smp["stop"], "rejected": len(smp["rejected"]),
                           "s": round(time.perf_counter() - started, 3)})
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

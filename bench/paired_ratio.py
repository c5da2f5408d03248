"""How far the perf gate's "vs torch" ratio strays when the two sides are the same op.

    python bench/paired_ratio.py [--rounds N] [--repeats R]

An A/A test on this GPU: each case captures the same torch op twice (two CUDA graphs, the
perf gate's launches_per_graph) and estimates the ratio of their times, whose true value is
1, `--rounds` times by two methods, alternating which goes first:
- sequential: all of A's repeats, then all of B's, ratio of the two medians (the perf
  runner before the paired timing, with the current warm-up);
- paired: A's and B's replays interleaved, each timed replay primed by an untimed one of
  its own graph (mpkbuild.runners.timing.time_graphs, as the perf runner's hot figures),
  median of the per-repeat ratios.
Prints, per case and method, the estimates' median, 5th-95th percentile and extremes, and
how many rounds a limit of 1.03x (linear_v2's at parity with cuBLAS) would have failed.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "site_scons"))
from mpkbuild.runners.timing import capture, each, paired_ratio, time_graphs  # noqa: E402

LAUNCHES, WARMUP, LIMIT = 20, 16, 1.03


def cases():
    """Decode shapes of the catalog's baselines: name -> a zero-argument torch op."""
    bf16 = dict(dtype=torch.bfloat16, device="cuda")
    x1, w1 = torch.randn(1, 4096, **bf16), torch.randn(14336, 4096, **bf16)
    x16, w16 = torch.randn(16, 2048, **bf16), torch.randn(7168, 2048, **bf16)
    gate, up = torch.randn(8, 14336, **bf16), torch.randn(8, 14336, **bf16)
    table = torch.randn(129280, 7168, **bf16)
    ids = torch.randint(0, 129280, (16,), device="cuda", dtype=torch.int32)
    return {
        "F.linear m1 n14336 k4096": lambda: F.linear(x1, w1),
        "F.linear m16 n7168 k2048": lambda: F.linear(x16, w16),
        "silu(gate)*up r8 i14336": lambda: F.silu(gate) * up,
        "F.embedding 16 ids h7168": lambda: F.embedding(ids, table),
    }


def percentile(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=7, help="the specs' perf.repeats")
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.rounds} rounds of "
          f"{args.repeats} repeats x {LAUNCHES} launches per method and case")
    print(f"{'case':<26} {'method':<10} {'median':>7} {'p5':>7} {'p95':>7} {'min':>7} {'max':>7} "
          f"{'>' + str(LIMIT):>6}")
    for name, op in cases().items():
        graphs = [capture(each(lambda i, s, op=op: op()), LAUNCHES) for _ in range(2)]
        found = {"sequential": [], "paired": []}
        for r in range(args.rounds):
            order = ("sequential", "paired") if r % 2 == 0 else ("paired", "sequential")
            for method in order:
                if method == "sequential":
                    (a,) = time_graphs(graphs[:1], LAUNCHES, args.repeats, WARMUP)
                    (b,) = time_graphs(graphs[1:], LAUNCHES, args.repeats, WARMUP)
                    found[method].append(a["median_us"] / b["median_us"])
                else:
                    a, b = time_graphs(graphs, LAUNCHES, args.repeats, WARMUP, prime=True)
                    found[method].append(paired_ratio(a, b))
        for method, ratios in found.items():
            print(f"{name:<26} {method:<10} {statistics.median(ratios):>7.4f} "
                  f"{percentile(ratios, 0.05):>7.4f} {percentile(ratios, 0.95):>7.4f} "
                  f"{min(ratios):>7.4f} {max(ratios):>7.4f} {sum(x > LIMIT for x in ratios):>6d}")
        del graphs
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()

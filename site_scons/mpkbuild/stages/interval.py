"""The one interval the tune stage judges "faster" with, kept apart so it can be swapped.

A candidate's figure is the median over its repeats of the paired ratio kernel time /
torch time (the perf runner interleaves the two replay by replay, so a drift during the
timing cancels within each pair: runners/timing.py). Candidates are timed in different
runs; their ratios to the same torch op are comparable across runs where raw times drift.

The interval is the distribution-free one for a median: the order statistics
x_(k), x_(n+1-k) for the largest k with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2.
With 7 repeats that is [min, max] (98.4%); below 6 repeats no k reaches 95% and the
interval is [min, max] at the confidence it has (reported as `confidence`).

A is faster than B only when A's whole interval lies below B's. Another interval (the
perf gate's, when it has one) replaces `median_interval` and `faster` here and nothing else.
"""
from __future__ import annotations

import math
import statistics

CONFIDENCE = 0.95
METHOD = ("median of the paired kernel/torch ratios, distribution-free order-statistic "
          "interval (stages/interval.py)")


def median_interval(samples: list[float], confidence: float = CONFIDENCE) -> dict:
    """{median, lo, hi, confidence, n} for the median of samples."""
    xs = sorted(float(x) for x in samples)
    n = len(xs)
    if n == 0:
        raise ValueError("no samples")
    alpha = (1.0 - confidence) / 2.0
    k, tail = 0, 0.0
    # tail = P(B <= j - 1) for B ~ Binomial(n, 1/2): the interval [x_(j), x_(n+1-j)] misses
    # the median with probability at most 2 * tail
    for j in range(1, n // 2 + 1):
        tail += math.comb(n, j - 1) / 2.0 ** n
        if tail > alpha:
            break
        k = j
    k = max(k, 1)
    achieved = 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2.0 ** n
    return {"median": statistics.median(xs), "lo": xs[k - 1], "hi": xs[n - k],
            "confidence": round(achieved, 4), "n": n}


def faster(a: dict, b: dict) -> bool:
    """Whether interval a says its figure is below b's (the whole of a under the whole of b)."""
    return a["hi"] < b["lo"]


def paired_ratios(figure: dict, baseline: dict) -> list[float]:
    """The per-repeat ratios kernel / baseline from the perf runner's paired samples."""
    return [k / b for k, b in zip(figure["samples_us"], baseline["samples_us"]) if b > 0]

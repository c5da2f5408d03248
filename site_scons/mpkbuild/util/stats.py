"""Intervals and verdicts for timed samples. Standard library only (the build imports it).

The interval of a median is the distribution-free one of the sign test: with n samples
sorted, [x_(k), x_(n+1-k)] covers the population median with probability at least
`confidence`, for the largest k where P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2. It
needs no assumption about the shape of the noise (timings are skewed, often bimodal), and
for paired samples it is the interval of the median of the per-pair ratios: a drift that
moves both members of a pair cancels in the ratio.

A comparison of two things' times (a ratio, kernel / other) reads:
- ``faster`` : the whole interval below 1 (a confirmed 0.5% difference is still faster);
- ``slower`` : the whole interval above 1;
- ``same``   : the interval contains 1 and lies within [1 - band, 1 + band];
- ``unsure`` : the interval contains 1 but reaches outside the band (too noisy to tell).
A threshold on a ratio (ratio <= limit) is ``pass`` when the interval's upper end is at or
below the limit, ``fail`` when its lower end is above it, ``unsure`` otherwise.
"""
from __future__ import annotations

import math
import statistics

CONFIDENCE = 0.95
SAME_BAND = 0.02          # a ratio whose interval lies within 1 +- 2% is "same"
# Two CUDA graphs of the *same* op, captured separately and timed interleaved, differ by a
# per-capture offset the samples of one run cannot see: on an H200 (2026-12-01, bench/
# aa_test.py, 30 rounds each of eager silu_mul r8, rms_norm r8, F.linear m8 4096^2) the
# paired ratio's median was off 1.0 by up to 0.69% while its sign-test interval was 0.2-0.45%
# wide, covering 1.0 in only 7-23% of rounds. A paired ratio's interval is widened by this
# floor (a fraction of the ratio each side): with 0.8% it covered 1.0 in all those rounds.
CAPTURE_FLOOR = 0.008


def _binom_cdf_half(n: int, k: int) -> float:
    """P(Binomial(n, 1/2) <= k)."""
    if k < 0:
        return 0.0
    return sum(math.comb(n, i) for i in range(0, min(k, n) + 1)) / 2.0 ** n


def median_rank(n: int, confidence: float = CONFIDENCE) -> int:
    """The 1-based rank k of the lower end of the median's interval (n + 1 - k the upper);
    1 when n is too small for the confidence asked (then [min, max], which covers less)."""
    alpha = (1.0 - confidence) / 2.0
    k = 1
    while k + 1 <= (n + 1) // 2 and _binom_cdf_half(n, k) <= alpha:   # P(B <= k) = P(B < k + 1)
        k += 1
    return k


def coverage(n: int, k: int) -> float:
    """The exact coverage of [x_(k), x_(n+1-k)] for the median."""
    return 1.0 - 2.0 * _binom_cdf_half(n, k - 1)


def median_ci(values, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(median, low, high) of `values` (at least one)."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        raise ValueError("no samples")
    k = median_rank(n, confidence)
    return statistics.median(xs), xs[k - 1], xs[n - k]


def median_interval(values, floor: float = 0.0, confidence: float = CONFIDENCE) -> dict:
    """{median, lo, hi, confidence, n, floor}: median_ci as a record, widened by `floor` x
    the median each side (CAPTURE_FLOOR for a paired ratio of two captures)."""
    med, lo, hi = median_ci(values, confidence)
    n = len(values)
    return {"median": med, "lo": lo - floor * med, "hi": hi + floor * med,
            "confidence": round(coverage(n, median_rank(n, confidence)), 4), "n": n, "floor": floor}


def below(a: dict, b: dict) -> bool:
    """Whether interval a lies wholly below interval b (a's figure is smaller, beyond noise)."""
    return a["hi"] < b["lo"]


def relative_half_width(values, confidence: float = CONFIDENCE) -> float:
    med, lo, hi = median_ci(values, confidence)
    return (hi - lo) / 2.0 / med if med else math.inf


def paired_ratios(kernel_samples, other_samples) -> list[float]:
    return [k / b for k, b in zip(kernel_samples, other_samples) if b > 0]


def compare(ratio: float, lo: float, hi: float, band: float = SAME_BAND) -> str:
    """faster / slower / same / unsure for an interval of kernel / other."""
    if hi < 1.0:
        return "faster"
    if lo > 1.0:
        return "slower"
    if lo >= 1.0 - band and hi <= 1.0 + band:
        return "same"
    return "unsure"


def ratio_figure(kernel_samples, other_samples, confidence: float = CONFIDENCE,
                 band: float = SAME_BAND, floor: float | None = None) -> dict:
    """The paired comparison of two sample lists: {ratio, lo, hi, n, verdict}: the sign-test
    interval of the median paired ratio (lo_samples, hi_samples) widened by `floor`
    (CAPTURE_FLOOR when None) x the ratio each side. With no pairs there is no interval:
    verdict unsure."""
    pairs = paired_ratios(kernel_samples, other_samples)
    if not pairs:
        return {"ratio": None, "lo": None, "hi": None, "n": 0, "verdict": "unsure"}
    floor = CAPTURE_FLOOR if floor is None else floor
    med, lo, hi = median_ci(pairs, confidence)
    wlo, whi = lo - floor * med, hi + floor * med
    return {"ratio": med, "lo": wlo, "hi": whi, "lo_samples": lo, "hi_samples": hi, "floor": floor,
            "n": len(pairs),
            "coverage": round(coverage(len(pairs), median_rank(len(pairs), confidence)), 4),
            "verdict": compare(med, wlo, whi, band)}


def unpaired_ratio(now: tuple[float, float, float], before: tuple[float, float, float]) -> dict:
    """now / before for two independent runs (no pairing across runs), each given as its
    (median, lo, hi): a conservative interval, [now.lo / before.hi, now.hi / before.lo] (each
    end's interval at CONFIDENCE, so together at least 2 * CONFIDENCE - 1)."""
    (med, lo, hi), (bmed, blo, bhi) = now, before
    return {"ratio": med / bmed, "lo": lo / bhi, "hi": hi / blo}


def at_most(lo: float, hi: float, limit: float) -> str:
    """The verdict of `value <= limit` for a value known to lie in [lo, hi]."""
    if hi <= limit:
        return "pass"
    if lo > limit:
        return "fail"
    return "unsure"


def at_least(lo: float, hi: float, limit: float) -> str:
    """The verdict of `value >= limit` for a value known to lie in [lo, hi]."""
    if lo >= limit:
        return "pass"
    if hi < limit:
        return "fail"
    return "unsure"


def gate_outcome(problems: list[str], unsure: list[str], met: str) -> tuple[str, str]:
    """(verdict, message) of a gate's threshold outcomes: a failure fails and is named; else
    an unsure one makes the gate unsure, never a pass; else `met`."""
    if problems:
        return "fail", "; ".join(problems)
    if unsure:
        return "unsure", "unsure: " + "; ".join(unsure)
    return "pass", met

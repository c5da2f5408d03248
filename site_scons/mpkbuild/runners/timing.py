"""CUDA-graph timing for the perf runner (the bandwidth runner shares its warm-up).

A graph of `launches` calls is captured once and replayed; each repeat is one replay
between two CUDA events, and the per-launch time is the replay time over `launches`. A
kernel and its baseline are timed in one interleaved loop and compared pair by pair. The
enqueuer gets the *capture* stream, read inside the capture context (a stream taken
before capture records nothing).
"""
from __future__ import annotations

import math
import statistics
import time

import torch

from ..util import stats

MIN_WARMUP_S = 0.025


def each(step):
    """A per-launch step(i, stream_handle) as an enqueue(count, stream_handle) for capture.
    Each step's return value (a torch baseline's output) is dropped at once, so the capture's
    pool reuses it rather than holding thousands of outputs to the end."""
    def enqueue(count: int, handle) -> None:
        for i in range(count):
            step(i, handle)
    return enqueue


def capture(enqueue, launches: int) -> torch.cuda.CUDAGraph:
    """enqueue(count, stream_handle) enqueues launches 0 .. count-1; returns the graph of all
    `launches` (after a warm-up of up to three outside the capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):          # warm-up outside capture (lazy init, attributes)
        enqueue(min(launches, 3), torch.cuda.current_stream().cuda_stream)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        enqueue(launches, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    return graph


DEFAULT_SAMPLING = {"min_samples": 7, "target": 0.005, "max_s": 0.5, "max_samples": 2000,
                    "clock_floor": 0.95}


def _criterion(samples: list[list[float]], kept: list[int]) -> float:
    """The noise criterion: the relative half-width of the median's interval of each
    baseline's paired ratio (kernel = graph 0), the widest; of graph 0's own median when it
    is timed alone."""
    if len(kept) < 2:
        return math.inf
    if len(samples) == 1:
        return stats.relative_half_width([samples[0][j] for j in kept])
    return max(stats.relative_half_width(stats.paired_ratios([samples[0][j] for j in kept],
                                                             [samples[i][j] for j in kept]))
               for i in range(1, len(samples)))


def _kept(clocks: list, floor_fraction: float) -> tuple[list[int], float | None]:
    """Indices of the samples taken at or above the clock floor (floor_fraction of the
    median SM clock seen over the samples), and the floor in MHz (None: no clock readings)."""
    seen = [c for c in clocks if c is not None]
    if not seen:
        return list(range(len(clocks))), None
    floor = floor_fraction * statistics.median(seen)
    return [j for j, c in enumerate(clocks) if c is None or c >= floor], floor


def time_graphs(graphs: list, launches: int, repeats: int, warmup: int,
                prime: bool = False, sampling: dict | None = None, nvml=None) -> list[dict]:
    """Per-launch microseconds for each graph (median, its interval, min, max and the
    samples), their replays interleaved: each repeat replays every graph once, in reversed
    order on alternate repeats, so a clock or thermal drift during the timing lands on all
    of them alike and the i-th samples of two graphs can be compared as a pair. `prime`: an
    untimed replay of the same graph just before each timed one, so that every timed replay
    follows its own graph as back-to-back replays would (after the other graph, the short
    hot replays of 1-2 us kernels on an H200 took ~5% longer).

    Sampling runs to a noise criterion, as nvbench does: at least `repeats` (and
    sampling.min_samples) repeats, then more in batches until the relative half-width of the
    paired ratio's median interval is at most sampling.target, or it stopped improving over
    three batches, or sampling.max_s of timing passed, or sampling.max_samples. With `nvml`
    each repeat records the SM clock (the lower of the readings before and after it); a
    repeat under clock_floor x the median clock is rejected (all its graphs' samples, so
    the pairs stay aligned) and reported."""
    cfg = {**DEFAULT_SAMPLING, **(sampling or {})}
    minimum = max(repeats, int(cfg["min_samples"]))
    warm_up([graph.replay for graph in graphs], max(1, warmup // max(1, launches) + 1))
    samples: list[list[float]] = [[] for _ in graphs]
    clocks: list = []
    started = time.perf_counter()
    history: list[float] = []
    batch, stop, r = minimum, None, 0
    while stop is None:
        for _ in range(batch):
            order = range(len(graphs)) if r % 2 == 0 else reversed(range(len(graphs)))
            before = nvml.sm_clock() if nvml is not None else None
            for i in order:
                if prime:
                    graphs[i].replay()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                graphs[i].replay()
                end.record()
                end.synchronize()
                samples[i].append(start.elapsed_time(end) * 1000.0 / launches)
            after = nvml.sm_clock() if nvml is not None else None
            clocks.append(min(c for c in (before, after) if c is not None)
                          if before is not None or after is not None else None)
            r += 1
        kept, floor = _kept(clocks, cfg["clock_floor"])
        crit = _criterion(samples, kept)
        history.append(crit)
        elapsed = time.perf_counter() - started
        if len(kept) >= minimum and crit <= cfg["target"]:
            stop = "target"
        elif elapsed >= cfg["max_s"]:
            stop = "budget"
        elif r >= cfg["max_samples"]:
            stop = "max_samples"
        elif len(history) >= 4 and crit > 0.95 * history[-4]:
            stop = "plateau"
        batch = max(minimum, r // 4)
    info = sampling_info(kept, clocks, r, stop, history[-1], cfg, time.perf_counter() - started, floor, nvml)
    return [figure([times[j] for j in kept], info) for times in samples]


def sampling_info(kept: list[int], clocks: list, taken: int, stop: str, half_width: float, cfg: dict,
                  elapsed_s: float, floor, nvml=None) -> dict:
    """How a figure's samples were taken: how many, why sampling stopped, the clock check."""
    rejected = [{"index": j, "sm_clock_mhz": clocks[j]} for j in range(len(clocks)) if j not in set(kept)]
    return {"samples": len(kept), "taken": taken, "stop": stop, "half_width": half_width,
            "capture_floor": cfg.get("capture_floor"),
            "target": cfg["target"], "elapsed_s": round(elapsed_s, 4),
            "clock_floor_mhz": floor, "rejected": rejected,
            "sm_clock_mhz": [clocks[j] for j in kept] if floor is not None else None,
            "clock_note": None if floor is not None else
            (getattr(nvml, "why", None) or "no NVML: samples not clock-checked")}


def figure(times: list[float], info: dict) -> dict:
    """One timed figure from its kept samples (us per launch) and their sampling_info."""
    med, lo, hi = stats.median_ci(times)
    return {"median_us": med, "ci_us": [lo, hi], "min_us": min(times), "max_us": max(times),
            "spread": (max(times) - min(times)) / med, "samples_us": list(times), "sampling": info}


def warm_up(steps: list, rounds: int) -> None:
    """Each step (a graph replay, a copy) at least `rounds` times, and rounds of them until
    MIN_WARMUP_S has passed. On an H200 embedding_v2's first 4-6 replays after its capture
    (10-15 ms) ran ~10% slower, in hot and cold alike; with one warm-up replay, 4-5 of 7
    samples fell there (bench/RESULTS.md). The rounds go in batches without a sync between
    them, each batch sized from the time so far: the first round (a graph's upload, a
    kernel's load) may take longer than the rest, so it alone does not set the count."""
    start, done, batch = time.perf_counter(), 0, 1
    while True:
        for _ in range(batch):
            for step in steps:
                step()
        torch.cuda.synchronize()
        done += batch
        elapsed = time.perf_counter() - start
        if done >= rounds and elapsed >= MIN_WARMUP_S:
            return
        batch = max(1, rounds - done, math.ceil((MIN_WARMUP_S - elapsed) * done / max(elapsed, 1e-6)))


def paired_ratio(figures: dict, baseline: dict) -> float:
    """The median over repeats of kernel time / baseline time, from time_graphs' paired
    samples: a drift between repeats cancels in each pair, which a ratio of the two medians
    does not do."""
    return statistics.median(k / b for k, b in zip(figures["samples_us"], baseline["samples_us"]))


def paired_figure(figures: dict, baseline: dict) -> dict:
    """paired_ratio with its interval and verdict (util.stats.ratio_figure)."""
    floor = (figures.get("sampling") or {}).get("capture_floor")
    return stats.ratio_figure(figures["samples_us"], baseline["samples_us"], floor=floor)

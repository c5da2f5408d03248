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


def time_graphs(graphs: list, launches: int, repeats: int, warmup: int,
                prime: bool = False) -> list[dict]:
    """Per-launch microseconds for each graph (median, min, max and the samples over
    repeats), their replays interleaved: each repeat replays every graph once, in reversed
    order on alternate repeats, so a clock or thermal drift during the timing lands on all
    of them alike and the i-th samples of two graphs can be compared as a pair. `prime`: an
    untimed replay of the same graph just before each timed one, so that every timed replay
    follows its own graph as back-to-back replays would (after the other graph, the short
    hot replays of 1-2 us kernels on an H200 took ~5% longer)."""
    warm_up([graph.replay for graph in graphs], max(1, warmup // max(1, launches) + 1))
    samples = [[] for _ in graphs]
    for r in range(repeats):
        order = range(len(graphs)) if r % 2 == 0 else reversed(range(len(graphs)))
        for i in order:
            if prime:
                graphs[i].replay()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graphs[i].replay()
            end.record()
            end.synchronize()
            samples[i].append(start.elapsed_time(end) * 1000.0 / launches)
    return [{"median_us": statistics.median(times), "min_us": min(times), "max_us": max(times),
             "spread": (max(times) - min(times)) / statistics.median(times), "samples_us": times}
            for times in samples]


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

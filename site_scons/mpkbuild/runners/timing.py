"""CUDA-graph timing shared by the perf and bandwidth runners.

A graph of `launches` calls is captured once and replayed; each repeat is one replay
between two CUDA events, and the per-launch time is the replay time over `launches`. The
enqueuer gets the *capture* stream, read inside the capture context (a stream taken
before capture records nothing).
"""
from __future__ import annotations

import statistics

import torch


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


def time_graph(graph: torch.cuda.CUDAGraph, launches: int, repeats: int, warmup: int) -> dict:
    """Per-launch microseconds: median, min, max and the list over repeats."""
    for _ in range(max(1, warmup // max(1, launches) + 1)):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / launches)
    return {"median_us": statistics.median(times), "min_us": min(times), "max_us": max(times),
            "spread": (max(times) - min(times)) / statistics.median(times), "samples_us": times}

"""The order SCons is handed the GPU gates in, planned so that N GPUs finish together.

SCons gives a free job slot the first ready node in the order of its targets, so with -jN
over N GPUs that order *is* the schedule. Each gate is expected to take as long as it took
last time (a gate never run yet: the median of its kind). The plan starts from the critical
path (a validate ranks as itself plus the perf waiting for it, so long chains start first)
and keeps any swap that shortens the simulated finish without putting a gate before what it
waits for. On the catalog's gate times from six recorded runs on two H200s, each plan made
from one run and judged on the other five, the GPUs finished 0.21 s after an even split on
average, against 0.28 s for "every validate, then perfs longest first": gate times move
±10% between runs, so a plan made from last run's times buys part of the gap, not all.
A gate after a perf on the same GPU waits for its CUDA context (the warm runner's spare
makes none beside a timing gate; the executor says how long, `after_timing_s`): the plan
counts that wait, and one GPU runs every validate before any perf.
SCons still decides what runs; this only orders what it is given.
"""
from __future__ import annotations

import random
import statistics
import time
from typing import Hashable, Sequence

Gate = Hashable


def simulate(order: Sequence[Gate], seconds: dict, needs: dict, slots: int,
             switch=None) -> float:
    """When the last gate ends, if each free slot takes the first ready gate in `order`.
    switch(previous gate on the slot or None, gate): extra seconds the gate waits there."""
    free = [0.0] * max(1, slots)
    previous: list = [None] * len(free)
    ends: dict = {}
    pending = list(order)
    while pending:
        slot = min(range(len(free)), key=free.__getitem__)
        now = free[slot]
        pick = next((g for g in pending
                     if all(ends.get(d, float("inf")) <= now for d in needs.get(g, ()) if d in seconds)),
                    None)
        if pick is None:
            later = [t for t in ends.values() if t > now]
            if later:              # nothing ready: this slot idles until a running gate ends
                free[slot] = min(later)
                continue
            pick = pending[0]      # (an order that breaks precedence: take it as it comes)
        pending.remove(pick)
        free[slot] = now + seconds[pick] + (switch(previous[slot], pick) if switch else 0.0)
        previous[slot] = pick
        ends[pick] = free[slot]
    return max(free)


def estimates(gates: Sequence[Gate], last: dict, kind) -> dict:
    """Last run's seconds; a gate never timed gets the median of its kind (or 1 s)."""
    by_kind: dict = {}
    for g in gates:
        if last.get(g):
            by_kind.setdefault(kind(g), []).append(last[g])
    return {g: last.get(g) or (statistics.median(by_kind[kind(g)]) if kind(g) in by_kind else 1.0)
            for g in gates}


def _in_precedence(ordered: list, needs: dict) -> list:
    """`ordered` with each gate moved after what it waits for, otherwise kept in order."""
    inside = set(ordered)
    placed, out = set(), []
    while len(out) < len(ordered):
        for g in ordered:
            if g not in placed and all(d in placed or d not in inside for d in needs.get(g, ())):
                placed.add(g)
                out.append(g)
                break
    return out


def one_gpu_order(gates: Sequence[Gate], seconds: dict, needs: dict, kind_rank) -> list:
    """For one GPU: every gate of the first kind (validate) before the next, each kind
    shortest first. The most verdicts soonest, correctness before speed, and no gate waits
    behind a timing gate for its CUDA context (see plan's `switch`)."""
    return _in_precedence(sorted(gates, key=lambda g: (kind_rank(g), seconds[g])), needs)


def critical_path_order(gates: Sequence[Gate], seconds: dict, needs: dict) -> list:
    """Longest remaining chain first (a gate plus the longest chain waiting on it)."""
    waiting: dict = {g: [] for g in gates}
    for g in gates:
        for d in needs.get(g, ()):
            if d in waiting:
                waiting[d].append(g)
    rank: dict = {}

    def chain(g) -> float:
        if g not in rank:
            rank[g] = seconds[g] + max((chain(w) for w in waiting[g]), default=0.0)
        return rank[g]
    # a gate must follow what it waits for (ties in rank could put it first)
    return _in_precedence(sorted(gates, key=lambda g: -chain(g)), needs)


def plan(gates: Sequence[Gate], seconds: dict, needs: dict, slots: int, kind_rank=lambda g: 0,
         switch=None, trials: int = 600, budget_s: float = 0.05, seed: int = 0) -> list:
    """The target order for `slots` GPUs: critical path first, then up to `trials` swaps
    (fewer if budget_s of wall time runs out, so a large build's start-up stays short).
    switch(previous, gate) is what a gate waits for after `previous` on the same GPU (the
    local executor's warm runner: a gate after a perf waits ~0.2-0.35 s for its context)."""
    if slots <= 1:
        return one_gpu_order(gates, seconds, needs, kind_rank)
    order = critical_path_order(gates, seconds, needs)
    if len(order) < 3:
        return order
    best = simulate(order, seconds, needs, slots, switch)
    pos_ok = _precedence_check(needs)
    rnd = random.Random(seed)
    deadline = time.perf_counter() + budget_s
    for _ in range(trials):
        if time.perf_counter() > deadline:
            break
        i, j = rnd.sample(range(len(order)), 2)
        trial = list(order)
        trial[i], trial[j] = trial[j], trial[i]
        if not pos_ok(trial):
            continue
        got = simulate(trial, seconds, needs, slots, switch)
        if got < best - 1e-9:
            order, best = trial, got
    return order


def _precedence_check(needs: dict):
    def ok(order) -> bool:
        at = {g: i for i, g in enumerate(order)}
        return all(at[d] < at[g] for g in order for d in needs.get(g, ()) if d in at)
    return ok

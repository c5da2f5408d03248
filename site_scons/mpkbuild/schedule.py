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
The warm runner's spares make CUDA contexts only beside gates that do not time (a
validate), so a gate that follows as many timing gates in a row as there are spares on its
GPU makes its own context and waits for it (`context_wait`); the plan counts that wait.
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
    switch(gates run before on the slot, oldest first; gate): extra seconds it waits there."""
    free = [0.0] * max(1, slots)
    previous: list = [[] for _ in free]
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
        previous[slot].append(pick)
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


def context_wait(is_timing, spares: int, wait_s: float):
    """A plan's `switch` for the warm runner: a gate waits `wait_s` for its CUDA context when
    the last `spares` gates on its GPU all timed (a spare makes its context only beside a
    gate that does not time, and each gate takes one)."""
    def switch(history: Sequence[Gate], gate: Gate) -> float:
        recent = history[-spares:] if spares > 0 else []
        return wait_s if len(recent) == spares and all(map(is_timing, recent)) else 0.0
    return switch


def one_gpu_order(gates: Sequence[Gate], seconds: dict, needs: dict, kind_rank,
                  switch=None) -> list:
    """For one GPU: every gate of the first kind (validate) before the next, each kind
    shortest first (the most verdicts soonest, correctness before speed), unless that lines
    up timing gates that wait for their CUDA context (`switch`): then each chain (a validate
    and the perf after it) in turn, the shortest first, so that every perf follows a validate.
    Six kernels' perfs in a row cost a -j1 build ~1 s on the H200s."""
    by_kind = _in_precedence(sorted(gates, key=lambda g: (kind_rank(g), seconds[g])), needs)
    if switch is None:
        return by_kind
    by_chain = _in_precedence(sorted(by_kind, key=_chain_key(gates, seconds, needs)), needs)
    return min((by_kind, by_chain), key=lambda o: simulate(o, seconds, needs, 1, switch))


def _chain_key(gates: Sequence[Gate], seconds: dict, needs: dict):
    """Sort key: the rank of a gate's chain (the gate it waits for, back to one that waits
    for none) by the chain's total seconds, ties by where the chain starts in `gates`. A
    stable sort keeps each chain's gates in the order they came."""
    inside = set(gates)
    root: dict = {}

    def find(g, seen=()):
        if g not in root:
            up = next((d for d in needs.get(g, ()) if d in inside and d not in seen), None)
            root[g] = g if up is None else find(up, (*seen, g))
        return root[g]
    total: dict = {}
    for g in gates:
        total[find(g)] = total.get(find(g), 0.0) + seconds[g]
    rank = {r: i for i, r in enumerate(sorted(total, key=lambda r: (total[r], gates.index(r))))}
    return lambda g: rank[find(g)]


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
    switch(history, gate) is what a gate waits for after the gates before it on the same GPU
    (the local executor's warm runner: `context_wait`)."""
    if slots <= 1:
        return one_gpu_order(gates, seconds, needs, kind_rank, switch)
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

"""A stand-in for the runtime gate's megakernel library (runners/runtime.py Megakernel), for
CPU tests only: the library's C entry points in Python, no GPU, no nvcc.

It "runs" a graph by writing each output's reference (bind() hands it the runner's tensor
table), so iterations before the chosen hang pass the runner's real checks; at the chosen
launch it reports a timeout (mpkb_launch returns 1, as the library does when its watchdog
fires) and answers mpkb_read_state with the runtime counters a real hang in that phase
leaves: `events <termination> <begin> <end-of-graph>; workers ...; schedulers ...`.

hang: {"graph": g, "iteration": k (from 1), "phase": "launch" | "tasks" | "termination" |
"host" (the launch call itself does not return: mpkb_launch answers 4)},
or {"graph": g, "setup": 2 | 3} (the scheduler / worker kernel alone did not finish).
"""
from __future__ import annotations


import ctypes
import random


class FakeMegakernel:
    """task_us: {"ours" | incumbent name | incumbent side (task@param=value): µs per task}
    for the profile records it writes (one worker, tasks back to back, a seeded jitter of
    +-2%); skew: {incumbent or side: factor} by which an incumbent's output differs from ours."""

    def __init__(self, graphs: list[dict], hang: dict | None = None, task_type: int = 197,
                 task_us: dict | None = None, skew: dict | None = None):
        self.graph_plans = graphs
        self.graphs = [g["name"] for g in graphs]
        self.task_type = task_type
        self.hang = hang or {}
        self.task_us = task_us or {}
        self.skew = skew or {}
        self.lib = self              # the runner calls lib.lib.mpkb_*
        self.runtime = 1             # v1: one pass of the graph a launch
        self.calls: list[str] = []
        self.selected, self.launches, self.state, self.bound = None, 0, "", None
        self.rivals: dict[int, list] = {}
        self.slots: dict[int, int] = {}
        self.profiler = None
        self.jitter = random.Random(7)

    # the runner's tensor table, handed over by the test's wrapper of runtime._tensors_for
    def bind(self, tensors, refs, checks) -> None:
        self.bound = (tensors, refs, checks)

    # an incumbent's tensor table, handed over by the test's wrapper of runtime.rival_tensors
    def bind_rival(self, g: int, tensors) -> None:
        self.rivals[g] = tensors

    def mpkb_graph_layers(self, g) -> int:
        return len(self.graph_plans[g]["layers"])

    def mpkb_layer_task_type(self, g, l) -> int:
        """Ours: task_type, or below it by i for the plan's MPKB_TASK_TYPE_i (a block kernel
        with other TMA maps); an incumbent's layer l: 150 + l."""
        plan = self.graph_plans[g]
        if plan.get("role") == "incumbent":
            return 150 + l
        symbol = plan["layers"][l].get("task_type", "MPKB_TASK_TYPE")
        return self.task_type - (int(symbol.rsplit("_", 1)[1]) if symbol[-1].isdigit() else 0)

    def mpkb_save(self, slot) -> int:
        self.calls.append(f"save {slot} {self.selected}")
        self.slots[slot] = self.selected
        return 0

    def mpkb_restore(self, slot) -> int:
        self.calls.append(f"restore {slot}")
        self.selected = self.slots[slot]
        return 0

    def mpkb_drop(self, slot) -> None:
        self.slots.pop(slot, None)

    def _write_profile(self) -> None:
        """Begin/end records of every task of the selected graph on one worker."""
        plan = self.graph_plans[self.selected]
        key = plan.get("incumbent", "ours")
        us = self.task_us.get(plan.get("side"), self.task_us.get(key, 1.0))
        # the task that begins the graph (runtime_header.h's TASK_BEGIN_TASK_GRAPH, 10), its
        # end 0.7 µs before the first layer's first task starts (the dispatch)
        words, t = [1, (1000 << 32) | (10 << 2), (1200 << 32) | (10 << 2) | 1], 1900
        for l, layer in enumerate(plan["layers"]):
            kind = self.mpkb_layer_task_type(self.selected, l)
            for _ in range(layer["tasks"]):
                span = int(us * 1000 * (1 + self.jitter.uniform(-0.02, 0.02)))
                words += [(t << 32) | (kind << 2), ((t + span) << 32) | (kind << 2) | 1]
                t += span + 50
        (ctypes.c_int64 * len(words)).from_address(self.profiler)[:] = [
            w - (1 << 64) if w >= 1 << 63 else w for w in words]

    def error(self, code: int) -> str:
        return f"stand-in error {code}"

    def mpkb_setup(self, g, ptrs, n, workers, schedulers, profiler, flags, timeout_ms) -> int:
        self.calls.append(f"setup {g} {workers}x{schedulers}")
        self.selected, self.launches, self.profiler = g, 0, profiler
        if self.hang.get("graph") == g and "setup" in self.hang:
            return self.hang["setup"]
        return 0

    def mpkb_launch(self, timeout_ms) -> int:
        self.launches += 1
        self.calls.append(f"launch {self.selected} {self.launches}")
        h = self.hang
        if h.get("graph") == self.selected and h.get("iteration") == self.launches:
            if h["phase"] == "host":
                return 4
            tasks = self.graph_plans[self.selected]["layers"][-1]["tasks"]
            done = {"launch": (0, 0), "tasks": (1, tasks // 2), "termination": (1, tasks)}[h["phase"]]
            self.state = (f"events 0 {done[0]} {done[1]}; workers {128 if done[0] else 0}; "
                          "schedulers 16")
            return 1
        tensors, refs, checks = self.bound
        plan = self.graph_plans[self.selected]
        if plan.get("role") == "incumbent":      # the same op: ours' outputs (skewed if asked)
            rival = self.rivals[self.selected]
            for j, recipe in enumerate(plan["tensors"]):
                if recipe["use"] == "output":       # its index: our table's
                    ours = tensors[recipe["index"]]
                    skew = self.skew.get(plan.get("side"), self.skew.get(plan["incumbent"], 1.0))
                    rival[j].copy_((ours.to(refs[recipe["index"]].dtype) * skew).to(ours.dtype))
        else:
            for i, _ in checks:
                tensors[i].copy_(refs[i].to(tensors[i].dtype))
        if self.profiler:
            self._write_profile()
        return 0

    def mpkb_preload_report(self) -> bytes:
        return b"local bytes per thread: stand-in"

    def mpkb_read_state(self, timeout_ms) -> bytes:
        self.calls.append("read_state")
        return self.state.encode()

    def mpkb_finalize(self) -> int:
        self.calls.append(f"finalize {self.selected}")
        return 0

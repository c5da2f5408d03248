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


class FakeMegakernel:
    def __init__(self, graphs: list[dict], hang: dict | None = None, task_type: int = 197):
        self.graph_plans = graphs
        self.graphs = [g["name"] for g in graphs]
        self.task_type = task_type
        self.hang = hang or {}
        self.lib = self              # the runner calls lib.lib.mpkb_*
        self.calls: list[str] = []
        self.selected, self.launches, self.state, self.bound = None, 0, "", None

    # the runner's tensor table, handed over by the test's wrapper of runtime._tensors_for
    def bind(self, tensors, refs, checks) -> None:
        self.bound = (tensors, refs, checks)

    def error(self, code: int) -> str:
        return f"stand-in error {code}"

    def mpkb_setup(self, g, ptrs, n, workers, schedulers, profiler, flags, timeout_ms) -> int:
        self.calls.append(f"setup {g} {workers}x{schedulers}")
        self.selected, self.launches = g, 0
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
        for i, _ in checks:
            tensors[i].copy_(refs[i].to(tensors[i].dtype))
        return 0

    def mpkb_preload_report(self) -> bytes:
        return b"local bytes per thread: stand-in"

    def mpkb_read_state(self, timeout_ms) -> bytes:
        self.calls.append("read_state")
        return self.state.encode()

    def mpkb_finalize(self) -> int:
        self.calls.append(f"finalize {self.selected}")
        return 0

"""The table of stages: the one description that the build, status, -n, dag, why= and
`scons -h` all read.

Each row says which spec sections the stage reads (its only spec inputs), what it runs
after, whether it produces one node per kernel, per target arch or per GPU, whether it
needs a GPU, and which module of this package implements it. That module declares the
stage's nodes (`nodes(g, k)`, and `shared_nodes(g, kernels)` for nodes no kernel owns),
runs them (`ACTIONS`: node kind -> action) and predicts their outputs for status
(`predict(node, k, request)`). Stages a kernel's spec does not call for (wire without a
`wiring` section) are simply not declared for it.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    name: str
    reads: tuple[str, ...]          # spec sections this stage depends on
    after: tuple[str, ...]          # stages whose outputs it consumes
    per: str                        # "kernel" | "arch" | "gpu"
    needs_gpu: bool
    is_gate: bool                   # produces a verdict
    module: str                     # mpkbuild.stages.<module>: its nodes, actions, prediction
    doc: str

    @property
    def impl(self):
        return importlib.import_module(f"mpkbuild.stages.{self.module}")


STAGES: tuple[Stage, ...] = (
    Stage("spec", (), (), "kernel", False, False, "spec",
          "validate specs/K.yaml, write normalised JSON and per-section signatures"),
    Stage("generate", ("codegen",), ("spec",), "kernel", False, False, "generate",
          "render K_spec.h, the task body and the harness with jinja2"),
    Stage("compile", (), ("generate",), "arch", False, True, "compile",
          "nvcc per target arch to a shared library; resource gate (spills, SMEM)"),
    Stage("wire", ("codegen", "wiring"), ("spec",), "kernel", False, True, "wire",
          "registration edits for an MPK checkout: fragments; with mpk_root= a diff, "
          "apply=1 applies them, unwire=1 removes them"),
    Stage("validate", ("codegen", "generators", "validate"), ("compile",), "gpu", True, True, "gates",
          "run every variant against the float64 torch reference (GPU)"),
    Stage("runtime", ("codegen", "generators", "validate", "wiring"), ("generate",), "gpu", True, True,
          "runtime",
          "every variant as tasks of the real MPK persistent kernel of mpk_root= at the "
          "production grid, 3+ iterations, with the runtime profiler's task spans (GPU)"),
    Stage("perf", ("codegen", "generators", "perf"), ("compile", "validate"), "gpu", True, True, "gates",
          "CUDA-graph timing, cold/hot, slowCTA, torch baseline, bandwidth (GPU)"),
    Stage("tune", ("tune", "generators", "validate", "perf"), ("spec",), "gpu", True, True, "tune",
          "search tune.space per variant: candidates compiled (CPU, -jN), validated and timed "
          "(GPU), the fastest committed as tuned/<gpu>/K.json"),
    Stage("review", (), ("compile", "wire", "validate", "runtime", "perf"), "kernel", False, False, "review",
          "build/K/review.md and build/review.md: every verdict and key number"),
)

BY_NAME = {s.name: s for s in STAGES}
NAMES = tuple(s.name for s in STAGES)
# the gates a kernel has on a GPU (validate, runtime with mpk_root=, perf); tune is a GPU
# stage of its own, asked for by name
GPU_GATES = tuple(s.name for s in STAGES if s.needs_gpu and s.module in ("gates", "runtime"))


def closure(stage: str) -> list[str]:
    """The stage and every stage it transitively needs, in table order."""
    need, todo = set(), [stage]
    while todo:
        name = todo.pop()
        if name not in need:
            need.add(name)
            todo.extend(BY_NAME[name].after)
    return [s for s in NAMES if s in need]


def modules() -> list:
    """Each implementing module once, in table order."""
    return list({s.module: s.impl for s in STAGES}.values())


_ACTIONS: dict = {}


def actions() -> dict:
    """Node kind -> action function, from every stage module."""
    if _ACTIONS:
        return _ACTIONS
    out = _ACTIONS
    for module in modules():
        out.update(module.ACTIONS)
    return out

"""The table of stages: the one description that the build, `scons -h` and status all read.

Each row says which spec sections the stage reads (its only spec inputs), what it runs
after, whether it produces one node per kernel, per target arch or per GPU, and whether it
needs a GPU. Stages a kernel's spec does not call for (wire without a `wiring` section)
are simply not declared for it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    name: str
    reads: tuple[str, ...]          # spec sections this stage depends on
    after: tuple[str, ...]          # stages whose outputs it consumes
    per: str                        # "kernel" | "arch" | "gpu"
    needs_gpu: bool
    is_gate: bool                   # produces a verdict
    doc: str


STAGES: tuple[Stage, ...] = (
    Stage("spec", (), (), "kernel", False, False,
          "validate specs/K.yaml, write normalised JSON and per-section signatures"),
    Stage("generate", ("codegen",), ("spec",), "kernel", False, False,
          "render K_spec.h, the task body and the harness with jinja2"),
    Stage("compile", (), ("generate",), "arch", False, True,
          "nvcc per target arch to a shared library; resource gate (spills, SMEM)"),
    Stage("wire", ("codegen", "wiring"), ("spec",), "kernel", False, True,
          "registration edits for an MPK checkout: fragments; with mpk_root= a diff, "
          "apply=1 applies them, unwire=1 removes them"),
    Stage("validate", ("codegen", "generators", "validate"), ("compile",), "gpu", True, True,
          "run every variant against the float64 torch reference (GPU)"),
    Stage("perf", ("codegen", "generators", "perf"), ("compile", "validate"), "gpu", True, True,
          "CUDA-graph timing, cold/hot, slowCTA, torch baseline, bandwidth (GPU)"),
    Stage("review", (), ("compile", "wire", "validate", "perf"), "kernel", False, False,
          "build/K/review.md and build/review.md: every verdict and key number"),
)

BY_NAME = {s.name: s for s in STAGES}
NAMES = tuple(s.name for s in STAGES)
GPU_GATES = tuple(s.name for s in STAGES if s.needs_gpu)


def closure(stage: str) -> list[str]:
    """The stage and every stage it transitively needs, in table order."""
    need, todo = set(), [stage]
    while todo:
        name = todo.pop()
        if name not in need:
            need.add(name)
            todo.extend(BY_NAME[name].after)
    return [s for s in NAMES if s in need]

"""The table of stages: the one list that the build, status, -n, dag, why=, review and
`scons -h` all read.

A `Stage` is everything about one stage: the spec sections it reads (its only spec inputs),
what it runs after, whether it has a node per kernel, per target arch or per GPU, whether it
needs a GPU, its GPU gate (the runner it runs, the kernel's Python it loads, the judge of its
figures), the modules whose code makes its outputs (`code`: their import closure, less the
plumbing, is the `code:` fact of every node it declares), and the module that implements it.
That module declares the stage's nodes (`nodes(g, k, stage)`, and `shared_nodes(g, kernels,
with_summary)` for nodes no kernel owns), runs them (`ACTIONS`: node kind -> action) and
predicts their outputs for status and -n (`predict(node, k, predictor)`).

This package's __init__ is plumbing (util/closure.PLUMBING): it plans, it computes no output.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Gate:
    """A GPU gate: how its job is made and judged. The runner is mpkbuild.runners.<runner>."""
    runner: str
    python_file: str | None = None    # the spec field naming the kernel's Python it loads
    judge: str | None = None          # build-side module whose judge() turns figures into a verdict
    needs_pass: tuple[str, ...] = ()  # gates whose verdict must be pass before it runs
    uses_bandwidth: bool = False      # reads the GPU's copy bandwidth node
    ledger: str | None = None         # module of the kernel's ledger it is judged against (fact, last_entry)
    can_sanitize: bool = False        # sanitize= applies to it
    can_share_gpu: bool = False       # the spec may let it share a GPU (`share_gpu`)
    timeout_s: float | None = None    # fixed watchdog (else the settings section's timeout_s)
    section: str | None = None        # the spec section with its settings (default: the stage's name)
    thresholds: str | None = None     # the spec section whose `thresholds` the judge applies
                                      # (default: the settings section)

    def code(self) -> tuple[str, ...]:
        return (f"mpkbuild.runners.{self.runner}",) + tuple(m for m in (self.judge, self.ledger) if m)


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
    gate: Gate | None = None        # a per-kernel GPU gate (validate, runtime, perf)
    code: tuple[str, ...] = field(default=())   # extra modules whose code makes its outputs
    note: str | None = None         # "module:function" giving status's line about its gate node

    @property
    def impl(self):
        return importlib.import_module(f"mpkbuild.stages.{self.module}")

    @property
    def settings(self) -> str:
        """The spec section its gate's settings are in."""
        return (self.gate.section if self.gate and self.gate.section else None) or self.name

    def code_modules(self) -> tuple[str, ...]:
        """The modules whose import closure is this stage's code input."""
        out = (f"mpkbuild.stages.{self.module}", *self.code)
        return out + (self.gate.code() if self.gate else ())


STAGES: tuple[Stage, ...] = (
    Stage("spec", (), (), "kernel", False, False, "spec",
          "validate specs/K.yaml, write normalised JSON and per-section signatures"),
    Stage("generate", ("codegen",), ("spec",), "kernel", False, False, "generate",
          "render K_spec.h, the task body and the harness with jinja2"),
    Stage("compile", (), ("generate",), "arch", False, True, "compile",
          "nvcc per target arch to a shared library; resource gate (spills, SMEM)"),
    # the fragments hold the rendered body and header (codegen) and the test-mode test,
    # which holds the reference's tolerances and the inputs' distributions
    Stage("wire", ("codegen", "wiring", "validate", "generators"), ("spec",), "kernel", False, True,
          "wire",
          "registration edits for an MPK checkout: fragments; with mpk_root= a diff, "
          "apply=1 applies them, unwire=1 removes them"),
    Stage("validate", ("codegen", "generators", "validate"), ("compile",), "gpu", True, True, "gates",
          "run every variant against the float64 torch reference (GPU)",
          gate=Gate("validate", "validate.reference", can_sanitize=True, can_share_gpu=True)),
    # judged by validate's reference and tolerances, so its settings are the validate section
    # its settings are validate's too; its head to head against the incumbents and their
    # thresholds are the runtime section's
    # never a megakernel before validate passed (test mode first: a body validate failed
    # is not launched inside the persistent kernel)
    Stage("runtime", ("codegen", "generators", "validate", "wiring", "runtime"), ("generate", "validate"),
          "gpu", True, True, "runtime",
          "every variant as tasks of the real MPK persistent kernel of mpk_root= at the "
          "production grid, 3+ iterations, then head to head with the MPK task it would "
          "replace (makespan and slowCTA from the runtime's profiler, judged) (GPU)",
          gate=Gate("runtime", "validate.reference", judge="mpkbuild.stages.runtime.judge",
                    section="validate", thresholds="runtime", needs_pass=("validate",)),
          note="mpkbuild.stages.runtime.report:status_note"),
    Stage("perf", ("codegen", "generators", "perf"), ("compile", "validate"), "gpu", True, True, "perf",
          "CUDA-graph timing, cold/hot, slowCTA, torch baseline, bandwidth (GPU)",
          gate=Gate("perf", "perf.baseline", judge="mpkbuild.stages.perf.judge",
                    needs_pass=("validate",), uses_bandwidth=True, ledger="mpkbuild.stages.perf.ledger"),
          note="mpkbuild.stages.perf.report:status_note"),
    Stage("tune", ("tune", "generators", "validate", "perf"), ("spec",), "gpu", True, True, "tune",
          "search tune.space per variant: candidates compiled (CPU, -jN), validated and timed "
          "(GPU), the fastest committed as tuned/<gpu>/K.json"),
    Stage("review", (), ("compile", "wire", "validate", "runtime", "perf"), "kernel", False, False, "review",
          "build/K/review.md and build/review.md: every verdict and key number"),
)

BY_NAME = {s.name: s for s in STAGES}
NAMES = tuple(s.name for s in STAGES)
# the gates a kernel has on a GPU (validate, runtime with mpk_root=, perf), in the order the
# build hands them out; tune is a GPU stage of its own, asked for by name
GPU_GATES = tuple(s.name for s in STAGES if s.gate is not None)


def runner_names() -> tuple[str, ...]:
    """Every runner a gate job of the build runs (a warm server imports each once)."""
    from mpkbuild.stages.gates import BANDWIDTH
    from mpkbuild.stages.tune.trials import TRIAL
    return tuple(dict.fromkeys([s.gate.runner for s in STAGES if s.gate] + [BANDWIDTH.runner, TRIAL.runner]))


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


def build_graph(root, kernels: list, fingerprint, wire_request, with_summary: bool,
                tampered=lambda rel: None, sanitize: str | None = None, files=None, code=None):
    """The whole graph for these kernels on this GPU (fingerprint None: no GPU), declared by
    the stage modules in table order; then the nodes no kernel owns (a GPU's copy
    bandwidth goes first, the summary last). files: the planning run's reads (default: a
    new ReadOnce); code: the code digests (util.closure.CodeDigests)."""
    from mpkbuild.model.graph import Graph
    g = Graph(root=root, gpu_key=fingerprint.key if fingerprint else "no-gpu",
              fingerprint=fingerprint, wire_request=wire_request, sanitize=sanitize,
              tampered=tampered, files=files, code=code,
              stage_modules={s.name: s.code_modules() for s in STAGES},
              kernels={k.name: k for k in kernels})
    rows = [(stage.impl, stage.name) for stage in STAGES]
    for k in kernels:
        for impl, name in rows:
            impl.nodes(g, k, name)
    for module in modules():
        if hasattr(module, "shared_nodes"):
            module.shared_nodes(g, kernels, with_summary)
    return g

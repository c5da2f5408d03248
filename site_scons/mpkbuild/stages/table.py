"""The table of stages: the one list that the build, status, -n, dag, why=, review and
`scons -h` all read, and that a stage module reads its own row from.

A `Stage` is everything about one stage: the spec sections it reads (its only spec inputs)
and the one it owns (`section`: a module whose SECTION is a model.section.Section), what it
runs after, whether it has a node per kernel, per target arch or per GPU, whether it needs a
GPU, its GPU gate (the runner it runs, the kernel's Python it loads, the judge of its
figures), the modules whose code makes its outputs (`code`: their import closure, less the
plumbing, is the `code:` fact of every node it declares), and the module that implements it.
That module is a `StageModule`. Data only: this module imports nothing of the package, so
any stage may read the table without an import circle (it is plumbing, util/closure.PLUMBING).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Protocol


class StageModule(Protocol):
    """What a row's module provides; the hooks beyond these are declared in the row
    (`shared`: a `shared_nodes(g, kernels, with_summary)` for nodes no kernel owns)."""
    ACTIONS: dict                               # node kind -> action(build, info, target, source)

    def nodes(self, g, k, stage: str) -> None:
        """Declare the kernel's nodes of this stage in g."""

    def predict(self, node, k, predictor) -> dict:
        """The bytes a stale node would write (or model.graph.CHANGED), for status and -n."""


@dataclass(frozen=True)
class Gate:
    """A GPU gate: how its job is made and judged. The runner is mpkbuild.runners.<runner>."""
    runner: str
    python_file: str | None = None    # the spec field naming the kernel's Python it loads
    judge: str | None = None          # build-side module whose judge(result, rules, expected, **extra)
                                      # turns figures into a verdict over expected(spec, payload)
    needs_pass: tuple[str, ...] = ()  # gates whose verdict must be pass before it runs
    uses_bandwidth: bool = False      # reads the GPU's copy bandwidth node
    ledger: str | None = None         # module of the kernel's ledger it is judged against (fact, last_entry)
    can_sanitize: bool = False        # sanitize= applies to it
    wrapper: tuple[str, str] | None = None  # (module, option): the run.job.ToolWrapper its runner
                                      # always runs under (never in a warm server)
    can_share_gpu: bool = False       # the spec may let it share a GPU (`share_gpu`)
    timeout_s: float | None = None    # fixed watchdog (else the settings section's timeout_s)
    section: str | None = None        # the spec section with its settings (default: the stage's name)
    thresholds: str | None = None     # the spec section whose `thresholds` the judge applies
                                      # (default: the settings section)
    job: str | None = None            # "module:function" adding to its job what it loads besides
                                      # the harness library (the runtime gate: its megakernel)

    def code(self) -> tuple[str, ...]:
        job = self.job.split(":")[0] if self.job else None
        return (f"mpkbuild.runners.{self.runner}",) + tuple(m for m in (self.judge, self.ledger, job) if m)


@dataclass(frozen=True, kw_only=True)
class Stage:
    name: str
    reads: tuple[str, ...]          # spec sections this stage depends on
    after: tuple[str, ...]          # stages whose outputs it consumes
    per: str                        # "kernel" | "arch" | "gpu"
    needs_gpu: bool = False
    judges: bool = False            # its node passes or fails the kernel (compile's resource
                                    # check, wire's clash check, the GPU gates)
    module: str                     # mpkbuild.stages.<module>: its nodes, actions, prediction
    doc: str
    section: str | None = None      # module whose SECTION is the spec section it owns
    shared: bool = False            # its module also declares nodes no kernel owns (shared_nodes)
    gate: Gate | None = None        # a per-kernel GPU gate (validate, runtime, perf)
    code: tuple[str, ...] = field(default=())   # extra modules whose code makes its outputs
    note: str | None = None         # "module:function" giving status's line about its gate node
    summary: str | None = None      # function of its module saying a result in the verdict table
                                    # (default: the verdict and the message's first line)
    needs_checkout: bool = False    # it runs inside an MPK checkout (mpk_root=): asked for without
                                    # one it is an error before anything is written
    report: str | None = None       # module of its part of review.md (stages/review.py): REVIEW (its
                                    # section's template beside it, or None), REVIEW_LEAD (or None);
                                    # a gate's review(res, results) -> what its result adds, any
                                    # other stage's part(inputs) -> its part (None: none) and
                                    # review_sources(g, k) -> the files the part reads

    @property
    def impl(self) -> StageModule:
        return importlib.import_module(f"mpkbuild.stages.{self.module}")

    @property
    def settings(self) -> str:
        """The spec section its gate's settings are in."""
        return (self.gate.section if self.gate and self.gate.section else None) or self.name

    def code_modules(self) -> tuple[str, ...]:
        """The modules whose import closure is this stage's code input."""
        out = (f"mpkbuild.stages.{self.module}", *self.code)
        return out + (self.gate.code() if self.gate else ())


_BUILDING: tuple[Stage, ...] = (
    Stage(name="spec", reads=(), after=(), per="kernel", module="spec",
          doc="validate specs/K.yaml, write normalised JSON and per-section signatures"),
    Stage(name="generate", reads=("codegen",), after=("spec",), per="kernel", module="generate",
          section="mpkbuild.stages.generate.section",
          doc="render K_spec.h, the task body and the harness with jinja2"),
    Stage(name="compile", reads=(), after=("generate",), per="arch", judges=True, module="compile",
          summary="summary", report="mpkbuild.stages.compile_review",
          doc="nvcc per target arch to a shared library; resource gate (spills, SMEM)"),
    # the fragments hold the rendered body and header (codegen) and the test-mode test,
    # which holds the reference's tolerances and the inputs' distributions
    Stage(name="wire", reads=("codegen", "wiring", "validate", "generators"), after=("spec",),
          per="kernel", judges=True, module="wire", section="mpkbuild.wire.section",
          report="mpkbuild.stages.wire_review",
          doc="registration edits for an MPK checkout: fragments; with mpk_root= a diff, "
              "apply=1 applies them, unwire=1 removes them"),
    Stage(name="validate", reads=("codegen", "generators", "validate"), after=("compile",), per="gpu",
          needs_gpu=True, judges=True, module="validate", section="mpkbuild.stages.validate.section",
          doc="run every variant against the float64 torch reference (GPU)",
          gate=Gate("validate", "validate.reference", can_sanitize=True, can_share_gpu=True),
          report="mpkbuild.stages.validate.report"),
    # judged by validate's reference and tolerances, so its settings are the validate section;
    # its head to head against the incumbents and their thresholds are the runtime section's.
    # never a megakernel before validate passed (test mode first: a body validate failed
    # is not launched inside the persistent kernel)
    Stage(name="runtime", reads=("codegen", "generators", "validate", "wiring", "runtime"),
          after=("generate", "validate"), per="gpu", needs_gpu=True, judges=True, module="runtime",
          section="mpkbuild.stages.runtime.section", needs_checkout=True,
          doc="every variant as tasks of the real MPK persistent kernel of mpk_root= at the "
              "production grid, 3+ iterations, then head to head with the MPK task it would "
              "replace (makespan and slowCTA from the runtime's profiler, judged) (GPU)",
          gate=Gate("runtime", "validate.reference", judge="mpkbuild.stages.runtime.judge",
                    section="validate", thresholds="runtime", needs_pass=("validate",),
                    job="mpkbuild.stages.runtime:gate_job"),
          note="mpkbuild.stages.runtime.report:status_note", report="mpkbuild.stages.runtime.report"),
    Stage(name="perf", reads=("codegen", "generators", "perf"), after=("compile", "validate"), per="gpu",
          needs_gpu=True, judges=True, module="perf", section="mpkbuild.stages.perf.section", shared=True,
          doc="CUDA-graph timing, cold/hot, slowCTA, torch baseline, bandwidth (GPU)",
          gate=Gate("perf", "perf.baseline", judge="mpkbuild.stages.perf.judge",
                    needs_pass=("validate",), uses_bandwidth=True, ledger="mpkbuild.stages.perf.ledger"),
          note="mpkbuild.stages.perf.report:status_note", report="mpkbuild.stages.perf.report"),
    Stage(name="profile", reads=("codegen", "generators", "profile"), after=("compile", "validate"),
          per="gpu", needs_gpu=True, judges=True, module="profile", section="mpkbuild.stages.profile.section",
          doc="Nsight Compute on the chosen variants after validate: each memory-, compute-, "
              "latency- or launch-bound against the measured ceilings, with DRAM and SM "
              "throughput, occupancy and the top stalls; a spec's expected bounds judged (GPU)",
          gate=Gate("profile", judge="mpkbuild.stages.profile.judge", needs_pass=("validate",),
                    uses_bandwidth=True, wrapper=("mpkbuild.stages.profile.ncu", "ncu"),
                    job="mpkbuild.stages.profile:gate_job"),
          report="mpkbuild.stages.profile.report"),
    Stage(name="tune", reads=("tune", "generators", "validate", "perf"), after=("spec",), per="gpu",
          needs_gpu=True, judges=True, module="tune", section="mpkbuild.stages.tune.section",
          report="mpkbuild.stages.tune.report",
          doc="search tune.space per variant: candidates compiled (CPU, -jN), validated and timed "
              "(GPU), the fastest committed as tuned/<gpu>/K.json"),
)
# the review renders every stage's part of it (their report modules are its code); it comes
# after compile, wire and each GPU gate, never after tune (a tuned file is read as it is)
STAGES: tuple[Stage, ...] = (
    *_BUILDING,
    Stage(name="review", reads=(), after=("compile", "wire", *(s.name for s in _BUILDING if s.gate and s.report)),
          per="kernel",
          module="review", shared=True, code=tuple(s.report for s in _BUILDING if s.report),
          doc="build/K/review.md and build/review.md: every verdict and key number"),
)

# what a figure is worth, as review.md, review.json and JUnit label it (issue 55): a stage's
# report says the tier of each figure it shows (TIERS) and of the figures its verdict judges
# (DECIDES); where a TIER-1 figure was measured, only it decides the kernel's headline
FIGURE_TIERS = {
    "TIER-1": "in-runtime, production grid",
    "TIER-2": "harness slowCTA, corroboration",
    "diagnostic": "event time, standalone",
}

# the stage whose closure is every other (the review of every gate, and the verdict table
# over all kernels): what status, -n and dag look at by default
EVERYTHING = STAGES[-1].name
# what `scons` builds without stage=: where a GPU is, everything; elsewhere the compile and
# its resource gate (wire's render is there for stage=wire)
DEFAULT_STAGE = {"gpu": EVERYTHING, "cpu": "compile"}

BY_NAME = {s.name: s for s in STAGES}
NAMES = tuple(s.name for s in STAGES)
# the gates a kernel has on a GPU (validate, runtime with mpk_root=, perf), in the order the
# build hands them out; tune is a GPU stage of its own, asked for by name
GPU_GATES = tuple(s.name for s in STAGES if s.gate is not None)


# the gates no row owns: the GPU's copy bandwidth (a node per GPU profile that perf reads)
# and one tune candidate's trial
BANDWIDTH = Gate("bandwidth", timeout_s=300)
TRIAL = Gate("trial", "validate.reference", uses_bandwidth=True)


def runner_names() -> tuple[str, ...]:
    """Every runner a gate job of the build runs (a warm server imports each once)."""
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

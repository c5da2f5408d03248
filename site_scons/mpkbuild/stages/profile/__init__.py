"""The profile stage: Nsight Compute on a kernel's chosen variants after validate, each
classified memory-, compute-, latency- or launch-bound against the GPU's measured ceilings.

Everything that is the stage's own is in this folder: its spec section (section.py), the
tool its runner runs under (ncu.py), the judge of ncu's figures (judge.py) and its part of
the review (report.py, review.md.j2); the runner is runners/profile.py and the row is in
stages/table.py. Its node is the GPU gate machinery's (stages/gates.py); a kernel whose spec
has no `profile` section has none.
"""
from __future__ import annotations

from mpkbuild.stages import gates
from mpkbuild.stages.gates import ACTIONS, predict  # noqa: F401 (the stage's own)


def gate_job(k, build, arch: str, payload: dict):
    """The job's variants to launch, resolved here (the runner reads no glob): the harness
    library it loads is the gate's usual one."""
    from mpkbuild.runners.facts import PROFILED
    from mpkbuild.stages.profile.section import chosen
    payload[PROFILED] = chosen(k.spec.data)
    return k.library(arch), []


def nodes(g, k, stage: str) -> None:
    """The gate node, for a kernel whose spec asks for a profile."""
    if "profile" not in k.spec.sections:
        g.requested[(k.name, stage)] = []
        return
    gates.gate_nodes(g, k, stage)

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


def nodes(g, k, stage: str) -> None:
    """The gate node, for a kernel whose spec asks for a profile."""
    if "profile" not in k.spec.sections:
        g.requested[(k.name, stage)] = []
        return
    gates.gate_nodes(g, k, stage)

"""The validate stage: every variant against the float64 reference on a GPU, in the harness
(runners/validate.py), optionally under compute-sanitizer or sharing a GPU. Its node is the
GPU gate machinery's (stages/gates.py, which perf and the runtime gate share); what is
validate's own is its spec section (section.py) and its row in the stage table."""
from __future__ import annotations

from mpkbuild.stages.gates import ACTIONS, nodes, predict  # noqa: F401 (the stage's own)

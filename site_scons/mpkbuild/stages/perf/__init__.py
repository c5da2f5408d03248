"""The perf stage: the gate that times every variant (runners/perf.py) is the GPU gate
machinery of stages/gates.py; what is perf's own lives here: the per-GPU copy-bandwidth
node it reads, the build-side judge of its figures (judge.py), the ledger of accepted
results it is held to (ledger.py) and its part of the review and of status (report.py).
Its code input (the `code:` fact) is this package's import closure, its runner's, its
judge's and its ledger's: the report is the review's code, never a reason to re-time."""
from __future__ import annotations

from mpkbuild.model.graph import Node
from mpkbuild.model.paths import bandwidth_rel
from mpkbuild.stages import gates
from mpkbuild.stages.gates import ACTIONS, nodes, predict  # noqa: F401 (the stage's own)


def shared_nodes(g, kernels, with_summary: bool) -> None:
    """The GPU's bandwidth ceilings: one node per GPU profile, first in the graph; the streams
    it compiles (runners/streams.cu) are its input, so an edit re-measures."""
    g.nodes.insert(0, Node(f"bandwidth {g.gpu_key}", "bandwidth", "perf", None,
                           (bandwidth_rel(g.gpu_key),), (g.pkg("runners", "streams.cu"),),
                           (gates.gpu_fact(g.fingerprint),
                            g.code_fact("bandwidth", (gates.__name__, *gates.BANDWIDTH.code()))),
                           column="bandwidth", on_gpu=True))

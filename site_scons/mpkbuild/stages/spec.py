"""The spec stage: specs/K.yaml checked, normalised and split into one file per section.

Each later stage depends only on the section files it reads, so an edit re-runs exactly
the stages that read the edited part. The spec itself is loaded (and any error reported)
before anything is declared; this node only writes what was loaded.
"""
from __future__ import annotations

from mpkbuild.model.graph import Node
from mpkbuild.util.fsutil import dump_json, write_json_atomic


def spec_fact(k) -> str:
    return f"spec: {k.spec.digest}"


def tuned_fact(k) -> tuple[str, ...]:
    """The fact of the tuned file a kernel's spec has its values from, if any (the spec
    node's and review's)."""
    if not k.tuned:
        return ()
    return (f"tuned: {k.tuned['path']} sha256 {k.tuned['sha256'][:12]}",)


def nodes(g, k, stage: str) -> None:
    sections = [k.rel.section_file(s) for s in k.spec.sections]
    node = g.add(Node(f"spec {k.name}", "spec", stage, k.name,
                      (k.rel.spec_json, *sections), (),
                      (spec_fact(k), *tuned_fact(k), g.stage_code(stage)),
                      always=g.edited(k.rel.spec_json, *sections), column="spec", fields=True))
    g.requested[(k.name, stage)] = list(node.targets)


def run_spec(build, info, target, source) -> int:
    k = build.kernels[info["MPK_KERNEL"]]
    for name, section in k.spec.sections.items():
        write_json_atomic(k.section_file(name), section)
    write_json_atomic(k.spec_json, k.spec.cache_record())
    return 0


def predict(node, k, request) -> dict:
    out = {node.targets[0]: dump_json(k.spec.cache_record()).encode()}
    for name, sec in k.spec.sections.items():
        out[k.rel.section_file(name)] = dump_json(sec).encode()
    return out


ACTIONS = {"spec": run_spec}

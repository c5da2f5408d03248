"""The stage table's plumbing: the graph the table's stages declare, their actions, and the
spec loader made of the sections they own. The table itself is stages/table.py (data, which
every stage module may read); this package's __init__ re-exports it for the plumbing.

This package's __init__ is plumbing (util/closure.PLUMBING): it plans, it computes no output.
"""
from __future__ import annotations

import functools
import importlib

from mpkbuild.stages.table import (BANDWIDTH, BY_NAME, DEFAULT_STAGE, EVERYTHING, GPU_GATES,  # noqa: F401
                                   NAMES, STAGES, TRIAL, Gate, Stage, StageModule, closure,
                                   runner_names)


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
                tampered=lambda rel: None, sanitize: str | None = None, files=None, code=None,
                runtime_request=None):
    """The whole graph for these kernels on this GPU (fingerprint None: no GPU), declared by
    the stage modules in table order; then the nodes no kernel owns (a GPU's copy
    bandwidth goes first, the summary last). files: the planning run's reads (default: a
    new ReadOnce); code: the code digests (util.closure.CodeDigests)."""
    from mpkbuild.model.graph import Graph
    g = Graph(root=root, gpu_key=fingerprint.key if fingerprint else "no-gpu",
              fingerprint=fingerprint, wire_request=wire_request, sanitize=sanitize,
              runtime_request=runtime_request,
              tampered=tampered, files=files, code=code,
              stage_modules={s.name: s.code_modules() for s in STAGES},
              kernels={k.name: k for k in kernels})
    rows = [(stage.impl, stage.name) for stage in STAGES]
    for k in kernels:
        for impl, name in rows:
            impl.nodes(g, k, name)
    for stage in STAGES:
        if stage.shared:
            stage.impl.shared_nodes(g, kernels, with_summary)
    return g


@functools.lru_cache(maxsize=None)
def spec_loader():
    """The loader of this table's specs: the sections the stages own, in table order."""
    from mpkbuild.model.spec import SpecLoader
    return SpecLoader(tuple(importlib.import_module(s.section).SECTION for s in STAGES if s.section))


def load_spec(path, root):
    """One spec, fully loaded and checked by this table's sections (model.spec.SpecLoader.load)."""
    return spec_loader().load(path, root)


def load_kernel(root, name: str, write_cache: bool = True):
    """A kernel of the project at root, its spec loaded by this table's sections."""
    from mpkbuild.model.kernel import Kernel
    return Kernel.load(root, name, spec_loader(), write_cache=write_cache)

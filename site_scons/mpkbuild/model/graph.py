"""The build graph as plain data: every action node with its targets, sources and facts.

The SCons tool declares exactly these nodes, and status, the exact dry run, `dag` and
`why` read the same list, so what they say and what the build does cannot drift apart.
Facts are the non-file inputs (SCons Value nodes): the normalised spec's hash, the nvcc
toolchain and flags, the GPU fingerprint, the wire request. Paths are repo-relative.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from mpkbuild.util import config
from mpkbuild.util.closure import CodeDigests
from mpkbuild.util.fsutil import ReadOnce, repo_rel

PKG = config.PACKAGE_DIR
CHANGED = object()          # a predicted output whose new bytes cannot be known in advance
CODE_CACHE = ".code-digests.json"       # build/<this>: util.closure.CodeDigests


@dataclass(frozen=True)
class Node:
    label: str                       # the line the build prints: "compile rmsnorm_v2 sm_90a"
    kind: str                        # which action runs it (spec, generate, compile, ...)
    stage: str                       # the stage-table row it belongs to
    kernel: str | None
    targets: tuple[str, ...]
    sources: tuple[str, ...]
    facts: tuple[str, ...] = ()
    opts: tuple[tuple[str, object], ...] = ()
    side_effects: tuple[str, ...] = ()
    always: str | None = None        # why it runs on every build (AlwaysBuild), if it does
    silent: bool = False             # bookkeeping (gate checks): prints no action line
    verdict_at: int | None = None    # which target is the JSON with its verdict (a gate's), if any
    precious: bool = False           # a failed run keeps the old output (SCons deletes it first)
    column: str = ""                 # its column in status's table ("validate", "compile sm_90a")
    on_gpu: bool = False             # runs on a GPU of the profile (pending where there is none)
    outcomes: tuple[str, ...] = ()   # stored verdicts besides pass that are no failure (a trial's)
    reported: bool = False           # a row of the build's verdict table (its verdict file)
    committed: bool = False          # its targets are committed files: `scons -c` keeps them
    fields: bool = False             # its targets are spec sections: a change is said field by field
    waits: str | None = None         # why it cannot run on this GPU profile at all (pending TIER-1):
                                     # shown, never declared to SCons, never passed, never an error

    @property
    def verdict_file(self) -> str | None:
        return None if self.verdict_at is None else self.targets[self.verdict_at]


@dataclass
class Graph:
    root: Path
    gpu_key: str
    fingerprint: object = None       # the GPU profile gates are judged for (None: no GPU)
    wire_request: object = None      # what the wire stage writes (stages/wire.WireRequest)
    runtime_request: object = None   # the checkout the runtime gate runs in (stages/runtime/megakernel)
    sanitize: str | None = None      # compute-sanitizer tool for validate, or None
    # tampered(rel) -> None, or why a stored result is not trusted ("tampered": edited by
    # hand; "unrecorded": its build was killed before SCons recorded it; status.tampered)
    tampered: Callable[[str], str | None] = lambda rel: None
    nodes: list[Node] = field(default_factory=list)
    requested: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    summary_targets: list[str] = field(default_factory=list)
    # repo-relative result path -> (its verdict, the seconds it took), read once while the
    # graph is built: status shows the verdict, the gate order sorts by the time
    stored: dict[str, tuple[str | None, float]] = field(default_factory=dict)
    # what planning reads (stored results, for the verdict and the tamper check), each file
    # once; status judges the nodes with the same reads
    files: ReadOnce | None = None
    code: CodeDigests | None = None          # the package files' normalised digests
    stage_modules: dict = field(default_factory=dict)   # stage -> its code modules (the table's)
    untrusted: list[str] = field(default_factory=list)  # why outputs on disk are not trusted
    notes: list[tuple[str, str]] = field(default_factory=list)   # (stage, what planning left out and why)
    # kernel -> {stage: why} for the gates this GPU profile cannot run (Node.waits)
    waiting: dict[str, dict[str, str]] = field(default_factory=dict)
    kernels: dict = field(default_factory=dict)         # name -> the loaded kernels the graph is of
    _rels: dict = field(default_factory=dict, repr=False, compare=False)   # str(path) -> rel (memo)
    _producers: tuple | None = field(default=None, repr=False, compare=False)  # (node count, producers())

    def add(self, node: Node) -> Node:
        self.nodes.append(node)
        return node

    def __post_init__(self):
        if self.files is None:
            self.files = ReadOnce(self.root)
        if self.code is None:
            self.code = CodeDigests(Path(self.root) / config.BUILD_DIRNAME / CODE_CACHE)

    def edited(self, *targets: str) -> str | None:
        """Why a node runs although its inputs did not change: one of its outputs is not the
        bytes its build wrote (a hand edit of a generated file is made again, never
        compiled and reported fresh). None when every output is as recorded."""
        for target in targets:
            if self.tampered(target):
                return self.distrust(f"{target} is not what its build wrote (edited by hand, or "
                                     "written by a build killed before it was recorded): it is made again")
        return None

    def note(self, stage: str, message: str) -> None:
        """A stage says why planning left something out (printed once by a build that
        needs the stage, and by status and -n)."""
        if (stage, message) not in self.notes:
            self.notes.append((stage, message))

    def distrust(self, message: str) -> str:
        """Note why an output on disk is not trusted (the build says so); returns it."""
        self.untrusted.append(message)
        return message

    def code_fact(self, name: str, modules) -> str:
        """`code: <name> <digest>`: the code of the modules' import closure (plumbing left
        out, comments and docstrings ignored) as the fact a node depends on."""
        return f"code: {name} {self.code.digest(tuple(modules))}"

    def stage_code(self, stage: str) -> str:
        """The code fact of a stage's nodes, from its row's code modules."""
        return self.code_fact(stage, self.stage_modules[stage])

    def rel(self, path: Path | str) -> str:
        """A path as the graph declares it: repo-relative. Kernels give theirs as strings
        already (Kernel.rel); this is for the paths built elsewhere."""
        key = os.fspath(path)
        try:
            return self._rels[key]
        except KeyError:
            out = self._rels[key] = rel(self.root, key)
            return out

    def pkg(self, *parts: str) -> str:
        """A file of this package, repo-relative (code a node depends on)."""
        try:
            return self._rels[parts]
        except KeyError:
            out = self._rels[parts] = rel(self.root, PKG.joinpath(*parts))
            return out

    def previous_verdict(self, path: Path | str) -> str | None:
        """The verdict of a stored gate result (None: none), its time remembered for the order."""
        rel_path = self.rel(path)
        res = self.files.json(rel_path)
        verdict, took = (res.get("verdict"), float(res.get("elapsed_s") or 0.0)) if res else (None, 0.0)
        self.stored[rel_path] = (verdict, took)
        return verdict

    def producers(self) -> dict[str, Node]:
        """Target -> the node that writes it (remembered while no node is added)."""
        if self._producers is None or self._producers[0] != len(self.nodes):
            self._producers = (len(self.nodes), {t: n for n in self.nodes for t in n.targets})
        return self._producers[1]

    def request(self, kernels: list[str], stage: str, with_summary: bool) -> list[str]:
        out = [t for k in kernels for t in self.requested.get((k, stage), [])]
        return out + (self.summary_targets if with_summary and stage == "review" else [])

    def needed_labels(self, targets: list[str]) -> set[str]:
        """Labels of the printed actions that building `targets` involves (a gate check
        stands for the gate it checks)."""
        producers = self.producers()
        seen: set[str] = set()
        todo = [producers[t] for t in targets if t in producers]
        while todo:
            node = todo.pop()
            if node.label in seen:
                continue
            seen.add(node.label)
            todo.extend(producers[s] for s in node.sources if s in producers)
        return {n.label for n in self.nodes if n.label in seen and not n.silent}

    def to_networkx(self):
        """Files, facts and actions as one DiGraph: file -> action -> file."""
        import networkx as nx
        g = nx.DiGraph()
        for n in self.nodes:
            g.add_node(n.label, type="action", node=n)
            for s in n.sources:
                g.add_node(s, type=g.nodes[s].get("type", "file") if s in g else "file")
                g.add_edge(s, n.label)
            for f in n.facts:
                g.add_node(f, type="fact")
                g.add_edge(f, n.label)
            for t in n.targets:
                g.add_node(t, type="file")
                g.add_edge(n.label, t)
        return g


def rel(root: Path, path: Path | str) -> str:
    """A path as the graph declares it, which is how SCons records it: under root, relative
    to it (a relative path is repo-relative already; a prefix cut, ~5x faster than relpath);
    outside the repository (an MPK checkout's headers, a spec's include folder), absolute."""
    p, r = os.fspath(path), os.fspath(root)
    if not os.path.isabs(p):
        if not p.startswith(".."):            # repo-relative already
            return repo_rel(p)
        p = os.path.normpath(os.path.join(r, p))
    if p.startswith(r) and p[len(r):len(r) + 1] == os.sep:
        return repo_rel(p[len(r) + 1:])
    return os.path.normpath(p)

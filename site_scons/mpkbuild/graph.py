"""The build graph as plain data: every action node with its targets, sources and facts.

The SCons tool declares exactly these nodes, and status, the exact dry run, `dag` and
`why` read the same list, so what they say and what the build does cannot drift apart.
Facts are the non-file inputs (SCons Value nodes): the normalised spec's hash, the nvcc
toolchain and flags, the GPU fingerprint, the wire request. Paths are repo-relative.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from . import compile as nvcc
from . import config, gates, stages
from .fsutil import sha256_bytes
from .kernel import Kernel, bandwidth_file, summary_file

PKG = config.PACKAGE_DIR


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


@dataclass
class Graph:
    root: Path
    gpu_key: str
    nodes: list[Node] = field(default_factory=list)
    requested: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    summary_targets: list[str] = field(default_factory=list)
    # seconds each stored gate result took (read once, with its verdict): the gate order
    last_elapsed: dict[Path, float] = field(default_factory=dict)

    def add(self, node: Node) -> Node:
        self.nodes.append(node)
        return node

    def producers(self) -> dict[str, Node]:
        return {t: n for n in self.nodes for t in n.targets}

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
    # hot (~60 calls per kernel): a plain prefix cut when path lies under root and has no
    # "." / ".." segments to normalise; os.path.relpath otherwise (same result, ~5x slower)
    p, r = os.fspath(path), os.fspath(root)
    if p.startswith(r) and p[len(r):len(r) + 1] == os.sep:
        rest = p[len(r) + 1:]
        if "/." not in "/" + rest and "//" not in f"/{rest}/":
            return rest
    return os.path.relpath(path, root)


def toolchain_fact() -> str:
    return f"toolchain: {nvcc.toolchain_fingerprint()}; flags: {' '.join(config.NVCC_BASE_FLAGS)}"


def gpu_fact(fingerprint) -> str:
    return f"gpu: {fingerprint.signature() if fingerprint else 'none'}"


def spec_fact(k: Kernel) -> str:
    # compact separators keep json on its C encoder (indent=2 falls back to pure Python)
    return f"spec: {sha256_bytes(json.dumps(k.spec.data, sort_keys=True, separators=(',', ':')).encode())}"


def add_kernel(g: Graph, k: Kernel, fingerprint, wire_request, previous_verdict,
               tampered=lambda rel: False, sanitize: str | None = None) -> None:
    """Append one kernel's nodes. previous_verdict(path) -> verdict of a stored result or
    None; tampered(rel) -> whether a result no longer has the bytes its gate wrote."""
    r = lambda p: rel(g.root, p)
    name, key = k.name, g.gpu_key
    pkg = lambda *parts: r(PKG.joinpath(*parts))
    sections = {s: r(k.section_file(s)) for s in k.spec.sections}

    spec = g.add(Node(f"spec {name}", "spec", "spec", name,
                      (r(k.spec_json), *sections.values()), (), (spec_fact(k),)))
    g.requested[(name, "spec")] = list(spec.targets)

    gen_sources = {
        "spec_header": (sections["codegen"], pkg("templates", "spec_header.h.j2")),
        "body": ((sections["codegen"],) if k.body_is_template else ()) + (r(k.body_source),),
        "harness": (sections["codegen"], pkg("templates", "harness.cu.j2")),
    }
    generated = []
    for role, path in k.generated.items():
        generated.append(r(path))
        g.add(Node(f"generate {name} {path.name}", "generate", "generate", name, (r(path),),
                   gen_sources[role] + (pkg("codegen.py"),), opts=(("MPK_ROLE", role),)))
    g.requested[(name, "generate")] = generated

    toolchain = toolchain_fact()
    libraries, compiled = {}, []
    for arch in k.archs:
        cmd = nvcc.nvcc_command(arch, r(k.generated["harness"]), r(k.gen_dir), r(k.library(arch)))
        node = g.add(Node(f"compile {name} {arch}", "compile", "compile", name,
                          (r(k.library(arch)), r(k.resources(arch)), r(k.arch_dir(arch) / "compile.log")),
                          (*generated, pkg("compile.py")), (toolchain,),
                          opts=(("MPK_ARCH", arch), ("MPK_NVCC_CMD", cmd))))
        libraries[arch] = node.targets[1]     # resources.json: carries the library's hash
        compiled += node.targets[:2]
    g.requested[(name, "compile")] = compiled

    review_sources = [r(k.resources(a)) for a in k.archs]
    if k.has_wiring:
        wiring_files = sorted(r(p) for p in (g.root / "wiring").rglob("*") if p.is_file())
        wire = g.add(Node(f"wire {name}", "wire", "wire", name, (r(k.wire_result),),
                          (sections["wiring"], sections["codegen"], sections["validate"],
                           sections["generators"], pkg("wirestage.py"),
                           r(k.body_source), pkg("codegen.py"), pkg("templates/spec_header.h.j2"),
                           *wiring_files, *sorted(r(p) for p in (PKG / "wire").glob("*.py"))),
                          (f"wire: {wire_request.describe()}",),
                          side_effects=(r(g.root / config.BUILD_DIRNAME / ".wire-in-use"),),
                          always="mpk_root= is given: the checkout is re-planned on every run"
                          if wire_request.mpk_root is not None else None))
        g.requested[(name, "wire")] = list(wire.targets)
        review_sources.append(wire.targets[0])
    else:
        g.requested[(name, "wire")] = []

    run_arch = config.ARCH_FOR_CC.get(fingerprint.cc) if fingerprint else None
    library = libraries.get(run_arch) or libraries[k.archs[0]]
    gpu = gpu_fact(fingerprint)
    # a sanitized validate is a different gate run: its verdict says so, and a plain run redoes it
    gate_facts = {"validate": (f"sanitize: {sanitize}",)} if sanitize else {}
    checks = {}
    for gate in stages.GPU_GATES:
        row = stages.BY_NAME[gate]
        result = k.gate_result(gate, key)
        sources = [library, *generated, *(sections[s] for s in row.reads),
                   *(r(p) for p in gates.runner_files(gate)),
                   r(k.reference_file if gate == "validate" else k.baseline_file)]
        if gate == "perf":
            sources += [r(bandwidth_file(g.root, key)), r(k.gpu_dir(key) / "validate.verdict")]
        verdict = previous_verdict(result)
        always = None
        if verdict not in (None, "pass"):
            always = f"its last verdict was {verdict}: failures are never cached"
        elif verdict is not None and tampered(r(result)):
            always = (f"{r(result)} was modified after its gate wrote it (signature mismatch): "
                      "it is not trusted, the gate runs again")
        node = g.add(Node(f"{gate} {name} {key}", "gate", gate, name,
                          (r(result), r(result.with_suffix(".verdict")), r(k.gate_log(gate, key))),
                          tuple(sources), (gpu, toolchain, *gate_facts.get(gate, ())),
                          opts=(("MPK_GATE", gate),), always=always))
        check = g.add(Node(f"check {gate} {name}", "check", gate, name,
                           (r(k.gate_stamp(gate, key)),), (node.targets[0],),
                           opts=(("MPK_GATE", gate),), silent=True))
        checks[gate] = check.targets[0]
        review_sources.append(node.targets[0])
        g.requested[(name, gate)] = [check.targets[0]]

    review = g.add(Node(f"review {name}", "review", "review", name,
                        (r(k.review), r(k.review.with_suffix(".json"))),
                        (*review_sources, pkg("review.py"), pkg("templates", "review.md.j2"))))
    g.requested[(name, "review")] = [*review.targets, *checks.values()]


def add_shared(g: Graph, fingerprint) -> None:
    """Nodes shared by kernels: the GPU's copy bandwidth."""
    g.nodes.insert(0, Node(f"bandwidth {g.gpu_key}", "bandwidth", "perf", None,
                           (rel(g.root, bandwidth_file(g.root, g.gpu_key)),),
                           tuple(rel(g.root, p) for p in gates.runner_files("bandwidth")),
                           (gpu_fact(fingerprint),)))


def add_summary(g: Graph, kernels: list[Kernel]) -> None:
    review_jsons = [rel(g.root, k.review.with_suffix(".json")) for k in kernels]
    node = g.add(Node("review summary", "summary", "review", None, (rel(g.root, summary_file(g.root)),),
                      (*review_jsons, rel(g.root, PKG / "review.py"),
                       rel(g.root, PKG / "templates" / "summary.md.j2"))))
    g.summary_targets = list(node.targets)


def build(root: Path, kernels: list[Kernel], fingerprint, wire_request, with_summary: bool,
          tampered=lambda rel: False, sanitize: str | None = None) -> Graph:
    """The whole graph for these kernels on this GPU (fingerprint None: no GPU)."""
    g = Graph(root=root, gpu_key=fingerprint.key if fingerprint else "no-gpu")
    add_shared(g, fingerprint)

    def previous_verdict(path: Path):
        res = gates.read_result(path)
        if not res:
            return None
        g.last_elapsed[path] = float(res.get("elapsed_s") or 0.0)
        return res.get("verdict")

    for k in kernels:
        add_kernel(g, k, fingerprint, wire_request, previous_verdict, tampered, sanitize)
    if with_summary:
        add_summary(g, kernels)
    return g

"""The DAG as pictures (Graphviz DOT, SVG, Mermaid) and `why`: what an input would touch.

Both read the graph model through networkx: the picture is the action graph (an edge
where one action consumes what another produces), coloured by status; `why` is the
descendants of an input (a file, or a spec field mapped to its section file).
"""
from __future__ import annotations

import re
import os
import shutil
import subprocess
from pathlib import Path

import networkx as nx

from mpkbuild.util.fsutil import write_atomic
from mpkbuild.model.graph import Graph
from mpkbuild import stages

COLOURS = {"fresh": "#b7e1a1", "stale": "#ffd28a", "failed": "#f4a4a4", "never run": "#d9d9d9",
           "pending": "#a9c8f0"}


class WhyError(ValueError):
    """A why= argument that names no input of the graph."""


def action_graph(g: Graph) -> nx.DiGraph:
    full = g.to_networkx()
    out = nx.DiGraph()
    for n in g.nodes:
        if not n.silent:
            out.add_node(n.label, node=n)
    for n in g.nodes:
        if n.silent:
            continue
        for target in n.targets:
            for consumer in full.successors(target):
                c = full.nodes[consumer]["node"]
                if not c.silent:
                    out.add_edge(n.label, consumer)
    return out


def restrict(ag: nx.DiGraph, g: Graph, targets: list[str]) -> nx.DiGraph:
    """The part of the action graph that building `targets` involves."""
    producers = g.producers()
    keep = set()
    for t in targets:
        node = producers.get(t)
        if node is None:
            continue
        if node.silent:                       # a gate check: keep the gate it checks
            node = producers[node.sources[0]]
        keep.add(node.label)
        keep |= nx.ancestors(ag, node.label)
    return ag.subgraph(keep).copy()


def _label(node, st) -> str:
    text = node.label
    if st is not None:
        text += f"\\n{st.state}" + (f" ({st.verdict})" if st.verdict else "")
    return text


def to_dot(ag: nx.DiGraph, statuses: dict) -> str:
    lines = ["digraph mpk {", "  rankdir=LR;", '  node [shape=box, style="rounded,filled", fontname="Helvetica"];']
    for label in nx.topological_sort(ag):
        node = ag.nodes[label]["node"]
        st = statuses.get(label)
        colour = COLOURS.get(st.state if st else "fresh", "#ffffff")
        shape = "box" if node.verdict_file is None else "octagon"
        lines.append(f'  "{label}" [label="{_label(node, st)}", fillcolor="{colour}", shape={shape}];')
    for a, b in ag.edges:
        lines.append(f'  "{a}" -> "{b}";')
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_mermaid(ag: nx.DiGraph, statuses: dict) -> str:
    ids = {label: f"n{i}" for i, label in enumerate(nx.topological_sort(ag))}
    lines = ["flowchart LR"]
    for label, nid in ids.items():
        st = statuses.get(label)
        text = label + (f"<br/>{st.state}" + (f" ({st.verdict})" if st and st.verdict else "") if st else "")
        lines.append(f'  {nid}["{text}"]')
    for a, b in ag.edges:
        lines.append(f"  {ids[a]} --> {ids[b]}")
    for state, colour in COLOURS.items():
        cls = state.replace(" ", "_")
        lines.append(f"  classDef {cls} fill:{colour}")
        members = [ids[l] for l in ids if statuses.get(l) and statuses[l].state == state]
        if members:
            lines.append(f"  class {','.join(members)} {cls}")
    return "\n".join(lines) + "\n"


def write(ag: nx.DiGraph, statuses: dict, out_dir: Path, name: str) -> list[Path]:
    """<build>/dag/<name>.dot and .mmd, plus .svg when Graphviz's dot is installed."""
    dot_text = to_dot(ag, statuses)
    paths = [out_dir / f"{name}.dot", out_dir / f"{name}.mmd"]
    write_atomic(paths[0], dot_text)
    write_atomic(paths[1], to_mermaid(ag, statuses))
    dot = shutil.which("dot")
    if dot:
        svg = subprocess.run([dot, "-Tsvg"], input=dot_text, capture_output=True, text=True)
        if svg.returncode == 0:
            write_atomic(out_dir / f"{name}.svg", svg.stdout)
            paths.append(out_dir / f"{name}.svg")
    return paths


_FIELD = re.compile(r"^(?:(?P<kernel>[A-Za-z_]\w*):)?(?P<path>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*|\[\d+\])*)$")


_STEP = re.compile(r"\.?([A-Za-z_]\w*)|\[(\d+)\]")


def has_field(data, path: str) -> bool:
    """Whether spec data has the field `a.b[0].c`."""
    for m in _STEP.finditer(path):
        key, index = m.group(1), m.group(2)
        if key is not None:
            if not isinstance(data, dict) or key not in data:
                return False
            data = data[key]
        else:
            if not isinstance(data, (list, tuple)) or int(index) >= len(data):
                return False
            data = data[int(index)]
    return True


def code_facts_of(path: str, g: Graph) -> list[str]:
    """The `code:` facts whose closure holds a module of this package (repo-relative path)."""
    from mpkbuild.util import config
    pkg = g.rel(config.PACKAGE_DIR) + "/"
    if not path.startswith(pkg) or not path.endswith(".py"):
        return []
    module = path[len(pkg):]
    out = []
    for fact in {f for n in g.nodes for f in n.facts if f.startswith("code: ")}:
        if module in g.code.facts.get(fact.rsplit(" ", 1)[1], {}):
            out.append(fact)
    return sorted(out)


def inputs_for(query: str, g: Graph, kernels: list[str], specs: dict | None = None) -> list[str]:
    """Graph inputs a query names: a repo-relative file (a module of this package: the code
    facts holding it), or `[kernel:]section.field`. specs: kernel name -> its spec data; a
    field no requested spec has is an error."""
    full = g.to_networkx()
    path = g.rel(os.path.normpath(os.path.join(os.getcwd(), query.strip())))
    if path in full and full.nodes[path].get("type") == "file":
        return [path]
    if (facts := code_facts_of(path, g)) or path.endswith(".py") and (g.root / path).is_file():
        return facts
    m = _FIELD.match(query.strip())
    if m is None:
        raise WhyError(f"why={query!r}: not a file in the graph nor a spec field like "
                       "`validate.rel_max` or `rmsnorm_v2:perf.repeats`")
    top = m.group("path").split(".")[0].split("[")[0]
    sections = stages.spec_loader().sections
    section = next((s.key for s in sections if s.key == top), None) or \
        next((s.key for s in sections if top in s.keys), None)
    if section is None:
        raise WhyError(f"why={query!r}: {top!r} is not a spec section "
                       f"(sections: {', '.join(sorted({k for s in sections for k in s.keys}))})")
    which = [m.group("kernel")] if m.group("kernel") else kernels
    from mpkbuild.util import config
    section_file = lambda k: f"{config.BUILD_DIRNAME}/{k}/spec/{section}.json"
    found = [section_file(k) for k in which if section_file(k) in full]
    if not found:
        raise WhyError(f"why={query!r}: no requested kernel has a {section} section"
                       + (f" (kernel {m.group('kernel')!r} not requested or unknown)" if m.group("kernel") else ""))
    if specs is not None:
        field = m.group("path")
        having = [k for k in which if k in specs and has_field(specs[k], field)]
        if not having:
            raise WhyError(f"why={query!r}: no requested spec has the field {field!r} "
                           f"(kernels: {', '.join(which)})")
        found = [section_file(k) for k in having if section_file(k) in full]
    return found


def why(query: str, g: Graph, kernels: list[str], specs: dict | None = None) -> list[str]:
    """Action labels a change to the named input would make stale, in build order. Like
    status, it assumes a gate keeps its verdict: nothing propagates through a verdict file
    (perf after validate), exactly as a real build behaves when the verdict stays."""
    full = g.to_networkx()
    full.remove_edges_from([(u, v) for u, v in list(full.edges) if u.endswith(".verdict")])
    hit = set()
    for inp in inputs_for(query, g, kernels, specs):
        hit |= {n for n in nx.descendants(full, inp) if full.nodes[n].get("type") == "action"}
    return [n.label for n in g.nodes if n.label in hit and not n.silent]

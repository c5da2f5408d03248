"""v1 -> v2 ports (wiring.port): the existing layer must be one this kernel can take over.

A port does not write a layer: its branch registers the kernel on the tb_graph the
upstream layer built, so that graph must hand the body the tensors the spec describes, in
the spec's order and partition, and the layer must have every wiring param to pass. Read
from the checkout's Python with ast (its formatting is the tree's own), before anything is
written; every problem of a run is returned together, each under its kernel.
"""
from __future__ import annotations

import ast

from .checkout import Checkout
from .section import Wiring


def _layer_def(tree: ast.AST, name: str) -> ast.FunctionDef | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    return None


def _calls(fn: ast.FunctionDef, attr: str) -> list[ast.Call]:
    return [n for n in ast.walk(fn) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute) and n.func.attr == attr]


def _graph_of(fn: ast.FunctionDef) -> tuple[list[str], dict[str, tuple]] | str:
    """(tensor names in customized() order, {name: partition}) or why it cannot be read."""
    custom = _calls(fn, "customized")
    if len(custom) != 1 or not custom[0].args or not isinstance(custom[0].args[0], ast.List):
        return "it does not call self.kn_graph.customized([...], tb_graph) once"
    names = [e.id if isinstance(e, ast.Name) else None for e in custom[0].args[0].elts]
    parts = {}
    for call in _calls(fn, "new_input"):
        if len(call.args) < 2 or not isinstance(call.args[0], ast.Name):
            continue
        try:
            parts[call.args[0].id] = tuple(ast.literal_eval(call.args[1]))
        except (ValueError, TypeError):
            parts[call.args[0].id] = None
    return names, parts


def check_ports(co: Checkout, wirings: dict[str, Wiring], planned: list[str]) -> dict[str, list[str]]:
    """{kernel: its messages, each starting with its name} for every planned port that does
    not fit its layer (empty: every port fits)."""
    site = next((s for s in co.surface.sites if s.when == "port"), None)
    ports = {k: wirings[k] for k in sorted(planned) if wirings[k].ports_layer}
    if not ports:
        return {}
    if site is None:
        return {k: [f"{k}: wiring.port: the wiring surface has no port site"] for k in ports}
    rel = site.file
    text = co.text(rel)
    if text is None:
        return {k: [f"{k}: wiring.port {w.port!r}: {rel} is missing in mpk_root {co.root}"]
                for k, w in ports.items()}
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        return {k: [f"{k}: wiring.port: {rel}:{exc.lineno}: not Python this tool can read ({exc.msg})"]
                for k in ports}
    problems, taken = {}, {}
    for k, w in ports.items():
        layer = f"{w.port}_layer"
        if layer in taken:
            found = [f"{k}: wiring.port {w.port!r}: {layer} is ported by {taken[layer]} "
                     "too; a layer takes one kernel on Runtime-V2"]
        else:
            taken[layer] = k
            found = _misfits(k, w, tree, rel, layer)
        if found:
            problems[k] = found
    return problems


def _misfits(k: str, w: Wiring, tree: ast.AST, rel: str, layer: str) -> list[str]:
    """What keeps one kernel from taking over `layer`: its absence, a wiring param it does not
    take, the tensors its task is handed."""
    fn = _layer_def(tree, layer)
    if fn is None:
        return [f"{k}: wiring.port {w.port!r}: {rel} has no def {layer}( to port "
                "(name an existing layer, or drop wiring.port for a layer of its own)"]
    where = f"{k}: wiring.port {w.port!r}: {rel}:{fn.lineno} {layer}"
    problems = []
    args = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
    missing = [p["name"] for p in w.params if p["name"] not in args]
    if missing:
        problems.append(f"{where} takes no {', '.join(missing)} (wiring.params), which the "
                        "port passes to the register function")
    graph = _graph_of(fn)
    if isinstance(graph, str):
        return problems + [f"{where}: {graph}"]
    names, parts = graph
    ours = [t["name"] for t in w.tensors]
    if len(names) != len(ours):
        return problems + [f"{where} hands its task {len(names)} tensors, the spec {len(ours)} "
                           f"({', '.join(ours)})"]
    for i, (theirs, t) in enumerate(zip(names, w.tensors)):
        want = tuple(t["partition"])
        got = parts.get(theirs) if theirs else None
        if got != want:
            shown = "cannot be read" if got is None else f"is partitioned {got}"
            problems.append(f"{where}: its tensor {i} ({theirs or '?'}) {shown}, the spec's "
                            f"{t['name']} {want} (codegen partition, wiring.tensors)")
    return problems

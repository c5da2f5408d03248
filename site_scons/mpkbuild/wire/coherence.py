"""The coherence check: do the registration files of a checkout agree with each other?

Owns :func:`problems_of`, which reads the enum, the task_type_to_name map, the graph.cc
name->type chain, the TaskRegister declarations and definitions and the tma.cuh switch
through the scan regexes in surface.yaml, and lists every disagreement as one line naming
the file and the entry: a type used by graph.cc or a register function without a name-map
entry (the `_execute_task` generator asserts on it), a branch calling an undeclared or
undefined register function, a type outside the enum, a number used twice, a type in a TMA
range without its case, and for every type wired by mpkbuild a missing branch, register
function or name-map entry. An empty list means coherent. Upstream itself is not coherent
by these rules (shared register functions, branches without a register call): :func:`plan`
tells its own problems from those by checking the would-be result against the untouched
tree.
"""
from __future__ import annotations

from .checkout import Checkout
from .blocks import site_file


def _segments(text: str, rx):
    """(match, text up to the next match) for each match of rx."""
    hits = list(rx.finditer(text))
    for i, m in enumerate(hits):
        end = hits[i + 1].start() if i + 1 < len(hits) else len(text)
        yield m, text[m.end():end]


def problems_of(co: Checkout) -> list[str]:
    """Every disagreement in one checkout view (a plain one, or a plan's would-be result)."""
    surface = co.surface
    scan = surface.scan

    def file_of(site_id: str) -> str:
        return site_file(surface, co.site(site_id), None, "")

    problems: list[str] = []
    enum_rel = file_of("enum")
    entries = co.enum_entries()
    real = [e for e in entries if not scan["placeholder"].search(e.name)]
    enum = {e.name: e for e in entries}
    by_number: dict[int, str] = {}
    for e in entries:
        if e.number in by_number:
            problems.append(f"{enum_rel}:{e.line}: {e.name} = {e.number} reuses the number of "
                            f"{by_number[e.number]}")
        by_number.setdefault(e.number, e.name)

    names_rel = file_of("name_map")
    names_text = co.need_text(names_rel, "it holds task_type_to_name")
    name_map = set(scan["name_map_entry"].findall(names_text))
    for t in sorted(name_map - set(enum)):
        problems.append(f"{names_rel}: task_type_to_name has {t}, which is not in enum TaskType")

    decl_rel, def_rel = file_of("register_decl"), file_of("register_fn")
    decls = set(scan["register_decl"].findall(co.need_text(decl_rel, "TaskRegister declarations")))
    defs = {}
    for m, body in _segments(co.need_text(def_rel, "TaskRegister definitions"), scan["register_def"]):
        v = scan["register_variant_type"].search(body)
        defs[m.group(1)] = v.group(1) if v else None
    for fn in sorted(decls - set(defs)):
        problems.append(f"{decl_rel}: register_{fn}_task is declared but {def_rel} does not define it")
    for fn in sorted(set(defs) - decls):
        problems.append(f"{def_rel}: register_{fn}_task is defined but {decl_rel} does not declare it")
    for fn, t in sorted(defs.items()):
        if t is None:
            problems.append(f"{def_rel}: register_{fn}_task never calls register_task_variant")
        elif t not in enum:
            problems.append(f"{def_rel}: register_{fn}_task registers {t}, which is not in enum TaskType")
        elif t not in name_map:
            problems.append(f"{names_rel}: {t} (registered by register_{fn}_task) has no "
                            "task_type_to_name entry; the _execute_task generator asserts on it")

    graph_rel = file_of("graph_branch")
    branch_types: dict[str, str] = {}
    for m, body in _segments(co.need_text(graph_rel, "Graph::register_task"), scan["graph_branch"]):
        name = m.group(1)
        t, r = scan["graph_tuple_type"].search(body), scan["register_call"].search(body)
        if not t or not r:
            problems.append(f"{graph_rel}: branch \"{name}\" lacks a "
                            f"{'task_config tuple' if not t else 'register call'}")
            continue
        t, fn = t.group(1), r.group(1)
        branch_types[t] = name
        if t not in enum:
            problems.append(f"{graph_rel}: branch \"{name}\" uses {t}, which is not in enum TaskType")
        if t not in name_map:
            problems.append(f"{names_rel}: {t} (graph.cc branch \"{name}\") has no "
                            "task_type_to_name entry; the _execute_task generator asserts on it")
        if fn not in decls or fn not in defs:
            problems.append(f"{graph_rel}: branch \"{name}\" calls register_{fn}_task, which is "
                            f"not {'declared' if fn not in decls else 'defined'}")
        elif defs[fn] and defs[fn] != t:
            problems.append(f"{graph_rel}: branch \"{name}\" tags {t} but register_{fn}_task "
                            f"registers {defs[fn]}")

    tma_rel = file_of("tma_create")
    cases = set(scan["tma_case"].findall(co.need_text(tma_rel, "the TMA switch")))
    for t in sorted(cases - set(enum)):
        problems.append(f"{tma_rel}: case {t} is not in enum TaskType")
    for e in real:
        for a in surface.archs.values():
            if a.in_tma(e.number) and e.name not in cases:
                problems.append(f"{tma_rel}: {e.name} = {e.number} lies in the {a.name} TMA range "
                                f"{a.tma_ranges} but has no case (default: assert(false))")
                break

    registered = set(defs.values())
    for e in real:
        if e.owner is None:
            continue
        who = f"{e.name} (wired by {e.owner}, {e.arch})"
        if e.name not in name_map:
            problems.append(f"{names_rel}: {who} has no task_type_to_name entry")
        if e.name not in branch_types:
            problems.append(f"{graph_rel}: {who} has no register_task branch")
        if e.name not in registered:
            problems.append(f"{def_rel}: {who} has no register function")
    return problems

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
    """Every disagreement in one checkout view (a plain one, or a plan's would-be result):
    the enum, the name map, the register functions, graph.cc's branches, the TMA switch,
    and each wired entry's presence in all of them."""
    surface = co.surface
    scan = surface.scan

    def file_of(site_id: str) -> str:
        return site_file(surface, co.site(site_id), None, "")

    problems: list[str] = []
    entries = co.enum_entries()
    enum = {e.name: e for e in entries}
    problems += _number_problems(entries, file_of("enum"))
    names_rel = file_of("name_map")
    name_map = set(scan["name_map_entry"].findall(co.need_text(names_rel, "it holds task_type_to_name")))
    for t in sorted(name_map - set(enum)):
        problems.append(f"{names_rel}: task_type_to_name has {t}, which is not in enum TaskType")
    decl_rel, def_rel = file_of("register_decl"), file_of("register_fn")
    decls = set(scan["register_decl"].findall(co.need_text(decl_rel, "TaskRegister declarations")))
    defs = {}
    for m, body in _segments(co.need_text(def_rel, "TaskRegister definitions"), scan["register_def"]):
        v = scan["register_variant_type"].search(body)
        defs[m.group(1)] = v.group(1) if v else None
    problems += _register_problems(decls, defs, enum, name_map, decl_rel, def_rel, names_rel)
    graph_rel = file_of("graph_branch")
    branch_types, more = _branch_problems(co, scan, graph_rel, names_rel, enum, name_map, decls, defs)
    problems += more
    real = [e for e in entries if not scan["placeholder"].search(e.name)]
    problems += _tma_problems(co, surface, file_of("tma_create"), enum, real)
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


def _number_problems(entries, enum_rel: str) -> list[str]:
    out, by_number = [], {}
    for e in entries:
        if e.number in by_number:
            out.append(f"{enum_rel}:{e.line}: {e.name} = {e.number} reuses the number of "
                       f"{by_number[e.number]}")
        by_number.setdefault(e.number, e.name)
    return out


def _register_problems(decls: set, defs: dict, enum: dict, name_map: set, decl_rel: str,
                       def_rel: str, names_rel: str) -> list[str]:
    """Each register function declared and defined, registering a type the enum and the
    name map have."""
    out = []
    for fn in sorted(decls - set(defs)):
        out.append(f"{decl_rel}: register_{fn}_task is declared but {def_rel} does not define it")
    for fn in sorted(set(defs) - decls):
        out.append(f"{def_rel}: register_{fn}_task is defined but {decl_rel} does not declare it")
    for fn, t in sorted(defs.items()):
        if t is None:
            out.append(f"{def_rel}: register_{fn}_task never calls register_task_variant")
        elif t not in enum:
            out.append(f"{def_rel}: register_{fn}_task registers {t}, which is not in enum TaskType")
        elif t not in name_map:
            out.append(f"{names_rel}: {t} (registered by register_{fn}_task) has no "
                       "task_type_to_name entry; the _execute_task generator asserts on it")
    return out


def _branch_problems(co: Checkout, scan, graph_rel: str, names_rel: str, enum: dict, name_map: set,
                     decls: set, defs: dict) -> tuple[dict, list[str]]:
    """graph.cc's register_task branches: ({type: branch name}, problems), each branch
    tagging a known type and calling the register function that registers it."""
    out, branch_types = [], {}
    for m, body in _segments(co.need_text(graph_rel, "Graph::register_task"), scan["graph_branch"]):
        name = m.group(1)
        t, r = scan["graph_tuple_type"].search(body), scan["register_call"].search(body)
        if not t or not r:
            out.append(f"{graph_rel}: branch \"{name}\" lacks a "
                       f"{'task_config tuple' if not t else 'register call'}")
            continue
        t, fn = t.group(1), r.group(1)
        branch_types[t] = name
        if t not in enum:
            out.append(f"{graph_rel}: branch \"{name}\" uses {t}, which is not in enum TaskType")
        if t not in name_map:
            out.append(f"{names_rel}: {t} (graph.cc branch \"{name}\") has no "
                       "task_type_to_name entry; the _execute_task generator asserts on it")
        if fn not in decls or fn not in defs:
            out.append(f"{graph_rel}: branch \"{name}\" calls register_{fn}_task, which is "
                       f"not {'declared' if fn not in decls else 'defined'}")
        elif defs[fn] and defs[fn] != t:
            out.append(f"{graph_rel}: branch \"{name}\" tags {t} but register_{fn}_task "
                       f"registers {defs[fn]}")
    return branch_types, out


def _tma_problems(co: Checkout, surface, tma_rel: str, enum: dict, real: list) -> list[str]:
    """The TMA switch's cases are known types, and every type in an arch's TMA range has one."""
    out = []
    cases = set(surface.scan["tma_case"].findall(co.need_text(tma_rel, "the TMA switch")))
    for t in sorted(cases - set(enum)):
        out.append(f"{tma_rel}: case {t} is not in enum TaskType")
    for e in real:
        for a in surface.archs.values():
            if a.in_tma(e.number) and e.name not in cases:
                out.append(f"{tma_rel}: {e.name} = {e.number} lies in the {a.name} TMA range "
                           f"{a.tma_ranges} but has no case (default: assert(false))")
                break
    return out

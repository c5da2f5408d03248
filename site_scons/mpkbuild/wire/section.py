"""The spec's `wiring` section: its JSON Schema, its semantic check, and its resolution.

Owns :data:`WIRING_SCHEMA` (embedded by the core under the spec's `wiring` property),
:func:`check_section` (semantic errors as (field path, message) pairs) and
:func:`resolve`, which turns a normalized spec plus the surface into one plain
:class:`Wiring` object with every default filled: names per arch, TaskType number or
"auto" per arch, the tensors in task order with MPK partitions, the dims the register
function reads, the CodeKeeper call lines and the values the test-mode test uses. Every
other module reads only a :class:`Wiring`, never the raw section.
"""
from __future__ import annotations

import keyword
import re
from dataclasses import dataclass

from ..util import config, expr, tma
from .errors import SectionError
from .surface import Surface, load_surface
from ..model.section import Section as ModelSection

MAX_INPUTS, MAX_OUTPUTS = 7, 3          # task_desc->input_ptrs / output_ptrs capacity
ARCH_NAMES = ("sm_90a", "sm_100a")
# the wiring targets a per-arch field may name: the spec's archs (v1) and the Runtime-V2
# target (runtime=v2: surface.yaml's arch with `runtime: v2`)
TARGET_NAMES = (*ARCH_NAMES, "v2")
C_IDENT = r"^[A-Za-z_][A-Za-z0-9_]*$"
TASK_TYPE = r"^TASK_[A-Z0-9_]+$"
_C_RESERVED = {"bgraph", "params", "num_inputs", "num_outputs", "input_ops", "output_ops",
               "op", "code"}
_PY_RESERVED = {"self", "grid_dim", "block_dim", "task_names", "tb_graph", "mi", "mpk"}


def _per_arch(item: dict, doc: str) -> dict:
    return {"type": "object", "additionalProperties": False, "description": doc,
            "properties": {a: item for a in TARGET_NAMES}}


WIRING_SCHEMA: dict = {
    "type": "object",
    "additionalProperties": False,
    "description": "How the kernel is registered in an MPK checkout (the wire stage). "
                   "Every field is optional; defaults are derived from the spec.",
    "properties": {
        "layer": {"type": "string", "pattern": C_IDENT,
                  "description": "Python method <layer>_layer on PersistentKernel. "
                                 "Default: the spec's op (name it for the op, not a model)."},
        "port": {"type": "string", "pattern": C_IDENT,
                 "description": "An existing layer (<port>_layer on PersistentKernel) this "
                                "kernel takes over on Runtime-V2: with runtime=v2, wire adds a "
                                "use_v2_runtime branch to that layer registering this kernel, "
                                "instead of a new layer (its tb_graph must partition the "
                                "tensors as the spec does, and it must take every wiring "
                                "param). On v1 the kernel gets its own layer as without it."},
        "task_type": _per_arch({"type": "string", "pattern": TASK_TYPE},
                               "enum TaskType name per arch. Default: TASK_<KERNEL>_<TAG>, "
                               "TAG from wiring/surface.yaml (HOPPER, SM100)."),
        "task_name": _per_arch({"type": "string", "pattern": C_IDENT},
                               "name passed to register_task and matched in graph.cc; the "
                               "register function is register_<task_name>_task. "
                               "Default: <kernel>_<tag lower-cased> (rmsnorm_v2_hopper, rmsnorm_v2_sm100)."),
        "number": _per_arch({"anyOf": [{"const": "auto"},
                                       {"type": "integer", "minimum": 1}]},
                            "TaskType number per arch, or \"auto\" (default): the lowest "
                            "free number in the arch's range (a number already wired for "
                            "this kernel is kept)."),
        "num_inputs": {"type": "integer", "minimum": 0, "maximum": MAX_INPUTS,
                       "description": "Default: len(codegen.inputs); must agree with it."},
        "num_outputs": {"type": "integer", "minimum": 1, "maximum": MAX_OUTPUTS,
                        "description": "Default: len(codegen.outputs); must agree with it."},
        "tensors": {
            "type": "object",
            "description": "Per-tensor overrides, keyed by codegen tensor name.",
            "additionalProperties": {
                "type": "object", "additionalProperties": False,
                "properties": {
                    "partition": {"type": "array", "minItems": 1, "maxItems": 3,
                                  "items": {"type": "integer", "minimum": -1, "maximum": 3},
                                  "description": "MPK input_map: entry g is the tensor dim "
                                                 "split across grid axis g, -1 none. "
                                                 "Default: from codegen partition."},
                    "forloop_dim": {"type": "integer", "minimum": -1, "maximum": 3,
                                    "description": "Default: -1."},
                },
            },
        },
        "params": {
            "type": "array", "default": [],
            "description": "ints the layer passes to the register function, in order",
            "items": {"type": "object", "additionalProperties": False, "required": ["name"],
                      "properties": {"name": {"type": "string", "pattern": C_IDENT},
                                     "test_value": {"type": "integer", "default": 1}}},
        },
        "tile_indexed": {"type": "boolean", "default": True,
                         "description": "the runtime sets task_offset = bid.x for this type and "
                                        "the body's task index is it; false: the body reads no "
                                        "task index (the call passes 0), and the kernel wires "
                                        "into a checkout whose TaskMetadata has no task_offset"},
        "call": {
            "type": "object", "additionalProperties": False,
            "description": "the call the register function emits with a CodeKeeper",
            "properties": {
                "function": {"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_:]*$",
                             "description": "Default: <kernel>_task (the generated body)."},
                "template_args": {
                    "type": "array",
                    "description": "Default: codegen.template_params. A symbol is read from "
                                   "the first tensor dim (outputs first) that has it.",
                    "items": {"anyOf": [
                        {"type": "string", "pattern": C_IDENT},
                        {"type": "object", "additionalProperties": False,
                         "required": ["literal"], "properties": {"literal": {"type": "string"}}},
                        {"type": "object", "additionalProperties": False,
                         "required": ["symbol", "tensor", "dim"],
                         "properties": {"symbol": {"type": "string", "pattern": C_IDENT},
                                        "tensor": {"type": "string", "pattern": C_IDENT},
                                        "dim": {"type": "integer", "minimum": 0},
                                        "of": {"enum": ["tile", "whole"], "default": "whole"}}},
                    ]},
                },
                "tail_args": {"type": "array", "items": {"type": "string"},
                              "description": "C++ arguments after the tensors. Default: "
                                             "surface.yaml call.tail_args."},
            },
        },
        "test_variant": {"type": "string",
                         "description": "variant the test-mode test uses. Default: the "
                                        "first variant name in sorted order."},
    },
}


@dataclass(frozen=True)
class Wiring:
    """A kernel's wiring with every default resolved (plain data for templates)."""

    kernel: str
    op: str
    layer: str
    archs: tuple[str, ...]
    task_type: dict          # arch -> TASK_X
    task_name: dict          # arch -> graph.cc name
    number: dict             # arch -> int | "auto"
    num_inputs: int
    num_outputs: int
    tensors: tuple           # dicts, inputs then outputs
    params: tuple            # dicts {name, test_value}
    dims: tuple              # dicts {symbol, source, note}
    call_lines: tuple        # dicts {fmt, args}
    tile_indexed: bool
    maps: tuple              # dicts {tensor, index, box, swizzle, swizzle_code}: TMA-loaded inputs
    test: dict               # {variant, grid, threads}
    runtime: str = "v1"      # the runtime these targets are (archs: v1's, or ("v2",))
    port: str | None = None  # wiring.port: the existing layer it takes over on Runtime-V2
    runtime_inputs: tuple = ()   # (name, RUNTIME_INPUTS key): inputs the runtime passes
    task_metadata: tuple = ()    # TASK_METADATA names the body takes, in its order

    @property
    def ports_layer(self) -> bool:
        """Registered through an existing layer's use_v2_runtime branch, not a layer of its own."""
        return self.port is not None and self.runtime == "v2"

    def register_fn(self, arch: str) -> str:
        return f"register_{self.task_name[arch]}_task"

    def claims(self):
        """(kind, value, arch) for every name this kernel claims in the checkout."""
        for a in self.archs:
            yield "task type", self.task_type[a], a
            yield "task name", self.task_name[a], a
        if not self.ports_layer:
            yield "layer", f"{self.layer}_layer", None


def check_section(spec: dict, wiring_root=None) -> list[tuple[str, str]]:
    """Semantic errors of spec['wiring'] as (field path, message); [] when it is fine.
    wiring_root: the wiring folders (config.wiring_roots), the shipped one by default."""
    try:
        surface = load_surface(wiring_root or config.SHIPPED_WIRING)
    except Exception as exc:  # a broken surface is not the spec's fault, but say so
        return [("wiring", f"cannot load the wiring surface: {exc}")]
    problems: list[tuple[str, str]] = []
    _resolve(spec, surface, problems)
    return problems


def resolve(spec: dict, surface: Surface, runtime: str = "v1") -> Wiring:
    """The spec's wiring with defaults filled, for one runtime's targets (v1: the spec's
    archs; v2: the Runtime-V2 target); raise SectionError listing every problem."""
    problems: list[tuple[str, str]] = []
    wiring = _resolve(spec, surface, problems, runtime)
    if problems:
        raise SectionError(spec.get("kernel", "?"), problems)
    return wiring


def _ident(value, path, problems, pattern=C_IDENT, what="a C identifier") -> bool:
    if not isinstance(value, str) or not re.match(pattern, value):
        problems.append((path, f"{value!r} is not {what}"))
        return False
    return True


def _mpk_partition(part, ndims: int) -> tuple:
    """codegen partition (per tensor dim: grid axis or -1) -> MPK input_map (per grid axis)."""
    out = [-1, -1, -1]
    for d, g in enumerate(part):
        if isinstance(g, int) and 0 <= g < 3:
            out[g] = d
    return tuple(out)


def _resolve(spec: dict, surface: Surface, problems: list, runtime: str = "v1") -> Wiring | None:
    kernel = spec.get("kernel", "")
    w = spec.get("wiring") or {}
    cg = spec.get("codegen") or {}
    _ident(kernel, "kernel", problems)
    archs, task_type, task_name, number = _targets(spec, w, surface, problems, runtime)
    layer = w.get("layer", spec.get("op", ""))
    lpath = "wiring.layer" if "layer" in w else "op"
    if _ident(layer, lpath, problems) and keyword.iskeyword(layer):
        problems.append((lpath, f"{layer!r} is a Python keyword"))
    port = w.get("port")
    if port is not None and _ident(port, "wiring.port", problems) and keyword.iskeyword(port):
        problems.append(("wiring.port", f"{port!r} is a Python keyword"))
    # runtime state is the runtime's, not the layer's (no tb_graph input, no input_ptrs
    # slot): the call passes the runtime's own
    every_input = list(cg.get("inputs") or [])
    runtime_inputs = {t.get("name"): t["runtime"] for t in every_input if t.get("runtime")}
    metadata = config.task_metadata(cg)
    if metadata and w.get("tile_indexed", True):
        problems.append(("wiring.tile_indexed", f"codegen.task_metadata ({', '.join(metadata)}) "
                         "shares TaskMetadata's bytes with task_offset (a union): set "
                         "wiring.tile_indexed: false (the body's task index is then its "
                         f"{metadata[0]})"))
    tensors, params = _tensors(cg, w, runtime_inputs, problems)
    tail, guard, state = _call_arguments(kernel, w, surface, runtime_inputs, metadata, problems)
    maps = _maps(cg, tensors)
    dims, call_lines = _call(spec, w, tensors, [p["name"] for p in params], problems, tail, guard,
                             [t.get("name") for t in every_input], state, maps)
    test = _test(spec, w, tensors, problems, surface.python.get("block_dim"))
    if problems:
        return None
    return Wiring(kernel=kernel, op=spec.get("op", ""), layer=layer, archs=archs,
                  task_type=task_type, task_name=task_name, number=number,
                  num_inputs=sum(t["role"] == "input" for t in tensors),
                  num_outputs=sum(t["role"] == "output" for t in tensors), tensors=tuple(tensors),
                  params=tuple(params), dims=tuple(dims), call_lines=tuple(call_lines),
                  tile_indexed=bool(w.get("tile_indexed", True)),
                  maps=tuple(maps), test=test, runtime=runtime,
                  port=port, runtime_inputs=tuple(runtime_inputs.items()),
                  task_metadata=tuple(metadata))


def _targets(spec: dict, w: dict, surface: Surface, problems: list, runtime: str):
    """(archs, task_type, task_name, number): the targets of this runtime and the names and
    numbers each takes, defaults filled (v1: the spec's archs; v2: the Runtime-V2 target)."""
    kernel = spec.get("kernel", "")
    archs = tuple(spec.get("archs") or ())
    for a in archs:
        if a not in surface.archs or surface.archs[a].runtime != "v1":
            problems.append(("archs", f"arch {a!r} has no entry in wiring/surface.yaml "
                                      f"(known: {', '.join(n for n, x in surface.archs.items() if x.runtime == 'v1')})"))
    archs = tuple(a for a in archs if a in surface.archs and surface.archs[a].runtime == "v1")
    targets = {n for n, x in surface.archs.items() if x.runtime != "v1"}
    if runtime != "v1":
        archs = tuple(n for n, x in surface.archs.items() if x.runtime == runtime)
        if not archs:
            problems.append(("wiring", f"wiring/surface.yaml has no {runtime} target"))
    for key in ("task_type", "task_name", "number"):
        for a in (w.get(key) or {}):
            if (a in targets) != (runtime != "v1"):
                continue            # the other runtime's target: resolved when it is asked for
            if a not in archs:
                problems.append((f"wiring.{key}.{a}", f"arch {a} is not in the spec's archs "
                                                     f"{list(archs)}; drop it or add the arch"))
    up = kernel.upper() if isinstance(kernel, str) else "?"
    task_type = {a: (w.get("task_type") or {}).get(a, f"TASK_{up}_{surface.archs[a].tag}")
                 for a in archs}
    task_name = {a: (w.get("task_name") or {}).get(a, f"{kernel}_{surface.archs[a].tag.lower()}")
                 for a in archs}
    number = {a: (w.get("number") or {}).get(a, "auto") for a in archs}
    for a in archs:
        _ident(task_type[a], f"wiring.task_type.{a}", problems, TASK_TYPE,
               "a TaskType name (TASK_ + upper-case C identifier)")
        _ident(task_name[a], f"wiring.task_name.{a}", problems)
        n = number[a]
        if n != "auto" and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
            problems.append((f"wiring.number.{a}", f"{n!r} is neither \"auto\" nor a positive integer"))
    for key, table in (("task_type", task_type), ("task_name", task_name)):
        seen = {}
        for a, v in table.items():
            if v in seen:
                problems.append((f"wiring.{key}.{a}", f"{v!r} is also used for {seen[v]}; "
                                                     "each arch needs its own"))
            seen.setdefault(v, a)
    return archs, task_type, task_name, number


def _tensors(cg: dict, w: dict, runtime_inputs: dict, problems: list) -> tuple[list, list]:
    """(the layer's tensors in task order, inputs then outputs, with their MPK partition;
    the wiring params): every tensor a task of the layer is handed, runtime state not."""
    ins = [t for t in cg.get("inputs") or [] if not t.get("runtime")]
    outs = list(cg.get("outputs") or [])
    for key, have, limit in (("num_inputs", len(ins), MAX_INPUTS),
                             ("num_outputs", len(outs), MAX_OUTPUTS)):
        given = w.get(key, have)
        if given != have:
            problems.append((f"wiring.{key}", f"{given} disagrees with codegen "
                                              f"({have} tensors); drop it or fix codegen"))
        if have > limit:
            side = "inputs" if key == "num_inputs" else "outputs"
            problems.append((f"codegen.{side}", f"{have} {side}: an MPK task takes at most "
                                                f"{limit} (task_desc->{side[:-1]}_ptrs); split the op"))
    overrides = w.get("tensors") or {}
    names = [t.get("name") for t in ins + outs]
    for n in overrides:
        if n in runtime_inputs:
            problems.append((f"wiring.tensors.{n}", f"{n} is runtime state "
                                                    f"({runtime_inputs[n]}), not a tensor of the layer"))
        elif n not in names:
            problems.append((f"wiring.tensors.{n}", f"no codegen tensor named {n!r} "
                                                    f"(have: {', '.join(map(str, names))})"))
    params = [{"name": p.get("name"), "test_value": p.get("test_value", 1)}
              for p in (w.get("params") or [])]
    pnames = [p["name"] for p in params]
    for i, p in enumerate(pnames):
        if _ident(p, f"wiring.params.{i}.name", problems):
            if p in _C_RESERVED or p in _PY_RESERVED or keyword.iskeyword(p):
                problems.append((f"wiring.params.{i}.name", f"{p!r} is reserved in the generated code"))
            if pnames.index(p) != i or p in names:
                problems.append((f"wiring.params.{i}.name", f"{p!r} is used twice"))
    tensors = []
    for role, group, ops in (("input", ins, "input_ops"), ("output", outs, "output_ops")):
        for i, t in enumerate(group):
            name = t.get("name", "")
            path = f"codegen.{role}s.{i}.name"
            if _ident(name, path, problems) and (keyword.iskeyword(name) or name in _PY_RESERVED):
                problems.append((path, f"{name!r} is reserved in the generated Python layer"))
            if names.count(name) > 1 and names.index(name) != len(tensors):
                problems.append((path, f"tensor name {name!r} is used twice"))
            tensors.append(_layer_tensor(t, role, ops, i, overrides.get(name) or {}, problems))
    return tensors, params


def _layer_tensor(t: dict, role: str, ops: str, i: int, ov: dict, problems: list) -> dict:
    """One tensor of the layer: its MPK partition and forloop dim (wiring.tensors over the
    codegen partition) and its C++ and torch types."""
    name = t.get("name", "")
    ndims = len(t.get("shape") or [])
    part = ov.get("partition")
    if part is None:
        part = _mpk_partition(t.get("partition") or [], ndims)
    else:
        part = tuple(list(part) + [-1] * (3 - len(part)))
        used = [d for d in part if d != -1]
        bad = [d for d in used if not 0 <= d < ndims]
        if bad or len(set(used)) != len(used):
            problems.append((f"wiring.tensors.{name}.partition",
                             f"{list(part)} must hold distinct dims of {name} "
                             f"(0..{ndims - 1}) or -1"))
    fl = ov.get("forloop_dim", -1)
    if not -1 <= fl < ndims:
        problems.append((f"wiring.tensors.{name}.forloop_dim",
                         f"{fl} is not -1 or a dim of {name} (0..{ndims - 1})"))
    out = {"name": name, "role": role, "ops": ops, "index": i,
           "dtype": t.get("dtype"), "shape": list(t.get("shape") or []),
           "ndims": ndims, "partition": part, "forloop_dim": fl,
           "ctype": config.CTYPES.get(t.get("dtype")),
           "pytype": (config.DTYPES.get(t.get("dtype")) or {}).get("torch")}
    if out["ctype"] is None or out["pytype"] is None:
        problems.append((f"codegen.{role}s.{i}.dtype", f"dtype {t.get('dtype')!r} has no "
                         "C++/Python type (util/config.py DTYPES)"))
    return out


def _call_arguments(kernel: str, w: dict, surface: Surface, runtime_inputs: dict,
                    metadata: list, problems: list) -> tuple[list, str | None, dict]:
    """What the surface says the call passes besides the layer's tensors: (the arguments
    after them: task metadata, then the tail; the guard line; {input: runtime state})."""
    names = {"kernel": kernel, "spec": config.spec_namespace(kernel)}
    state = {}
    for name, what in runtime_inputs.items():
        source = (surface.call.get("runtime_inputs") or {}).get(what)
        if source is None:
            problems.append(("codegen.inputs", f"{name}: the wiring surface has no "
                             f"call.runtime_inputs.{what} (how this tree's tasks reach it)"))
            continue
        state[name] = surface.text(source, f"call.runtime_inputs.{what}", **names,
                                   ctype=config.CTYPES[config.RUNTIME_INPUTS[what]["dtype"]])
    tail = [surface.text(surface.call.get("task_metadata", "task_desc->task_metadata.{{ name }}"),
                         "call.task_metadata", **names, name=m) for m in metadata]
    tail += [surface.text(a, "call.tail_args", **names, tile_indexed=bool(w.get("tile_indexed", True)))
             for a in surface.call.get("tail_args", [])]
    guard = surface.text(surface.call["guard"], "call.guard", **names) \
        if surface.call.get("guard") else None
    return tail, guard, state


def _maps(cg: dict, tensors: list) -> list[dict]:
    """Each input the body loads with TMA: its index among the task's inputs (the slot of
    its descriptor, task_desc->input_tma_desc_ptrs[index][0]) and its box as C++ over the
    TensorDesc the runtime hands tma.cuh (the task's tile: dim[0] rows, dim[1] cols)."""
    inputs = [t["name"] for t in tensors if t["role"] == "input"]
    return [{"tensor": name, "index": inputs.index(name),
             **tma.box_cpp(tma.copy_of(cg, name), cg.get("params") or {},
                           ("tensor_desc.dim[0]", "tensor_desc.dim[1]"))}
            for name in tma.tensors(cg) if name in inputs]


def _call(spec, w, tensors, pnames, problems, tail_default, guard=None, input_order=(), state=None,
          maps=()):
    """The dims the register function reads and the CodeKeeper lines of the emitted call:
    the body's arguments in its order, the inputs (a runtime one as `state` has it) first,
    the outputs, then each TMA-loaded input's tensor map."""
    kernel, cg, call = spec.get("kernel", ""), spec.get("codegen") or {}, w.get("call") or {}
    targs = call.get("template_args", cg.get("template_params") or [])
    tpath = "wiring.call.template_args" if "template_args" in call else "codegen.template_params"
    by_name = {t["name"]: t for t in tensors}
    dims, fmt, args = [], [], []
    order = [t for t in tensors if t["role"] == "output"] + [t for t in tensors if t["role"] == "input"]
    for i, ta in enumerate(targs):
        if isinstance(ta, dict) and "literal" in ta:
            fmt.append(ta["literal"])
            continue
        if isinstance(ta, dict):
            sym, t, d, of = ta.get("symbol"), by_name.get(ta.get("tensor")), ta.get("dim"), ta.get("of", "whole")
            if t is None or not isinstance(d, int) or not 0 <= d < t["ndims"]:
                problems.append((f"{tpath}.{i}", f"{ta!r}: no such tensor/dim"))
                continue
        else:
            sym = ta
            if sym in pnames:
                fmt.append("$")
                args.append(sym)
                continue
            hit = [(t, d) for t in order for d, s in enumerate(t["shape"]) if s == sym]
            if not hit:
                problems.append((f"{tpath}.{i}", f"symbol {sym!r} is not a dim of any tensor nor "
                                 "a wiring param: add it to wiring.params (the layer passes it), "
                                 "or give {literal: ...} or {symbol, tensor, dim} in "
                                 "wiring.call.template_args"))
                continue
            t, d = hit[0]
            of = "whole" if d in t["partition"] else "tile"
        if not _ident(sym, f"{tpath}.{i}", problems):
            continue
        if sym in _C_RESERVED:
            problems.append((f"{tpath}.{i}", f"{sym!r} is reserved in the register function"))
            continue
        ref = f"{t['ops']}[{t['index']}]"
        source = f"{ref}->dtensor.dim[{d}]" if of == "whole" else f"{ref}->output_tensors[0].dim[{d}]"
        if sym not in [x["symbol"] for x in dims]:
            dims.append({"symbol": sym, "source": source,
                         "note": f"{t['name']} dim {d} ({'whole tensor' if of == 'whole' else 'task tile'})"})
        fmt.append("$")
        args.append(sym)
    function = call.get("function", f"{kernel}_task")
    if "::" not in function:   # the body's own: in its namespace (util/config.body_namespace)
        function = f"{config.body_namespace(kernel)}::{function}"
    head = function + (f"<{', '.join(fmt)}>(" if fmt else "(")
    lines = [{"fmt": head, "args": args}]
    state = state or {}
    pointer = {}
    for t in tensors:
        const = " const" if t["role"] == "input" else ""
        pointer[t["role"], t["name"]] = (f"static_cast<{t['ctype']}{const} *>"
                                         f"(task_desc->{t['role']}_ptrs[{t['index']}])")
    items = [state[n] if n in state else pointer[("input", n)] for n in input_order
             if n in state or ("input", n) in pointer]
    items += [pointer[k] for k in pointer if k[0] == "output"]
    items += [f"task_desc->input_tma_desc_ptrs[{m['index']}][0]" for m in maps]
    items += list(call.get("tail_args", tail_default))
    for j, item in enumerate(items):
        lines.append({"fmt": f"    {item}{');' if j == len(items) - 1 else ','}", "args": []})
    if not items:
        lines[0]["fmt"] += ");"
    if guard:
        # CodeKeeper indents after a line ending in "{" and dedents at "}"
        lines = [{"fmt": guard, "args": []}] + lines + [{"fmt": "}", "args": []}]
    return dims, lines


def _test(spec, w, tensors, problems, surface_block_dim=None) -> dict:
    """Variant, grid and threads for the test-mode test, evaluated from codegen."""
    cg = spec.get("codegen") or {}
    variants = cg.get("variants") or {}
    name = w.get("test_variant", min(variants) if variants else None)
    if name not in variants:
        problems.append(("wiring.test_variant" if "test_variant" in w else "codegen.variants",
                         f"variant {name!r} not in codegen.variants ({', '.join(sorted(variants))})"))
        return {}
    consts = {k: v for k, v in (cg.get("params") or {}).items() if isinstance(v, (int, float))}
    syms = {**consts, **variants[name]}
    try:
        grid = [int(expr.evaluate(g, syms)) for g in (cg.get("grid") or [1])]
        for t in tensors:
            t["test_shape"] = tuple(int(expr.evaluate(s, syms)) for s in t["shape"])
    except expr.ExprError as exc:
        problems.append(("codegen", f"variant {name}: {exc}"))
        return {}
    gens = spec.get("generators") or {}
    for t in tensors:
        t["generator"] = dict(gens.get(t["name"]) or {"dist": "normal", "mean": 0.0, "std": 1.0})
    v = spec.get("validate") or {}
    # the worker block MPK runs every Hopper/Blackwell task in (WORKER_NUM_THREADS)
    block = tuple(surface_block_dim) if surface_block_dim else (int(cg.get("threads", 128)), 1, 1)
    return {"variant": name, "grid": tuple(grid + [1] * (3 - len(grid))),
            "threads": int(cg.get("threads", 128)), "block_dim": block,
            "reference": v.get("reference", ""), "compare": v.get("compare", "tolerance"),
            "cos_min": v.get("cos_min", 0.999), "rel_max": v.get("rel_max", 3e-2),
            "codegen_params": dict(cg.get("params") or {})}


def _check(data: dict, root) -> list:
    return [(tuple(str(path).split(".")), message)
            for path, message in check_section(data, config.wiring_roots(root))]


def _surfaces(root) -> bytes:
    """The wiring surfaces a wiring section is checked against (the project's
    wiring/surface.yaml over the shipped one)."""
    parts = []
    for folder in config.wiring_roots(root):
        try:
            parts.append((folder / config.WIRING_SURFACE).read_bytes())
        except OSError:
            parts.append(b"(none)")
    return b"\0".join(parts)


# archs ride along: the wire stage renders per arch
SECTION = ModelSection("wiring", WIRING_SCHEMA, _check, carries=("archs",), outside=_surfaces)

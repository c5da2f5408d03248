"""The codegen section, owned by the generate stage: the kernel's task body, its tensors,
variants, grid and SMEM plan, as its JSON Schema and the checks the schema cannot express
(what the generated C++ declares, every variant's shapes and tiling, splits that hold
beyond the listed variants, the SMEM plan)."""
from __future__ import annotations

import fnmatch
import keyword

from mpkbuild.model.schema import C_IDENT, INT_OR_EXPR, REPO_PATH, VARIANT_GLOB
from mpkbuild.model.section import INT64_MAX, Section, cpp_reserved, inside_repo, short
from mpkbuild.stages.generate import pipeline
from mpkbuild.stages.generate.plan import SmemPlanError, smem_layout, variant_tensors
from mpkbuild.util import config, expr
from mpkbuild.util.expr import constants

PARTITION = {"type": "array", "minItems": 1, "maxItems": 4, "items": {"enum": [-1, 0]},
             "description": "MPK notation: 0 = this dim is split across grid x, -1 = whole"}

OVERRIDE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["variants", "partition"],
    "properties": {
        "variants": VARIANT_GLOB,
        "partition": {"type": "object", "minProperties": 1,
                      "propertyNames": {"pattern": C_IDENT},
                      "additionalProperties": PARTITION,
                      "description": "tensor name -> the partition these variants use instead"},
        "description": {"type": "string"},
    },
}

TENSOR = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "dtype", "shape", "partition"],
    "properties": {
        "name": {"type": "string", "pattern": C_IDENT},
        "dtype": {"enum": list(config.DTYPES)},
        "shape": {"type": "array", "minItems": 1, "maxItems": 4, "items": INT_OR_EXPR,
                  "description": "extents: integers or expressions over variant symbols"},
        "partition": PARTITION,
        "runtime": {"enum": list(config.RUNTIME_INPUTS), "description":
                    "an input the runtime keeps rather than the layer hands the task "
                    "(util/config.py RUNTIME_INPUTS): in MPK the wired call passes the runtime's "
                    "own; elsewhere it is the input tensor it is, whole (partition all -1)"},
        "shared_by_tasks": {"type": "boolean", "description":
                            "every task is given all of this unsplit tensor by design: the body "
                            "finds its own part from task_index (silu_mul_v2's tiles) or "
                            "accumulates into it; without it an output split over no dim, in a "
                            "grid of more than one task, is an error"},
        "description": {"type": "string"},
    },
}

LEVER = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "default": {"type": "boolean", "default": False,
                    "description": "on for every GPU profile (turning one on is a spec edit)"},
        "description": {"type": "string"},
    },
}

SCHEMA: dict = {
    "type": "object",
    "additionalProperties": False,
    "required": ["body", "threads", "variants", "grid", "inputs", "outputs"],
    "properties": {
        "body": {"type": "string", "pattern": REPO_PATH,
                 "description": "task body: a .cuh, or a .cuh.j2 rendered with the codegen section"},
        # no default: a spec without include folders keeps its codegen signature
        "include_dirs": {"type": "array", "maxItems": 16, "uniqueItems": True,
                         "items": {"type": "string", "minLength": 1, "maxLength": 4096},
                         "description": "folders the body's #includes are looked for in "
                                        "(repo-relative or absolute: e.g. an MPK checkout's "
                                        "include/mirage/persistent_kernel); every header "
                                        "found there is an input of the compile"},
        "threads": {"type": "integer", "minimum": 32, "maximum": 1024},
        "params": {"type": "object", "default": {}, "maxProperties": 64,
                   "propertyNames": {"pattern": C_IDENT},
                   "additionalProperties": {"type": ["number", "boolean"]}},
        "template_params": {"type": "array", "default": [], "uniqueItems": True, "maxItems": 16,
                            "items": {"type": "string", "pattern": C_IDENT}},
        "variants": {"type": "object", "minProperties": 1,
                     "maxProperties": config.MAX_VARIANTS,
                     "propertyNames": {"pattern": C_IDENT},
                     "additionalProperties": {
                         "type": "object", "minProperties": 1, "maxProperties": 32,
                         "propertyNames": {"pattern": C_IDENT},
                         # `constexpr int` in K_spec.h, and template arguments
                         "additionalProperties": {"type": "integer", "minimum": 0,
                                                  "maximum": config.INT32_MAX}}},
        "tiling": {"type": "array", "default": [], "maxItems": 16, "items": {
            "type": "object", "additionalProperties": False,
            "required": ["symbol", "multiple_of"],
            "properties": {"symbol": {"type": "string", "pattern": C_IDENT},
                           "multiple_of": INT_OR_EXPR}}},
        "min_blocks_per_sm": {**INT_OR_EXPR, "default": 1,
                              "description": "harness __launch_bounds__ minimum blocks per SM "
                                             "(caps registers); an expression over variant symbols"},
        "grid": {"type": "array", "minItems": 1, "maxItems": 1, "items": INT_OR_EXPR,
                 "description": "number of tasks (grid x), an expression over variant symbols"},
        "inputs": {"type": "array", "minItems": 1, "maxItems": 7, "items": TENSOR},
        "task_metadata": {
            "type": "array", "minItems": 1, "uniqueItems": True,
            "items": {"enum": list(config.TASK_METADATA)},
            "description": "task metadata the body takes, as ints after its tensors "
                           "(in the order request_id, expert_offset, kv_idx): each "
                           "the task's index on grid x, which the wired builder sets "
                           "as MPK's sets it for its attention and MoE tasks (bid.x); "
                           "they share TaskMetadata's union with task_offset, so "
                           "wiring.tile_indexed must be false"},
        "outputs": {"type": "array", "minItems": 1, "maxItems": 3, "items": TENSOR},
        # no default: a spec without a pipeline keeps its codegen signature
        "pipeline": pipeline.SCHEMA,
        # no default: a spec without levers keeps its codegen signature
        "levers": {"type": "object", "maxProperties": 16,
                   "propertyNames": {"pattern": C_IDENT},
                   "additionalProperties": LEVER,
                   "description": "default-off switches: `levers.NAME` (a bool) in the "
                                  "body template; off, they must not change a byte"},
        # no default: a spec without overrides keeps its codegen signature
        "overrides": {"type": "array", "maxItems": 64, "items": OVERRIDE,
                      "description": "per-variant tensor partitions (a variant glob each); "
                                     "a tensor takes at most one override per variant"},
        "smem": {
            "type": "object", "additionalProperties": False,
            "default": {"budget": config.SMEM_MAX_BYTES, "regions": []},
            "properties": {
                "budget": {"type": "integer", "minimum": 0, "maximum": config.SMEM_MAX_BYTES,
                           "default": config.SMEM_MAX_BYTES,
                           "description": "at most what MPK's runtime gives a task"},
                "regions": {"type": "array", "default": [], "maxItems": 16, "items": {
                    "type": "object", "additionalProperties": False,
                    "required": ["name", "bytes"],
                    "properties": {"name": {"type": "string", "pattern": C_IDENT},
                                   "bytes": {**INT_OR_EXPR, "description":
                                             "an expression over threads, params and the "
                                             "variant's symbols (the plan may differ per variant)"},
                                   # the harness aligns the SMEM base to 1024 bytes only
                                   "align": {"type": "integer", "minimum": 1, "maximum": 1024,
                                             "default": 16},
                                   # no default: a spec without it keeps its signature
                                   "can_pack": {"type": "boolean", "description":
                                                "the region may share 16 KB pages with the "
                                                "other packable ones (default: pages of its own)"}}}},
            },
        },
    },
}


def check(data: dict, root):
    cg = data["codegen"]
    yield from _file_problems(cg, root)
    yield from _cpp_name_problems(cg)
    consts = constants(cg)
    yield from _param_problems(cg)
    yield from _tensor_problems(cg)
    yield from _override_problems(cg)
    for vname, binding in cg["variants"].items():
        yield from _variant_problems(cg, consts, vname, binding)
    yield from _split_problems(cg, consts)
    yield from _smem_problems(cg, consts)
    yield from pipeline.problems(cg, consts)
    yield from _lever_problems(cg, consts)


def _file_problems(cg: dict, root):
    body = cg["body"]
    target = inside_repo(root, body)
    if target is None:
        yield ("codegen", "body"), f"{body!r} escapes the repository"
    elif not (body.endswith(".cuh") or body.endswith(".cuh.j2")):
        yield ("codegen", "body"), f"{body!r} must be a .cuh or a .cuh.j2 template"
    elif not target.is_file():
        yield ("codegen", "body"), f"file {body} does not exist"
    for i, d in enumerate(cg.get("include_dirs", [])):
        if "\x00" in d or not (root / d).is_dir():
            yield ("codegen", "include_dirs", i), f"{d!r} is not a folder (relative to the repository, or absolute)"
    if cg["threads"] % 32:
        yield ("codegen", "threads"), f"threads={cg['threads']} is not a multiple of the warp size 32"
    if cg["threads"] > config.MPK_WORKER_THREADS:
        yield ("codegen", "threads"), (f"threads={cg['threads']} is more than MPK's worker block of "
                                       f"{config.MPK_WORKER_THREADS} threads (WORKER_NUM_THREADS on Hopper "
                                       "and Blackwell), on whose first codegen.threads the body runs")


def _param_problems(cg: dict):
    for pname, value in cg["params"].items():
        if isinstance(value, bool):
            continue
        if isinstance(value, int) and not -2**31 <= value <= config.INT32_MAX:
            yield ("codegen", "params", pname), (f"{short(value)} does not fit the C++ int it "
                                                 f"becomes ({-2**31}..{config.INT32_MAX})")
        elif isinstance(value, float) and abs(value) > config.FLOAT32_MAX:
            yield ("codegen", "params", pname), (f"{value!r} does not fit the C++ float it becomes "
                                                 f"(|x| <= {config.FLOAT32_MAX:g})")


def _tensor_problems(cg: dict):
    names = set()
    for kind in ("inputs", "outputs"):
        for i, t in enumerate(cg[kind]):
            if t["name"] in names:
                yield ("codegen", kind, i, "name"), f"tensor name {t['name']!r} is used twice"
            names.add(t["name"])
            if len(t["partition"]) != len(t["shape"]):
                yield ("codegen", kind, i, "partition"), (
                    f"partition has {len(t['partition'])} entries but shape has {len(t['shape'])} dims")
            if t["partition"].count(0) > 1:
                yield ("codegen", kind, i, "partition"), "at most one dim can be split across grid x"
            if "runtime" in t:
                yield from _runtime_input_problems(kind, i, t)
    yield from _task_metadata_problems(cg)


def _override_problems(cg: dict):
    shapes = {t["name"]: t["shape"] for kind in ("inputs", "outputs") for t in cg[kind]}
    runtime_inputs = {t["name"]: t["runtime"] for t in cg["inputs"] if "runtime" in t}
    claimed = {}                            # (variant, tensor) -> the override index that set it
    for i, rule in enumerate(cg.get("overrides", [])):
        matched = fnmatch.filter(cg["variants"], rule["variants"])
        if not matched:
            yield ("codegen", "overrides", i, "variants"), f"{rule['variants']!r} matches no variant"
        for tname, part in rule["partition"].items():
            where = ("codegen", "overrides", i, "partition", tname)
            if tname not in shapes:
                yield where, f"no tensor named {tname!r} (tensors: {', '.join(shapes)})"
                continue
            if tname in runtime_inputs:
                yield where, (f"{tname} is runtime state ({runtime_inputs[tname]}): every task "
                              "gets all of it, in every variant")
                continue
            if len(part) != len(shapes[tname]):
                yield where, f"partition has {len(part)} entries but {tname}'s shape has {len(shapes[tname])} dims"
            if part.count(0) > 1:
                yield where, "at most one dim can be split across grid x"
            for vname in matched:
                if (vname, tname) in claimed:
                    yield where, (f"variant {vname!r} already takes {tname}'s partition from "
                                  f"codegen.overrides[{claimed[vname, tname]}]")
                claimed[vname, tname] = i


def _variant_problems(cg: dict, consts: dict, vname: str, binding: dict):
    """One variant: its symbols, tiling, launch bounds, grid, and every tensor's shape."""
    shadow = sorted(set(binding) & set(consts))
    if shadow:
        yield ("codegen", "variants", vname, shadow[0]), (
            f"variant symbol {shadow[0]!r} shadows a codegen param or 'threads'")
    symbols = {**consts, **binding}
    for tp in cg["template_params"]:
        if tp not in binding:
            yield ("codegen", "variants", vname), f"template parameter {tp!r} is not bound"
    for i, rule in enumerate(cg["tiling"]):
        if rule["symbol"] not in binding:
            yield ("codegen", "tiling", i, "symbol"), (
                f"symbol {rule['symbol']!r} is not bound by variant {vname!r}")
            continue
        try:   # static_assert'ed as C++ int arithmetic in K_spec.h
            mult = expr.evaluate(rule["multiple_of"], symbols, cpp_int=True)
        except expr.ExprError as exc:
            yield ("codegen", "tiling", i, "multiple_of"), str(exc)
            continue
        value = binding[rule["symbol"]]
        if not isinstance(mult, int) or mult <= 0 or value % mult:
            yield ("codegen", "variants", vname, rule["symbol"]), (
                f"{rule['symbol']}={value} does not tile: it must be a multiple of "
                f"{rule['multiple_of']} = {mult} (codegen.tiling[{i}])")
    try:
        blocks = expr.evaluate(cg["min_blocks_per_sm"], symbols)
    except expr.ExprError as exc:
        yield ("codegen", "min_blocks_per_sm"), f"variant {vname}: {exc}"
        return
    if not isinstance(blocks, int) or not 1 <= blocks <= 32:
        yield ("codegen", "min_blocks_per_sm"), (
            f"variant {vname}: min_blocks_per_sm = {blocks!r} is not an integer in 1..32")
    try:
        grid = expr.evaluate(cg["grid"][0], symbols)
    except expr.ExprError as exc:
        yield ("codegen", "grid", 0), f"variant {vname}: {exc}"
        return
    if not isinstance(grid, int) or grid < 1:
        yield ("codegen", "grid", 0), f"variant {vname}: grid = {grid!r} is not a positive integer"
        return
    if grid > config.INT32_MAX:
        yield ("codegen", "grid", 0), (f"variant {vname}: grid = {grid} does not fit the C++ int "
                                       f"GRID (at most {config.INT32_MAX})")
        return
    for name in cg.get("task_metadata") or []:
        if grid - 1 > config.TASK_METADATA[name]["max"]:
            yield ("codegen", "grid", 0), (
                f"variant {vname}: {grid} tasks, but task_metadata {name} holds task "
                f"indices up to {config.TASK_METADATA[name]['max']}")
    tensors = variant_tensors(cg, vname)
    for kind in ("inputs", "outputs"):
        for i, t in enumerate(tensors[kind]):
            yield from _shape_problems(cg, vname, symbols, grid, (kind, i), t)


def _shape_problems(cg: dict, vname: str, symbols: dict, grid: int, where: tuple, t: dict):
    """One tensor of one variant: positive int extents, a split dim the grid divides, and a
    size a 64-bit byte offset reaches."""
    for d, extent in enumerate(t["shape"]):
        try:
            n = expr.evaluate(extent, symbols)
        except expr.ExprError as exc:
            yield ("codegen", *where, "shape", d), f"variant {vname}: {exc}"
            continue
        split = d < len(t["partition"]) and t["partition"][d] == 0
        if not isinstance(n, int) or n < 1:
            yield ("codegen", *where, "shape", d), (
                f"variant {vname}: extent {extent!r} = {n!r} is not a positive integer")
        elif n > config.INT32_MAX:
            yield ("codegen", *where, "shape", d), (
                f"variant {vname}: extent {extent!r} = {n} is more than "
                f"{config.INT32_MAX} (kernels index a dim with int)")
        elif split and grid > n:
            # more tasks than the split dim has elements: the grid is what is wrong
            yield ("codegen", "grid", 0), (
                f"variant {vname}: {grid} tasks ({cg['grid'][0]}) but {t['name']}'s split "
                f"dim {d} ({extent} = {n}) has only {n} elements to give them")
        elif split and n % grid:
            yield ("codegen", *where, "shape", d), (
                f"variant {vname}: dim {d} ({extent} = {n}) is split over {grid} tasks "
                f"but is not a multiple of it" + _partition_origin(cg, vname, t["name"]))
    try:
        nbytes = config.DTYPE_BYTES[t["dtype"]] * _product(expr.evaluate(e, symbols) for e in t["shape"])
    except expr.ExprError:
        return                                  # reported above
    if isinstance(nbytes, int) and nbytes > INT64_MAX:
        yield ("codegen", *where, "shape"), (
            f"variant {vname}: {t['name']} is {nbytes} bytes, more than a 64-bit "
            "byte offset can address")


def _smem_problems(cg: dict, consts: dict):
    # region sizes may use variant symbols, so the plan is checked for every variant
    for i, region in enumerate(cg["smem"]["regions"]):
        if region["align"] & (region["align"] - 1):
            yield ("codegen", "smem", "regions", i, "align"), f"alignment {region['align']} is not a power of two"
    for vname, binding in cg["variants"].items():
        try:
            smem_layout(cg["smem"], {**consts, **binding})
        except SmemPlanError as exc:
            # plain-number regions fail the same way for every variant: no variant to name
            varies = any(not isinstance(r["bytes"], int) for r in cg["smem"]["regions"][:exc.index + 1])
            yield exc.path, f"variant {vname}: {exc}" if varies else str(exc)
            break


def _lever_problems(cg: dict, consts: dict):
    levers = cg.get("levers", {})
    for name in levers:
        clash = name in consts or any(name in b for b in cg["variants"].values())
        if clash:
            yield ("codegen", "levers", name), f"lever {name!r} shadows a param, 'threads' or a variant symbol"


# what the generated spec header declares in namespace <K>_spec (params and variant
# namespaces live there too), and in each variant's namespace (its symbols live there)
SPEC_HEADER_NAMES = frozenset({"THREADS", "WORKER_THREADS", "SMEM_BUDGET", "SMEM_TOTAL", "SMEM_TOTAL_MAX",
                               "SMEM_BASE_ALIGN", "SMEM_BASE_PAD", "task_barrier", "task_smem"})
VARIANT_NAMES = frozenset({"GRID", "SMEM_TOTAL"})


def _cpp_name_problems(cg: dict):
    """Every name the generated code declares: no keyword, no reserved name, and no clash
    with another name in the same C++ scope (params become upper-case constexprs beside
    THREADS and the SMEM constants; a variant is a namespace there too; its symbols are
    upper-case constexprs beside GRID)."""
    regions = {f"SMEM_{r['name'].upper()}_{s}" for r in cg.get("smem", {}).get("regions", [])
               for s in ("OFFSET", "BYTES", "ALIGN")}
    taken = {n: "a name the spec header defines" for n in SPEC_HEADER_NAMES | regions}
    for pname in cg["params"]:
        upper = pname.upper()
        why = cpp_reserved(upper) or taken.get(upper)
        if why is None and keyword.iskeyword(pname):
            why = "a Python keyword (params are passed to the reference by name)"
        if why:
            yield ("codegen", "params", pname), f"{pname!r} becomes the C++ constant {upper}, which is {why}"
        taken.setdefault(upper, f"param {pname!r}'s constant")
    for vname, binding in cg["variants"].items():
        why = cpp_reserved(vname) or taken.get(vname)
        if why:
            yield ("codegen", "variants", vname), f"variant {vname!r} becomes a C++ namespace and is {why}"
        seen = {n: "a name each variant's namespace defines" for n in VARIANT_NAMES | regions}
        for sym in binding:
            upper = sym.upper()
            why = cpp_reserved(upper) or seen.get(upper)
            if why:
                yield ("codegen", "variants", vname, sym), (f"symbol {sym!r} becomes the C++ constant "
                                                            f"{vname}::{upper}, which is {why}")
            seen.setdefault(upper, f"symbol {sym!r}'s constant")
    for kind in ("inputs", "outputs"):
        for i, t in enumerate(cg[kind]):
            why = cpp_reserved(t["name"]) or ("the harness's own argument" if t["name"] == "spans" else None)
            if why is None and keyword.iskeyword(t["name"]):
                why = "a Python keyword (tensors are passed to the reference by name)"
            if why:
                yield ("codegen", kind, i, "name"), f"tensor {t['name']!r} is a C++ parameter name and is {why}"


def _runtime_input_problems(kind: str, i: int, t: dict):
    """A runtime input is one the runtime has, of its type, and whole for every task."""
    rt = config.RUNTIME_INPUTS[t["runtime"]]
    if kind != "inputs":
        yield ("codegen", kind, i, "runtime"), "only an input can be runtime state"
    elif t["dtype"] != rt["dtype"]:
        yield ("codegen", kind, i, "dtype"), (f"{t['runtime']} is {rt['what']}: its dtype is "
                                              f"{rt['dtype']}, not {t['dtype']}")
    elif any(p != -1 for p in t["partition"]):
        yield ("codegen", kind, i, "partition"), (
            f"{t['runtime']} is runtime state, which MPK hands every task whole: its partition "
            f"is all -1 (the body finds its part from task_index), not {t['partition']}")


def _task_metadata_problems(cg: dict):
    """Metadata fields that would share TaskMetadata's bytes (a union)."""
    meta = cg.get("task_metadata") or []
    for a, name in enumerate(meta):
        lo, hi = config.TASK_METADATA[name]["bytes"]
        for other in meta[a + 1:]:
            olo, ohi = config.TASK_METADATA[other]["bytes"]
            if lo < ohi and olo < hi:
                yield ("codegen", "task_metadata", meta.index(other)), (
                    f"{other} and {name} share TaskMetadata's bytes (a union): MPK's tasks "
                    "take one or the other")


def _product(values) -> int | float:
    out = 1
    for v in values:
        out *= v
    return out


_PROBES = (2, 3, 5, 7)


def _bindings_beyond(cg: dict, consts: dict):
    """(variant, binding) for bindings the spec allows beyond its listed variants: each
    variant with one symbol scaled by, or set to, a small prime, kept where every tiling
    rule holds and the grid is a positive integer. A split that divides only for the listed
    values holds by accident, and the next variant someone adds breaks it."""
    for vname, binding in cg["variants"].items():
        for sym in binding:
            for p in _PROBES:
                for value in (binding[sym] * p, p):
                    probe = {**binding, sym: value}
                    symbols = {**consts, **probe}
                    try:
                        ok = all(probe[r["symbol"]] % expr.evaluate(r["multiple_of"], symbols, cpp_int=True) == 0
                                 for r in cg["tiling"] if r["symbol"] in probe)
                        grid = expr.evaluate(cg["grid"][0], symbols)
                    except (expr.ExprError, TypeError, ZeroDivisionError):
                        continue
                    if ok and isinstance(grid, int) and grid >= 1:
                        yield vname, probe, symbols, grid


def _split_problems(cg: dict, consts: dict):
    """What must hold for every variant, not only the listed ones: a split dim is a multiple
    of the grid, and an output split over no dim is written by one task, or the spec says
    the tasks share it (shared_by_tasks: tiles found from task_index, or accumulation)."""
    listed = [(v, b, {**consts, **b}) for v, b in cg["variants"].items()]
    try:
        listed = [(v, b, s, expr.evaluate(cg["grid"][0], s)) for v, b, s in listed]
    except expr.ExprError:
        return                                   # reported per variant
    for vname, probe, symbols, grid in listed + list(_bindings_beyond(cg, consts)):
        is_listed = probe == cg["variants"][vname]
        where_from = (f"variant {vname}" if is_listed else
                      f"variant {vname} with " + ", ".join(f"{k}={probe[k]}" for k in probe
                                                         if probe[k] != cg["variants"][vname][k]))
        tensors = variant_tensors(cg, vname)
        for kind in ("inputs", "outputs"):
            for i, t in enumerate(tensors[kind]):
                part = t["partition"]
                if kind == "outputs" and 0 not in part and grid > 1 and not t.get("shared_by_tasks"):
                    yield ("codegen", kind, i, "partition"), (
                        f"output {t['name']} is split over no dim, so each of the {grid} tasks of "
                        f"{where_from} (grid {cg['grid'][0]} = {grid}) gets all of it: split the "
                        "dim the grid counts (0 in partition), or say shared_by_tasks: true if the "
                        "body finds its own part from task_index or accumulates into it")
                    return
                if 0 not in part or is_listed:
                    continue                     # the listed variants are checked one by one
                d = part.index(0)
                try:
                    n = expr.evaluate(t["shape"][d], symbols)
                except expr.ExprError:
                    continue
                if isinstance(n, int) and (n < grid or n % grid):
                    yield ("codegen", kind, i, "partition"), (
                        f"{t['name']}'s dim {d} ({t['shape'][d]}) is split over the grid "
                        f"({cg['grid'][0]}), which divides it for the listed variants only: for "
                        f"{where_from} (a binding the tiling rules allow) it is {n} over {grid} "
                        "tasks. Split the dim the grid counts, or add the tiling rule that "
                        "makes it divide" + _partition_origin(cg, vname, t["name"]))
                    return


def _partition_origin(codegen: dict, variant: str, tensor: str) -> str:
    for i, rule in enumerate(codegen.get("overrides", [])):
        if tensor in rule["partition"] and fnmatch.fnmatch(variant, rule["variants"]):
            return f" (partition from codegen.overrides[{i}])"
    return ""


def _files(data: dict) -> tuple[str, ...]:
    return (data["codegen"]["body"],)


SECTION = Section("codegen", SCHEMA, check, required=True, carries=("kernel", "op", "family"),
                  files=_files)

"""codegen.pipeline: a warp-role pipeline declared in the spec, audited before any GPU, and
rendered into K_spec.h (constants, static_asserts and the helpers a body calls).

A pipeline task (a loader warp filling a ring of SMEM stages with bulk copies that complete
on mbarriers, consumer warps waiting on them and handing the stages back) hangs or corrupts
the persistent kernel when its protocol is off by one: a barrier not re-initialised at task
start (the worker runs task after task in the same SMEM), an arrival count that is not the
arriving role's, transaction bytes that are not the copies', a wait on a barrier nobody
arrives on, a named barrier id another task uses. The spec says the protocol; this module
checks it for every variant (`problems`) and gives the header what makes the body follow it
(`view`): `pipeline::begin(bars)` re-initialises every mbarrier by its arriving role at task
start, fences, and meets every body thread before anyone waits; arrive, expect-tx, wait on a
phase, the bulk copy that completes on a barrier, the ring's slot and phase of a step, and
one `sync_<group>()` per named barrier group, whose id the tool assigns per runtime. A copy
may load a box of an input through a TMA tensor map (`tensor`, `box`, `swizzle`, `region`):
the audit holds the box to what the hardware and the checkout's tma.cuh can make, the header
gives `copy_box` and the map's box (util/tma.py renders it for the harness and the wire too).
"""
from __future__ import annotations

from mpkbuild.model.schema import C_IDENT, INT_OR_EXPR
from mpkbuild.util import expr, tma
from mpkbuild.wire.barriers import PIPELINE_BARRIERS

MBARRIER_BYTES = 8            # one mbarrier: a 64-bit word in SMEM
MBARRIER_REGION = "mbarriers"  # the SMEM region the mbarriers live in
BULK_ALIGN = 16               # cp.async.bulk: 16-byte aligned addresses, a multiple of 16 bytes
MAX_SEMAPHORES = 31           # op-private semaphore ordinals a task may take
TEMPLATES = ("pipeline_roles.h.j2", "pipeline_ring.h.j2")   # what the spec header includes for it

_ROLE = {"type": "object", "additionalProperties": False, "required": ["name", "warps"],
         "properties": {"name": {"type": "string", "pattern": C_IDENT},
                        "warps": {"type": "integer", "minimum": 1, "maximum": 32},
                        "description": {"type": "string"}}}
_ROLE_NAMES = {"type": "array", "minItems": 1, "uniqueItems": True,
               "items": {"type": "string", "pattern": C_IDENT}}

SCHEMA: dict = {
    "type": "object", "additionalProperties": False,
    "required": ["roles", "ring", "mbarriers"],
    "description": "a warp-role pipeline (codegen.pipeline): roles, the SMEM stage ring, the "
                   "copies that fill a stage, its mbarriers, named barriers per role group and "
                   "op-private semaphores; audited for every variant at load, rendered into "
                   "K_spec.h as constants and the helpers the body calls (pipeline::begin, "
                   "arrive, arrive_expect_tx, wait, copy, sync_<group>)",
    "properties": {
        "roles": {"type": "array", "minItems": 1, "maxItems": 8, "items": _ROLE,
                  "description": "warp roles in warp order from warp 0; their warps cover "
                                 "codegen.threads exactly"},
        "ring": {"type": "object", "additionalProperties": False, "required": ["stages", "steps"],
                 "properties": {"stages": {**INT_OR_EXPR, "description": "SMEM stages in the ring"},
                                "steps": {**INT_OR_EXPR, "description":
                                          "stage fills per task (the K loop); any count, "
                                          "a multiple of stages or not"}}},
        "copies": {"type": "array", "maxItems": 8, "default": [], "items": {
            "type": "object", "additionalProperties": False, "required": ["name", "barrier"],
            "properties": {"name": {"type": "string", "pattern": C_IDENT},
                           "bytes": {**INT_OR_EXPR, "description": "bytes of one fill, a multiple "
                                     "of 16 (a flat bulk copy; a tensor copy's are its box's)"},
                           "barrier": {"type": "string", "pattern": C_IDENT,
                                       "description": "the per-stage mbarrier it completes on"},
                           "tensor": {"type": "string", "pattern": C_IDENT, "description":
                                      "a TMA tensor copy: the codegen input (bf16, 2-d) it loads a "
                                      "box of, through the tensor map MPK's tma.cuh makes per task "
                                      "(the body takes it as <tensor>_tmap)"},
                           "box": {"type": "array", "minItems": 2, "maxItems": 2, "items": INT_OR_EXPR,
                                   "description": "the box [rows, cols] one fill loads: expressions "
                                                  "of rows and cols (the task's tile of the tensor, "
                                                  "all the checkout's tma.cuh case sees) and params"},
                           "boxes": {**INT_OR_EXPR, "description":
                                     "boxes of the map one fill loads (default 1), each in a "
                                     "room of its own (its bytes rounded up to the swizzle's "
                                     "pattern): a stage larger than one box (a box is what the "
                                     "checkout's tma.cuh case makes from the task's tile "
                                     "alone); an expression of params and the variant's symbols"},
                           "swizzle": {"enum": tma.SWIZZLES, "description":
                                       "the box's SMEM swizzle in bytes (0: none; 128 if unsaid)"},
                           "region": {"type": "string", "pattern": C_IDENT, "description":
                                      "the SMEM region holding the ring's stages of this copy "
                                      "(required for a tensor copy: its alignment is checked)"}}},
            "description": "the copies that fill one stage, each completing on a "
                           "transaction-counted mbarrier: flat bulk copies (bytes) or TMA "
                           "tensor copies (tensor, box, swizzle, region)"},
        "mbarriers": {"type": "array", "minItems": 1, "maxItems": 8, "items": {
            "type": "object", "additionalProperties": False,
            "required": ["name", "arrive", "arrivals", "wait"],
            "properties": {
                "name": {"type": "string", "pattern": C_IDENT},
                "per_stage": {"type": "boolean", "default": True,
                              "description": "one per ring stage (else one for the task)"},
                "arrive": {"type": "string", "pattern": C_IDENT, "description": "the role that arrives"},
                "arrivals": {"type": "integer", "minimum": 1,
                             "description": "arrivals per phase: 1 (one elected lane), the "
                                            "role's warps (a lane per warp) or its threads"},
                "tx_bytes": {**INT_OR_EXPR, "description":
                             "transaction bytes expected per phase: the copies completing on it"},
                "wait": {**_ROLE_NAMES, "description": "the roles that wait on it"},
                "completes": {"enum": ["tcgen05"], "description":
                              "tcgen05: its arrivals are tcgen05.commit's (sm_100a), made when "
                              "the MMAs issued before them complete, so the issuing role may "
                              "wait on it itself"},
                "init": {"type": "string", "pattern": C_IDENT,
                         "description": "the role that re-initialises it at task start "
                                        "(default: the arriving role; a transaction-counted "
                                        "barrier must be re-initialised by it)"}}}},
        "named_barriers": {"type": "array", "maxItems": max(len(p) for p in PIPELINE_BARRIERS.values()),
                           "default": [], "items": {
            "type": "object", "additionalProperties": False, "required": ["name", "roles"],
            "properties": {"name": {"type": "string", "pattern": C_IDENT}, "roles": _ROLE_NAMES}},
            "description": "bar.sync among a group of roles: sync_<name>(); ids are the tool's"},
        "semaphores": {"type": "integer", "minimum": 0, "maximum": MAX_SEMAPHORES, "default": 0,
                       "description": "op-private semaphore ordinals the task takes"},
    },
}


def _roles(p: dict) -> dict:
    """name -> {begin (warp), warps, threads}, in warp order."""
    out, warp = {}, 0
    for r in p["roles"]:
        out[r["name"]] = {"begin": warp, "warps": r["warps"], "threads": 32 * r["warps"]}
        warp += r["warps"]
    return out


def problems(cg: dict, consts: dict):
    """Every way the declared protocol could hang or corrupt a task, for every variant."""
    p = cg.get("pipeline")
    if p is None:
        return
    where = ("codegen", "pipeline")
    roles = _roles(p)
    if len(roles) != len(p["roles"]):
        yield (*where, "roles"), "a role name is used twice"
        return
    threads = sum(r["threads"] for r in roles.values())
    if threads != cg["threads"]:
        yield (*where, "roles"), (f"the roles have {threads} threads and the body {cg['threads']} "
                                  "(codegen.threads): every body thread needs exactly one role")
    yield from _barrier_problems(p, roles, where)
    tensor_faults = list(_tensor_copy_problems(cg, p, where))
    yield from tensor_faults
    if tensor_faults:
        return
    names = [b["name"] for b in p["mbarriers"]] + [g["name"] for g in p["named_barriers"]]
    if len(set(names)) != len(names):
        yield (*where, "mbarriers"), "a barrier name is used twice (mbarriers and named_barriers share them)"
    for i, group in enumerate(p["named_barriers"]):
        for role in group["roles"]:
            if role not in roles:
                yield (*where, "named_barriers", i, "roles"), f"no role {role!r} (roles: {', '.join(roles)})"
    yield from _instantiation_problems(cg, p, consts, where)
    for vname, binding in cg["variants"].items():
        yield from _variant_problems(cg, p, {**consts, **binding}, vname, where)


def _instantiation_problems(cg: dict, p: dict, consts: dict, where: tuple):
    """The ring is a class template over the body's template parameters (the body is
    instantiated per their values): its expressions name only those, threads and params."""
    known = set(cg["template_params"]) | set(consts)
    fields = [(("ring", "stages"), p["ring"]["stages"]), (("ring", "steps"), p["ring"]["steps"])]
    fields += [(("copies", i, "bytes"), c["bytes"]) for i, c in enumerate(p["copies"]) if "bytes" in c]
    fields += [(("copies", i, "tensor"), dim) for i, c in enumerate(p["copies"]) if "tensor" in c
               for dim in _tile_used(cg, c) if dim != "0"]
    fields += [(("mbarriers", i, "tx_bytes"), b["tx_bytes"]) for i, b in enumerate(p["mbarriers"])
               if "tx_bytes" in b]
    for path, text in fields:
        if isinstance(text, int):
            continue
        try:
            names = expr.symbols(text)
        except expr.ExprError as exc:
            yield (*where, *path), str(exc)
            continue
        unknown = sorted(names - known)
        if unknown:
            yield (*where, *path), (
                f"{text!r} uses {unknown[0]!r}, which is not one of codegen.template_params "
                f"({', '.join(cg['template_params']) or 'none'}), a param or threads: the body's "
                "pipeline::ring is instantiated with its template arguments")


def _barrier_problems(p: dict, roles: dict, where: tuple):
    tx = {b["name"] for b in p["mbarriers"] if "tx_bytes" in b}
    for i, b in enumerate(p["mbarriers"]):
        at = (*where, "mbarriers", i)
        for field, role in [("arrive", b["arrive"]), ("init", b.get("init", b["arrive"])),
                            *(("wait", w) for w in b["wait"])]:
            if role not in roles:
                yield (*at, field), f"no role {role!r} (roles: {', '.join(roles)})"
        if b["arrive"] not in roles:
            continue
        r = roles[b["arrive"]]
        if b["arrivals"] not in (1, r["warps"], r["threads"]):
            yield (*at, "arrivals"), (
                f"{b['arrivals']} arrivals per phase match neither one elected lane (1), a lane "
                f"per warp ({r['warps']}) nor every thread ({r['threads']}) of role {b['arrive']!r}")
        if b["name"] in tx and b.get("init", b["arrive"]) != b["arrive"]:
            yield (*at, "init"), (
                f"{b['name']} completes asynchronously (its copies' transaction bytes): the role that "
                f"arrives on it ({b['arrive']}) must re-initialise it at task start, not {b['init']}")
        if b["name"] in tx and not b.get("per_stage", True):
            yield (*at, "per_stage"), f"{b['name']} counts a stage's copies: it is one per stage"
        if b["arrive"] in b["wait"] and len(b["wait"]) == 1 and b.get("completes") != "tcgen05":
            yield (*at, "wait"), f"only its arriving role {b['arrive']!r} waits on {b['name']}: nobody hands it over"
    for i, c in enumerate(p["copies"]):
        if c["barrier"] not in tx:
            yield (*where, "copies", i, "barrier"), (
                f"{c['barrier']!r} is not a transaction-counted mbarrier (one with tx_bytes): "
                f"a bulk copy completes only on one ({', '.join(sorted(tx)) or 'none declared'})")


def _value(text, symbols: dict, what: str):
    try:
        v = expr.evaluate(text, symbols)
    except expr.ExprError as exc:
        return None, f"{what}: {exc}"
    if not isinstance(v, int) or v < 1:
        return None, f"{what} = {text!r} = {v!r} is not a positive integer"
    return v, None


def _variant_problems(cg: dict, p: dict, symbols: dict, vname: str, where: tuple):
    """One variant: a ring that fills, copies of whole 16-byte units, each transaction-counted
    barrier expecting exactly its copies' bytes, and room for the mbarriers in SMEM."""
    stages, why = _value(p["ring"]["stages"], symbols, "ring.stages")
    if why:
        yield (*where, "ring", "stages"), f"variant {vname}: {why}"
        return
    _, why = _value(p["ring"]["steps"], symbols, "ring.steps")
    if why:
        yield (*where, "ring", "steps"), f"variant {vname}: {why}"
        return
    landing, in_region = {}, {}
    for i, c in enumerate(p["copies"]):
        if "tensor" in c:
            n, fault = _tensor_copy_bytes(cg, c, symbols)
            if fault:
                yield (*where, "copies", i, fault[0]), f"variant {vname}: {fault[1]}"
                return
            boxes, why = _value(c.get("boxes", 1), symbols, f"copy {c['name']}.boxes")
            if why or boxes < 1:
                yield (*where, "copies", i, "boxes"), f"variant {vname}: {why or f'{boxes} boxes a fill'}"
                return
            in_region.setdefault(c["region"], []).append(boxes * tma.slot_bytes(n, c))
            landing[c["barrier"]] = landing.get(c["barrier"], 0) + boxes * n
            continue
        n, why = _value(c["bytes"], symbols, f"copy {c['name']}")
        if why:
            yield (*where, "copies", i, "bytes"), f"variant {vname}: {why}"
            return
        if "region" in c:
            in_region.setdefault(c["region"], []).append(n)
        if n % BULK_ALIGN:
            yield (*where, "copies", i, "bytes"), (
                f"variant {vname}: copy {c['name']} moves {n} bytes, not a multiple of {BULK_ALIGN} "
                "(a bulk copy's size)")
        landing[c["barrier"]] = landing.get(c["barrier"], 0) + n
    for i, b in enumerate(p["mbarriers"]):
        if "tx_bytes" not in b:
            continue
        n, why = _value(b["tx_bytes"], symbols, f"{b['name']}.tx_bytes")
        if why:
            yield (*where, "mbarriers", i, "tx_bytes"), f"variant {vname}: {why}"
        elif n != landing.get(b["name"], 0):
            yield (*where, "mbarriers", i, "tx_bytes"), (
                f"variant {vname}: {b['name']} expects {n} transaction bytes per phase, and the "
                f"copies completing on it move {landing.get(b['name'], 0)}: the phase would "
                + ("never complete" if n > landing.get(b["name"], 0) else "complete early"))
    yield from _ring_region_problems(cg, p, symbols, stages, in_region, vname)
    need = MBARRIER_BYTES * count(p, stages)
    region = next((r for r in cg["smem"]["regions"] if r["name"] == MBARRIER_REGION), None)
    if region is None:
        yield ("codegen", "smem", "regions"), (
            f"the pipeline's mbarriers live in an SMEM region named {MBARRIER_REGION!r} "
            f"({need} bytes for variant {vname}, align 8): declare it")
        return
    size, why = _value(region["bytes"], symbols, f"region {MBARRIER_REGION}")
    at = ("codegen", "smem", "regions", cg["smem"]["regions"].index(region))
    if why is None and size < need:
        yield (*at, "bytes"), (f"variant {vname}: {count(p, stages)} mbarriers need {need} bytes, "
                               f"region {MBARRIER_REGION} has {size}")
    if region.get("align", 16) % MBARRIER_BYTES:
        yield (*at, "align"), f"an mbarrier is {MBARRIER_BYTES}-byte aligned"


def tile_texts(cg: dict, tensor: str) -> list[str]:
    """The task's tile of a 2-d input as expressions of the variant's symbols: a dim split
    over grid x is its extent over the grid, as the runtime's TensorDesc has it per task."""
    t = next(t for t in cg["inputs"] if t["name"] == tensor)
    return [f"({dim}) // ({cg['grid'][0]})" if part == 0 else str(dim)
            for dim, part in zip(t["shape"], t["partition"])]


def _tile_used(cg: dict, c: dict) -> list[str]:
    """The tile dims a copy's box is written in (the others "0"): what the ring's C++ must
    know of the variant to size a box."""
    used = set().union(*(expr.symbols(d) for d in c["box"]))
    return [text if name in used else "0" for name, text in zip(tma.TILE, tile_texts(cg, c["tensor"]))]


def _tensor_copy_problems(cg: dict, p: dict, where: tuple):
    """What a TMA tensor copy needs whatever the variant: a 2-d bf16 input of the layer,
    split over grid x or whole, loaded through one tensor map, its box in the tile's terms."""
    inputs = {t["name"]: t for t in cg["inputs"]}
    regions = {r["name"] for r in cg["smem"]["regions"]}
    loaded: dict[str, tuple] = {}
    for i, c in enumerate(p["copies"]):
        at = (*where, "copies", i)
        if c.get("region") is not None and c["region"] not in regions:
            yield (*at, "region"), f"no SMEM region {c['region']!r} (regions: {', '.join(sorted(regions))})"
        if "tensor" not in c:
            if "bytes" not in c:
                yield at, f"copy {c['name']} says neither its bytes (a flat bulk copy) nor its tensor (a TMA box)"
            for field in ("box", "swizzle", "boxes"):
                if field in c:
                    yield (*at, field), f"{field} is a tensor copy's: copy {c['name']} names no tensor"
            continue
        if "bytes" in c:
            yield (*at, "bytes"), (f"copy {c['name']} loads a box of {c['tensor']}: its bytes are the "
                                   "box's, drop bytes")
            continue
        for field in ("box", "region"):
            if field not in c:
                yield at, f"copy {c['name']} (a TMA box of {c['tensor']}) needs its {field}"
        t = inputs.get(c["tensor"])
        if t is None:
            yield (*at, "tensor"), (f"no codegen input {c['tensor']!r} (inputs: "
                                    f"{', '.join(inputs) or 'none'}): TMA loads an input of the task")
            continue
        if t.get("runtime"):
            yield (*at, "tensor"), f"{c['tensor']} is runtime state ({t['runtime']}), not a tensor of the task"
        elif t["dtype"] not in tma.DTYPES or len(t["shape"]) != 2:
            yield (*at, "tensor"), (f"{c['tensor']} is {t['dtype']} with {len(t['shape'])} dims: the "
                                    f"checkout's fill_tma_desc makes 2-d {'/'.join(tma.DTYPES)} maps")
        elif any(part not in (-1, 0) for part in t["partition"]):
            yield (*at, "tensor"), (f"{c['tensor']}'s partition {t['partition']} splits a dim over "
                                    "another grid axis than x: its tile is not one the map covers")
        elif any(c["tensor"] in rule["partition"] for rule in cg.get("overrides", [])):
            yield (*at, "tensor"), (f"codegen.overrides repartitions {c['tensor']}: a tensor map's tile "
                                    "is one for every variant")
        shape = (tma.swizzle(c), tuple(map(str, c.get("box", ()))))
        if loaded.setdefault(c["tensor"], shape) != shape:
            yield (*at, "box"), (f"{c['tensor']} is loaded through one tensor map a task: every copy "
                                 "of it has the same box and swizzle")
        known = set(tma.TILE) | {k for k, v in cg["params"].items() if not isinstance(v, bool)}
        for j, text in enumerate(c.get("box", ())):
            try:
                unknown = sorted(expr.symbols(text) - known)
            except expr.ExprError as exc:
                yield (*at, "box", j), str(exc)
                continue
            if unknown:
                yield (*at, "box", j), (
                    f"{text!r} uses {unknown[0]!r}: a box is written in rows and cols (the task's "
                    "tile of the tensor) and params, all the checkout's tma.cuh case sees of a task")


def _tensor_copy_bytes(cg: dict, c: dict, symbols: dict):
    """(bytes of one box, None) or (None, (field, why)) for one variant's symbols."""
    tile = [expr.evaluate(d, symbols) for d in tile_texts(cg, c["tensor"])]
    box = []
    for j, text in enumerate(c["box"]):
        v, why = _value(text, {**symbols, **dict(zip(tma.TILE, tile))}, f"box[{j}]")
        if why:
            return None, ("box", why)
        if v > tma.BOX_MAX:
            return None, ("box", f"box[{j}] = {v}: a TMA box dim is at most {tma.BOX_MAX} elements")
        box.append(v)
    elem = tma.ELEMENT_BYTES
    inner, swizzle = box[1] * elem, tma.swizzle(c)
    if inner % BULK_ALIGN:
        return None, ("box", f"a box row is {box[1]} elements = {inner} bytes, not a multiple of "
                             f"{BULK_ALIGN} (TMA's inner box extent)")
    if swizzle and inner > swizzle:
        return None, ("box", f"a box row is {inner} bytes, wider than the {swizzle}-byte swizzle span "
                             "(split the box, or swizzle wider)")
    if (tile[1] * elem) % BULK_ALIGN:
        return None, ("tensor", f"{c['tensor']}'s rows are {tile[1] * elem} bytes apart, not a multiple of "
                                f"{BULK_ALIGN} (a tensor map's row stride)")
    return box[0] * box[1] * elem, None


def _ring_region_problems(cg: dict, p: dict, symbols: dict, stages: int, in_region: dict, vname: str):
    """A ring region holds every stage of the copies landing in it, each box where TMA can
    write it: the region aligned to the box's swizzle pattern, and every copy sharing it a
    whole number of those patterns, so the next one starts aligned too."""
    regions = cg["smem"]["regions"]
    for name, sizes in in_region.items():
        i = next(j for j, r in enumerate(regions) if r["name"] == name)
        at = ("codegen", "smem", "regions", i)
        size, why = _value(regions[i]["bytes"], symbols, f"region {name}")
        if why is None and size < stages * sum(sizes):
            yield (*at, "bytes"), (f"variant {vname}: {stages} stages of the copies landing in {name} "
                                   f"need {stages * sum(sizes)} bytes, the region has {size}")
        boxes = [c for c in p["copies"] if "tensor" in c and c["region"] == name]
        if not boxes:
            continue
        need = max(tma.pattern(c) for c in boxes)
        if regions[i].get("align", 16) < need:
            yield (*at, "align"), (f"region {name} is {regions[i].get('align', 16)}-byte aligned; a "
                                   f"TMA box lands at a multiple of {need} (its swizzle's whole "
                                   "pattern, 8 rows of the span)")
        if len(sizes) > 1 and any(n % need for n in sizes):
            yield (*at, "bytes"), (f"variant {vname}: the copies sharing {name} are {sizes} bytes a "
                                   f"stage; each must be a multiple of {need} for the next box to "
                                   "land aligned (give the odd one a region of its own)")
        elif stages > 1 and sum(sizes) % need:
            yield (*at, "bytes"), (f"variant {vname}: a stage of {name} is {sum(sizes)} bytes, so stage "
                                   f"1 lands at {sum(sizes)}, not a multiple of {need}: swizzle it (a "
                                   "swizzled box takes whole patterns) or make a stage's boxes a "
                                   f"multiple of {need} bytes")


def count(p: dict, stages: int) -> int:
    """mbarriers of the task: per-stage ones once per stage."""
    return sum(stages if b.get("per_stage", True) else 1 for b in p["mbarriers"])


def _cpp(text, cg: dict) -> str:
    """An expression as C++ over the ring's template parameters (the body's), THREADS and the
    params' constants."""
    params = cg["params"]
    return expr.to_cpp(text, lambda s: s if s in cg["template_params"] else
                       "THREADS" if s == "threads" else s.upper() if s in params else s)


def view(cg: dict) -> dict | None:
    """What the spec header renders of the pipeline: the roles and their helpers, and the
    `ring` class template over the body's template parameters (its expressions in C++)."""
    p = cg.get("pipeline")
    if p is None:
        return None
    roles = _roles(p)
    groups = []
    for i, g in enumerate(p["named_barriers"]):
        groups.append({"name": g["name"], "roles": g["roles"],
                       "threads": sum(roles[r]["threads"] for r in g["roles"]),
                       "ids": {rt: ids[i] for rt, ids in PIPELINE_BARRIERS.items()}})
    bars, index = [], "0"
    for b in p["mbarriers"]:
        count = "STAGES" if b.get("per_stage", True) else "1"
        bars.append({"name": b["name"], "NAME": b["name"].upper(), "index": index, "count": count,
                     "arrivals": b["arrivals"], "init_warp": roles[b.get("init", b["arrive"])]["begin"],
                     "tx": _cpp(b["tx_bytes"], cg) if "tx_bytes" in b else None,
                     "copies": [c["name"].upper() for c in p["copies"] if c["barrier"] == b["name"]]})
        index = f"{b['name'].upper()} + {b['name'].upper()}_COUNT"
    copies = []
    for c in p["copies"]:
        if "tensor" in c:
            tile = ", ".join(_cpp(d, cg) for d in _tile_used(cg, c))
            m = f"tma_{c['tensor']}"
            nbytes = (f"{m}::box_rows({tile}) * {m}::box_cols({tile}) * "
                      f"{tma.ELEMENT_BYTES}u")
        else:
            nbytes = _cpp(c["bytes"], cg)
        copies.append({"NAME": c["name"].upper(), "bytes": nbytes, "slot_unit": tma.slot_unit(c),
                       "boxes": _cpp(c.get("boxes", 1), cg)})
    return {"roles": [{"name": n, "NAME": n.upper(), **r} for n, r in roles.items()],
            "named_barriers": groups, "semaphores": p["semaphores"],
            "region": MBARRIER_REGION.upper(), "template_params": cg["template_params"],
            "stages": _cpp(p["ring"]["stages"], cg), "steps": _cpp(p["ring"]["steps"], cg),
            "mbarriers": bars, "last": bars[-1]["NAME"], "copies": copies,
            "maps": [{"tensor": name, **tma.box_cpp(tma.copy_of(cg, name), cg["params"], tma.TILE)}
                     for name in tma.tensors(cg)]}


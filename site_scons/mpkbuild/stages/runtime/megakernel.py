"""What the runtime gate takes from MPK: a checkout (its runtime headers, CUTLASS and json),
the compile flags of Mirage's get_compile_command, the worker/scheduler grid for a GPU, and
the megakernel source: one graph per variant (and a chain graph), whose task dispatch is the
very call the wire stage registers."""
from __future__ import annotations

import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from mpkbuild.runners import facts
from mpkbuild.stages.runtime import composition, events
from mpkbuild.util.expr import variant_facts
from mpkbuild.util import config, tma
from mpkbuild.util.config import V2_MARKER
from mpkbuild.util.fsutil import temp_name, write_atomic
from mpkbuild.wire.incumbents import NoIncumbent, stands_for
from mpkbuild.util.nvcc_steps import split_compile


# The gate's task types are the highest numbers of these ranges that the checkout's enum
# leaves free (gate_task_types; the dispatch is megakernel.cu's own, nothing is registered):
# strictly inside the Hopper compute range, all of which MPK's init makes TMA descriptors for
# (197 on the pinned trees); on Runtime-V2, whose tasks live in the SM100 range, above its
# TMA sub-range (297, and 296 for the snapshot task)
V1_TYPE_RANGE = range(151, 198)
V2_TYPE_RANGE = range(257, 298)
# the gated kernel's task type in megakernel.cu (a block's other kernels that need a type
# of their own: TYPE_SYMBOL_1, ...)
TYPE_SYMBOL = "MPKB_TASK_TYPE"
SNAPSHOT_TASKS = 128      # the snapshot tasks after each v2 graph's op (megakernel_v2.cu.j2)


# MPK's worker/scheduler split by SM count (mirage/utils.py get_configurations_from_gpu:
# a worker per SM up to a table's count, 4 schedulers per remaining SM)
WORKER_TABLE = ((160, 144), (144, 128), (132, 128), (108, 96), (68, 64), (40, 30), (0, 20))


# Mirage's compile command sizes a scheduler's per-worker array from the grid; 128 (its
# value when no grid is given) holds for any grid, so one compile serves every GPU
MAX_WORKER_PER_SCHEDULER = 128


# production sizes the runtime's MODE_OFFLINE build expects; test mode uses none of them
MODE_MACROS = ("-DMODE_OFFLINE", "-DMPK_TEST_MODE", "-DMPK_MAX_NUM_BATCHED_REQUESTS=1",
               "-DMPK_MAX_NUM_BATCHED_TOKENS=8", "-DMPK_MAX_NUM_PAGES=16", "-DMPK_PAGE_SIZE=64",
               "-DMPK_MAX_SEQ_LENGTH=64")
# Runtime-V2: USE_RUNTIME_V2 as MPK's builder sets it; MODE_ONLINE_NOTOKEN, whose
# prepare_next_batch touches no request state, so each launch re-runs the graph for
# max_seq_length iterations with the runtime's iteration barrier between them (the v2
# prototype has no test mode); the same production sizes
MODE_MACROS_V2 = ("-DMODE_ONLINE_NOTOKEN", "-DUSE_RUNTIME_V2", *MODE_MACROS[2:])


ITERATIONS = 3           # at least; validate.steps when larger


# the same source built without the production worker's other tasks (with ALONE_MACRO: the
# worker of one variant alone, in which ours is timed beside the production one)
MINIMAL_MACRO = "MPKB_MINIMAL_WORKER"
# with MINIMAL_MACRO: the worker of one variant (or one block's graph) alone, its index in
# alone_units (its incumbents beside it, no other variant's task): what ours is timed in
# beside the gate's worker, so that a verdict that moves with the other variants compiled in
# is seen (issue 59)
ALONE_MACRO = "MPKB_ALONE_VARIANT"


def grid_for(sm_count: int) -> tuple[int, int]:
    """(workers, local schedulers) as MPK computes them from the SM count."""
    for at_least, workers in WORKER_TABLE:
        if sm_count >= at_least:
            return workers, 4 * (sm_count - workers)
    raise AssertionError("unreachable")


# ---------------------------------------------------------------- the checkout
@dataclass(frozen=True)
class Checkout:
    root: Path
    cutlass: Path
    json: Path

    @classmethod
    def find(cls, root: Path) -> "Checkout":
        root = Path(root)
        header = root / "include/mirage/persistent_kernel/persistent_kernel.cuh"
        if not header.is_file():
            raise FileNotFoundError(f"mpk_root={root}: no include/mirage/persistent_kernel/"
                                    "persistent_kernel.cuh (not an MPK checkout)")
        found = {}
        for dep in ("cutlass", "json"):
            for base in (root / "deps", root.parent / "deps", root.parent):
                if (base / dep / "include").is_dir():
                    found[dep] = base / dep / "include"
                    break
            else:
                raise FileNotFoundError(f"mpk_root={root}: {dep}/include not found in deps/, "
                                        "../deps/ or ../ (Mirage's submodules)")
        return cls(root, found["cutlass"], found["json"])

    @property
    def runtime_dir(self) -> Path:
        return self.runtime_dir_of(self.root)

    @staticmethod
    def runtime_dir_of(root: Path) -> Path:
        return Path(root) / "include/mirage/persistent_kernel"

    def headers(self) -> list[Path]:
        """The runtime's own headers (every file under include/mirage): the compile's sources."""
        return sorted(p for p in (self.root / "include/mirage").rglob("*")
                      if p.is_file() and p.suffix in (".h", ".cuh", ".hpp", ".inl"))

    def require(self, runtime: str) -> None:
        """A checkout without the runtime asked for stops here, naming what is missing."""
        self.require_runtime(self.root, runtime)

    @staticmethod
    def require_runtime(root: Path, runtime: str) -> None:
        """The same, on the tree alone (no deps/ needed: what wiring asks of it)."""
        if runtime == "v2" and not (Path(root) / V2_MARKER).is_file():
            raise FileNotFoundError(
                f"mpk_root={root}: runtime=v2 needs Runtime-V2, and this checkout has no "
                f"{V2_MARKER} (the v2 prototype is "
                "../shared/mirage/v2)")

    def include_flags(self) -> list[str]:
        return [f"-I{self.root / 'include'}", f"-I{self.runtime_dir}", f"-I{self.cutlass}",
                f"-I{self.json}"]


@dataclass(frozen=True)
class RuntimeRequest:
    """What the runtime gate runs in, resolved once for the whole build (the command line
    makes it; the graph, the actions and status read it): the checkout with its deps, or
    None and why not, and the runtime targeted."""
    checkout: Checkout | None
    runtime: str = "v1"
    why_none: str | None = None          # a checkout was named but is not one

    @classmethod
    def resolve(cls, mpk_root: Path | None, runtime: str = "v1") -> "RuntimeRequest":
        if mpk_root is None:
            return cls(None, runtime)
        try:
            return cls(Checkout.find(mpk_root), runtime)
        except FileNotFoundError as exc:
            return cls(None, runtime, str(exc))

    @property
    def root(self) -> Path | None:
        return self.checkout.root if self.checkout else None


def compile_flags(arch: str, profiling: bool = True, runtime: str = "v1") -> list[str]:
    """The macros and flags of Mirage's get_compile_command for one GPU, test mode (v1) or
    MODE_ONLINE_NOTOKEN (v2), no NVSHMEM. v2's worker has no profiler: its spans are the
    megakernel's own marks."""
    if arch != "sm_90a":
        raise ValueError(f"the runtime gate builds for sm_90a only (asked: {arch})")
    flags = ["-O3", "-lineinfo", "-std=c++17", "-shared", "-rdc=false", "-use_fast_math",
             "-Xcompiler=-fPIC", "--expt-relaxed-constexpr",
             f"-DMAX_WORKER_PER_SCHEDULER={MAX_WORKER_PER_SCHEDULER}",
             "-DMIRAGE_USE_CUTLASS_KERNEL=1", "-DMPK_TARGET_CC=90", "-DMIRAGE_BACKEND_USE_CUDA",
             "-gencode=arch=compute_90a,code=sm_90a", "-DMPK_ENABLE_TMA",
             "-DMIRAGE_GRACE_HOPPER", "-DNDEBUG",
             *(MODE_MACROS_V2 if runtime == "v2" else MODE_MACROS)]
    if profiling and runtime == "v1":
        flags.append("-DMPK_ENABLE_PROFILING")
    return flags


def nvcc_command(checkout: Checkout, source: Path, gen_dirs: list[Path], out: Path,
                 arch: str = "sm_90a", shadow: Path | None = None, runtime: str = "v1",
                 alone: int | None = None) -> list[str]:
    """alone: the index of the variant whose worker alone this builds (ALONE_MACRO)."""
    first = [f"-I{shadow}"] if shadow is not None else []
    return ["nvcc", str(source), *first, *checkout.include_flags(), *(f"-I{d}" for d in gen_dirs),
            *compile_flags(arch, runtime=runtime),
            *([f"-D{MINIMAL_MACRO}", f"-D{ALONE_MACRO}={alone}"] if alone is not None else []),
            "-Xptxas", "-v", "-o", str(out)]


def runtime_fact(checkout_root: Path | None, runtime: str = "v1") -> str:
    return (f"runtime: mpk_root={checkout_root}; " + (f"runtime={runtime}; " if runtime != "v1" else "")
            + f"flags: {' '.join(compile_flags('sm_90a', runtime=runtime))}")


# ---------------------------------------------------------------- the graph plan
def _call_lines(spec: dict, symbols: dict, wiring_root: Path) -> list[str]:
    """The wire stage's registered call, with `$` replaced by the variant's values."""
    from mpkbuild.wire.section import resolve
    from mpkbuild.wire.surface import load_surface
    w = resolve(spec, load_surface(wiring_root))
    out = []
    for line in w.call_lines:
        text, args = line["fmt"], list(line["args"])
        while "$" in text:
            text = text.replace("$", str(symbols[args.pop(0)]), 1)
        out.append(text)
    return out


def _layer(spec: dict, variant: str, dispatch_id: int, tensor_index: list[int],
           task_type: str = TYPE_SYMBOL) -> dict:
    """One layer of our kernel over the graph's tensors `tensor_index` (the spec's inputs,
    then outputs): a runtime input is no tensor of the task (the call passes the runtime's)."""
    from mpkbuild.stages.generate import _variant_views
    view = next(v for v in _variant_views(spec["codegen"]) if v["name"] == variant)
    state = {t["name"] for t in spec["codegen"]["inputs"] if t.get("runtime")}
    kept = [(t, at) for t, at in zip(view["tensors"], tensor_index) if t["name"] not in state]
    ins = [t for t, _ in kept if t["kind"] == "inputs"]
    outs = [t for t, _ in kept if t["kind"] == "outputs"]
    dtypes = {t["name"]: t["dtype"] for t in spec["codegen"]["inputs"] + spec["codegen"]["outputs"]}
    metadata = config.task_metadata(spec["codegen"])
    # a TMA-loaded input's TensorDesc as MPK's init fills it (the task's tile, the whole
    # tensor's row stride): the checkout's create_tma_desc_by_task makes its map from it
    maps = {m["tensor"]: m for m in view["tma"]}
    return {"id": dispatch_id, "kernel": spec["kernel"], "variant": variant,
            "metadata": sum(1 << i for i, m in enumerate(config.TASK_METADATA) if m in metadata),
            # the graph tensor of each of the spec's inputs and outputs (the runner makes
            # them all; `tensors`, the task's, leaves runtime state out)
            "spec_tensors": list(tensor_index),
            "task_type": task_type, "tasks": view["grid"], "grid_x": view["grid"],
            "num_inputs": len(ins), "num_outputs": len(outs), "tensors": [at for _, at in kept],
            "strides": [t["task_stride"] * config.DTYPE_BYTES[dtypes[t["name"]]] for t in ins + outs],
            "strides_y": [0] * (len(ins) + len(outs)), "tma": bool(maps),
            "tma_dims": [[maps[t["name"]]["rows"], maps[t["name"]]["cols"]] if t["name"] in maps
                         else [0, 0] for t in ins + outs],
            "row_strides": [maps[t["name"]]["row_stride"] if t["name"] in maps else 0 for t in ins + outs],
            "tensor_names": [t["name"] for t in ins + outs]}


def _absolute(recipe: dict, index: list[int], n_in: int) -> dict:
    """An incumbent's tensor recipe (wire/incumbents.py: indices into the op's own inputs
    and outputs) with its indices into our graph's tensor table."""
    r = dict(recipe)
    if r["use"] == "output":
        r["index"] = index[n_in + r["index"]]
    elif "index" in r:
        r["index"] = index[r["index"]]
    if "compare_values_of" in r:
        r["compare_values_of"] = index[r["compare_values_of"]]
    return r


def _incumbent_layers(lay: dict, where: list[int], variant: str, pending: list,
                      base: int, alternative: bool = False) -> list[dict]:
    """The plan layers of one incumbent layout whose tensors are `where` in the graph's
    table, with the events MPK's compile makes between two of them (a chain's linear and
    the silu_mul tiles it feeds); their dispatch entries are appended to `pending` (ids
    from `base`; an `alternative`, another configuration of the incumbent, is compiled
    into the workers alone only, where there are any)."""
    layers = _plan_layers(lay, where, variant, pending, base, alternative)
    for (a, b), (pa, pb) in zip(zip(lay["layers"], lay["layers"][1:]), zip(layers, layers[1:])):
        shared = [j for j in a["outputs"] if j in b["inputs"] and lay["tensors"][j]["use"] == "scratch"]
        if shared:
            r = lay["tensors"][shared[0]]
            _events_between(pa, pb, (where[shared[0]], r["shape"], r["dtype"]))
    return layers


def _plan_layers(lay: dict, where: list[int], variant: str, pending: list,
                 base: int, alternative: bool) -> list[dict]:
    layers = []
    for layer in lay["layers"]:
        gx, gy = layer["grid"]
        n = len(layer["inputs"]) + len(layer["outputs"])
        entry = {"id": base + len(pending), "kernel": lay["incumbent"], "variant": variant,
                 "task_type": layer["task_type"], "register": layer["register"]}
        pending.append({**entry, "call": layer["call"], "spec": None,
                        **({"alternative": True} if alternative else {})})
        tma = layer.get("tma")
        layers.append({**entry, "tasks": gx * gy, "grid_x": gx,
                       "num_inputs": len(layer["inputs"]), "num_outputs": len(layer["outputs"]),
                       "tensors": [where[i] for i in layer["inputs"] + layer["outputs"]],
                       "strides": [st[0] for st in layer["stride"][:n]],
                       "strides_y": [st[1] for st in layer["stride"][:n]],
                       "tma": tma is not None,
                       "tma_dims": tma["dims"] if tma else [[0, 0]] * n,
                       "row_strides": tma["row_stride"] if tma else [0] * n})
    return layers


def _incumbent_graphs(spec: dict, variant: str, text: str | None, next_id: int,
                      runtime: str = "v1") -> tuple[list, list, list]:
    """(graphs, dispatch entries, [{incumbent, why}] of those that cannot run) for one
    variant's incumbents (wire/incumbents.py) of this runtime on the checkout whose
    register text is `text`."""
    from mpkbuild.wire import incumbents as inc
    rules, why = inc.rules_for(spec, variant, runtime)
    graphs, dispatch, missing = [], [], []
    if not rules:
        return [], [], [{"incumbent": None, "why": why}]
    shapes, dtypes = inc.variant_shapes(spec, variant)
    n_in = len(shapes["inputs"])
    ours = list(range(n_in + len(shapes["outputs"])))
    for rule in rules:
        params = rule.get("params", {})
        # the builder's configuration, then (rule.best) the others of its own parameters
        others = inc.best_candidates(rule["task"], shapes, params) if rule.get("best", True) else []
        for values in [params, *others]:
            try:
                lay = inc.layout(rule["task"], spec["op"], shapes, dtypes, values, text)
            except inc.NoIncumbent as exc:
                if values is params:
                    missing.append({"incumbent": rule["task"], "why": str(exc)})
                    break
                continue
            layers = _incumbent_layers(lay, list(range(len(lay["tensors"]))), variant, dispatch,
                                       next_id, alternative=values is not params)
            side = rule["task"] if values is params else f"{rule['task']}@{inc.config_text(values)}"
            graphs.append({"name": f"incumbent:{variant}:{side}", "role": "incumbent",
                           "of": variant, "incumbent": rule["task"], "side": side,
                           "config": inc.config_text(values), "default": values is params,
                           "num_tensors": len(lay["tensors"]),
                           "tensors": [_absolute(r, ours, n_in) for r in lay["tensors"]],
                           "layers": layers, "headers": lay["headers"],
                           "active_tokens": lay["layers"][0]["active_tokens"]})
    return graphs, dispatch, missing


# ---------------------------------------------------------------- blocks
def block_kernels(spec: dict) -> list[str]:
    """The other kernels the spec's blocks run (their specs, headers and bodies are the
    megakernel's inputs too), in order."""
    names = [l["kernel"] for b in spec.get("runtime", {}).get("blocks", []) for l in b["layers"]]
    return [n for n in dict.fromkeys(names) if n != spec["kernel"]]


def _one_branch_per_call(dispatch: list, rivals: list) -> list:
    """The dispatch with one branch per distinct incumbent call (a block's chain runs the
    very call of a variant's incumbent at the same shape): the worker's code grows with
    each branch, and its size moves the in-runtime figures (bench/RESULTS.md §16)."""
    first, keep, same = {}, [], {}
    # the run graphs' calls first; a call two kinds of entry make (a run graph's, a production
    # task's, an incumbent's other configuration's) is one branch in every worker
    kind = lambda d: 1 if d.get("filler") else 2 if d.get("alternative") else 0
    for d in sorted(dispatch, key=kind):
        if d.get("register") is None:
            keep.append(d)
            continue
        key = (d["task_type"], tuple(d["call"]))
        if key in first:
            kept = first[key]
            same[d["id"]] = kept["id"]
            if kind(kept) != kind(d):
                kept.pop("filler", None)
                kept.pop("alternative", None)
        else:
            first[key] = d = dict(d)
            keep.append(d)
    for g in rivals:
        for l in g["layers"]:
            l["id"] = same.get(l["id"], l["id"])
    return keep


def alone_units(spec: dict) -> list[str]:
    """What a worker alone is built for, in ALONE_MACRO's order: each variant, then each
    block's graph (its layers' kernels and the incumbents' chain: a block is judged too, and
    its production worker grows with every variant of its kernels)."""
    from mpkbuild.wire.incumbents import block_graph_names
    return list(spec["codegen"]["variants"]) + block_graph_names(spec)


def _mark_owners(dispatch: list, graphs: list, units: list[str]) -> None:
    """Each branch the graphs run gets `alone`: the indices (alone_units) of the variants and
    blocks whose graphs (ours, its incumbents at every configuration) run it -- the branches
    that unit's worker alone keeps (ALONE_MACRO)."""
    owners: dict[int, set[int]] = {}
    for g in graphs:
        unit = g["name"] if g.get("role") != "incumbent" else g.get("of")
        if unit in units:
            for layer in g["layers"]:
                owners.setdefault(layer["id"], set()).add(units.index(unit))
    for d in dispatch:
        if "filler" not in d:
            d["alone"] = sorted(owners.get(d["id"], ()))


def _block_error(spec: dict, bi: int, where: str, message: str):
    from mpkbuild.stages.generate import TemplateError
    return TemplateError(f"{config.SPEC_DIRNAME}/{spec['kernel']}.yaml: runtime.blocks[{bi}]"
                         f"{where}: {message}")


# MPK's meta tensors up to the last one a runtime input is fed as (the graph table's width)
META_SLOTS = 1 + max(r["meta_index"] for r in config.RUNTIME_INPUTS.values())


def _runtime_state(cg: dict) -> list[int]:
    """Per MPK meta tensor the graph feeds (util/config.py RUNTIME_INPUTS meta_index), the
    graph tensor it is, or -1: the runtime reads our tensor where MPK reads its own."""
    slots = [-1] * META_SLOTS
    for i, t in enumerate(cg["inputs"]):
        if t.get("runtime"):
            slots[config.RUNTIME_INPUTS[t["runtime"]]["meta_index"]] = i
    return slots


def _block_graphs(spec: dict, specs: dict, dispatch: list, text: str | None,
                  runtime: str, wiring_root: Path, with_incumbents: bool,
                  type_of: dict[str, str]) -> tuple[list, list, dict]:
    """(our graphs, the incumbents' chains, {graph: [{incumbent, why}]}) of every block and
    batch: our graph runs the layers' variants, each layer's first input the layer
    before's first output (shapes and dtypes must agree; the bytes are one buffer); the
    incumbents' chain runs each layer's incumbent in the same order on the same inputs,
    with the tensors laid out as MPK's builder lays them (a silu_mul fed by a linear gets
    the linear's weight rows in its tiles, as the builder shuffles them)."""
    from mpkbuild.util.expr import tensor_shape, variant_symbols
    from mpkbuild.wire import incumbents as inc
    ours_graphs, chains, missing = [], [], {}
    ids = {(d["kernel"], d["variant"]): d["id"] for d in dispatch}
    for bi, block in enumerate(spec.get("runtime", {}).get("blocks", [])):
        for m in block["batches"]:
            name = inc.block_graph_name(block, m)
            layers, nxt = [], 0
            fed = None              # (tensor index, shape, dtype) of the layer before's output
            for li, layer in enumerate(block["layers"]):
                where = f".layers[{li}]"
                kspec = specs.get(layer["kernel"])
                if kspec is None:
                    raise _block_error(spec, bi, where + ".kernel",
                                       f"no kernel {layer['kernel']!r} (specs/{layer['kernel']}.yaml)")
                variant = layer["variant"].format(batch=m)
                cg = kspec["codegen"]
                if any(t.get("runtime") for t in cg["inputs"]):
                    raise _block_error(spec, bi, where + ".kernel",
                                       f"{layer['kernel']} reads runtime state, which a block's "
                                       "graph does not feed (the kernel's own graphs do)")
                if variant not in cg["variants"]:
                    raise _block_error(spec, bi, where + ".variant",
                                       f"{layer['kernel']} has no variant {variant!r} (batch {m})")
                sym = variant_symbols(cg, variant)
                ins = [(tensor_shape(t, sym), t["dtype"]) for t in cg["inputs"]]
                outs = [(tensor_shape(t, sym), t["dtype"]) for t in cg["outputs"]]
                index = []
                for j, _ in enumerate(ins):
                    if j == 0 and fed is not None:
                        (at, pshape, pdtype), (shape, dtype) = fed, ins[0]
                        if pdtype != dtype or math.prod(pshape) != math.prod(shape):
                            raise _block_error(spec, bi, where + ".variant",
                                               f"{layer['kernel']}.{variant}'s first input is "
                                               f"{dtype} {shape}; the layer before writes "
                                               f"{pdtype} {pshape}")
                        index.append(at)
                    else:
                        index.append(nxt)
                        nxt += 1
                index += list(range(nxt, nxt + len(outs)))
                nxt += len(outs)
                key = (layer["kernel"], variant)
                if key not in ids:
                    ids[key] = len(dispatch)
                    dispatch.append({"id": ids[key], "kernel": layer["kernel"], "variant": variant,
                                     "spec": config.spec_namespace(layer["kernel"]),
                                     "task_type": type_of[layer["kernel"]],
                                     "call": _call_lines(kspec, sym, wiring_root)})
                layers.append(_layer(kspec, variant, ids[key], index, type_of[layer["kernel"]]))
                if fed is not None and runtime == "v1":
                    _events_between(layers[-2], layers[-1], fed)
                fed = (index[len(ins)], *outs[0])
            ours_graphs.append({"name": name, "role": "block", "block": block["name"],
                                "num_tensors": nxt, "active_tokens": 0, "layers": layers,
                                "validate": {"compare": "tolerance", "cos_min": block["cos_min"],
                                             "rel_max": block["rel_max"]}})
            if not with_incumbents:
                continue
            try:
                chain, pending = _incumbent_chain(block, name, layers, specs, text, runtime,
                                                  len(dispatch))
            except inc.NoIncumbent as exc:
                missing[name] = [{"incumbent": "the incumbents' chain", "why": str(exc)}]
                continue
            dispatch += pending
            chains.append(chain)
    return ours_graphs, chains, missing


def _events_between(producer: dict, consumer: dict, fed: tuple) -> None:
    """The events after `producer` as MPK's compile makes them (events.py), where they are
    finer than one for the whole layer: `fed` is the (tensor, shape, dtype) it hands on."""
    made = events.between(producer, consumer, fed[0], fed[1], config.DTYPE_BYTES[fed[2]])
    if made is not None:
        producer["events"] = made


def _incumbent_chain(block: dict, name: str, ours_layers: list, specs: dict,
                     text: str | None, runtime: str, base: int) -> tuple[dict, list]:
    """The incumbents' chain of one block graph and its dispatch entries (ids from
    `base`), or NoIncumbent."""
    from mpkbuild.wire import incumbents as inc
    if inc.block_runtime(block) != runtime:
        raise inc.NoIncumbent(f"the block's incumbents are tasks of {inc.block_runtime(block)}, "
                              f"this run is on {runtime}")
    tensors, layers, pending, headers = [], [], [], []
    # the layer before's output (its index in the chain's table) and, of a linear, its
    # weight's (which a silu_mul after it makes MPK's builder shuffle)
    fed = None
    for li, (layer, ours) in enumerate(zip(block["layers"], ours_layers)):
        kspec = specs[layer["kernel"]]
        shapes, dtypes = inc.variant_shapes(kspec, ours["variant"])
        lay = inc.layout(layer["incumbent"], kspec["op"], shapes, dtypes,
                         layer.get("params", {}), text)
        n_in = len(shapes["inputs"])
        where = []
        for j, recipe in enumerate(lay["tensors"]):
            if fed is not None and inc.takes_what_came_before(recipe, tensors, fed[1], layer["incumbent"]):
                where.append(fed[0])
                continue
            r = _absolute(recipe, ours["tensors"], n_in)
            if r["use"] == "output" and li + 1 < len(block["layers"]):
                r["intermediate"] = True        # laid out as MPK lays it: not compared with ours
            where.append(len(tensors))
            tensors.append(r)
        out_local = next(j for j, r in enumerate(lay["tensors"]) if r["use"] == "output")
        made = _incumbent_layers(lay, where, name, pending, base)
        if fed is not None:
            _events_between(layers[-1], made[0], (fed[0], *fed[2:]))
        fed = (where[out_local], None if lay["weight"] is None else where[lay["weight"]],
               shapes["outputs"][0], dtypes["outputs"][0])
        layers += made
        headers += lay["headers"]
    return {"name": f"incumbent:{name}:chain", "role": "incumbent", "of": name,
            "incumbent": " > ".join(l["incumbent"] for l in block["layers"]), "num_tensors": len(tensors), "tensors": tensors,
            "layers": layers, "headers": list(dict.fromkeys(headers)),
            "active_tokens": lay["layers"][0]["active_tokens"]}, pending


def plan(spec: dict, wiring_root: Path, companions: dict | None = None,
         checkout_root: Path | None = None, runtime: str = "v1") -> dict:
    """Everything the template renders: the dispatch branches and the graphs.

    Per variant one graph of one layer, and one per incumbent the spec names for it
    (runtime.incumbent) that the checkout has (its register text, wire/incumbents.py); per
    block of runtime.blocks and batch, one graph of its layers (`companions`: the specs of
    the other kernels they run, block_kernels) and one of the incumbents' chain. Without a
    checkout, no incumbent graphs."""
    from mpkbuild.util.expr import variant_symbols
    from mpkbuild.wire.incumbents import register_text
    kernel, cg = spec["kernel"], spec["codegen"]
    text = register_text(checkout_root) if checkout_root is not None else None
    specs = {**(companions or {}), kernel: spec}
    groups = task_type_groups([spec] + [specs[n] for n in block_kernels(spec) if n in specs],
                              wiring_root)
    numbers, snapshot_type = gate_task_types(checkout_root, runtime, len(groups))
    task_types = [{"symbol": TYPE_SYMBOL if i == 0 else f"{TYPE_SYMBOL}_{i}", "number": n,
                   "kernels": names, "tma_label": TMA_LABEL if i == 0 else f"{TMA_LABEL}_{i}"}
                  for i, (names, n) in enumerate(zip(groups, numbers))]
    type_of = {name: t["symbol"] for t in task_types for name in t["kernels"]}
    dispatch, graphs, rivals, missing = [], [], [], {}
    for i, variant in enumerate(cg["variants"]):
        dispatch.append({"id": i, "kernel": kernel, "variant": variant, "spec": config.spec_namespace(kernel),
                         "task_type": TYPE_SYMBOL,
                         "call": _call_lines(spec, variant_symbols(cg, variant), wiring_root)})
        n = len(cg["inputs"]) + len(cg["outputs"])
        graphs.append({"name": variant, "role": "ours", "num_tensors": n, "active_tokens": 0,
                       "runtime_state": _runtime_state(cg),
                       "layers": [_layer(spec, variant, i, list(range(n)))]})
    if checkout_root is not None:
        next_id = len(dispatch)
        for variant in cg["variants"]:
            more, calls, lost = _incumbent_graphs(spec, variant, text, next_id, runtime)
            next_id += len(calls)
            rivals += more
            dispatch += calls
            if lost:
                missing[variant] = lost
    blocks, chains, lost = _block_graphs(spec, specs, dispatch, text, runtime, wiring_root,
                                         checkout_root is not None, type_of)
    graphs += blocks + rivals + chains
    missing.update(lost)
    fillers, filler_headers = _production_tasks(spec, companions or {}, text, runtime,
                                                checkout_root, len(dispatch))
    dispatch = _one_branch_per_call(dispatch + fillers, rivals + chains)
    _mark_owners(dispatch, graphs, alone_units(spec))
    includes = [f"{name}{suffix}" for name in block_kernels(spec) + [kernel]
                for suffix in ("_spec.h", ".cuh")]
    max_tensors = max(len(l["tensors"]) for g in graphs for l in g["layers"])
    max_tensors = max(max_tensors, max(g["num_tensors"] for g in graphs))
    for g in graphs:
        for l in g["layers"]:
            pad = max_tensors - len(l["tensors"])
            l["tensors"] = l["tensors"] + [0] * pad
            l["strides"] = l["strides"] + [0] * pad
            l["strides_y"] = l["strides_y"] + [0] * pad
            l["tma_dims"] = l["tma_dims"] + [[0, 0]] * pad
            l["row_strides"] = l["row_strides"] + [0] * pad
    return {"kernel": kernel, "task_type": numbers[0], "task_types": task_types,
            "snapshot_type": snapshot_type,
            "runtime": runtime, "dispatch": dispatch, "graphs": graphs,
            "includes": includes, "max_tensors": max_tensors, "missing": missing,
            "meta_slots": META_SLOTS, "minimal_macro": MINIMAL_MACRO, "alone_macro": ALONE_MACRO,
            "has_minimal_worker": checkout_root is not None and has_minimal_worker(spec, runtime),
            "task_metadata_names": list(config.TASK_METADATA),
            "max_layers": max(len(g["layers"]) for g in graphs),
            "task_headers": sorted({h for g in rivals + chains for h in g["headers"]} | set(filler_headers)),
            "composition": composition.describe(composition.declared(spec) if checkout_root else None,
                                                runtime)}


def has_minimal_worker(spec: dict, runtime: str) -> bool:
    """Whether the gate's worker is production-shaped (v1, runtime.composition not minimal)
    and so is built again for each variant alone (MINIMAL_MACRO and ALONE_MACRO)."""
    return runtime == "v1" and composition.declared(spec) is not None


def _production_tasks(spec: dict, companions: dict, text: str | None, runtime: str,
                      checkout_root: Path | None, first_id: int) -> tuple[list, list]:
    """The production worker's other tasks (composition.py), compiled in and never run:
    where it has a minimal twin and a checkout; else none."""
    if checkout_root is None or not has_minimal_worker(spec, runtime):
        return [], []
    model = composition.declared(spec)
    ops = {o for c in (spec, *companions.values()) for o in stands_for(c["op"])}
    try:
        return composition.production_calls(model, ops, text, first_id)
    except NoIncumbent as exc:
        from mpkbuild.stages.generate import TemplateError
        raise TemplateError(f"{config.SPEC_DIRNAME}/{spec['kernel']}.yaml: runtime.composition: "
                            f"the {model['model']} worker cannot be made on {checkout_root}: {exc} "
                            "(runtime.composition: minimal runs without it)") from None


# the checkout's runtime entry header and the header of every task it includes, which the
# megakernel's build replaces with one of only the tasks its graphs use (shadow_files)
ENTRY_HEADER = "persistent_kernel.cuh"
TASK_HEADER = "tasks/hopper/task_header.cuh"
# v2: the checkout's dispatch_v2.cuh includes every v2 task (tcgen05 and TMEM among them,
# which no sm_90a build takes); the shadow's is the same file with only the v2 task
# headers the graphs use (persistent_kernel_v2.cuh finds it first, through -I)
DISPATCH_V2 = "mirage/persistent_kernel/dispatch_v2.cuh"
_V2_TASK_INCLUDE = re.compile(r'^\s*#include\s+"mirage/persistent_kernel/(tasks/blackwell_v2/[^"]+)"')
_ENUM_VALUE = re.compile(r"^\s*(TASK_\w+)\s*=\s*(\d+)\s*,", re.M)


def v2_dispatch_header(checkout_root: Path, headers: list[str]) -> bytes:
    """The checkout's dispatch_v2.cuh without the includes of v2 tasks not in `headers`."""
    text = (Checkout.runtime_dir_of(checkout_root) / "dispatch_v2.cuh").read_text()
    keep = []
    for line in text.splitlines(keepends=True):
        m = _V2_TASK_INCLUDE.match(line)
        if m and m.group(1) not in headers:
            continue
        keep.append(line)
    return "".join(keep).encode()


def gate_task_types(checkout_root: Path | None, runtime: str, count: int) -> tuple[list[int], int | None]:
    """(the numbers of the gate's `count` task types, the v2 snapshot task's or None): the
    highest numbers of the runtime's range (V1_TYPE_RANGE, V2_TYPE_RANGE) that the
    checkout's enum does not use (a number the wire stage gave a kernel is used), the
    snapshot's the second (so a gate of one type keeps the numbers it always had)."""
    span, title = (V2_TYPE_RANGE, "SM100") if runtime == "v2" else (V1_TYPE_RANGE, "Hopper")
    need = count + (runtime == "v2")
    free = list(reversed(span))
    if checkout_root is not None:
        header = Checkout.runtime_dir_of(checkout_root) / "runtime_header.h"
        used = {int(v) for _, v in _ENUM_VALUE.findall(header.read_text(errors="replace"))} \
            if header.is_file() else set()
        free = [n for n in free if n not in used]
        if len(free) < need:
            from mpkbuild.stages.generate import TemplateError
            raise TemplateError(f"{header}: the {title} range {span.start}-{span.stop - 1} has "
                                f"{len(free)} free task types; the {runtime} gate needs {need}")
    if runtime == "v2":
        return [free[0], *free[2:need]], free[1]
    return free[:need], None


def _check_v2(checkout_root: Path, body: str, kernel: str, codegen: dict | None = None) -> None:
    """The barrier ids the v2 megakernel takes for itself, and the ones its task header
    gives the body (task_barrier, a pipeline's named barrier groups), are free on this
    checkout; else one error naming both users."""
    from mpkbuild.stages.generate import TemplateError, pipeline
    from mpkbuild.wire import barriers
    headers = barriers.v2_task_headers(checkout_root)
    problems = barriers.clashes(
        {**headers, f"{kernel}.cuh (the body)": body},
        {barriers.V2_MARK_BARRIER: "the runtime gate's span mark (megakernel_v2.cu.j2)"})
    ours = {barriers.V2_TASK_BARRIER: f"{kernel}_spec::task_barrier() on Runtime-V2"}
    view = pipeline.view(codegen) if codegen is not None else None
    for group in view["named_barriers"] if view else ():
        ours[group["ids"]["v2"]] = f"{kernel}_spec::pipeline::sync_{group['name']}() on Runtime-V2"
    problems += barriers.clashes(headers, ours)
    if problems:
        raise TemplateError(f"the v2 megakernel of {kernel} cannot be made on {checkout_root}:\n  "
                            + "\n  ".join(problems))


def render(k, wiring_root: Path, mpk_root: Path | None, companions=(), runtime: str = "v1") -> str:
    return render_all(k, wiring_root, mpk_root, companions, runtime)["megakernel.cu"].decode()


def render_all(k, wiring_root: Path, mpk_root: Path | None, companions=(),
               runtime: str = "v1") -> dict[str, bytes]:
    """{name: bytes}: megakernel.cu and the shadow include folder's two files: the checkout's
    persistent_kernel.cuh as it is, and a task_header.cuh of only the tasks the graphs
    dispatch to (ours come in through megakernel.cu's own includes). Without the
    checkout's CUTLASS GEMMs the nvcc of a rmsnorm megakernel takes a third of the time."""
    from mpkbuild.stages.generate import render_template
    p = plan(k.spec.data, wiring_root, {c.name: c.spec.data for c in companions}, mpk_root, runtime)
    context = {**p, "mpk_root": str(mpk_root) if mpk_root else "(none)"}
    v1_headers = p["task_headers"]
    if runtime == "v2":
        from mpkbuild.stages.wire import task_sources
        from mpkbuild.wire.barriers import V2_MARK_BARRIER
        if mpk_root is not None:
            _check_v2(mpk_root, task_sources(k)["body"], k.name, k.spec.data["codegen"])
        context.update(snapshot_tasks=SNAPSHOT_TASKS, mark_barrier=V2_MARK_BARRIER,
                       profile_entries=config.PROFILE_ENTRIES_PER_WORKER)
        v1_headers = [h for h in v1_headers if not h.startswith("tasks/blackwell_v2/")]
    template = "megakernel_v2.cu.j2" if runtime == "v2" else "megakernel.cu.j2"
    out = {"megakernel.cu": render_template(config.TEMPLATE_DIR / template, context).encode()}
    if mpk_root is not None:
        out[f"shadow/{TASK_HEADER}"] = render_template(
            config.TEMPLATE_DIR / "task_header.cuh.j2",
            {"kernel": p["kernel"], "headers": v1_headers}).encode()
        entry = Checkout.runtime_dir_of(mpk_root) / ENTRY_HEADER
        out[f"shadow/{ENTRY_HEADER}"] = entry.read_bytes() if entry.is_file() else b""
        if runtime == "v2":
            out[f"shadow/{DISPATCH_V2}"] = v2_dispatch_header(mpk_root, p["task_headers"])
        specs = {s["kernel"]: s for s in (k.spec.data, *(c.spec.data for c in companions))}
        types = [(t, [specs[n] for n in t["kernels"] if tma.tensors(specs[n]["codegen"])])
                 for t in p["task_types"]]
        if any(loading for _, loading in types):
            out[f"shadow/{TMA_HEADER}"] = gate_tma_header(
                mpk_root, [(loading, t["tma_label"], t["number"], t["symbol"])
                           for t, loading in types if loading], wiring_root)
    return out


TMA_HEADER = "tma.cuh"
TMA_LABEL = "MPKB_TMA_TASK"


def _maps_key(spec: dict, surface) -> str | None:
    """What a kernel's tma.cuh case makes (inputs, boxes, swizzles), or None: it loads none."""
    from mpkbuild.wire.section import resolve
    return repr(resolve(spec, surface).maps) if tma.tensors(spec["codegen"]) else None


def task_type_groups(specs: list[dict], wiring_root: Path) -> list[list[str]]:
    """The gate's task types, each as the kernels that run under it, the first the gated
    kernel's (`specs[0]`). MPK makes a TMA task's maps in its task type's tma.cuh case, so
    kernels that load through different maps need a type each, as each of MPK's own TMA
    tasks has; a kernel that loads none, or the same maps as a kernel before it, shares
    that type (a megakernel that one type serves is built as it always was)."""
    from mpkbuild.wire.surface import load_surface
    surface = load_surface(wiring_root)
    groups: list[tuple[str | None, list[str]]] = [(_maps_key(specs[0], surface), [specs[0]["kernel"]])]
    for spec in specs[1:]:
        key = _maps_key(spec, surface)
        if key is None or groups[0][0] is None:
            groups[0] = (groups[0][0] or key, groups[0][1] + [spec["kernel"]])
            continue
        at = next((i for i, (k, _) in enumerate(groups) if k == key), None)
        if at is None:
            groups.append((key, [spec["kernel"]]))
        else:
            groups[at][1].append(spec["kernel"])
    return [names for _, names in groups]


def gate_tma_header(mpk_root: Path, types: list[tuple[list[dict], str, int, str]],
                    wiring_root: Path) -> bytes:
    """The checkout's tma.cuh with the wire stage's two cases, as the wire writes them, of
    the kernels the gate runs that load with TMA, each under its gate task type: `types`,
    per type (the specs of its kernels that load with TMA, which load the same maps
    (task_type_groups); the label it has here; its number; its name in megakernel.cu).
    The checkout's create_tma_desc_by_task then makes our tasks' maps as MPK's init does
    (and our blocks, where the checkout is wired, are left out: they name the wired task
    type)."""
    from mpkbuild.stages.generate import TemplateError
    from mpkbuild.wire.patch import gate_tma_text
    from mpkbuild.wire.errors import WireError
    declared = "".join(
        f"// the runtime gate's task type for {', '.join(s['kernel'] for s in specs)} "
        f"(megakernel.cu: {symbol})\n"
        f"constexpr TaskType {label} = static_cast<TaskType>({number});\n\n"
        for specs, label, number, symbol in types)
    try:
        return gate_tma_text(mpk_root, [(specs[0], label) for specs, label, _, _ in types],
                             wiring_root, declared).encode()
    except WireError as exc:
        raise TemplateError(f"{Checkout.runtime_dir_of(mpk_root) / TMA_HEADER}: {exc}") from None


def companions_for(k, kernels: dict) -> list:
    """The other kernels k's blocks run (block_kernels), from `kernels` where the build has
    them, else loaded from their specs (a missing one is left out: plan() names it)."""
    out = []
    for name in block_kernels(k.spec.data):
        if name in kernels:
            out.append(kernels[name])
        elif (k.root / config.SPEC_DIRNAME / f"{name}.yaml").is_file():
            out.append(k.sibling(name))
    return out


# ---------------------------------------------------------------- compiling
def compile_megakernel(checkout: Checkout, source: Path, gen_dirs: list[Path], out: Path,
                       log: Path, shadow: Path | None = None, runtime: str = "v1",
                       alone: int | None = None) -> tuple[bool, str, float]:
    """The library to `out` (atomically), by split_compile; (ok, log text, seconds).
    `alone`: the worker of that variant alone (ALONE_MACRO)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{temp_name(out)}nvcc.tmp")      # named for its writer: an orphan is removed
    cmd = nvcc_command(checkout, source, gen_dirs, tmp, shadow=shadow, runtime=runtime, alone=alone)
    t0 = time.perf_counter()
    ok, text = split_compile(cmd, out.parent / "nvcc-steps")
    took = time.perf_counter() - t0
    write_atomic(log, " ".join(cmd) + "\n" + text)
    if not ok:
        tmp.unlink(missing_ok=True)
        return False, text, took
    os.replace(tmp, out)
    return True, text, took


def worker_facts(log_text: str) -> dict:
    """The persistent kernel's worker as ptxas built it (from the compile's -Xptxas -v):
    registers, stack and spills of the entry that runs the tasks (v1's worker_kernel; v2's
    one persistent kernel), the figures a task body's speed depends on besides its own
    code, which every task compiled into the worker moves (issue 59)."""
    from mpkbuild.stages.compile import parse_ptxas
    functions = parse_ptxas(log_text)
    entries = {n: f for n, f in functions.items() if f["entry"]}
    if not entries:
        return {}
    name = next((n for n in entries if "worker_kernel" in n), None) or \
        max(entries, key=lambda n: entries[n]["registers"])
    e = entries[name]
    # a task body that is its own function (not inlined) is the worker's code too: its
    # spills count here, and the entry's stack is cumulative (its callees' frames included)
    called = [f for f in functions.values() if not f["entry"]]
    return {"entry": name, "registers": e["registers"], "stack_bytes": e["stack"],
            "spill_stores": e["spill_stores"] + sum(f["spill_stores"] for f in called),
            "spill_loads": e["spill_loads"] + sum(f["spill_loads"] for f in called)}


def task_bodies(dispatch: list) -> list[str]:
    """The task bodies compiled into the worker, as its dispatch has them: ours as
    kernel.variant, an incumbent by its task, a production task by its model layer
    (whatever the graph runs, the worker holds all)."""
    return sorted({f"{d['kernel']}.{d['variant']}" if d.get("spec") else
                   f"{d['kernel']} ({d['variant']})" if d.get("filler") else f"{d['kernel']} (incumbent)"
                   for d in dispatch})


# ---------------------------------------------------------------- the job
# mpkb_setup's flags (megakernel.cu.j2 says what each does; 1 warm-up and 4 one persistent
# kernel are there for experiments): PRELOAD loads every kernel and sizes the stack before
# the first launch, without which the host hangs in it (bench/RESULTS.md §15); CARVEOUT
# stays because every catalog run on the GPU was made with it
FLAG_CARVEOUT, FLAG_PRELOAD = 2, 8
LAUNCH_FLAGS = FLAG_CARVEOUT | FLAG_PRELOAD


LAUNCH_TIMEOUT_S = 20.0


def job_payload(k, build=None, wiring_root: Path | None = None,
                checkout_root: Path | None = None, runtime: str | None = None) -> dict:
    """What the runner needs beyond the gate's sections: the graphs (as plan() has them,
    the incumbents' with their tensor recipes), every kernel's codegen/generators/validate,
    the iteration count, the launch knobs, the head to head's pairs and generators, and
    why a variant's incumbent cannot run."""
    companions = companions_for(k, build.kernels if build is not None else {})
    request = build.runtime_request if build is not None else RuntimeRequest(None)
    checkout_root = request.root if checkout_root is None else checkout_root
    runtime = request.runtime if runtime is None else runtime
    p = plan(k.spec.data, wiring_root or config.wiring_roots(k.root),
             {c.name: c.spec.data for c in companions}, checkout_root, runtime)
    kernels = {}
    for x in [k, *companions]:
        kernels[x.name] = {s: x.spec.sections[s][s] for s in ("codegen", "generators", "validate")}
        kernels[x.name][facts.KEY] = variant_facts(x.spec.data["codegen"])
    steps = int(k.spec.data["validate"].get("steps", 0))
    section = k.spec.data["runtime"]
    return {"graphs": p["graphs"], "kernels": kernels, "iterations": max(ITERATIONS, steps),
            "flags": LAUNCH_FLAGS, "launch_timeout_s": LAUNCH_TIMEOUT_S,
            "pairs": section["pairs"], "memory": section["memory"],
            "generators": section.get("generators", {}),
            "missing": p["missing"], "runtime": runtime, "composition": task_bodies(p["dispatch"]),
            "composition_kind": p["composition"]}

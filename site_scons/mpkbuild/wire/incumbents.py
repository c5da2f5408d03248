"""The MPK tasks a kernel is judged against inside the runtime: the incumbents.

An incumbent is the task MPK's own Python builder registers for the same op on a Hopper
checkout (persistent_kernel.py's layer -> graph.cc's name -> a TaskRegister function in
src/kernel/task_register.cc). The call it is dispatched with is read from that register
function's text in the checkout (its CodeKeeper lines, `$` for each value), never written
here: what this table holds is what the text cannot say, i.e. the values the function
computes from the graph's tensor dims, in its order, at a shape, and how the layer splits
the tensors over its grid. A checkout whose register function is missing, or takes another
number of values, has no incumbent of that name ("not on this checkout", with the reason).

Standard library only (the build side).
"""
from __future__ import annotations

import fnmatch
import functools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

REGISTER_FILE = "src/kernel/task_register.cc"


class NoIncumbent(Exception):
    """This incumbent cannot run at this shape or on this checkout; the message says why."""


@dataclass(frozen=True)
class Incumbent:
    name: str                 # what a spec's runtime.incumbent[].task names
    op: str                   # the spec `op` it stands in for
    registers: tuple[str, ...]  # TaskRegister functions, one per layer, in graph order
    doc: str                  # where MPK's builder picks it and how it partitions
    params: dict = field(default_factory=dict)   # param -> what it means (spec-settable)
    skip: tuple[str, ...] = ()    # CodeKeeper lines of a branch the builder does not take
    task_type: str | None = None  # of a function that registers several, the branch's one
    headers: tuple[str, ...] = ()   # its task headers under include/mirage/persistent_kernel
    runtime: str = "v1"       # the runtime whose gate runs it (v2: a Runtime-V2 task)
    # a fused op's incumbent: the MPK tasks MPK's builder runs for it, in order (each after
    # the first takes the output of the part before as its input 0); registers, params and
    # headers are theirs. feeds: per part, the fused op's inputs it takes, in its order
    # (after the part before's output, for every part but the first)
    parts: tuple[str, ...] = ()
    feeds: tuple[tuple[int, ...], ...] = ()


def grid_for_rmsnorm_linear_layer(size: int) -> int:
    """MPK's models/utils.py rule for the gate|up linear's grid (qwen3 builder)."""
    if size / 96 > 400:
        return size // 256
    for n in (96, 64):
        if size % n == 0:
            return n
    raise NoIncumbent(f"MPK's grid_for_rmsnorm_linear_layer has no grid for {size}")


TABLE: dict[str, Incumbent] = {i.name: i for i in (
    Incumbent("rmsnorm_hopper", "rmsnorm", ("register_rmsnorm_hopper_task",),
              "rmsnorm_layer on sm_90 registers 'rmsnorm_hopper'; the builders give it "
              "grid (max_num_batched_tokens): one row per task",
              {"rows_per_task": "rows each task normalises (default 1, as the builders)"},
              headers=('tasks/hopper/rmsnorm_hopper.cuh',)),
    Incumbent("silu_mul", "silu_mul", ("register_silu_mul_task",),
              "silu_mul_layer on sm_90 registers 'silu_mul' (the Ampere-named task, all of "
              "the worker's threads); the qwen3 builder's grid is "
              "grid_for_rmsnorm_linear_layer(2 * inter) // 2 column tiles, each tile's gate "
              "and up halves side by side (its gate|up weight is shuffled to match)",
              {"tasks": "column tiles (default: the qwen3 builder's)"},
              headers=('tasks/ampere/silu_mul.cuh',)),
    Incumbent("silu_mul_hopper", "silu_mul", ("register_silu_mul_hopper_task",),
              "the Hopper task graph.cc maps 'silu_mul_hopper' to (128 consumer threads); "
              "no builder layer asks for it on the pinned tree; tiles as silu_mul",
              {"tasks": "column tiles (default: the qwen3 builder's)"},
              headers=('tasks/hopper/silu_mul_hopper.cuh',)),
    Incumbent("embedding", "embedding", ("register_embedding_task",),
              "embed_layer on sm_90 registers 'embedding' (the Ampere-named task) with "
              "input_source=1 (ids from an input tensor); the qwen3 builder's grid is (1, 1): "
              "one task gathers every token's whole row",
              {"grid": "[column tiles, token groups] (default [1, 1], as the builder)"},
              skip=("    runtime_config.tokens + runtime_config.step[0], ",),
              headers=('tasks/ampere/embedding.cuh',)),
    Incumbent("embedding_hopper", "embedding", ("register_embedding_hopper_task",),
              "the Hopper task graph.cc maps 'embedding_hopper' to (128 consumer threads); "
              "no builder layer asks for it on the pinned tree; input_source=1",
              {"grid": "[column tiles, token groups] (default [1, 1], as the builder)"},
              skip=("    runtime_config.tokens + runtime_config.step[0], ",),
              headers=('tasks/hopper/embedding_hopper.cuh',)),
    Incumbent("argmax_hopper", "argmax", ("register_argmax_partial_sm100_task",
                                          "register_argmax_reduce_task"),
              "argmax_partial_layer on sm_90 registers 'argmax_partial_sm100' over grid "
              "(num_workers) column chunks, then argmax_reduce_layer 'argmax_reduce' in one "
              "task (the qwen3 builder)",
              {"tasks": "partial tasks (default 128: MPK's worker count at 132-159 SMs)"},
              headers=('tasks/blackwell/argmax_sm100.cuh', 'tasks/ampere/argmax.cuh')),
    # Runtime-V2 (the v2 prototype's persistent_kernel.py with use_v2_runtime=True): the
    # same layers register the v2 task names, with the v1 builders' grids
    Incumbent("rmsnorm_hopper_v2", "rmsnorm", ("register_rmsnorm_hopper_v2_task",),
              "rmsnorm_layer with use_v2_runtime registers 'rmsnorm_hopper_v2' (the first 128 "
              "threads, named barrier 2); one row per task, as the builders",
              headers=("tasks/blackwell_v2/rmsnorm_v2.cuh",), runtime="v2"),
    Incumbent("silu_mul_v2", "silu_mul", ("register_silu_mul_v2_task",),
              "silu_mul_layer with use_v2_runtime registers 'silu_mul_v2' (128 consumer "
              "threads); tiles as silu_mul",
              {"tasks": "column tiles (default: the qwen3 builder's)"},
              headers=("tasks/blackwell_v2/silu_mul_v2.cuh",), runtime="v2"),
    Incumbent("embedding_v2", "embedding", ("register_embedding_v2_task",),
              "embed_layer with use_v2_runtime registers 'embedding_v2' (128 consumer "
              "threads) with input_source=1; grid (1, 1) as the qwen3 builder",
              {"grid": "[column tiles, token groups] (default [1, 1], as the builder)"},
              skip=("    runtime_config.tokens + runtime_config.step[0], ",),
              headers=("tasks/blackwell_v2/embedding_v2.cuh",), runtime="v2"),
    Incumbent("argmax_sm100_v2", "argmax", ("register_argmax_partial_sm100_v2_task",
                                            "register_argmax_reduce_sm100_v2_task"),
              "argmax_partial_layer with use_v2_runtime registers 'argmax_partial_sm100_v2' over "
              "grid (num_workers) column chunks, then argmax_reduce_layer 'argmax_reduce_sm100_v2' "
              "in one task",
              {"tasks": "partial tasks (default 128: MPK's worker count at 132-159 SMs)"},
              headers=("tasks/blackwell_v2/argmax_sm100.cuh",), runtime="v2"),
    Incumbent("linear_swapAB_hopper", "linear", ("register_linear_swapAB_hopper_task",),
              "linear_layer on sm_90 registers 'linear_swapAB_hopper' (a TMA producer warpgroup "
              "and a wgmma consumer, W as the A operand); the qwen3 builder's grid is "
              "grid_for_rmsnorm_linear_layer(n) output slices; its TMA descriptors are made on "
              "the host per task by the checkout's create_tma_desc_by_task, as MPK's generated "
              "init makes them",
              {"tasks": "output slices (default: grid_for_rmsnorm_linear_layer(n), the qwen3 builder's)"},
              skip=("using TMA_RESIDUAL = kernel::tma::tma_2d<bfloat16, $, $, $, $, $, $, "
                    "$, $, $, $, $, $, true>;",
                    "TMA_RESIDUAL tma_residual(static_cast<CUtensorMap*>(task_desc->input_tma_desc_"
                    "ptrs[2][0]));",
                    "    &tma_residual,", "    runtime_config.my_gpu_id == 0"),
              task_type="TASK_LINEAR_SWAPAB_HOPPER",
              headers=('tasks/hopper/linear_swapAB_hopper.cuh',)),
    Incumbent("linear_swapAB_with_residual_hopper", "linear_with_residual",
              ("register_linear_swapAB_hopper_task",),
              "linear_with_residual_layer on sm_90 registers 'linear_swapAB_with_residual_hopper' "
              "(the same task adding the residual in its epilogue); the qwen3 builder gives "
              "o_proj and down_proj grid hidden // 64",
              {"tasks": "output slices (default: grid_for_rmsnorm_linear_layer(n); the qwen3 builder's hidden // 64 at hidden 4096)"},
              skip=("    nullptr,", "    false/*residual*/"),
              task_type="TASK_LINEAR_SWAPAB_WITH_RESIDUAL_HOPPER",
              headers=('tasks/hopper/linear_swapAB_hopper.cuh',)),
)}


def _chain(name: str, op: str, parts: tuple[str, ...], feeds: tuple[tuple[int, ...], ...],
           doc: str) -> Incumbent:
    """A fused op's incumbent: the chain of MPK tasks the builder runs where our one task
    runs (one of them a linear). Its params are its parts', each named `<part's op>.<param>`
    (silu_mul and the linear both have a `tasks`)."""
    members = [TABLE[p] for p in parts]
    params = {f"{i.op}.{k}": v for i in members for k, v in i.params.items()}
    return Incumbent(name, op, tuple(r for i in members for r in i.registers), doc, params,
                     headers=tuple(dict.fromkeys(h for i in members for h in i.headers)),
                     runtime=members[0].runtime, parts=parts, feeds=feeds)


# MPK's builders on Hopper run these fused ops as separate layers (the qwen3 builder:
# rmsnorm_layer then linear_layer for the gate|up projection, silu_mul_layer then
# linear_with_residual_layer for the down projection), though persistent_kernel.py has the
# fused layers (rmsnorm_linear_layer, silu_mul_linear_with_residual_layer) for other archs
TABLE.update({i.name: i for i in (
    _chain("rmsnorm_hopper_then_linear_swapAB_hopper", "rmsnorm_linear",
           ("rmsnorm_hopper", "linear_swapAB_hopper"), ((0, 2), (1,)),
           "the qwen3 builder's post-attention norm and gate|up projection on sm_90: "
           "rmsnorm_hopper (one row a task) writes the normalised x, then "
           "linear_swapAB_hopper reads it whole in each of its output slices"),
    _chain("silu_mul_then_linear_swapAB_with_residual_hopper", "silu_mul_linear_with_residual",
           ("silu_mul", "linear_swapAB_with_residual_hopper"), ((0,), (1, 2)),
           "the qwen3 builder's silu_mul and down projection on sm_90: silu_mul's column tiles "
           "write silu(gate) * up, then linear_swapAB_with_residual_hopper reads it whole in "
           "each of its output slices and adds the residual"),
    _chain("rmsnorm_hopper_then_linear_swapAB_hopper_then_silu_mul", "rmsnorm_linear_silu_mul",
           ("rmsnorm_hopper", "linear_swapAB_hopper", "silu_mul"), ((0, 2), (1,), ()),
           "the qwen3 builder's post-attention norm, gate|up projection and silu_mul on sm_90: "
           "rmsnorm_hopper, then linear_swapAB_hopper over the gate|up weight its rows shuffled "
           "into silu_mul's tiles (shuffle_tensors), then silu_mul's column tiles, each waiting "
           "only for the linear's slices of its tile (MPK's events)"),
)})


def known(op: str | None = None) -> str:
    """The incumbents' names (of one op's), for a message that names a wrong one."""
    return ", ".join(n for n, i in TABLE.items() if op is None or i.op == op) or "none"


def stands_for(op: str) -> set[str]:
    """The ops a kernel of `op` replaces in a model's step: its own, and a fused op's parts'."""
    return {op, *(TABLE[p].op for i in TABLE.values() if i.op == op for p in i.parts)}


# ---------------------------------------------------------------- the checkout's text
_FUNC = re.compile(r"^int TaskRegister::(\w+)\(", re.M)
_EMIT = re.compile(r'code\.e\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+)(?:,([^;]*?))?\)\s*;', re.S)
_VARIANT = re.compile(r"register_task_variant\(\s*(TASK_\w+)\s*,")


def register_text(checkout_root: Path) -> str | None:
    path = Path(checkout_root) / REGISTER_FILE
    return path.read_text(errors="replace") if path.is_file() else None


def register_function(text: str, name: str) -> tuple[list[str], list[str]]:
    """(the CodeKeeper lines, the task types it registers) of TaskRegister::<name>."""
    bodies = _register_bodies(text)
    if name not in bodies:
        raise NoIncumbent(f"TaskRegister::{name} is not in {REGISTER_FILE}")
    lines, types = bodies[name]
    return list(lines), list(types)


@functools.lru_cache(maxsize=4)
def _register_bodies(text: str) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """Every TaskRegister function of one task_register.cc, read once: planning asks for
    an incumbent's once per graph of every megakernel (~500 times for this catalog)."""
    starts = [(m.start(), m.group(1)) for m in _FUNC.finditer(text)]
    out = {}
    for i, (pos, fn) in enumerate(starts):
        if fn in out:
            continue                  # the first definition, as the scan always took
        body = text[pos:starts[i + 1][0] if i + 1 < len(starts) else len(text)]
        lines = tuple("".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1))) for m in _EMIT.finditer(body))
        out[fn] = (lines, tuple(_VARIANT.findall(body)))
    return out


def call_lines(text: str, register: str, values: list, skip: tuple[str, ...] = (),
               task_type: str | None = None) -> tuple[list[str], str]:
    """The dispatch call TaskRegister::<register> emits for these values, and its task type
    (`task_type`, where the function registers one per branch)."""
    lines, types = register_function(text, register)
    lines = [l for l in lines if l not in skip]
    holes = sum(l.count("$") for l in lines)
    if holes != len(values):
        raise NoIncumbent(f"TaskRegister::{register} emits {holes} values on this checkout; "
                          f"the incumbent table knows {len(values)}")
    if task_type is not None:
        if task_type not in types:
            raise NoIncumbent(f"TaskRegister::{register} registers {types or 'no task type'}, "
                              f"not {task_type}")
        types = [task_type]
    if len(set(types)) != 1:
        raise NoIncumbent(f"TaskRegister::{register} registers {types or 'no task type'}: "
                          "not one task type")
    out, it = [], iter(values)
    for line in lines:
        while "$" in line:
            line = line.replace("$", str(next(it)), 1)
        out.append(line)
    return out, types[0]


# ---------------------------------------------------------------- layouts per incumbent
# A layout: the incumbent's tensor table (recipes the runner makes from our tensors) and
# its layers (values for the register text, grid, tensors and per-task byte strides).
#   {"use": "input", "index": i}                 our input i itself (the same buffer)
#   {"use": "gate_up_tiles", "index": i, "tiles": T}   our [rows, 2*inter] (gate then up)
#                                                 as MPK's tiles (gate tile t, up tile t, ...)
#   {"use": "int64", "index": i}                 our integer input i widened to int64
#   {"use": "output", "index": j}                our output j's shape and dtype, its own buffer
#                                                 (compare_values_of: i -- an index into our
#                                                 input i's last dim, compared by the value)
#   {"use": "scratch", "shape": [...], "dtype": d}
def _rmsnorm(shapes, p):
    rows, hidden = shapes["inputs"][0]
    b = int(p.get("rows_per_task", 1))
    if rows % b:
        raise NoIncumbent(f"rows_per_task {b} does not divide {rows} rows")
    # its static_asserts: 256 threads share the row in 4-, 8- or 16-byte copies that tile it
    per_thread = hidden // 256 * 2
    copy = next((c for c in (16, 8, 4) if per_thread % c == 0), None)
    if hidden % 256 or copy is None or hidden % (256 * copy // 2):
        raise NoIncumbent(f"rms_norm_hopper_impl's static_asserts refuse hidden {hidden}")
    return _rows_of_rmsnorm(rows, hidden, b)


def _rows_of_rmsnorm(rows: int, hidden: int, b: int):
    """An rmsnorm incumbent's tensors and layer: b rows of input and output a task, the
    whole weight in each (bf16)."""
    tensors = [{"use": "input", "index": 0}, {"use": "input", "index": 1},
               {"use": "output", "index": 0}]
    row = b * hidden * 2
    return tensors, [{"values": [b, hidden], "grid": [rows // b, 1], "inputs": [0, 1],
                      "outputs": [2], "stride": [[row, 0], [0, 0], [row, 0]],
                      "active_tokens": rows}]


def _silu_mul(shapes, p):
    shape = shapes["inputs"][0]
    rows, inter = shape[0], math.prod(shape[1:]) // 2
    tasks = int(p["tasks"]) if "tasks" in p else grid_for_rmsnorm_linear_layer(2 * inter) // 2
    if inter % tasks:
        raise NoIncumbent(f"{tasks} tiles do not divide inter {inter}")
    o = inter // tasks
    tensors = [{"use": "gate_up_tiles", "index": 0, "tiles": tasks}, {"use": "output", "index": 0}]
    return tensors, [{"values": [rows, o, 2 * inter, inter], "grid": [tasks, 1], "inputs": [0],
                      "outputs": [1], "stride": [[2 * o * 2, 0], [o * 2, 0]],
                      "active_tokens": rows}]


def _embedding(shapes, p):
    (rows,), (_, hidden) = shapes["inputs"][0], shapes["inputs"][1]
    gx, gy = (int(x) for x in p.get("grid", [1, 1]))
    if hidden % gx or rows % gy:
        raise NoIncumbent(f"grid [{gx}, {gy}] does not divide hidden {hidden} x rows {rows}")
    if rows // gy > 64:
        raise NoIncumbent(f"{rows // gy} tokens per task: the task unrolls its token loop "
                          "(set runtime.incumbent[].params.grid)")
    chunk, b = hidden // gx, rows // gy
    tensors = [{"use": "int64", "index": 0}, {"use": "input", "index": 1},
               {"use": "output", "index": 0}]
    return tensors, [{"values": [b, chunk, hidden], "grid": [gx, gy], "inputs": [0, 1],
                      "outputs": [2], "stride": [[0, b * 8], [chunk * 2, 0],
                                                 [chunk * 2, b * hidden * 2]],
                      "active_tokens": rows}]


def _argmax(shapes, p):
    rows, vocab = shapes["inputs"][0]
    tasks = int(p.get("tasks", 128))
    if vocab % tasks:
        raise NoIncumbent(f"{tasks} partial tasks do not divide vocab {vocab}")
    chunk = vocab // tasks
    tensors = [{"use": "input", "index": 0},
               {"use": "scratch", "shape": [rows, tasks], "dtype": "bf16"},
               {"use": "scratch", "shape": [rows, tasks], "dtype": "int64"},
               # an index is judged by the value it picks: on a tie either index is right
               {"use": "output", "index": 0, "compare_values_of": 0}]
    return tensors, [
        {"values": [rows, chunk, tasks], "grid": [tasks, 1], "inputs": [0], "outputs": [1, 2],
         "stride": [[chunk * 2, 0], [2, 0], [8, 0]], "active_tokens": rows},
        {"values": [rows, chunk, tasks], "grid": [1, 1], "inputs": [1, 2], "outputs": [3],
         "stride": [[0, 0], [0, 0], [0, 0]], "active_tokens": rows}]


def _rmsnorm_v2(shapes, p):
    rows, hidden = shapes["inputs"][0]
    # its static_asserts: one row (BATCH_SIZE 1), 128 threads tiling the row in 4-, 8- or
    # 16-byte copies
    per_thread = hidden // 128 * 2
    if hidden % 128 or per_thread % 4:
        raise NoIncumbent(f"kernel::rmsnorm_v2::rms_norm_task's static_asserts refuse hidden {hidden}")
    return _rows_of_rmsnorm(rows, hidden, 1)


def _linear_swapab(shapes, p):
    return _swapab(shapes, p, residual=False)


def _linear_swapab_residual(shapes, p):
    return _swapab(shapes, p, residual=True)


def _swapab(shapes, p, residual: bool):
    """linear_swapAB_hopper's layout: y = x W^T (+ the residual, linear_with_residual_layer's
    branch of the same register function)."""
    (m, k), (n, _) = shapes["inputs"][:2]
    tasks = int(p["tasks"]) if "tasks" in p else grid_for_rmsnorm_linear_layer(n)
    if n % tasks:
        raise NoIncumbent(f"{tasks} output slices do not divide n {n}")
    if m > 16:
        raise NoIncumbent(f"linear_swapAB_kernel_hopper asserts batch <= 16 (m is {m})")
    out = n // tasks
    # the register function's constants: 3-3-3 swizzle, 64-column TMA copies over a
    # 128-wide K tile (2 copies), W in 64-row atoms, the batch padded to 8 or 16 in SMEM,
    # 5 stages, no split K; the residual's copies unswizzled, as it declares them
    smem_m, out_cp = (8 if m <= 8 else 16), min(out, 64)
    values = [3, 3, 3, m, k, m, 64, k, 1, 1, 2, smem_m * 64,          # TMA_B: x
              3, 3, 3, out, k, 64, 64, k, 1, 1, 2, 64 * 64]           # TMA_A: this task's W rows
    if residual:
        values += [0, 0, 0, m, out, m, out_cp, n, 1, 1, 1, smem_m * out_cp]   # TMA_RESIDUAL
    values += [3, 3, 3, m, out, m, out_cp, n, 1, 1, 1, smem_m * out_cp,     # TMA_OUT: its y columns
               m, out, k, 5, "TMA_RESIDUAL" if residual else "void", n, "false"]
    ins = [0, 1, 2] if residual else [0, 1]
    tensors = [{"use": "input", "index": i} for i in ins] + [{"use": "output", "index": 0}]
    # the per-task tensors the host-side descriptors are made from (create_tma_desc_by_task
    # reads each TensorDesc's dims and row stride): x whole, W's, the residual's and y's slices
    dims = [[m, k], [out, k]] + [[m, out]] * (len(ins) - 1)       # x, W, (the residual,) y
    return tensors, [{"values": values, "grid": [tasks, 1], "inputs": ins, "outputs": [len(ins)],
                      "stride": [[0, 0], [out * k * 2, 0]] + [[out * 2, 0]] * (len(ins) - 1),
                      "active_tokens": m,
                      "tma": {"dims": dims, "row_stride": [k, k] + [n] * (len(ins) - 1)}}]


LAYOUTS = {"rmsnorm_hopper": _rmsnorm, "silu_mul": _silu_mul, "silu_mul_hopper": _silu_mul,
           "embedding": _embedding, "embedding_hopper": _embedding, "argmax_hopper": _argmax,
           "rmsnorm_hopper_v2": _rmsnorm_v2, "silu_mul_v2": _silu_mul, "embedding_v2": _embedding,
           "argmax_sm100_v2": _argmax, "linear_swapAB_hopper": _linear_swapab,
           "linear_swapAB_with_residual_hopper": _linear_swapab_residual}


def _part_params(part: Incumbent, p: dict) -> dict:
    prefix = part.op + "."
    return {k[len(prefix):]: v for k, v in p.items() if k.startswith(prefix)}


# the shape a chain's inner part writes (the last part writes the fused op's output)
_WRITES = {"rmsnorm": lambda ins: ins[0],
           "linear": lambda ins: [ins[0][0], ins[1][0]],
           "silu_mul": lambda ins: [ins[0][0], math.prod(ins[0][1:]) // 2]}


def _part_shapes(inc: Incumbent, shapes: dict) -> list[dict]:
    """The shapes each part of a chain sees: the first takes its feeds, each later one the
    part before's output and its feeds; the last writes the fused op's outputs."""
    ins, out, before = shapes["inputs"], [], None
    for i, (name, feeds) in enumerate(zip(inc.parts, inc.feeds)):
        part_ins = ([] if before is None else [before]) + [ins[j] for j in feeds]
        last = i + 1 == len(inc.parts)
        writes = shapes["outputs"] if last else [_WRITES[TABLE[name].op](part_ins)]
        out.append({"inputs": part_ins, "outputs": writes})
        before = writes[0]
    return out


def takes_what_came_before(recipe: dict, tensors: list[dict], weight: int | None, reader: str) -> bool:
    """Whether `recipe` is the input 0 a layer takes from the one before it (in a chain or a
    block): True, and where it reads it in gate|up tiles, the weight of the linear before
    (its index in `tensors`) is marked shuffled into them, as MPK's builder shuffles it."""
    if recipe.get("index") != 0 or recipe["use"] not in ("input", "gate_up_tiles"):
        return False
    if recipe["use"] == "gate_up_tiles":
        if weight is None:
            raise NoIncumbent(f"{reader} reads its input in gate|up tiles, which only a linear "
                              "before it writes (its weight rows shuffled)")
        tensors[weight] = {**tensors[weight], "use": "gate_up_rows", "tiles": recipe["tiles"]}
    return True


def _fused(inc: Incumbent, shapes: dict, p: dict):
    """A chain's layout: each part's tensors and layers, an inner part's output a scratch
    tensor (MPK's intermediate, never compared) that the next part takes as its input 0.
    A silu_mul after a linear reads it in tiles, for which MPK's builder shuffles the
    linear's weight rows (gate_up_rows)."""
    tensors, layers = [], []
    before = weight = None         # where the part before's output (and a linear's weight) are
    for i, (name, feeds, s_part) in enumerate(zip(inc.parts, inc.feeds, _part_shapes(inc, shapes))):
        part = TABLE[name]
        t, lay = LAYOUTS[name](s_part, _part_params(part, p))
        last = i + 1 == len(inc.parts)
        at = []
        for r in t:
            if before is not None and takes_what_came_before(r, tensors, weight, name):
                at.append(before)
                continue
            at.append(len(tensors))
            if r["use"] == "output" and not last:
                tensors.append({"use": "scratch", "shape": s_part["outputs"][0], "dtype": "bf16"})
            elif r["use"] != "output" and "index" in r:
                # the part's input index: after the part before's output, its feeds in order
                tensors.append({**r, "index": feeds[r["index"] - (before is not None)]})
            else:
                tensors.append(r)
        layers += [{**l, "inputs": [at[j] for j in l["inputs"]], "outputs": [at[j] for j in l["outputs"]]}
                   for l in lay]
        before = at[next(j for j, r in enumerate(t) if r["use"] == "output")]
        weight = (at[next(j for j, r in enumerate(t) if r["use"] == "input" and r["index"] == 1)]
                  if part.op == "linear" else None)
    return tensors, layers


def _weight_of(inc: Incumbent, tensors: list[dict]) -> int | None:
    """Where a linear's (or a chain ending in one) weight is in its layout's tensors: a
    silu_mul after it makes MPK's builder shuffle its rows (a linear_layer's only, as the
    gate|up projection's; never a linear_with_residual's)."""
    last = TABLE[inc.parts[-1]] if inc.parts else inc
    if last.op != "linear":
        return None
    at = inc.feeds[-1][0] if inc.parts else 1
    return next(j for j, r in enumerate(tensors) if r["use"] == "input" and r["index"] == at)


LAYOUTS.update({name: (lambda shapes, p, name=name: _fused(TABLE[name], shapes, p))
                for name, i in TABLE.items() if i.parts})

# ---------------------------------------------------------------- the incumbent at its best
# Beside the builder's default, the values of its own parameters an incumbent is also timed
# at (issue 59 item 7): "faster than MPK's task" needs MPK's task at its fastest, not only at
# what the builder happens to pick. A few each, near the worker count (128 at 132-159 SMs):
# every one is another setup and another side of every round.
MAX_ALTERNATIVES = 3
WORKERS = 128


def _near_workers(values: list[int], default: int) -> list[int]:
    return sorted((v for v in set(values) if v != default),
                  key=lambda v: abs(math.log(v / WORKERS)))[:MAX_ALTERNATIVES]


def _linear_tasks(shapes, p) -> list[dict]:
    """Output slices of 64, 128, 256 or 512 rows (whole 64-row TMA atoms of W)."""
    n = shapes["inputs"][1][0]
    default = int(p["tasks"]) if "tasks" in p else grid_for_rmsnorm_linear_layer(n)
    return [{"tasks": t} for t in _near_workers([n // out for out in (64, 128, 256, 512)
                                                  if n % out == 0], default)]


def _rmsnorm_rows(shapes, p) -> list[dict]:
    rows, default = shapes["inputs"][0][0], int(p.get("rows_per_task", 1))
    return [{"rows_per_task": b} for b in (1, 2, 4, 8, 16) if rows % b == 0 and b != default][:MAX_ALTERNATIVES]


def _silu_tiles(shapes, p) -> list[dict]:
    inter = math.prod(shapes["inputs"][0][1:]) // 2
    default = int(p["tasks"]) if "tasks" in p else grid_for_rmsnorm_linear_layer(2 * inter) // 2
    return [{"tasks": t} for t in _near_workers([t for t in (default // 2, default * 2, 64, 96, 128, 256)
                                                  if t >= 1 and inter % t == 0], default)]


def _argmax_tasks(shapes, p) -> list[dict]:
    vocab, default = shapes["inputs"][0][1], int(p.get("tasks", WORKERS))
    return [{"tasks": t} for t in _near_workers([t for t in (64, 96, 192, 256) if vocab % t == 0], default)]


ALTERNATIVES = {"linear_swapAB_hopper": _linear_tasks, "linear_swapAB_with_residual_hopper": _linear_tasks,
                "rmsnorm_hopper": _rmsnorm_rows,
                "silu_mul": _silu_tiles, "silu_mul_hopper": _silu_tiles, "argmax_hopper": _argmax_tasks}


def _chain_tasks(inc: Incumbent, shapes: dict, p: dict) -> list[dict]:
    """A chain at its best is its linear's other task counts: the linear is where its time is."""
    i, linear = next((i, TABLE[n]) for i, n in enumerate(inc.parts) if TABLE[n].op.startswith("linear"))
    return [{f"{linear.op}.{k}": v for k, v in alt.items()}
            for alt in ALTERNATIVES.get(linear.name, lambda *_: [])(_part_shapes(inc, shapes)[i],
                                                                   _part_params(linear, p))]


ALTERNATIVES.update({name: (lambda shapes, p, name=name: _chain_tasks(TABLE[name], shapes, p))
                     for name, i in TABLE.items() if i.parts})


def best_candidates(name: str, shapes: dict, params: dict) -> list[dict]:
    """The incumbent's other configurations worth timing at these shapes (its parameters
    over the rule's), each one its layout accepts; none for an incumbent without any."""
    out = []
    for alt in ALTERNATIVES.get(name, lambda *_: [])(shapes, params):
        values = {**params, **alt}
        try:
            LAYOUTS[name](shapes, values)
        except NoIncumbent:
            continue
        out.append(values)
    return out


def config_text(params: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(params.items()))


# what each op's incumbent reads from the spec's tensors, in order (dtypes MPK's tasks take)
EXPECTS = {"rmsnorm": (("bf16", "bf16"), ("bf16",)), "silu_mul": (("bf16",), ("bf16",)),
           "embedding": ((None, "bf16"), ("bf16",)), "argmax": (("bf16",), ("int64",)),
           "linear": (("bf16", "bf16"), ("bf16",)),
           "linear_with_residual": (("bf16", "bf16", "bf16"), ("bf16",))}


def layout(name: str, op: str, shapes: dict, dtypes: dict, params: dict, text: str | None) -> dict:
    """The incumbent `name`'s graph at one variant's shapes: {"tensors", "layers"} with each
    layer's call (from the checkout's text) and task type. Raises NoIncumbent."""
    inc = TABLE.get(name)
    if inc is None:
        raise NoIncumbent(f"no incumbent named {name!r} (known for op {op}: {known(op)})")
    if inc.op != op:
        raise NoIncumbent(f"{name} stands in for op {inc.op!r}, the spec's op is {op!r}")
    _check_dtypes(inc, dtypes)
    if text is None:
        raise NoIncumbent(f"the checkout has no {REGISTER_FILE}")
    tensors, layers = LAYOUTS[name](shapes, params)
    _with_calls(inc, layers, text)
    return {"incumbent": name, "tensors": tensors, "layers": layers, "headers": list(inc.headers),
            "weight": _weight_of(inc, tensors)}


def _with_calls(inc: Incumbent, layers: list[dict], text: str) -> list[dict]:
    """Each layer given the call its register function emits for its values."""
    owners = [(TABLE[p], r) for p in inc.parts for r in TABLE[p].registers] or \
        [(inc, r) for r in inc.registers]
    for (owner, reg), lay in zip(owners, layers):
        lay["call"], lay["task_type"] = call_lines(text, reg, lay.pop("values"), owner.skip,
                                                   owner.task_type)
        lay["register"] = reg
    return layers


def task_calls(name: str, shapes: dict, params: dict, text: str) -> list[dict]:
    """The calls (register, call, task type) incumbent `name` is dispatched with at these
    shapes, its tensors aside: a model's task compiled into the worker, not run."""
    return _with_calls(TABLE[name], LAYOUTS[name](shapes, params)[1], text)


# ---------------------------------------------------------------- the spec's runtime section
def rules_for(spec: dict, variant: str, runtime: str | None = None) -> tuple[list[dict], str | None]:
    """(the incumbent rules of one variant, why it has none): a matching `task: none` rule
    leaves it none, with that rule's `why`. With a runtime, only its incumbents (a task
    this table does not know stays, so that its run says why it cannot)."""
    rules = [r for r in spec["runtime"]["incumbent"] if fnmatch.fnmatch(variant, r["variants"])]
    for r in rules:
        if r["task"] == "none":
            return [], r.get("why") or "the spec says there is none"
    if runtime is not None:
        rules = [r for r in rules if r["task"] not in TABLE or TABLE[r["task"]].runtime == runtime]
        if not rules:
            return [], f"the spec names no {runtime} incumbent (runtime.incumbent)"
    return rules, (None if rules else "the spec names none (runtime.incumbent)")


BLOCK_PREFIX = "block:"


def block_graph_name(block: dict, batch: int) -> str:
    """A block's graph at one batch, as the gate, its thresholds and the review name it."""
    return f"{BLOCK_PREFIX}{block['name']}:b{batch}"


def block_graph_names(spec: dict, runtime: str | None = None) -> list[str]:
    """The graphs the spec's runtime.blocks make (one per block and batch); with a runtime,
    those of the blocks whose incumbents' chain runs on it (block_runtime)."""
    return [block_graph_name(b, m) for b in spec.get("runtime", {}).get("blocks", [])
            if runtime is None or block_runtime(b) == runtime for m in b["batches"]]


def matching(glob: str, names: list[str]) -> list[str]:
    """The graphs a runtime.thresholds glob judges: `block:...` globs the blocks' graphs,
    any other glob the variants (so `*` is every variant, `block:*` every block graph)."""
    return [n for n in fnmatch.filter(names, glob)
            if n.startswith(BLOCK_PREFIX) == glob.startswith(BLOCK_PREFIX)]


def _block_runtimes(block: dict) -> set[str]:
    """The runtimes of a block's layers' known incumbents."""
    return {TABLE[l["incumbent"]].runtime for l in block["layers"] if l["incumbent"] in TABLE}


def block_runtime(block: dict) -> str | None:
    """The runtime a block's incumbents' chain runs on: its layers' incumbents' (one, as
    check_section holds them), None where one is unknown."""
    found = _block_runtimes(block)
    return found.pop() if len(found) == 1 and all(l["incumbent"] in TABLE for l in block["layers"]) else None


def variant_shapes(spec: dict, variant: str) -> tuple[dict, dict]:
    """({"inputs": [shape], "outputs": [shape]}, the same with dtypes) for one variant."""
    from mpkbuild.util.expr import tensor_shape, variant_symbols
    cg = spec["codegen"]
    sym = variant_symbols(cg, variant)
    shapes = {kind: [tensor_shape(t, sym) for t in cg[kind]] for kind in ("inputs", "outputs")}
    dtypes = {kind: [t["dtype"] for t in cg[kind]] for kind in ("inputs", "outputs")}
    return shapes, dtypes


def check_section(data: dict):
    """(field path, message) for each problem of spec['runtime'] a checkout cannot change:
    an unknown task, another op's, params it does not take, a shape it refuses."""
    section = data["runtime"]
    variants = list(data["codegen"]["variants"])
    for i, rule in enumerate(section["incumbent"]):
        where = ("runtime", "incumbent", i)
        matched = fnmatch.filter(variants, rule["variants"])
        if not matched:
            yield where + ("variants",), f"{rule['variants']!r} matches no variant"
        if rule["task"] == "none":
            if "params" in rule:
                yield where + ("params",), "task: none takes no params"
            continue
        inc = TABLE.get(rule["task"])
        if inc is None:
            yield where + ("task",), (f"no incumbent named {rule['task']!r} (known for op "
                                       f"{data['op']}: {known(data['op'])}, none)")
            continue
        if inc.op != data["op"]:
            yield where + ("task",), f"{inc.name} stands in for op {inc.op!r}, this spec's op is {data['op']!r}"
            continue
        unknown = sorted(set(rule.get("params", {})) - set(inc.params))
        if unknown:
            yield where + ("params", unknown[0]), (f"{inc.name} takes no param {unknown[0]!r}"
                                                   f" (it takes: {', '.join(inc.params) or 'none'})")
            continue
        for v in matched:
            shapes, dtypes = variant_shapes(data, v)
            try:
                _check_dtypes(inc, dtypes)
                LAYOUTS[inc.name](shapes, rule.get("params", {}))
            except NoIncumbent as exc:
                yield where, f"variant {v}: {exc}"
                break
            except (TypeError, ValueError, KeyError) as exc:
                yield where + ("params",), f"variant {v}: {exc!r}"
                break
    blocks = block_graph_names(data)
    for i, block in enumerate(section.get("blocks", [])):
        where = ("runtime", "blocks", i)
        if block["name"] in [b["name"] for b in section["blocks"][:i]]:
            yield where + ("name",), f"a second block named {block['name']!r}"
        runtimes = sorted(_block_runtimes(block))
        if len(runtimes) > 1:
            yield where + ("layers",), (f"the layers' incumbents are tasks of {' and '.join(runtimes)}: "
                                        "a chain runs on one runtime")
        for j, layer in enumerate(block["layers"]):
            if layer["incumbent"] not in TABLE:
                yield where + ("layers", j, "incumbent"), (f"no incumbent named {layer['incumbent']!r} "
                                                           f"(known: {known()})")
            try:
                layer["variant"].format(batch=1)
            except (KeyError, IndexError, ValueError) as exc:
                yield where + ("layers", j, "variant"), (f"{layer['variant']!r}: only {{batch}} is "
                                                         f"replaced ({exc!r})")
    for i, rule in enumerate(section["thresholds"]):
        where = ("runtime", "thresholds", i)
        matched = matching(rule["variants"], variants)
        if rule["variants"].startswith(BLOCK_PREFIX):
            if not matching(rule["variants"], blocks):
                yield where + ("variants",), f"{rule['variants']!r} matches no block graph ({', '.join(blocks) or 'none'})"
            elif "incumbent" in rule:
                yield where + ("incumbent",), "a block graph has one incumbent, its chain: no `incumbent:`"
            continue
        if not matched:
            yield where + ("variants",), f"{rule['variants']!r} matches no variant"
        for v in matched:
            rules, why = rules_for(data, v)
            names = [r["task"] for r in rules]
            if not names:
                yield where + ("variants",), f"variant {v} has no incumbent to judge ({why})"
                break
            if "incumbent" in rule and rule["incumbent"] not in names:
                yield where + ("incumbent",), (f"variant {v}'s incumbents are {', '.join(names)}, "
                                               f"not {rule['incumbent']!r}")
                break


def _expects(inc: Incumbent) -> tuple[tuple, tuple]:
    """(input dtypes, output dtypes) the incumbent takes; a chain's: each part's inputs
    where its feeds route them, the last part's output."""
    if not inc.parts:
        return EXPECTS[inc.op]
    ins = [None] * sum(len(f) for f in inc.feeds)
    for i, (name, feeds) in enumerate(zip(inc.parts, inc.feeds)):
        part_ins, out = _expects(TABLE[name])
        for j, d in zip(feeds, part_ins[1 if i else 0:]):
            ins[j] = d
    return tuple(ins), out


def _check_dtypes(inc: Incumbent, dtypes: dict) -> None:
    want_in, want_out = _expects(inc)
    got_in, got_out = dtypes["inputs"], dtypes["outputs"]
    if len(got_in) != len(want_in) or len(got_out) != len(want_out) or any(
            w is not None and w != g for w, g in zip(want_in + want_out, got_in + got_out)):
        raise NoIncumbent(f"{inc.name} takes inputs {list(want_in)} and outputs {list(want_out)}; "
                          f"the spec has {got_in} and {got_out}")

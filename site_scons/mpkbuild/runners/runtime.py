"""The runtime gate, GPU side: each variant as tasks of the real MPK persistent kernel.

Two runtimes (the library says which, mpkb_runtime): v1, the scheduler and worker kernels,
one pass of the graph a launch (test mode); and Runtime-V2, whose one launch runs the
graph for `iterations` iterations on a static per-SM plan with the runtime's barrier
between them. On v2 the library's snapshot tasks copy the op's outputs of every iteration
(mpkb_snapshots), so each iteration is checked as a v1 launch is, and its spans (the
library's own marks, in the profiler's layout) are split at the barriers.

The megakernel library (stages/runtime/ generates and compiles it against a checkout)
builds its graph with the runtime's own init_persistent_kernel at the production grid
(workers and local schedulers from the SM count, as MPK computes them) and runs it through
the runtime's own launch path, one pass per launch (test mode). Per variant, on the same
buffers, for `iterations` launches: outputs poisoned before each, every element checked
against the float64 reference after each (validate's comparison), bit-equal across
iterations. Iterations count from 1 in the result and its messages. A launch that does
not finish in time is a `hang` naming its phase (warm-up, launch, iteration k, termination) and the runtime's counters read while it hangs. With
MPK_ENABLE_PROFILING the runtime's profiler gives every task's span.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import statistics
import time

import torch

from .common import (CudaFault, bits_equal, call_with_params, device_facts, load_function,
                     poison_, random_tensor, run_main, tensor_specs)
from .validate import compare
from ..util.config import PROFILE_ENTRIES_PER_WORKER

# profiler entries: low 32 bits the tag (bits 0-1 begin/end, 2-10 the task type, 11-18 the
# worker), high 32 bits %globaltimer_lo
LAUNCH_BLOCKED = 4          # mpkb_launch: the launch call itself did not return in time
# the gate's context as the driver makes it: its default 8 hardware work queues (not the one
# queue of the other gates: the worker and scheduler kernels must run at once) and its own
# wait mode (gpuwait.prepare_context says what was and was not measured)
WORK_QUEUES = 8
# where the buffers live: "cuda" on the GPU; the CPU tests drive run_graph/main with a
# stand-in library (tests/fakes/fake_megakernel.py) and "cpu"
DEVICE = "cuda"


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


# where the gate's own time goes (seconds by phase, summed over graphs): the result's
# phases_s, so an edit-to-verdict figure can be taken apart without a profiler
PHASES: dict[str, float] = {}


def _spent(name: str, seconds: float) -> None:
    PHASES[name] = PHASES.get(name, 0.0) + seconds


@contextlib.contextmanager
def _phase(name: str):
    t0 = time.perf_counter()
    try:
        yield
    finally:
        _spent(name, time.perf_counter() - t0)


WORKER_TABLE = ((160, 144), (144, 128), (132, 128), (108, 96), (68, 64), (40, 30), (0, 20))


def grid_for(sm_count: int) -> tuple[int, int]:
    """(workers, local schedulers) as MPK computes them (one copy per side of the split:
    runners import nothing from the build side)."""
    for at_least, workers in WORKER_TABLE:
        if sm_count >= at_least:
            return workers, 4 * (sm_count - workers)
    raise AssertionError


class Megakernel:
    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        L = self.lib
        L.mpkb_graph_name.restype = ctypes.c_char_p
        L.mpkb_graph_name.argtypes = [ctypes.c_int]
        L.mpkb_error_string.restype = ctypes.c_char_p
        L.mpkb_error_string.argtypes = [ctypes.c_int]
        L.mpkb_setup.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                 ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        L.mpkb_launch.argtypes = [ctypes.c_int]
        L.mpkb_read_state.restype = ctypes.c_char_p
        L.mpkb_read_state.argtypes = [ctypes.c_int]
        L.mpkb_describe.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        L.mpkb_preload_report.restype = ctypes.c_char_p
        L.mpkb_save.argtypes = [ctypes.c_int]
        L.mpkb_restore.argtypes = [ctypes.c_int]
        L.mpkb_drop.argtypes = [ctypes.c_int]
        L.mpkb_graph_layers.argtypes = [ctypes.c_int]
        L.mpkb_layer_task_type.argtypes = [ctypes.c_int, ctypes.c_int]
        self.graphs = [L.mpkb_graph_name(i).decode() for i in range(L.mpkb_num_graphs())]
        self.runtime = L.mpkb_runtime() if hasattr(L, "mpkb_runtime") else 1
        if self.runtime == 2:
            L.mpkb_setup.argtypes = L.mpkb_setup.argtypes + [ctypes.c_int]
            L.mpkb_snapshots.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                         ctypes.c_longlong, ctypes.c_int]

    def error(self, code: int) -> str:
        return self.lib.mpkb_error_string(code).decode()


def setup(lib: Megakernel, g: int, ptrs, n: int, grid, prof: torch.Tensor, flags: int,
          timeout_ms: int, iterations: int) -> int:
    """The library's mpkb_setup; on v2 every launch of the setup runs `iterations`."""
    workers, schedulers = grid
    extra = (iterations,) if lib.runtime == 2 else ()
    return lib.lib.mpkb_setup(g, ptrs, n, workers, schedulers, prof.data_ptr(), flags,
                              timeout_ms, *extra)


def per_launch(lib: Megakernel, iterations: int) -> int:
    """The iterations one launch runs: all of them on v2, one on v1."""
    return iterations if lib.runtime == 2 else 1


def task_types(lib: Megakernel, g: int) -> set[int]:
    """The task types graph g's layers run under (ours, or an incumbent's)."""
    return {lib.lib.mpkb_layer_task_type(g, l) for l in range(lib.lib.mpkb_graph_layers(g))}


def describe(lib: Megakernel, g: int) -> dict:
    """The graph as the library's builder expands it (no GPU needed)."""
    buf = ctypes.create_string_buffer(1 << 16)
    need = lib.lib.mpkb_describe(g, buf, len(buf))
    if need:
        buf = ctypes.create_string_buffer(need)
        lib.lib.mpkb_describe(g, buf, len(buf))
    tasks, events = [], []
    for line in buf.value.decode().splitlines():
        f = line.split()
        if f[0] == "T":
            tasks.append({"type": int(f[1]), "variant": int(f[2]), "trigger": int(f[3]),
                          "dependent": int(f[4]), "offset": int(f[5])})
        elif f[0] == "E":
            events.append({"type": int(f[1]), "triggers": int(f[2]), "first": int(f[3]),
                           "last": int(f[4])})
    return {"tasks": tasks, "events": events}


def task_records(buf: torch.Tensor, task_types, kinds: bool = False) -> list[tuple]:
    """(begin, end) in ns of every task of these types, from the runtime profiler's records,
    relative to the first begin (%globaltimer_lo wraps every 4.3 s: differences are taken
    modulo 2**32, signed, valid within a launch); with `kinds`, (begin, end, task type). A
    worker's records are a prefix of its column (zeroed before the launch) and its tasks
    never nest, so its k-th begin pairs with its k-th end; read with tensor ops (a launch
    has up to 2**19 entries)."""
    types = [task_types] if isinstance(task_types, int) else sorted(set(task_types))
    raw = buf                   # read where it is: only the records picked leave the GPU
    nblocks = int(raw[0].item()) & 0xFFFFFFFF
    if nblocks <= 0:
        return []
    body = raw[1:1 + (len(raw) - 1) // nblocks * nblocks].view(-1, nblocks).t()   # [worker, entry]
    written = torch.cumprod((body != 0).to(torch.int8), dim=1).bool()
    kind = (body >> 2) & 0x1FF
    phase = body & 0x3
    ours = written & torch.isin(kind, torch.tensor(types, dtype=body.dtype, device=body.device))
    t = (body >> 32) & 0xFFFFFFFF
    begins, ends = t[ours & (phase == 0)], t[ours & (phase == 1)]     # row-major: per worker, in order
    per_worker_b = (ours & (phase == 0)).sum(dim=1)
    per_worker_e = (ours & (phase == 1)).sum(dim=1)
    if len(begins) == 0 or not torch.equal(per_worker_b, per_worker_e):
        return []                 # an unfinished task: the caller's count check reports it
    begins, ends = begins.cpu(), ends.cpu()
    ref = int(begins[0])
    rel = lambda x: ((x - ref + 2**31) & 0xFFFFFFFF) - 2**31
    if kinds:
        return list(zip(rel(begins).tolist(), rel(ends).tolist(), kind[ours & (phase == 0)].cpu().tolist()))
    return list(zip(rel(begins).tolist(), rel(ends).tolist()))


# runtime_header.h's TaskType: the task a launch begins with, whose end fires its first layer's event
BEGIN_TASK_GRAPH = 10


def dispatch_us(chunks: list[list[tuple[int, int]]], begun: list[int]) -> float | None:
    """From the end of the task that begins the graph (its end fires the first layer's
    event) to the op's first task start, µs, the median over the launch's iterations: the
    dispatch the makespan leaves out (the event reaching a scheduler, the hand-out, a worker
    loading the task), as a decode step pays it after each layer. `chunks`: the op's records
    per iteration (by_iteration); `begun`: the begin task's end per iteration, in order. None
    where there is no begin task per iteration (Runtime-V2's marks time only the gated tasks)."""
    if not chunks or len(begun) != len(chunks):
        return None
    return statistics.median(min(b for b, _ in chunk) - end for chunk, end in zip(chunks, begun)) / 1000.0


def spans_from_profile(buf: torch.Tensor, task_type) -> list[float]:
    """Each gated task's span in µs from the runtime profiler's begin/end records."""
    return [(e - b) / 1000.0 for b, e in task_records(buf, task_type)]


def by_iteration(records: list[tuple[int, int]], n: int) -> list[list[tuple[int, int]]]:
    """One launch's records split into its n iterations: Runtime-V2's barrier ends every
    task of an iteration before any of the next starts, so in start order the first
    len / n records are iteration 1's, and so on."""
    records = sorted(records)
    per = len(records) // n
    return [records[i * per:(i + 1) * per] for i in range(n)]


def op_figures(records: list[tuple[int, int]]) -> tuple[float, float, float]:
    """(makespan, slowest task, start spread) in µs of one op's tasks in one launch: first
    start to last end, the longest span, and first start to last start (how long the
    runtime took to get every task going: the part of the makespan no task's own work
    explains)."""
    first = min(b for b, _ in records)
    return ((max(e for _, e in records) - first) / 1000.0,
            max(e - b for b, e in records) / 1000.0,
            (max(b for b, _ in records) - first) / 1000.0)


def _tensors_for(job: dict, graph: dict, gen):
    """The graph's tensor table (t0, t1, ...), per output tensor its float64 reference (of
    a block: the float64 composition of the layers' references, nothing rounded between
    them), the tensors' names and the outputs' checks ((index, validate config): a block's
    last output is held to the block's own tolerances)."""
    rt = job["runtime"]
    layers = graph["layers"]
    table: dict[int, torch.Tensor] = {}
    refs: dict[int, torch.Tensor] = {}
    names: dict[int, str] = {}
    ref64: dict[int, torch.Tensor] = {}
    checks = []
    for li, layer in enumerate(layers):
        side = rt["kernels"][layer["kernel"]]
        codegen = side["codegen"]
        ins, outs = tensor_specs(side, layer["variant"])
        # every tensor of the spec (runtime state too: the runtime reads it, not the task)
        idx = layer.get("spec_tensors") or layer["tensors"][:layer["num_inputs"] + layer["num_outputs"]]
        for (name, shape, dtype), i in zip(ins, idx[:len(ins)]):
            if i not in table:
                table[i] = random_tensor(shape, dtype, side["generators"].get(name), gen, device=DEVICE)
                ref64[i] = table[i].to(torch.float64)
                names[i] = f"{layer['kernel']}.{name}"
        for (name, shape, dtype), i in zip(outs, idx[len(ins):]):
            table[i] = torch.empty(shape, dtype=dtype, device=DEVICE)
            names[i] = f"{layer['kernel']}.{name}"
        reference = load_function(job["root"], side["validate"]["reference"])
        # an input fed by the layer before is its output's bytes in this layer's shape
        args = [ref64[i].reshape(shape) for (_, shape, _), i in zip(ins, idx[:len(ins)])]
        res = call_with_params(reference, args, codegen["params"])
        for (name, shape, dtype), i, r in zip(outs, idx[len(ins):], res):
            ref64[i] = refs[i] = r
            last = li + 1 == len(layers)
            checks.append((i, graph["validate"] if last and "validate" in graph else side["validate"]))
    order = [table[i] for i in range(graph["num_tensors"])]
    return order, refs, names, checks


def run_graph(lib: Megakernel, job: dict, gi: int, graph: dict, grid: tuple[int, int],
              minimal: Megakernel | None = None) -> dict:
    rt = job["runtime"]
    iterations, timeout_ms, flags = rt["iterations"], int(rt["launch_timeout_s"] * 1000), rt["flags"]
    seed = int.from_bytes(os.urandom(6), "little")
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    with _phase("inputs and references"):
        tensors, refs, names, checks = _tensors_for(job, graph, gen)
    workers, schedulers = grid
    prof = torch.zeros(1 + workers * PROFILE_ENTRIES_PER_WORKER, dtype=torch.int64, device=DEVICE)
    ptrs = (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])
    _sync()
    print(f"runtime {graph['name']}: setup ({workers} workers, {schedulers} schedulers)", flush=True)
    t0 = time.perf_counter()
    code = setup(lib, gi, ptrs, len(tensors), grid, prof, flags, timeout_ms, iterations)
    if code in (2, 3):
        return {"verdict": "hang", "phase": "warm-up", "seed": seed,
                "message": f"{graph['name']}: the {'scheduler' if code == 2 else 'worker'} kernel "
                           f"launched alone did not finish in {rt['launch_timeout_s']} s (warm-up)"}
    if code != 0:
        raise CudaFault(f"{graph['name']}: setup failed: {lib.error(code) if code > 0 else code}")
    setup_s = time.perf_counter() - t0
    _spent("setup", setup_s)
    preload = lib.lib.mpkb_preload_report().decode()
    if preload:
        print(f"runtime {graph['name']}: {preload}", flush=True)
    expect = sum(l["tasks"] for l in graph["layers"])
    types = task_types(lib, gi)
    run = _iterations_v2 if lib.runtime == 2 else _iterations_v1
    with _phase("iterations"):
        res = run(lib, rt, graph, tensors, refs, names, checks, prof, expect, types, seed)
    if res["verdict"] != "pass":
        return res
    spans_all, walls = res["spans_all"], res["walls"]
    result = {"verdict": "pass", "seed": seed, "iterations": iterations, "tasks": expect,
              "runtime": f"v{lib.runtime}",
              "setup_s": round(setup_s, 4), "preload": preload,
              "launch_wall_ms": [round(w * 1000, 3) for w in walls], "spans": span_stats(spans_all)}
    rivals = [(ri, rg) for ri, rg in enumerate(rt["graphs"])
              if rg.get("role") == "incumbent" and rg.get("of") == graph["name"]]
    if not rivals:
        lib.lib.mpkb_finalize()
        return result
    with _phase("head to head"):
        h2h = head_to_head(lib, job, gi, graph, rivals, grid, tensors, refs, checks, prof, gen, names,
                           minimal)
    if "verdict" in h2h:            # a hang, or ours or the incumbent failed on its inputs
        return {**h2h, "seed": seed}
    return {**result, "head_to_head": h2h}


def _iterations_v1(lib: Megakernel, rt: dict, graph: dict, tensors, refs, names, checks,
                   prof: torch.Tensor, expect: int, types: set[int], seed: int) -> dict:
    """`iterations` v1 launches, one pass of the graph each, on the same buffers: outputs
    poisoned before each, checked after each and bit-equal to the launch before."""
    iterations = rt["iterations"]
    outputs = [tensors[i] for i, _ in checks]
    previous, spans_all, walls = None, [], []
    for it in range(1, iterations + 1):     # counted from 1: "iteration 2" is the second
        for o in outputs:
            poison_(o)
        prof.zero_()
        _sync()
        print(f"runtime {graph['name']}: iteration {it}", flush=True)
        t1 = time.perf_counter()
        hung = launch(lib, rt, graph, it)
        walls.append(time.perf_counter() - t1)
        if hung:
            return {**hung, "iteration": it, "seed": seed}
        current = [o.clone() for o in outputs]
        outs = [(i, tensors[i], refs[i], vcfg) for i, vcfg in checks]
        failed = _iteration_failure(graph, it, iterations, outs, previous, current, names, seed)
        if failed:
            return failed
        previous = current
        spans = spans_from_profile(prof, types)
        if spans and len(spans) != expect:
            return {"verdict": "fail", "check": "profile", "iteration": it,
                    "message": f"{graph['name']} iteration {it}: the profiler saw {len(spans)} "
                               f"task spans, the graph has {expect} tasks"}
        spans_all.append(spans)
    return {"verdict": "pass", "spans_all": spans_all, "walls": walls}


def _iteration_failure(graph: dict, it: int, iterations: int, outs: list, previous, current,
                       names: dict, seed: int, one_launch: bool = False) -> dict | None:
    """The failure of iteration `it` (from 1), or None: each output ((tensor index, the
    iteration's output, its reference, validate's config) in `outs`) against the reference,
    then bit for bit against the iteration before. `one_launch`: the iterations are one
    Runtime-V2 launch's (the messages say so)."""
    where = " (one Runtime-V2 launch)" if one_launch else ""
    for i, out, ref, vcfg in outs:
        numbers, problem = compare(out, ref, vcfg)
        if problem:
            return {"verdict": "fail", "check": "numeric", "iteration": it, "seed": seed,
                    "output": names[i], "numbers": numbers,
                    "message": f"{graph['name']} iteration {it} of {iterations}{where} output "
                               f"{names[i]}: {problem}"
                               + (" (the earlier iterations passed: state kept across "
                                  "iterations?)" if it > 1 else "")}
    if previous is not None:
        for (i, _, _, _), a, b in zip(outs, previous, current):
            if not bits_equal(a, b):
                return {"verdict": "fail", "check": "determinism", "iteration": it,
                        "seed": seed, "output": names[i],
                        "message": f"{graph['name']}: output {names[i]} differs bitwise "
                                   f"between iteration {it - 1} and {it}"
                                   f"{' of one launch' if one_launch else ''} on the same inputs "
                                   "(state kept across iterations, or a race)"}
    return None


def _iterations_v2(lib: Megakernel, rt: dict, graph: dict, tensors, refs, names, checks,
                   prof: torch.Tensor, expect: int, types: set[int], seed: int) -> dict:
    """One Runtime-V2 launch of `iterations` iterations with the snapshots on: each
    iteration's outputs of the op's last layer checked against the reference and bit-equal
    to the iteration before (the first that is not names the iteration), the final
    state of every output checked too; the spans of each iteration."""
    iterations = rt["iterations"]
    last = graph["layers"][-1]
    snapped = last["tensors"][last["num_inputs"]:last["num_inputs"] + last["num_outputs"]]
    sizes = [tensors[i].numel() * tensors[i].element_size() for i in snapped]
    slots = [(s + 15) // 16 * 16 for s in sizes]
    per = sum(slots)
    snap = torch.empty(iterations * per, dtype=torch.uint8, device=DEVICE)
    snap.fill_(0xFF)
    for i, _ in checks:
        poison_(tensors[i])
    arr = (ctypes.c_longlong * len(sizes))(*sizes)
    code = lib.lib.mpkb_snapshots(snap.data_ptr(), arr, len(sizes), per, iterations)
    if code != 0:
        raise CudaFault(f"{graph['name']}: the snapshots could not be set: {lib.error(code) if code > 0 else code}")
    prof.zero_()
    _sync()
    print(f"runtime {graph['name']}: one launch of {iterations} iterations", flush=True)
    t1 = time.perf_counter()
    hung = launch(lib, rt, graph, 1)
    walls = [time.perf_counter() - t1]
    if hung:
        return {**hung, "seed": seed}
    lib.lib.mpkb_snapshots(None, arr, len(sizes), per, iterations)     # off for the timed launches
    vcfg_of = dict(checks)
    previous = None
    for it in range(1, iterations + 1):
        current, at = [], (it - 1) * per
        for i, size, slot in zip(snapped, sizes, slots):
            current.append(snap[at:at + size].view(tensors[i].dtype).view(tensors[i].shape))
            at += slot
        failed = _iteration_failure(graph, it, iterations,
                                    [(i, out, refs[i], vcfg_of[i]) for i, out in zip(snapped, current)],
                                    previous, current, names, seed, one_launch=True)
        if failed:
            return failed
        previous = current
    for i, vcfg in checks:          # the final state of every output (a chain's producer too)
        numbers, problem = compare(tensors[i], refs[i], vcfg)
        if problem:
            return {"verdict": "fail", "check": "numeric", "iteration": iterations, "seed": seed,
                    "output": names[i], "numbers": numbers,
                    "message": f"{graph['name']} after {iterations} iterations, output {names[i]}: {problem}"}
    records = task_records(prof, types)
    if len(records) != expect * iterations:
        return {"verdict": "fail", "check": "profile", "iteration": iterations,
                "message": f"{graph['name']}: the marks saw {len(records)} task spans, "
                           f"{iterations} iterations of the graph have {expect * iterations} tasks"}
    spans_all = [[(e - b) / 1000.0 for b, e in chunk] for chunk in by_iteration(records, iterations)]
    return {"verdict": "pass", "spans_all": spans_all, "walls": walls}


def launch(lib: Megakernel, rt: dict, graph: dict, it: int) -> dict | None:
    """Launch `it` (from 1) of the current setup, graph `graph`: a hang result naming its
    phase, or None when it finished; a CUDA error raises CudaFault."""
    code = lib.lib.mpkb_launch(int(rt["launch_timeout_s"] * 1000))
    if code == LAUNCH_BLOCKED:      # the driver holds the host: reading the state could block too
        phase = f"launch (iteration {it}: the host's launch call did not return)"
        return {"verdict": "hang", "phase": phase,
                "message": f"{graph['name']}: {phase} in {rt['launch_timeout_s']} s"}
    if code == 1:
        state = lib.lib.mpkb_read_state(2000).decode()
        phase = (hang_phase_v2(state, graph, rt["iterations"]) if lib.runtime == 2
                 else hang_phase(state, graph, it))
        return {"verdict": "hang", "state": state, "phase": phase,
                "message": f"{graph['name']}: {phase} did not finish in {rt['launch_timeout_s']} s "
                           f"(runtime state: {state[:300]})"}
    if code != 0:
        raise CudaFault(f"{graph['name']} iteration {it}: {lib.error(code) if code > 0 else code}")
    return None


def rival_tensors(recipes: list[dict], ours: list[torch.Tensor]) -> list[torch.Tensor]:
    """An incumbent's tensor table made from ours (wire/incumbents.py's recipes, indices into
    our table): our tensors themselves where it reads them as they are, re-laid or widened
    copies where it reads them otherwise, its own output and scratch buffers."""
    from .common import DTYPES
    out = []
    for r in recipes:
        use = r["use"]
        if use == "input":
            out.append(ours[r["index"]])
        elif use == "int64":
            out.append(ours[r["index"]].to(torch.int64))
        elif use == "gate_up_tiles":        # [rows, gate | up] -> per tile t: gate_t, up_t
            x = ours[r["index"]]
            out.append(x.reshape(x.shape[0], 2, r["tiles"], -1).permute(0, 2, 1, 3)
                       .contiguous().reshape(x.shape[0], -1))
        elif use == "gate_up_rows":         # W [gate; up] -> per tile t: gate_t's rows, up_t's
            w = ours[r["index"]]
            out.append(w.reshape(2, r["tiles"], -1, w.shape[-1]).permute(1, 0, 2, 3)
                       .contiguous().reshape(w.shape))
        elif use == "output":
            o = torch.empty_like(ours[r["index"]])
            poison_(o)
            out.append(o)
        elif use == "scratch":
            out.append(torch.zeros(r["shape"], dtype=DTYPES[r["dtype"]], device=DEVICE))
        else:
            raise ValueError(f"unknown tensor recipe {use!r}")
    return out


def _against(ours_out, theirs, recipe: dict, ours: list[torch.Tensor], vcfg: dict):
    """(numbers, problem) of our output against the incumbent's on the same inputs, by the
    spec's tolerances, also row by row (each row against its own largest value: the head to
    head's inputs have rows of very different magnitude); an index output by the values it
    picks."""
    vcfg = {**vcfg, "per_row": True}
    if "compare_values_of" in recipe:
        src = ours[recipe["compare_values_of"]]
        pick = lambda idx: src.gather(-1, idx.reshape(*src.shape[:-1], 1).clamp(0, src.shape[-1] - 1))
        numbers, problem = compare(pick(ours_out), pick(theirs).to(torch.float64), vcfg)
        numbers["index_mismatches"] = int((ours_out != theirs).sum())
        return numbers, problem
    return compare(ours_out, theirs.to(torch.float64), vcfg)


def layer_figures(records: list[tuple[int, int]], counts: list[int]) -> list[tuple[float, float, float]]:
    """(makespan, slowest task, start spread) in µs of each layer of one launch's records: a layer's
    tasks all end before the next layer's start (its launch event), so in start order the
    first counts[0] records are layer 0's, and so on."""
    records, out, at = sorted(records), [], 0
    for n in counts:
        out.append(op_figures(records[at:at + n]))
        at += n
    return out


class _Slots:
    """The launch setups of one head to head: ours in slot 0, each incumbent's after it,
    saved with mpkb_save and torn down together. Every incumbent's tensors live until the
    end: a setup holds their addresses, and a buffer the allocator took back would be handed
    to the next setup (seen on an H200: an illegal address in the first setup's launch once
    the second had been made)."""

    def __init__(self, lib: Megakernel, graph: dict, types: set[int]):
        self.lib = lib
        # (slot, whose, graph, its task types): ours first, then each incumbent, launched in turn
        self.order = [(0, "ours", graph, types)]
        # the library of a side set up in another (the variant's worker alone)
        self.lib_of: dict[str, Megakernel] = {}
        self.live, self.held_tensors = [(lib, 0)], []

    def finalize_all(self) -> None:
        for lib, slot in list(self.live):
            self.tear_down(lib, slot)

    def tear_down(self, lib: Megakernel, slot: int) -> None:
        """One setup finalized and its slot given back."""
        self.live.remove((lib, slot))
        lib.lib.mpkb_restore(slot)
        lib.lib.mpkb_finalize()
        lib.lib.mpkb_drop(slot)


def head_to_head(lib: Megakernel, job: dict, gi: int, graph: dict, rivals: list, grid,
                 tensors: list[torch.Tensor], refs: dict, checks: list, prof: torch.Tensor,
                 gen, names: dict, minimal: Megakernel | None = None) -> dict:
    """Ours and each incumbent on the same inputs, set up side by side (mpkb_save/restore)
    and launched in turn, with ours again set up separately (the A/A side) and, given the
    library of the variant's worker alone (`minimal`), in it (the composition's effect), `pairs` rounds in
    alternating order (A B C | C B A): per launch the op's makespan and
    slowest task from the runtime's profiler (a block's: the whole block's, and each
    layer's). Before timing, each incumbent's output is compared with the float64
    reference (reported) and with ours (held to the tolerances: the spec's, a block's
    own); an incumbent's intermediate outputs in a chain are laid out as MPK lays them
    and are not compared. The judge (stages/runtime/judge.py) makes the intervals and the
    verdict. `refs`: the references of ours' outputs by tensor index (made again here on
    new inputs)."""
    rt = job["runtime"]
    slots, numbers = _Slots(lib, graph, task_types(lib, gi)), {}
    launches, refs, failed = _on_head_to_head_inputs(lib, job, graph, tensors, refs, checks, gen)
    if failed:
        return failed
    lib.lib.mpkb_save(0)
    next_slot, dropped, failed = _set_up_rivals(lib, minimal, rt, graph, rivals, grid, tensors, refs,
                                                checks, prof, names, slots, numbers)
    if failed:
        return failed
    failed = _set_up_again(lib, rt, graph, gi, next_slot, grid, tensors, prof, slots, AA)
    if failed:
        return failed
    if minimal is not None:
        failed = _set_up_again(minimal, rt, graph, gi, 0, grid, tensors, prof, slots, MINIMAL)
        if failed:
            return failed
    t_pairs = time.perf_counter()
    flush = None
    if rt.get("memory") == "cold":       # twice the L2 read between launches (make_l2_cold)
        words = max(2 * int(device_facts().get("l2_bytes") or 0) // 8, 1)
        flush = torch.zeros(words, dtype=torch.int64, device=DEVICE)
    samples, hot, failed = _timed_pairs(lib, rt, slots, prof, launches, flush)
    if failed:
        return failed
    _spent("head to head: the timed pairs", time.perf_counter() - t_pairs)
    slots.finalize_all()
    sides = " ".join(w for _, w, _, _ in slots.order)
    extra = {}
    if minimal is not None:
        extra["minimal"] = samples[MINIMAL]
    if hot is not None:                  # the judged figures are cold; hot is a diagnostic
        extra["hot"] = {"ours": hot["ours"], "aa": hot[AA],
                        **({"minimal": hot[MINIMAL]} if minimal is not None else {}),
                        "incumbents": {w: hot[w] for _, w, _, _ in slots.order[1:] if w not in (AA, MINIMAL)}}
    return {"pairs": rt["pairs"], "iterations_per_launch": per_launch(lib, rt["iterations"]),
            "order": f"alternating: {sides} | {' '.join(reversed(sides.split(' ')))} ...",
            "memory": ("cold: the L2 filled with other, clean data before each launch (a decode "
                       "step streams its weights from DRAM); hot, the data the launch before left "
                       "in L2, beside it"
                       if hot is not None else "hot: the data the launch before left in L2"),
            **extra,
            "ours": {**samples["ours"], **({"layers": [f"{l['kernel']}.{l['variant']}" for l in graph["layers"]]}
                                          if len(graph["layers"]) > 1 else {})},
            "aa": samples[AA],
            **({"dropped": dropped} if dropped else {}),
            "incumbents": {whose: {"graph": rg["name"], "task": rg["incumbent"],
                                   "config": rg.get("config", ""), "default": rg.get("default", True),
                                   **({"worker": "minimal"} if whose in slots.lib_of else {}),
                                   "tasks": sum(l["tasks"] for l in rg["layers"]),
                                   "task_types": sorted(types),
                                   "registers": [l["register"] for l in rg["layers"]],
                                   **samples[whose], "numerics": numbers[whose]}
                           for _, whose, rg, types in slots.order[1:] if whose not in (AA, MINIMAL)}}


def _set_up_rivals(lib: Megakernel, minimal: Megakernel | None, rt: dict, graph: dict, rivals: list,
                   grid, tensors: list, refs: dict, checks: list, prof: torch.Tensor, names: dict,
                   slots: _Slots, numbers: dict) -> tuple[int, dict, dict | None]:
    """Each incumbent set up in a slot of its own (slot 0 of each library is ours; an
    incumbent at another of its configurations is set up in the variant's worker
    alone only, where there is one): (the main library's next free slot, {side: why it was left out}, a verdict that
    ends the head to head or None)."""
    used, dropped = {id(lib): 0, id(minimal): 0}, {}
    for ri, rg in rivals:
        there = minimal if minimal is not None and not rg.get("default", True) else lib
        slot = used[id(there)] + 1
        side = rg.get("side", rg["incumbent"])
        held, failed = _set_up_incumbent(there, rt, graph, slot, ri, rg, grid, tensors, refs, dict(checks),
                                         prof, names, slots)
        if failed and failed["verdict"] == DROPPED:
            dropped[side] = failed["message"]
            continue
        if failed:
            return 0, dropped, failed
        used[id(there)] = slot
        numbers[side] = held
        slots.order.append((slot, side, rg, task_types(there, ri)))
        if there is not lib:
            slots.lib_of[side] = there
    return used[id(lib)] + 1, dropped, None


# the A/A side of a head to head: ours again, set up separately on its own copy of the
# inputs; ours against it measures the gate's own systematic spread (stages/runtime/judge.py
# widens every ratio's interval by it)
AA = "A/A"
# ours set up in its variant's worker alone (the same source without the production worker's
# other tasks and without the other variants): ours against it is the composition's effect
# on ours, the model's tasks and the spec's other variants together (issue 59)
MINIMAL = "worker alone"


def _set_up_again(lib: Megakernel, rt: dict, graph: dict, gi: int, slot: int, grid,
                  tensors: list, prof: torch.Tensor, slots: _Slots, whose: str) -> dict | None:
    """Ours set up again in `slot` of `lib` (the A/A side, or the variant's worker alone) on
    copies of its tensors and launched once: a verdict that ends the head to head, or None."""
    copies = [t.clone() for t in tensors]
    slots.held_tensors.append(copies)
    ptrs = (ctypes.c_void_p * len(copies))(*[t.data_ptr() for t in copies])
    _sync()
    code = setup(lib, gi, ptrs, len(copies), grid, prof, rt["flags"], int(rt["launch_timeout_s"] * 1000),
                 rt["iterations"])
    if code in (2, 3):
        return {"verdict": "hang", "phase": "warm-up",
                "message": f"{graph['name']} ({whose}): a kernel launched alone did not finish (warm-up)"}
    if code != 0:
        slots.finalize_all()
        raise CudaFault(f"{graph['name']} ({whose}): setup failed: {lib.error(code) if code > 0 else code}")
    save(lib, slot, f"{graph['name']} ({whose})", slots)
    slots.live.append((lib, slot))
    hung = launch(lib, rt, graph, 1)
    if hung:
        return hung
    slots.order.append((slot, whose, graph, task_types(lib, gi)))
    if lib is not slots.lib:
        slots.lib_of[whose] = lib
    return None


def save(lib: Megakernel, slot: int, what: str, slots: _Slots) -> None:
    """The current setup kept in `slot` (the library holds MPKB_SLOTS of them)."""
    if lib.lib.mpkb_save(slot) != 0:
        slots.finalize_all()
        raise CudaFault(f"{what}: the library has no setup slot {slot} (megakernel.cu.j2 MPKB_SLOTS)")


def pair_order(order: list, p: int) -> list:
    """Round p's launch order: as set up on even rounds, reversed on odd ones (A B | B A), so
    no side always runs first or right after the same other."""
    return order if p % 2 == 0 else order[::-1]


def _on_head_to_head_inputs(lib: Megakernel, job: dict, graph: dict, tensors: list, refs: dict,
                            checks: list, gen) -> tuple[int, dict, dict | None]:
    """A variant's head to head inputs (runtime.generators: inputs every incumbent accepts):
    ours run on them once and held to the reference again. (ours' launches so far, the
    references of its outputs, a verdict that ends the head to head or None)."""
    rt = job["runtime"]
    layer = graph["layers"][0]
    side = rt["kernels"][layer["kernel"]]
    gens = head_to_head_generators(side, rt.get("generators") or {}) if graph.get("role") == "ours" else {}
    ins, _ = tensor_specs(side, layer["variant"])
    n_in = len(ins)
    for i, (name, shape, dtype) in enumerate(ins):
        if name in gens:
            tensors[i].copy_(random_tensor(shape, dtype, gens[name], gen, device=DEVICE))
    launches = rt["iterations"]          # ours' launches so far: its iterations
    if not gens:
        return launches, refs, None
    reference = load_function(job["root"], side["validate"]["reference"])
    refs.update(zip((i for i, _ in checks),          # in place: the setup's references were these inputs'
                    call_with_params(reference, [tensors[i].to(torch.float64) for i in range(n_in)],
                                     side["codegen"]["params"])))
    for i, _ in checks:
        poison_(tensors[i])
    _sync()
    launches += 1
    hung = launch(lib, rt, graph, launches)
    if hung:
        return launches, refs, hung
    for i, vcfg in checks:
        got, problem = compare(tensors[i], refs[i], vcfg)
        if problem:
            lib.lib.mpkb_finalize()
            return launches, refs, {"verdict": "fail", "check": "numeric",
                                    "message": f"{graph['name']} on the head to head's inputs "
                                               f"(rows of varied magnitude, or runtime.generators): {problem}"}
    return launches, refs, None


# the head to head's float inputs have rows of very different magnitude (down to near zero),
# unless runtime.generators says otherwise: an incumbent with another eps or scaling rule
# then differs from ours where the validate inputs (rows alike) hide it
ROW_SCALES = [1e-3, 1e2]


def head_to_head_generators(side: dict, declared: dict) -> dict:
    """Input name -> generator for the head to head: runtime.generators' where it names one,
    else the top-level generator with ROW_SCALES (integer inputs keep theirs: ids, counts)."""
    out = {}
    for t in side["codegen"]["inputs"]:
        name = t["name"]
        if name in declared:
            out[name] = declared[name]
            continue
        base = (side.get("generators") or {}).get(name) or {"dist": "normal", "mean": 0.0, "std": 1.0}
        if base["dist"] != "randint" and not t.get("runtime"):
            out[name] = {**base, "row_scales": ROW_SCALES}
    return out


def _set_up_incumbent(lib: Megakernel, rt: dict, graph: dict, slot: int, ri: int, rg: dict, grid,
                      tensors: list, refs: dict, vcfg_of: dict, prof: torch.Tensor, names: dict,
                      slots: _Slots) -> tuple[dict, dict | None]:
    """One incumbent set up in its slot, launched once and its outputs compared with the
    reference and with ours: ({output: numerics}, a verdict that ends the head to head or None)."""
    what = rg["name"]
    timeout_ms, flags = int(rt["launch_timeout_s"] * 1000), rt["flags"]
    rtensors = rival_tensors(rg["tensors"], tensors)
    slots.held_tensors.append(rtensors)
    ptrs = (ctypes.c_void_p * len(rtensors))(*[t.data_ptr() for t in rtensors])
    _sync()
    code = setup(lib, ri, ptrs, len(rtensors), grid, prof, flags, timeout_ms, rt["iterations"])
    if code in (2, 3):
        return {}, {"verdict": "hang", "phase": "warm-up",
                    "message": f"{what}: a kernel launched alone did not finish (warm-up)"}
    if code != 0:
        slots.finalize_all()
        raise CudaFault(f"{what}: setup failed: {lib.error(code) if code > 0 else code}")
    save(lib, slot, what, slots)
    slots.live.append((lib, slot))
    hung = launch(lib, rt, rg, 1)
    if hung:
        return {}, hung
    _sync()
    held = {}
    for j, recipe in enumerate(rg["tensors"]):
        if recipe["use"] != "output" or recipe.get("intermediate"):
            continue
        k = recipe["index"]
        theirs, mine = rtensors[j], tensors[k]
        vs_ref, _ = compare(theirs, refs[k], vcfg_of[k])
        vs_ours, problem = _against(mine, theirs, recipe, tensors, vcfg_of[k])
        held[names[k]] = {"incumbent_vs_reference": vs_ref, "ours_vs_incumbent": vs_ours}
        if problem and not rg.get("default", True):
            # MPK's task at another of its configurations, disagreeing: no configuration it
            # can run; its setup alone is torn down, and the head to head goes on without it
            slots.tear_down(lib, slot)
            return held, {"verdict": DROPPED, "message": f"output {names[k]} against ours: {problem}"}
        if problem:
            slots.finalize_all()
            return held, {"verdict": "fail", "check": "incumbent numerics",
                          "message": f"{graph['name']} output {names[k]} against incumbent "
                                     f"{rg['incumbent']} on the same inputs: {problem}",
                          "numbers": held}
    return held, None


DROPPED = "dropped"


def make_l2_cold(buffer: torch.Tensor) -> None:
    """Evict what the launch before left in L2 by reading a buffer twice its size: the L2
    then holds clean lines of other data, as a decode step finds it (the layer before's
    weights). Written over instead (a fill, until 2026-12-05), it held dirty lines that the
    next launch's reads evicted and wrote back to DRAM inside its timing: min(its reads, the
    L2) of extra writes, which a decode step does not pay (on the H100 the in-runtime cold
    figures of the linears sat 9-16 us above the harness's cold ones, RESULTS 28)."""
    buffer.sum()


def _timed_pairs(main_lib: Megakernel, rt: dict, slots: _Slots, prof: torch.Tensor, launches: int,
                 flush: torch.Tensor | None = None) -> tuple[dict, dict | None, dict | None]:
    """The interleaved launches, `pairs` rounds: (per side its samples: makespan, slowCTA,
    start spread, dispatch and a block's per-layer figures; with `flush` those of launches
    after the L2 was written over, and then the hot ones (each side launched hot, then cold)
    or None; a verdict that ends the head to head or None)."""
    states = ["hot"] + (["cold"] if flush is not None else [])
    by_state = {st: {whose: {"makespan_us": [], "slowcta_us": []} for _, whose, _, _ in slots.order}
                for st in states}
    # the setup's launches before these: ours' iterations (and one on the head to head's
    # inputs), or the incumbent's and the A/A's check
    done = {whose: launches if whose == "ours" else 1 for _, whose, _, _ in slots.order}
    for p in range(rt["pairs"]):
        for (slot, whose, g, types), state in ((side, st) for side in pair_order(slots.order, p)
                                               for st in states):
            samples = by_state[state]
            lib = slots.lib_of.get(whose, main_lib)
            lib.lib.mpkb_restore(slot)
            prof.zero_()
            if state == "cold":
                make_l2_cold(flush)
            _sync()
            done[whose] += 1
            hung = launch(lib, rt, g, done[whose])
            if hung:
                return samples, None, hung
            # the op's tasks and the task that begins the graph, read once
            typed = task_records(prof, set(types) | {BEGIN_TASK_GRAPH}, kinds=True)
            rec = [(b, e) for b, e, k in typed if k != BEGIN_TASK_GRAPH]
            begun = sorted(e for _, e, k in typed if k == BEGIN_TASK_GRAPH)
            n = per_launch(lib, rt["iterations"])
            counts = [l["tasks"] for l in g["layers"]]
            want = sum(counts) * n
            if len(rec) != want:
                slots.finalize_all()
                return samples, None, {"verdict": "fail", "check": "profile",
                                       "message": f"{g['name']} pair {p + 1}: the profiler saw {len(rec)} "
                                                  f"task spans, the graph has {want} tasks"}
            # a launch is one sample: on v2, where a launch runs every iteration, the median
            # of its iterations' figures (its iterations are not independent samples)
            chunks = by_iteration(rec, n)
            figs = [op_figures(chunk) for chunk in chunks]
            samples[whose]["makespan_us"].append(round(statistics.median(f[0] for f in figs), 4))
            samples[whose]["slowcta_us"].append(round(statistics.median(f[1] for f in figs), 4))
            if len(counts) == 1:        # a block's layers start one after another: no one op's spread
                samples[whose].setdefault("startspread_us", []).append(round(statistics.median(f[2] for f in figs), 4))
            disp = dispatch_us(chunks, begun)
            if disp is not None:
                samples[whose].setdefault("dispatch_us", []).append(round(disp, 4))
            if len(counts) > 1:
                per_layer = [layer_figures(chunk, counts) for chunk in chunks]
                samples[whose].setdefault("layers_us", []).append(
                    [[round(statistics.median(it[i][0] for it in per_layer), 4),
                      round(statistics.median(it[i][1] for it in per_layer), 4)] for i in range(len(counts))])
    if flush is not None:
        return by_state["cold"], by_state["hot"], None
    return by_state["hot"], None, None


def span_stats(per_iteration: list[list[float]]) -> dict:
    if not per_iteration or not per_iteration[-1]:
        return {}
    slowest = [max(s) for s in per_iteration if s]
    last = sorted(per_iteration[-1])
    q = lambda p: last[min(len(last) - 1, int(p * len(last)))]
    return {"slowest_task_us": statistics.median(slowest), "min_us": last[0],
            "median_us": statistics.median(last), "p90_us": q(0.9), "max_us": last[-1],
            "count": len(last), "per_iteration_slowest_us": slowest}


def hang_phase(state: str, graph: dict, iteration: int) -> str:
    """Which phase a hang is in, from the runtime's event counters: the launch (the begin
    task never ran), iteration k (tasks left unfinished), or termination (every task ran,
    the kernels did not exit)."""
    try:
        events = [int(x) for x in state.split(";")[0].split()[1:]]
    except ValueError:
        return f"iteration {iteration}"
    if len(events) < 3:
        return f"iteration {iteration}"
    if events[1] == 0:
        return f"launch (iteration {iteration}: the begin-graph task never ran)"
    done, want = events[-1], graph["layers"][-1]["tasks"]
    if done >= want:
        return f"termination (iteration {iteration}: all {want} tasks finished)"
    return f"iteration {iteration} ({done} of {want} tasks of the last layer finished)"


def hang_phase_v2(state: str, graph: dict, iterations: int) -> str:
    """Which phase of a Runtime-V2 launch hangs, from its cumulative event counters: the
    begin-graph task counts the iterations begun, the op's last layer's event its tasks
    done over all of them."""
    try:
        events = [int(x) for x in state.split(";")[0].split()[1:]]
    except ValueError:
        return "the launch"
    layers = len(graph["layers"])
    if len(events) < layers + 3:
        return "the launch"
    begun, want = events[1], graph["layers"][-1]["tasks"]
    if begun == 0:
        return "launch (the begin-graph task never ran)"
    done = events[1 + layers] - (begun - 1) * want
    if begun >= iterations and done >= want:
        return f"termination (all {iterations} iterations' tasks finished)"
    return (f"iteration {begun} of {iterations} ({max(done, 0)} of {want} tasks of the last "
            "layer finished in it)")


def worker_record(rt: dict) -> dict:
    """The worker this run measured in (its build's figures and the task bodies compiled in)
    and, where the last verdict was measured in another, what changed: the registers and
    stack then and now, the task bodies added and removed."""
    now = {**(rt.get("worker") or {}), "composition": rt.get("composition") or [],
           "kind": rt.get("composition_kind"),
           **({"alone": rt["worker_alone"]} if rt.get("worker_alone") else {})}
    before = rt.get("worker_before") or {}
    if before and {k: before.get(k) for k in now} != now:
        now["changed"] = {"registers": [before.get("registers"), now.get("registers")],
                          "stack_bytes": [before.get("stack_bytes"), now.get("stack_bytes")],
                          "added": sorted(set(now["composition"]) - set(before.get("composition") or [])),
                          "removed": sorted(set(before.get("composition") or []) - set(now["composition"]))}
    return now


def main(job: dict) -> dict:
    clock = time.perf_counter()
    PHASES.clear()
    with _phase("context"):
        if DEVICE == "cuda":
            torch.cuda.init()
        torch.empty(1, device=DEVICE)
        facts = device_facts()
    grid = grid_for(facts["sm_count"])
    with _phase("library load"):
        lib = Megakernel(job["library"])
    # each variant's (and block's) worker alone, where the gate's is production-shaped: ours
    # timed in it too, loaded when its graph comes
    alone_paths, alone = job.get("library_alone") or {}, {}
    graphs, failed = {}, []
    for gi, name in enumerate(lib.graphs):
        graph = job["runtime"]["graphs"][gi]
        assert graph["name"] == name, (graph["name"], name)
        if graph.get("role") == "incumbent":
            continue            # run beside its variant (head_to_head)
        if job.get("only") and name not in job["only"]:
            continue            # compiled in, not asked for (bench/worker_evidence.py: one variant)
        if name in alone_paths and name not in alone:
            with _phase("library load"):
                alone[name] = Megakernel(alone_paths[name])
        res = run_graph(lib, job, gi, graph, grid, alone.get(name))
        if name in (job["runtime"].get("missing") or {}):
            res["no_incumbent"] = job["runtime"]["missing"][name]
        graphs[name] = res
        if res["verdict"] == "fail":
            lib.lib.mpkb_finalize()     # idempotent; the next graph sets up afresh
        if res["verdict"] != "pass":
            failed.append(res)
            if res["verdict"] == "hang":
                break           # the GPU still runs the hung kernels: nothing more can run
    verdict = "pass" if not failed else ("hang" if any(f["verdict"] == "hang" for f in failed)
                                          else "fail")
    return {"verdict": verdict, "device": facts, "grid": {"workers": grid[0], "schedulers": grid[1]},
            "runtime": f"v{lib.runtime}", "iterations": job["runtime"]["iterations"],
            # what every figure was measured in: the worker as built, the task bodies it holds
            "worker": worker_record(job["runtime"]),
            "variants": graphs, "elapsed_run_s": round(time.perf_counter() - clock, 3),
            "phases_s": {k: round(v, 3) for k, v in PHASES.items()},
            "message": "; ".join(f["message"] for f in failed) if failed else
            (f"all {len(graphs)} graphs pass {job['runtime']['iterations']} iterations in the "
             f"persistent kernel ({grid[0]} workers, {grid[1]} schedulers)" if lib.runtime == 1 else
             f"all {len(graphs)} graphs pass one Runtime-V2 launch of {job['runtime']['iterations']} "
             f"iterations (static plan over {grid[0]} workers, the runtime's barrier between them)")}


if __name__ == "__main__":
    run_main(main, min_work_queues=WORK_QUEUES, block_while_waiting=False)

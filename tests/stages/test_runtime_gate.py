"""The runtime gate: the generated megakernel against the pinned MPK tree.

CPU: every catalog kernel's megakernel compiles with nvcc against ../shared/mirage/mpk (one
compile per kernel, all in parallel); the graph the compiled builder makes is checked
against the plan (task and event counts, triggers, the last event); the hang phase is read
from the runtime's counters. GPU (marked): every kernel passes 3+ iterations in the
persistent kernel, the chain too.
"""
from __future__ import annotations

import copy
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import REPO
PINNED = REPO.parent / "shared" / "mirage" / "mpk"
sys.path.insert(0, str(REPO / "site_scons"))

from mpkbuild.model.kernel import Kernel, discover  # noqa: E402
from mpkbuild.stages import generate  # noqa: E402
from mpkbuild.stages.runtime import megakernel as runtime  # noqa: E402  (what the gate takes from MPK)
from mpkbuild.util import config
from mpkbuild.stages import load_kernel

needs_tree = pytest.mark.skipif(not (PINNED / "include").is_dir(),
                                reason="../shared/mirage (the pinned MPK tree) is absent")
KERNELS = [k for k in discover(REPO) if "wiring" in load_kernel(REPO, k, write_cache=False).spec.data]


FAULTS = REPO / "tests" / "fixtures" / "faults"
STALE = "fault_stale_state"


def _materialise(name: str, out: Path, root: Path = REPO, checkout: Path = PINNED,
                 runtime_: str = "v1") -> Path:
    """The generated headers and the megakernel source (with its shadow/) of one kernel."""
    k = load_kernel(root, name, write_cache=False)
    companions = runtime.companions_for(k, {})
    for x in [k, *companions]:
        sec = x.spec.sections["codegen"]
        for role, fn in (("body", f"{x.name}.cuh"), ("spec_header", f"{x.name}_spec.h")):
            (out / fn).write_text(generate.render_file(role, sec, x.spec.file, x.body_source, x.root))
    for name, data in runtime.render_all(k, config.wiring_roots(root), checkout, companions, runtime_).items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    return out


def _built(name: str, d: Path, root: Path) -> Path:
    """The megakernel of kernel `name` of the project at `root`, made in the new folder `d`
    and compiled against the pinned tree: its library."""
    d.mkdir()
    _materialise(name, d, root)
    lib = d / f"lib{name}_mpk.so"
    ok, log, took = runtime.compile_megakernel(runtime.Checkout.find(PINNED), d / "megakernel.cu",
                                               [d], lib, d / "log", shadow=d / "shadow")
    assert ok, "\n".join(l for l in log.splitlines() if "error" in l)[:3000]
    return lib


def _run_runtime(root: Path, name: str, lib: Path, tmp_path: Path, checkout: Path = PINNED,
                 runtime_: str = "v1") -> tuple[dict, str]:
    """The runtime gate's runner on one compiled megakernel, as the gate runs it."""
    k = load_kernel(root, name, write_cache=False)
    job = {"root": str(root), "library": str(lib), "kernel": name,
           "runtime": runtime.job_payload(k, checkout_root=checkout, runtime=runtime_),
           "result_file": str(tmp_path / f"{name}.json")}
    (tmp_path / f"{name}.job").write_text(json.dumps(job))
    proc = subprocess.run([sys.executable, "-m", "mpkbuild.runners.runtime",
                           str(tmp_path / f"{name}.job")], cwd=root, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO / "site_scons")},
                          capture_output=True, text=True)
    return json.loads((tmp_path / f"{name}.json").read_text()), proc.stdout[-3000:] + proc.stderr[-3000:]


def _fault_project(dest: Path) -> Path:
    sys.path.insert(0, str(FAULTS))
    import faultsuite
    return faultsuite.make_project(dest, with_gate_after=False)


@pytest.fixture(scope="session")
def compiled(tmp_path_factory):
    """{kernel: (ok, log, seconds, library)}: every catalog kernel compiled once, in parallel."""
    if not (PINNED / "include").is_dir():
        pytest.skip("../shared/mirage (the pinned MPK tree) is absent")
    import shutil
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc on PATH")
    checkout = runtime.Checkout.find(PINNED)
    base = tmp_path_factory.mktemp("megakernels")

    def one(name):
        d = base / name
        d.mkdir()
        _materialise(name, d)
        lib = d / f"lib{name}_mpk.so"
        ok, log, took = runtime.compile_megakernel(checkout, d / "megakernel.cu", [d], lib, d / "log",
                                                   shadow=d / "shadow")
        return name, (ok, log, took, lib)

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return dict(pool.map(one, KERNELS))


def expand(graph: dict) -> tuple[list[dict], list[dict]]:
    """The tasks and events the C++ builder (megakernel.cu.j2) should make from a plan graph,
    written out again here in Python: what mpkb_describe reports is held to it. As the
    checkout's compile builds an iteration: event 1 hands out every task, a later layer's
    task waits on the (empty) event that covers it."""
    tasks = [{"type": "terminate", "trigger": None, "waits": None},
             {"type": "begin", "trigger": 1, "waits": None}]
    events = [{"type": "termination", "triggers": 0},
              {"type": "launch_dependent", "triggers": 1, "first": 2,
               "last": 2 + sum(layer["tasks"] for layer in graph["layers"])}]
    first, order, waits = 2, None, [None] * graph["layers"][0]["tasks"]
    for l, layer in enumerate(graph["layers"]):
        base = len(events)
        made = layer.get("events") or {"event_of": [0] * layer["tasks"], "order": None,
                                        "launches": [graph["layers"][l + 1]["tasks"]]
                                        if l + 1 < len(graph["layers"]) else []}
        for k, t in enumerate(order or range(layer["tasks"])):
            tasks.append({"type": "task", "variant": layer["id"], "offset": t,
                          "trigger": base + made["event_of"][t], "waits": waits[k]})
        first += layer["tasks"]
        if l + 1 == len(graph["layers"]):
            events.append({"type": "end_of_graph", "triggers": layer["tasks"]})
        start, waits = first, []
        for e, launches in enumerate(made["launches"]):
            events.append({"type": "empty", "triggers": made["event_of"].count(e),
                           "first": start, "last": start + launches})
            waits += [len(events) - 1] * launches
            start += launches
        order = made["order"]
    return tasks, events


def test_grid_is_mpks():
    assert runtime.grid_for(132) == (128, 16)     # H200 / H100 SXM
    assert runtime.grid_for(148) == (128, 80)
    assert runtime.grid_for(170) == (144, 104)
    from mpkbuild.runners import runtime as side  # noqa: F401  (needs torch)


def test_plan_expands_to_the_documented_graph():
    k = load_kernel(REPO, "rmsnorm_v2", write_cache=False)
    p = runtime.plan(k.spec.data, config.SHIPPED_WIRING)
    assert [g["name"] for g in p["graphs"]] == list(k.spec.data["codegen"]["variants"])
    for g in p["graphs"]:
        tasks, events = expand(g)
        n = g["layers"][0]["tasks"]
        assert [t["type"] for t in tasks[:2]] == ["terminate", "begin"]
        assert len(tasks) == n + 2 and len(events) == 3
        assert events[0]["type"] == "termination"
        assert events[1] == {"type": "launch_dependent", "triggers": 1, "first": 2, "last": 2 + n}
        assert events[-1] == {"type": "end_of_graph", "triggers": n}
        assert all(t["trigger"] == 2 and t["waits"] is None for t in tasks[2:])
        assert [t["offset"] for t in tasks[2:]] == list(range(n))


def test_call_is_the_wired_one():
    k = load_kernel(REPO, "linear_v2", write_cache=False)
    p = runtime.plan(k.spec.data, config.SHIPPED_WIRING, {c.name: c.spec.data for c in runtime.companions_for(k, {})})
    call = p["dispatch"][0]["call"]
    assert call[0] == "if (threadIdx.x < kernel::mpkbuild_linear_v2::linear_v2_spec::THREADS) {"
    assert "task_desc->task_metadata.task_offset," in " ".join(call)
    assert "$" not in " ".join(call)


LINEAR_BLOCKS = ("llama8b_mlp", "llama8b_mlp_fused", "llama8b_mlp_silu_epilogue")   # linear_v2's


def test_block_plan_feeds_each_layer_the_layer_befores_output():
    k = load_kernel(REPO, "linear_v2", write_cache=False)
    specs = {c.name: c.spec.data for c in runtime.companions_for(k, {})}
    assert sorted(specs) == ["linear_residual_v2", "rmsnorm_linear_silu_mul_v2", "rmsnorm_linear_v2",
                             "rmsnorm_v2", "silu_mul_linear_residual_v2", "silu_mul_v2"]
    p = runtime.plan(k.spec.data, config.SHIPPED_WIRING, specs)
    blocks = [g for g in p["graphs"] if g["role"] == "block"]
    assert [g["name"] for g in blocks] == [f"block:{name}:b{b}" for name in LINEAR_BLOCKS
                                          for b in (1, 8, 16)]
    # linear_v2 loads W in 32-row boxes where nt is an odd multiple of 32, the other TMA
    # linears in boxes of up to 64 rows: those run under a gate task type of their own
    assert [(t["symbol"], t["kernels"]) for t in p["task_types"]] == [
        ("MPKB_TASK_TYPE", ["linear_v2", "rmsnorm_v2", "silu_mul_v2"]),
        ("MPKB_TASK_TYPE_1", ["linear_residual_v2", "rmsnorm_linear_v2", "silu_mul_linear_residual_v2",
                              "rmsnorm_linear_silu_mul_v2"])]
    for g in blocks[:3]:
        layers = g["layers"]
        assert [l["kernel"] for l in layers] == ["rmsnorm_v2", "linear_v2", "silu_mul_v2", "linear_residual_v2"]
        assert [l["task_type"] for l in layers] == ["MPKB_TASK_TYPE"] * 3 + ["MPKB_TASK_TYPE_1"]
        for before, after in zip(layers, layers[1:]):
            # the layer before's output tensor is this layer's first input
            assert after["tensors"][0] == before["tensors"][before["num_inputs"]]
        tasks, events = expand(g)
        # our layers read the whole tensor the layer before writes: one event after each,
        # which every task of the next layer waits on; event 1 hands out all of them
        assert [e["type"] for e in events[2:-1]] == ["empty"] * 3
        assert events[1]["last"] == 2 + sum(layer["tasks"] for layer in layers)
        begins = [2 + sum(layer["tasks"] for layer in layers[:l]) for l in range(len(layers) + 1)]
        for l in range(1, len(layers)):
            assert {t["waits"] for t in tasks[begins[l]:begins[l + 1]]} == {1 + l}
        assert events[-1] == {"type": "end_of_graph", "triggers": layers[-1]["tasks"]}
    # without a checkout no incumbents' chain; a shape that does not chain is refused
    assert not [g for g in p["graphs"] if g["role"] == "incumbent"]
    bad = copy.deepcopy(k.spec.data)
    bad["runtime"]["blocks"][0]["layers"][2]["variant"] = "decode_r{batch}_i2048"
    with pytest.raises(generate.TemplateError, match=r"runtime.blocks\[0\].layers\[2\].variant: "
                       r"silu_mul_v2.decode_r1_i2048's first input is bf16 \[1, 2, 2048\]; "
                       r"the layer before writes bf16 \[1, 28672\]"):
        runtime.plan(bad, config.SHIPPED_WIRING, specs)


@needs_tree
def test_a_blocks_worker_alone_keeps_its_layers_and_chain_and_no_other_variant():
    """Issue 59 item 3 for blocks: a block's graph is judged too, and its production worker
    grows with every variant of its kernels; its worker alone (ALONE_MACRO's index after the
    variants) keeps the branches its layers and the incumbents' chain run, and only those."""
    k = load_kernel(REPO, "linear_v2", write_cache=False)
    specs = {c.name: c.spec.data for c in runtime.companions_for(k, {})}
    p = runtime.plan(k.spec.data, config.SHIPPED_WIRING, specs, PINNED)
    units = runtime.alone_units(k.spec.data)
    assert units == [*k.spec.data["codegen"]["variants"],
                     *(f"block:{name}:b{b}" for name in LINEAR_BLOCKS for b in (1, 8, 16))]
    b8 = units.index("block:llama8b_mlp:b8")
    kept = {(d["kernel"], d["variant"]) for d in p["dispatch"] if b8 in d.get("alone", ())}
    graphs = {g["name"]: g for g in p["graphs"]}
    ids = {l["id"] for g in p["graphs"] if "block:llama8b_mlp:b8" in (g["name"], g.get("of")) for l in g["layers"]}
    assert {d["id"] for d in p["dispatch"] if b8 in d.get("alone", ())} == ids
    assert ("linear_v2", "decode_m8_n14336_k4096") not in kept      # a variant the block does not run
    assert {kern for kern, _ in kept} >= {"rmsnorm_v2", "linear_v2", "silu_mul_v2", "linear_residual_v2"}
    assert graphs["block:llama8b_mlp:b8"]["role"] == "block"
    # its folder takes '-' for the graph name's ':'
    from mpkbuild.stages.runtime import library_path
    assert library_path(k, alone="block:llama8b_mlp:b8").parent.name == "block-llama8b_mlp-b8"


@needs_tree
def test_the_incumbents_chain_lays_the_gate_up_weight_in_silu_muls_tiles():
    """MPK's builder shuffles the gate|up weight rows into silu_mul's tiles; the chain's
    linear reads our weight so re-laid, silu_mul reads the linear's output as it is, and
    only the block's last output is compared with ours."""
    k = load_kernel(REPO, "linear_v2", write_cache=False)
    specs = {c.name: c.spec.data for c in runtime.companions_for(k, {})}
    p = runtime.plan(k.spec.data, config.SHIPPED_WIRING, specs, PINNED)
    ours = next(g for g in p["graphs"] if g["name"] == "block:llama8b_mlp:b8")
    chain = next(g for g in p["graphs"] if g.get("of") == ours["name"])
    assert chain["incumbent"] == ("rmsnorm_hopper > linear_swapAB_hopper > silu_mul > "
                                  "linear_swapAB_with_residual_hopper")
    recipes = chain["tensors"]
    weight = ours["layers"][1]["tensors"][1]
    assert {"use": "gate_up_rows", "index": weight, "tiles": 32} in recipes
    compared = [r for r in recipes if r["use"] == "output" and not r.get("intermediate")]
    assert compared == [{"use": "output", "index": ours["layers"][-1]["tensors"][3]}]
    linear, silu, down = chain["layers"][1], chain["layers"][2], chain["layers"][3]
    assert silu["tensors"][0] == linear["tensors"][2]       # the linear's output, as it is
    assert linear["tma"] and linear["tma_dims"][:3] == [[8, 4096], [448, 4096], [8, 448]]
    # the down projection adds the residual in its epilogue, as the builder's
    # linear_with_residual_layer: MPK's task reads our residual, with its own TMA map
    assert down["task_type"] == "TASK_LINEAR_SWAPAB_WITH_RESIDUAL_HOPPER" and down["num_inputs"] == 3
    assert recipes[down["tensors"][2]] == {"use": "input", "index": ours["layers"][-1]["tensors"][2]}
    assert down["tma_dims"][:4] == [[8, 14336], [64, 14336], [8, 64], [8, 64]]
    call = next(d for d in p["dispatch"] if d["id"] == down["id"])["call"]
    assert any("TMA_RESIDUAL" in line for line in call) and "    nullptr," not in call


@needs_tree
def test_the_incumbents_chain_has_mpks_events_between_gate_up_and_silu_mul():
    """MPK's compile gives the 64 gate|up tasks and silu_mul's 32 tiles gcd(64, 32) = 32
    events (its annotated graph): a silu_mul tile starts when the two linear tasks that write
    its columns are done. Ours read the whole tensor the layer before writes, so each of our
    layers waits for the whole layer before, as MPK would build them too."""
    k = load_kernel(REPO, "linear_v2", write_cache=False)
    specs = {c.name: c.spec.data for c in runtime.companions_for(k, {})}
    p = runtime.plan(k.spec.data, config.SHIPPED_WIRING, specs, PINNED)
    for b in (1, 8, 16):
        ours = next(g for g in p["graphs"] if g["name"] == f"block:llama8b_mlp:b{b}")
        chain = next(g for g in p["graphs"] if g.get("of") == ours["name"])
        assert not any(l.get("events") for l in ours["layers"])
        assert [bool(l.get("events")) for l in chain["layers"]] == [False, True, False, False]
        made = chain["layers"][1]["events"]
        assert made["launches"] == [1] * 32
        # linear task j writes columns [448 j, 448 (j + 1)) of 28672; tile i reads [896 i, 896 (i + 1))
        assert made["event_of"] == [j // 2 for j in range(64)]
        tasks, events = expand(chain)
        silu = [t for t in tasks if t.get("variant") == chain["layers"][2]["id"]]
        linear_events = sorted({t["trigger"] for t in tasks if t.get("variant") == chain["layers"][1]["id"]})
        assert [e["type"] for e in events[linear_events[0]:linear_events[-1] + 1]] == ["empty"] * 32
        assert [t["offset"] for t in silu] == list(range(32))
        # silu_mul's tile i waits for the event of the two linear tasks that write its columns
        assert [t["waits"] for t in silu] == [linear_events[0] + i for i in range(32)]
        assert all(e["triggers"] == 2 for e in events[linear_events[0]:linear_events[-1] + 1])


def test_events_follow_the_tiles_each_side_declares():
    """events.between, on layers as the plan makes them: MPK's gcd rule per dimension,
    tasks launched event by event with their own tile index, and one event where a side
    reads (or writes) the whole tensor or its strides make no equal tiles."""
    from mpkbuild.stages.runtime import events

    def layer(tasks, tensors, strides, num_inputs=1, grid_x=None, strides_y=None):
        return {"tasks": tasks, "grid_x": grid_x or tasks, "tensors": tensors, "num_inputs": num_inputs,
                "strides": strides, "strides_y": strides_y or [0] * len(strides)}
    # a [4, 96] bf16 tensor: the producer writes 6 column tiles of 16, the consumer reads 4 of 24
    producer = layer(6, [0, 1], [0, 32])
    consumer = layer(4, [1, 2], [48, 0])
    made = events.between(producer, consumer, 1, [4, 96], 2)
    assert made == {"event_of": [0, 0, 0, 1, 1, 1], "order": [0, 1, 2, 3], "launches": [2, 2]}
    # rows against columns: 4 row tasks, 3 column tiles; every tile needs every row: one event
    assert events.between(layer(4, [0, 1], [0, 96 * 2]), layer(3, [1, 2], [64, 0]), 1, [4, 96], 2) is None
    # a 2-d grid of the consumer (2 column tiles x 2 row tiles) over a producer of 2 row tiles:
    # the events follow the rows, the tasks launched row by row
    made = events.between(layer(2, [0, 1], [0, 2 * 96 * 2]),
                          layer(4, [1, 2], [48 * 2, 0], grid_x=2, strides_y=[2 * 96 * 2, 0]), 1, [4, 96], 2)
    assert made == {"event_of": [0, 1], "order": [0, 1, 2, 3], "launches": [2, 2]}
    # tiles that do not cover the tensor are not taken for tiles
    assert events.between(layer(5, [0, 1], [0, 32]), consumer, 1, [4, 96], 2) is None
    # a consumer that reads it whole waits for the whole layer
    assert events.between(producer, layer(4, [1, 2], [0, 0]), 1, [4, 96], 2) is None


def test_hang_phase_from_runtime_counters():
    pytest.importorskip("torch")
    from mpkbuild.runners.runtime import hang_phase
    g = {"layers": [{"tasks": 8}]}
    assert hang_phase("events 0 0 0; workers 0; schedulers 1", g, 1).startswith("launch (iteration 1")
    assert hang_phase("events 0 1 5; workers 1; schedulers 1", g, 2).startswith("iteration 2 (5 of 8")
    assert hang_phase("events 0 1 8; workers 1; schedulers 1", g, 1).startswith("termination")


# Issue 59 item 3: a spec's variants share the gate's worker. silu_mul_v2's ten (with their
# incumbents) take the production-shaped worker to 255 registers and 56 B of spill stores and
# loads; one variant alone beside the model's tasks compiles to 217 registers and none
# (bench/worker_evidence.py, RESULTS 28). linear_v2's (its variants and its MLP blocks'
# layers) spilled 20 B at 255 registers while the fused linears had two prologue warps and
# four mma warps each (RESULTS 36); since silu_mul's has four and two (the mma warps dealt
# a box's tiles in turn) it is 245 registers, 16 B of stack, no spills (RESULTS 38). The day
# silu_mul_v2's stops spilling, or another starts, this set says so.
SPILLING_WORKERS = {"silu_mul_v2"}


@needs_tree
@pytest.mark.nvcc
def test_every_catalog_megakernel_compiles(compiled):
    bad = {n: "\n".join(l for l in r[1].splitlines() if "error" in l)[:800]
           for n, r in compiled.items() if not r[0]}
    assert not bad, bad
    spilling = {}
    for name, (ok, log, took, lib) in compiled.items():
        assert lib.stat().st_size > 0
        worker = runtime.worker_facts(log)      # ptxas -v named the runtime's worker entry
        assert "worker_kernel" in worker["entry"] and 0 < worker["registers"] <= 255, (name, worker)
        if worker["spill_stores"] or worker["spill_loads"]:
            spilling[name] = worker
    assert set(spilling) == SPILLING_WORKERS, spilling


@needs_tree
@pytest.mark.nvcc
def test_compiled_builder_makes_the_planned_graph(compiled):
    """The C++ builder (loaded without a GPU) against the Python plan, every graph."""
    pytest.importorskip("torch")
    from mpkbuild.runners.runtime import Megakernel, describe
    for name, (ok, log, took, lib) in compiled.items():
        k = load_kernel(REPO, name, write_cache=False)
        specs = {c.name: c.spec.data for c in runtime.companions_for(k, {})}
        p = runtime.plan(k.spec.data, config.SHIPPED_WIRING, specs, PINNED)
        m = Megakernel(str(lib))
        assert m.graphs == [g["name"] for g in p["graphs"]]
        for gi, g in enumerate(p["graphs"]):
            d = describe(m, gi)
            tasks, events = expand(g)
            assert len(d["tasks"]) == len(tasks), (name, g["name"])
            assert len(d["events"]) == len(events)
            assert d["tasks"][0]["type"] == 0 and d["tasks"][1]["type"] == 10
            assert d["tasks"][1]["trigger"] == 1
            assert [t["trigger"] for t in d["tasks"][2:]] == [t["trigger"] for t in tasks[2:]]
            assert [t["offset"] for t in d["tasks"][2:]] == [t["offset"] for t in tasks[2:]]
            assert [t["dependent"] for t in d["tasks"]] == [-1 if t["waits"] is None else t["waits"] for t in tasks]
            assert d["events"][0]["type"] == 911 and d["events"][1]["type"] == 903
            assert d["events"][-1]["type"] == 910           # the last event ends the graph
            assert d["events"][-1]["triggers"] == g["layers"][-1]["tasks"]
            assert (d["events"][1]["first"], d["events"][1]["last"]) == (2, len(tasks))
            codes = {"empty": 900}
            assert [(e["type"], e["triggers"], e["first"], e["last"]) for e in d["events"][2:-1]] == \
                [(codes[e["type"]], e["triggers"], e["first"], e["last"]) for e in events[2:-1]], (name, g["name"])


@pytest.mark.gpu
@needs_tree
@pytest.mark.nvcc
def test_every_kernel_passes_in_the_persistent_kernel(compiled, tmp_path):
    for name, (ok, log, took, lib) in compiled.items():
        res, out = _run_runtime(REPO, name, lib, tmp_path)
        assert res["verdict"] == "pass", (name, res["message"], out)
        for g, r in res["variants"].items():
            assert r["iterations"] >= 3 and r["spans"]["count"] == r["tasks"]


TWO_LINEARS = "block:two_linears:b8"


def _two_linears_project(dest: Path) -> Path:
    """linear_v2 at one shape and a twin that loads W in 32-row boxes (other maps, so a
    tma.cuh case and a gate task type of its own), one after the other in a block of
    linear_v2's, each layer's incumbent MPK's TMA linear; no thresholds (the block is run
    for its numbers and its tasks, not judged)."""
    import shutil
    import yaml
    sys.path.insert(0, str(REPO / "bench"))
    from trim_spec import trim
    (dest / "specs").mkdir(parents=True)
    shutil.copytree(REPO / "kernels" / "linear_v2", dest / "kernels" / "linear_v2")
    shape = "decode_m8_n4096_k4096"
    data = trim(yaml.safe_load((REPO / "specs" / "linear_v2.yaml").read_text()), f"^{shape}$")
    data["runtime"]["thresholds"] = []
    twin = copy.deepcopy(data)
    twin["kernel"] = twin["wiring"]["layer"] = "linear_narrow"
    twin["codegen"]["params"]["box_n"] = 32
    data["runtime"]["blocks"] = [{
        "name": "two_linears", "batches": [8], "cos_min": 0.999, "rel_max": 3.0e-2,
        "layers": [{"kernel": name, "variant": "decode_m{batch}_n4096_k4096", "incumbent": "linear_swapAB_hopper"}
                   for name in ("linear_v2", "linear_narrow")]}]
    for spec in (data, twin):
        (dest / "specs" / f"{spec['kernel']}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return dest


@pytest.fixture(scope="module")
def two_linears(tmp_path_factory):
    """(project root, the compiled library, its folder: megakernel.cu, shadow/) of _two_linears_project."""
    if not (PINNED / "include").is_dir():
        pytest.skip("../shared/mirage (the pinned MPK tree) is absent")
    base = tmp_path_factory.mktemp("two_linears")
    root = _two_linears_project(base / "p")
    d = base / "mk"
    lib = _built("linear_v2", d, root)
    return root, lib, d


@needs_tree
@pytest.mark.nvcc
def test_a_block_of_tma_kernels_that_load_other_maps_builds_with_a_task_type_each(two_linears):
    """The block's second linear loads W in 32-row boxes: the library runs its layer under
    a second gate task type, and the shadow tma.cuh makes that type's maps (32-row W boxes)."""
    pytest.importorskip("torch")
    from mpkbuild.runners.runtime import Megakernel, task_types
    root, lib, d = two_linears
    m = Megakernel(str(lib))
    gi = m.graphs.index(TWO_LINEARS)
    assert [m.lib.mpkb_layer_task_type(gi, l) for l in range(2)] == [197, 196]
    assert task_types(m, gi) == {197, 196}
    assert task_types(m, m.graphs.index("decode_m8_n4096_k4096")) == {197}
    tma_text = (d / "shadow" / "tma.cuh").read_text()
    narrow = tma_text[tma_text.index("case MPKB_TMA_TASK_1:"):]
    assert "(32 - (tensor_desc.dim[0] % 32))" in narrow[:narrow.index("break;")]
    assert "(64 - (tensor_desc.dim[0] % 64))" in tma_text[tma_text.index("case MPKB_TMA_TASK:"):]


@pytest.mark.gpu
@needs_tree
@pytest.mark.nvcc
def test_a_block_of_tma_kernels_that_load_other_maps_passes_in_the_persistent_kernel(two_linears, tmp_path):
    """Run: every graph passes its iterations (the block's output within tolerance of the
    float64 composition), and the profiler sees each of the block's tasks under its type."""
    root, lib, d = two_linears
    res, out = _run_runtime(root, "linear_v2", lib, tmp_path)
    assert res["verdict"] == "pass", (res["message"], out)
    block = res["variants"][TWO_LINEARS]
    assert block["tasks"] == 2 * 128 and block["spans"]["count"] == block["tasks"]
    assert "head_to_head" in block, out


def test_the_stale_state_fixture_is_planned_as_one_layer_of_1024_tasks(tmp_path):
    """The fault fixture (tests/fixtures/faults/kernels/fault_stale_state) is wired for the
    runtime gate: more tasks than any production grid has workers, so workers run several."""
    root = _fault_project(tmp_path / "p")
    k = load_kernel(root, STALE, write_cache=False)
    (g,) = runtime.job_payload(k)["graphs"]
    assert g["layers"][0]["tasks"] == 1024 > 2 * max(w for _, w in runtime.WORKER_TABLE)
    assert runtime.job_payload(k)["iterations"] == 3


@pytest.mark.gpu
@needs_tree
@pytest.mark.nvcc
def test_state_kept_across_iterations_is_caught_at_iteration_2_and_by_validates_worker_mode(tmp_path):
    """fault_stale_state keeps, per CTA, the row it served and the launch it served it in
    (`__device__` globals) and, at a new launch, copies that row instead of its own.

    The runtime's 128 workers run 8 tasks each, and a worker's first task of iteration 2
    finds the last row it served in iteration 1: the runtime gate fails (numeric) at
    iteration 2, iteration 1 having passed. validate's one-task-per-block steps cannot see
    it (task b always runs on CTA b), but its first worker-mode launch (several tasks per
    block) leaves CTA b another task's row, which the second (Runtime-V2's block size)
    copies: validate fails too, without a checkout."""
    root = _fault_project(tmp_path / "p")
    d = tmp_path / "mk"
    lib = _built(STALE, d, root)
    res, out = _run_runtime(root, STALE, lib, tmp_path)
    r = res["variants"]["r1024_c256"]
    assert res["verdict"] == "fail" and r["check"] == "numeric", (res["message"], out)
    assert r["iteration"] == 2, res["message"]
    assert "r1024_c256 iteration 2 of 3 output fault_stale_state.output:" in res["message"]
    assert "state kept across iterations" in res["message"]
    import faultsuite
    run = faultsuite.scons(root, f"kernel={STALE}", "stage=validate")
    path = faultsuite.result_file(root, STALE)
    assert path is not None, run.output[-3000:]
    validate = json.loads(path.read_text())
    assert validate["verdict"] == "fail", (validate["message"], run.output[-3000:])
    assert "r1024_c256: trial 0 worker mode (352-thread blocks, the body on the first 128, " \
        in validate["message"] and "output output: cos " in validate["message"]


def _stand_in(monkeypatch, checkout=None, names=("decode_r1_h4096", "decode_r8_h4096")):
    """runners/runtime.py's main() on the CPU with the stand-in library: run(hang, **fake
    options) -> result; run.made: the stand-ins made. With a checkout, each graph's
    incumbents too (the runner's real rival_tensors, bound to the stand-in)."""
    pytest.importorskip("torch")
    sys.path.insert(0, str(REPO / "tests" / "fakes"))
    from fake_megakernel import FakeMegakernel
    from mpkbuild.runners import runtime as side
    monkeypatch.setattr(side, "DEVICE", "cpu")
    monkeypatch.setattr(side, "device_facts", lambda: {"name": "stand-in", "sm_count": 132})
    real_tensors_for, real_rivals = side._tensors_for, side.rival_tensors
    made = []

    def tensors_for(job, graph, gen):
        order, refs, names_, checks = real_tensors_for(job, graph, gen)
        for m in made:              # the minimal worker's stand-in runs ours on them too
            m.bind(order, refs, checks)
        return order, refs, names_, checks

    def rivals(recipes, ours):
        out = real_rivals(recipes, ours)
        g = next(i for i, p in enumerate(payload["graphs"]) if p.get("tensors") is recipes)
        for m in made:
            m.bind_rival(g, out)
        return out

    monkeypatch.setattr(side, "_tensors_for", tensors_for)
    monkeypatch.setattr(side, "rival_tensors", rivals)
    k = load_kernel(REPO, "rmsnorm_v2", write_cache=False)
    payload = runtime.job_payload(k, checkout_root=checkout)
    # the smallest graphs (and their incumbents): the stand-in copies references, the CPU
    # computes them
    payload["graphs"] = [g for g in payload["graphs"] if g["name"] in names or g.get("of") in names]
    payload["pairs"] = 9

    def run(hang=None, minimal=None, only=None, **fake):
        """minimal: the minimal worker's stand-in options over `fake` (None: no minimal worker);
        only: the graphs asked for (the job's `only`)."""
        monkeypatch.setattr(side, "Megakernel", lambda path: made.append(
            FakeMegakernel(payload["graphs"], hang, **fake) if path == "stand-in" else
            FakeMegakernel(payload["graphs"], None, **{**fake, **minimal})) or made[-1])
        job = {"root": str(REPO), "library": "stand-in", "runtime": payload,
               **({"only": only} if only else {})}
        if minimal is not None:         # each variant's worker alone: one library each
            job["library_alone"] = {g["name"]: f"stand-in {g['name']} alone" for g in payload["graphs"]
                                    if g.get("role") != "incumbent"}
        return side.main(job)

    run.graphs = [g for g in payload["graphs"] if g.get("role") != "incumbent"]
    run.payload = payload
    run.made = made
    return run


@pytest.fixture
def stand_in(monkeypatch):
    return _stand_in(monkeypatch)


@pytest.fixture
def head_to_head(monkeypatch):
    if not (PINNED / "src" / "kernel" / "task_register.cc").is_file():
        pytest.skip("../shared/mirage (the pinned MPK tree) is absent")
    return _stand_in(monkeypatch, PINNED, names=("decode_r1_h4096",))


def test_a_stand_in_without_a_hang_passes_every_graph_for_3_iterations(stand_in):
    res = stand_in(None)
    assert res["verdict"] == "pass", res["message"]
    assert res["grid"] == {"workers": 128, "schedulers": 16}
    assert [r["iterations"] for r in res["variants"].values()] == [3, 3]
    assert stand_in.made[-1].calls.count("finalize 1") == 1


def test_a_job_that_asks_for_one_graph_runs_only_it_from_the_whole_library(stand_in):
    """bench/worker_evidence.py times one variant in a library that holds them all: the job
    keeps every graph (its index is the library's) and names the one to run."""
    first, second = (g["name"] for g in stand_in.graphs)
    res = stand_in(None, only=[second])
    assert res["verdict"] == "pass", res["message"]
    assert list(res["variants"]) == [second]


@pytest.mark.parametrize("hang, phase", [
    ({"graph": 1, "iteration": 2, "phase": "tasks"},
     "iteration 2 (4 of 8 tasks of the last layer finished)"),
    ({"graph": 1, "iteration": 1, "phase": "launch"},
     "launch (iteration 1: the begin-graph task never ran)"),
    ({"graph": 1, "iteration": 3, "phase": "termination"},
     "termination (iteration 3: all 8 tasks finished)"),
])
def test_a_task_that_never_finishes_is_a_hang_naming_its_phase_and_the_runtime_state(
        stand_in, hang, phase):
    """The runner's real main() and run_graph() with the stand-in library: the graph before
    passes, the hung graph's verdict names the phase read from the runtime's counters, the
    runner stops there (the GPU would still hold the hung kernels) and never finalizes it."""
    res = stand_in(hang)
    first, hung = (g["name"] for g in stand_in.graphs)
    assert res["verdict"] == "hang"
    assert res["variants"][first]["verdict"] == "pass"
    r = res["variants"][hung]
    assert r["verdict"] == "hang" and r["iteration"] == hang["iteration"]
    assert r["phase"] == phase
    assert r["state"].startswith("events 0 ") and r["state"] in res["message"]
    assert res["message"].startswith(f"{hung}: {phase} did not finish in 20.0 s")
    calls = stand_in.made[-1].calls
    assert calls[-2:] == [f"launch 1 {hang['iteration']}", "read_state"]
    assert "finalize 1" not in calls


def test_a_launch_call_that_never_returns_is_a_launch_hang_without_reading_the_state(stand_in):
    """The host blocked inside the runtime's launch (seen on an H200): the library's own
    timeout answers, the verdict names the phase, and the runner reads no state (that read
    could block on the same driver lock) and stops."""
    res = stand_in({"graph": 1, "iteration": 2, "phase": "host"})
    first, hung = (g["name"] for g in stand_in.graphs)
    assert res["verdict"] == "hang" and res["variants"][first]["verdict"] == "pass"
    r = res["variants"][hung]
    assert r["phase"] == "launch (iteration 2: the host's launch call did not return)"
    assert "state" not in r and res["message"].startswith(f"{hung}: {r['phase']} in 20.0 s")
    assert stand_in.made[-1].calls[-1] == "launch 1 2"


def test_a_kernel_that_does_not_finish_alone_is_a_warm_up_hang(stand_in):
    res = stand_in({"graph": 0, "setup": 3})
    (name,) = res["variants"]
    assert res["verdict"] == "hang" and res["variants"][name]["phase"] == "warm-up"
    assert "the worker kernel launched alone did not finish" in res["message"]


def test_review_with_a_checkout_that_has_no_cutlass_says_why_the_runtime_gate_is_not_there(project, tmp_path):
    """stage=runtime refuses such a checkout; stage=review builds without the gate, and says why."""
    fake = tmp_path / "mpk_no_deps"
    (fake / "include/mirage/persistent_kernel").mkdir(parents=True)
    (fake / "include/mirage/persistent_kernel/persistent_kernel.cuh").write_text("// stand-in\n")
    run = project.scons("-n", "stage=review", f"mpk_root={fake}")
    assert "no runtime gate for any kernel" in run.stderr and "cutlass/include not found" in run.stderr


def _judged(res: dict, thresholds: list, variants: list[str]) -> dict:
    from mpkbuild.stages.runtime import judge
    return judge.judge(res, thresholds, variants)


def test_ours_and_the_incumbent_are_set_up_side_by_side_and_launched_in_turn(head_to_head):
    """Ours passes its iterations, the incumbent is set up beside it, checked once against
    ours, ours is set up a second time (the A/A side), then the three are launched from their
    kept setups in alternating order (0 1 2 | 2 1 0), and all are freed."""
    res = head_to_head(task_us={"ours": 1.0, "rmsnorm_hopper": 1.0})
    assert res["verdict"] == "pass", res["message"]
    h = res["variants"]["decode_r1_h4096"]["head_to_head"]
    assert h["pairs"] == 9 and len(h["ours"]["makespan_us"]) == 9 and len(h["aa"]["makespan_us"]) == 9
    assert list(h["incumbents"]) == ["rmsnorm_hopper"]            # the A/A side is no incumbent
    assert h["order"].startswith("alternating: ours rmsnorm_hopper A/A | A/A rmsnorm_hopper ours")
    inc = h["incumbents"]["rmsnorm_hopper"]
    assert inc["registers"] == ["register_rmsnorm_hopper_task"] and inc["tasks"] == 1
    assert inc["numerics"]["rmsnorm_v2.output"]["ours_vs_incumbent"]["cos"] == pytest.approx(1.0)
    calls = head_to_head.made[-1].calls
    timed = [c for c in calls if c.startswith("restore")]
    assert timed[:27] == ["restore 0", "restore 1", "restore 2", "restore 2", "restore 1", "restore 0"] * 4 \
        + ["restore 0", "restore 1", "restore 2"]
    # each slot torn down (the stand-in logs the graph a setup runs: the A/A's is ours, 0)
    assert calls[-6:] == ["restore 0", "finalize 0", "restore 1", "finalize 1", "restore 2", "finalize 0"]


def test_a_graph_whose_tasks_run_under_another_gate_task_type_is_checked_and_timed_by_it(head_to_head):
    """A block's kernel that loads other TMA maps runs under a gate task type of its own
    (MPKB_TASK_TYPE_1, the stand-in's 196): the runner counts and times a graph's tasks by
    the types the library says its layers run under, not by the gated kernel's type."""
    graph = next(g for g in head_to_head.payload["graphs"] if g["name"] == "decode_r1_h4096")
    graph["layers"][0]["task_type"] = "MPKB_TASK_TYPE_1"
    res = head_to_head(task_us={"ours": 1.0, "rmsnorm_hopper": 2.0})
    assert res["verdict"] == "pass", res["message"]
    r = res["variants"]["decode_r1_h4096"]
    assert r["tasks"] == 1 and len(r["spans"]["per_iteration_slowest_us"]) == 3   # 3 iterations
    h = r["head_to_head"]
    assert 0.9 < statistics.median(h["ours"]["makespan_us"]) < 1.1
    assert 0.9 < statistics.median(h["aa"]["makespan_us"]) < 1.1
    assert 1.9 < statistics.median(h["incumbents"]["rmsnorm_hopper"]["makespan_us"]) < 2.1


def test_a_cold_head_to_head_judges_launches_after_the_l2_is_written_over_and_keeps_hot_beside(head_to_head):
    """runtime.memory: cold (issue 59 item 6): each side is launched hot and then cold in
    every round; the judged samples are the cold ones, the hot ones a diagnostic judged
    alike (no rule), and the record says which memory state it measured."""
    from mpkbuild.stages.runtime import judge
    head_to_head.payload["memory"] = "cold"
    res = head_to_head(task_us={"ours": 1.0, "rmsnorm_hopper": 2.0})
    h = res["variants"]["decode_r1_h4096"]["head_to_head"]
    assert h["memory"].startswith("cold: the L2 filled with other, clean data before each launch")
    assert len(h["ours"]["makespan_us"]) == 9 and len(h["hot"]["ours"]["makespan_us"]) == 9
    assert list(h["hot"]["incumbents"]) == ["rmsnorm_hopper"] and len(h["hot"]["aa"]["makespan_us"]) == 9
    launches = [c for c in head_to_head.made[-1].calls if c.startswith("restore")]
    assert launches[:6] == ["restore 0", "restore 0", "restore 1", "restore 1", "restore 2", "restore 2"]
    out = judge.judge(res, [{"variants": "decode_*", "max_vs_incumbent": 1.0}], ["decode_r1_h4096"])
    h = out["variants"]["decode_r1_h4096"]["head_to_head"]
    assert h["incumbents"]["rmsnorm_hopper"]["vs"]["makespan"]["verdict"] == "faster"
    assert h["hot"]["incumbents"]["rmsnorm_hopper"]["vs"]["makespan"]["verdict"] == "faster"
    assert out["verdict"] == "pass" and len(out["variants"]["decode_r1_h4096"]["limits"]) == 1


def test_ours_is_timed_in_its_worker_alone_too_and_the_review_shows_the_compositions_effect(head_to_head):
    """Issue 59 items 2 and 3: where the worker is production-shaped, ours is also set up in
    the library of its variant's worker alone (no model task, no other variant) and launched
    in the same alternating rounds; ours here / ours there is the composition's effect (a
    stand-in 1.3x slower among the model's tasks and the other variants), judged with the
    A/A floor like any ratio, and the review's lead has it per variant."""
    res = head_to_head(task_us={"ours": 1.3, "rmsnorm_hopper": 2.0}, minimal={"task_us": {"ours": 1.0}})
    main, small = head_to_head.made[-2:]
    h = res["variants"]["decode_r1_h4096"]["head_to_head"]
    assert len(h["minimal"]["makespan_us"]) == 9 and "A/A" not in h["incumbents"]
    assert list(h["incumbents"]) == ["rmsnorm_hopper"]
    # set up once (one checked launch), then one launch a round; torn down with the rest
    assert len([c for c in small.calls if c.startswith("launch")]) == 1 + 9
    assert small.calls[-1] == "finalize 0" and not [c for c in main.calls if c.startswith("restore 3")]
    from mpkbuild.stages.runtime import judge
    out = judge.judge(res, [{"variants": "decode_*", "max_vs_incumbent": 1.0}], ["decode_r1_h4096"])
    h = out["variants"]["decode_r1_h4096"]["head_to_head"]
    effect = h["minimal"]["vs"]["makespan"]
    assert effect["ratio"] == pytest.approx(1.3, rel=0.05) and effect["verdict"] == "slower"
    assert out["verdict"] == "pass", out["message"]          # held to no rule
    from mpkbuild.stages import review
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "runtime.json"
        path.write_text(json.dumps(out))
        page = review.render_kernel(review.kernel_review("rmsnorm_v2", Path(d), [], "h200", {}, {"runtime": path}))
    # the gate says which verdicts the worker's other tasks move beyond its floor
    assert out["composition_effect"] == {"graphs": 1, "beyond_floor": {"decode_r1_h4096": pytest.approx(1.3, rel=0.05)}}
    assert ("The composition's effect on ours (ours in the production worker / in its variant's worker "
            "alone: the model's tasks and the other variants together) is within the A/A floor for 0 of "
            "1 graphs; beyond it: decode_r1_h4096 1.3") in page, page
    row = next(l for l in page.splitlines() if l.startswith("| decode_r1_h4096 | rmsnorm_hopper"))
    floor_at = row.split(" | ").index(next(c for c in row.split(" | ") if c.startswith("±")))
    assert row.split(" | ")[floor_at + 1].startswith(f"{effect['ratio']:.3f}× [") and "slower" in row


@needs_tree
def test_the_gate_says_what_worker_it_measured_in_and_a_new_variant_is_in_it():
    """Issue 59 item 2: the composition is part of every result (the task bodies the worker
    holds, ours by variant, the incumbents by task) with the worker's registers and stack
    from its compile; a variant added to the spec joins the composition, and the review says
    which worker the verdict was measured in."""
    k = load_kernel(REPO, "rmsnorm_v2", write_cache=False)
    payload = runtime.job_payload(k, checkout_root=PINNED)
    assert "rmsnorm_v2.decode_r1_h4096" in payload["composition"]
    assert "rmsnorm_hopper (incumbent)" in payload["composition"]
    more = copy.deepcopy(k.spec.data)
    more["codegen"]["variants"]["decode_r3_h4096"] = dict(more["codegen"]["variants"]["decode_r1_h4096"], rows=3)
    grown = runtime.task_bodies(runtime.plan(more, config.wiring_roots(REPO), {}, PINNED)["dispatch"])
    assert set(grown) - set(payload["composition"]) == {"rmsnorm_v2.decode_r3_h4096"}
    log = ("ptxas info    : Compiling entry function '_Z13worker_kernelN6mirage7runtime13RuntimeConfigE' for 'sm_90a'\n"
           "ptxas info    : Function properties for _Z13worker_kernelN6mirage7runtime13RuntimeConfigE\n"
           "    16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
           "ptxas info    : Used 167 registers, used 5 barriers, 16 bytes cumulative stack size\n")
    worker = runtime.worker_facts(log)
    assert worker["registers"] == 167 and worker["stack_bytes"] == 16
    # a task body the worker calls (not inlined) is the worker's code: its spills are counted,
    # not lost behind the entry's (ptxas lists the callee after the entry, by its own name)
    called = runtime.worker_facts(log + (
        "ptxas info    : Compile time = 9.0 ms\n"
        "ptxas info    : Function properties for _ZN6kernel19mpkbuild_linear_v213linear_v2_taskILi1EEEvPc\n"
        "    0 bytes stack frame, 36 bytes spill stores, 36 bytes spill loads\n"))
    assert (called["registers"], called["stack_bytes"], called["spill_stores"], called["spill_loads"]) == (167, 16, 36, 36)
    from mpkbuild.stages import review
    res = {"verdict": "pass", "message": "ok", "grid": {"workers": 128, "schedulers": 16},
           "worker": {**worker, "composition": payload["composition"], "kind": payload["composition_kind"]},
           "variants": {"decode_r1_h4096": {"verdict": "pass", "tasks": 1, "head_to_head": {
               "ours": {"makespan_us": [1.0] * 9, "slowcta_us": [1.0] * 9},
               "incumbents": {"rmsnorm_hopper": {"tasks": 1, "makespan_us": [2.0] * 9, "slowcta_us": [2.0] * 9,
                                                 "numerics": {}}}}}}}
    from mpkbuild.stages.runtime import judge
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "runtime.json"
        path.write_text(json.dumps(judge.judge(res, [], ["decode_r1_h4096"])))
        page = review.render_kernel(review.kernel_review("rmsnorm_v2", Path(d), [], "h200", {}, {"runtime": path}))
    assert (f"Measured in a worker of 167 registers (16 B stack, no spills) holding "
            f"{len(payload['composition'])} task bodies (production-shaped: the qwen3 builder's decode "
            "tasks on Hopper (batch 8, hidden 4096") in page
    # measured again after a variant joined: the result says what changed since the verdict
    # before, and the review leads with it
    from mpkbuild.runners.runtime import worker_record
    record = worker_record({"worker": dict(worker, registers=252), "composition": grown,
                            "worker_before": {**worker, "composition": payload["composition"]}})
    assert record["changed"] == {"registers": [167, 252], "stack_bytes": [16, 16],
                                 "added": ["rmsnorm_v2.decode_r3_h4096"], "removed": []}
    assert "changed" not in worker_record({"worker": worker, "composition": grown,
                                           "worker_before": {**worker, "composition": grown}})
    res["worker"] = record
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "runtime.json"
        path.write_text(json.dumps(judge.judge(res, [], ["decode_r1_h4096"])))
        page = review.render_kernel(review.kernel_review("rmsnorm_v2", Path(d), [], "h200", {}, {"runtime": path}))
    assert ("**The worker changed since the verdict before** (167 → 252 registers, 16 → 16 B stack; "
            "added: rmsnorm_v2.decode_r3_h4096): every variant was measured again in it.") in page


def test_the_a_a_floor_widens_every_ratio_so_faster_is_said_only_beyond_it():
    """Ours against ours reads 0.96-1.04x: a 0.98x ratio against the incumbent, faster on
    its own interval, is `same` once widened by that floor, and a 1.0 limit is unsure, not
    passed; the message names the floor. Without an A/A side the floor is 0."""
    from mpkbuild.stages.runtime import judge
    ours = [10.0 + 0.01 * (i % 3) for i in range(20)]
    spread = [0.96, 1.04, 1.0, 0.97, 1.03] * 4
    h2h = {"ours": {"makespan_us": ours, "slowcta_us": ours},
           "aa": {"makespan_us": [o / r for o, r in zip(ours, spread)],
                  "slowcta_us": [o / r for o, r in zip(ours, spread)]},
           "incumbents": {"inc": {"makespan_us": [o / 0.98 for o in ours], "slowcta_us": [o / 0.98 for o in ours]}}}
    res = {"verdict": "pass", "message": "ran", "variants": {"v": {"verdict": "pass", "head_to_head": h2h}}}
    out = judge.judge(copy.deepcopy(res), [{"variants": "v", "max_vs_incumbent": 1.0, "incumbent": "inc"}], ["v"])
    h = out["variants"]["v"]["head_to_head"]
    assert 0.03 <= h["floor"]["makespan"] <= 0.05, h["floor"]
    c = h["incumbents"]["inc"]["vs"]["makespan"]
    assert c["ratio"] == pytest.approx(0.98) and c["lo"] < 0.96 and c["hi"] > 1.0
    assert out["verdict"] == "unsure" and "with the A/A floor of" in out["unsure"][0], out
    del res["variants"]["v"]["head_to_head"]["aa"]
    bare = judge.judge(copy.deepcopy(res), [{"variants": "v", "max_vs_incumbent": 1.0, "incumbent": "inc"}], ["v"])
    assert bare["verdict"] == "pass" and bare["variants"]["v"]["head_to_head"]["floor"]["makespan"] == 0.0


@pytest.mark.parametrize("ours_us, verdict, word", [(2.0, "fail", "slower"), (0.5, "pass", "faster")])
def test_the_in_runtime_figures_are_judged_against_the_incumbent(head_to_head, ours_us, verdict, word):
    """A stand-in whose tasks take twice the incumbent's fails `max_vs_incumbent: 1.0` on the
    makespan, with the ratio's interval in the message; half the time passes, `faster`."""
    res = head_to_head(task_us={"ours": ours_us, "rmsnorm_hopper": 1.0})
    out = _judged(res, [{"variants": "decode_*", "max_vs_incumbent": 1.0, "figure": "makespan"}],
                  ["decode_r1_h4096"])
    assert out["verdict"] == verdict, out["message"]
    c = out["variants"]["decode_r1_h4096"]["head_to_head"]["incumbents"]["rmsnorm_hopper"]["vs"]["makespan"]
    assert c["verdict"] == word and c["ratio"] == pytest.approx(ours_us, rel=0.05)
    if verdict == "fail":
        assert "in-runtime makespan" in out["message"] and "rmsnorm_hopper's" in out["message"]
        assert "95% CI" in out["message"]


def test_an_output_that_differs_from_the_incumbents_fails_the_gate(head_to_head):
    res = head_to_head(skew={"rmsnorm_hopper": 1.5})
    r = res["variants"]["decode_r1_h4096"]
    assert res["verdict"] == "fail" and r["check"] == "incumbent numerics", res["message"]
    assert "against incumbent rmsnorm_hopper on the same inputs: rel" in r["message"]


def test_a_rule_whose_incumbent_cannot_run_fails_and_says_why():
    res = {"verdict": "pass", "message": "ok", "variants": {"v": {
        "verdict": "pass", "no_incumbent": [{"incumbent": "linear_swapAB_hopper",
                                             "why": "its call takes TMA descriptors"}]}}}
    out = _judged(res, [{"variants": "*", "max_vs_incumbent": 1.0}], ["v"])
    assert out["verdict"] == "fail"
    assert "no in-runtime figure of an incumbent (linear_swapAB_hopper: its call takes TMA" in out["message"]


def _text_sections(cubin: Path) -> dict[str, bytes]:
    from mpkbuild.util.nvcc_steps import cubin_functions
    return cubin_functions(cubin)


@needs_tree
@pytest.mark.nvcc
def test_the_split_build_makes_the_device_code_of_one_plain_nvcc_and_reuses_the_host_object(tmp_path):
    """The runtime gate's megakernel compile runs nvcc's own steps as two chains side by
    side; the worker's SASS (every function's machine code in the cubin) is byte for byte
    what one plain nvcc of the same source makes. A body edit that leaves the host side as
    it was (a comment, lines moved) reuses the host object; the library still links."""
    import shutil
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc on PATH")
    (tmp_path / "mk").mkdir()
    d = _materialise("rmsnorm_v2", tmp_path / "mk")
    assert (d / "shadow" / "persistent_kernel.cuh").read_bytes() == \
        (PINNED / "include/mirage/persistent_kernel/persistent_kernel.cuh").read_bytes()
    assert '#include "tasks/hopper/rmsnorm_hopper.cuh"' in (d / "shadow/tasks/hopper/task_header.cuh").read_text()
    checkout = runtime.Checkout.find(PINNED)
    lib = d / "lib.so"
    ok, log, _ = runtime.compile_megakernel(checkout, d / "megakernel.cu", [d], lib, d / "log", shadow=d / "shadow")
    assert ok, log[-3000:]
    plain = d / "plain"
    plain.mkdir()
    cmd = runtime.nvcc_command(checkout, d / "megakernel.cu", [d], plain / "lib.so", shadow=d / "shadow")
    proc = subprocess.run(cmd + ["--keep", f"--keep-dir={plain}"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ours, theirs = _text_sections(d / "nvcc-steps" / "megakernel.cubin"), _text_sections(plain / "megakernel.cubin")
    assert any("worker_kernel" in n for n in ours) and ours == theirs
    body = d / "rmsnorm_v2.cuh"
    body.write_text("// an edit that moves every line\n\n" + body.read_text())
    ok, log, _ = runtime.compile_megakernel(checkout, d / "megakernel.cu", [d], lib, d / "log", shadow=d / "shadow")
    assert ok and "(the host object of an identical host side:" in log, log[-3000:]
    assert _text_sections(d / "nvcc-steps" / "megakernel.cubin") == theirs


def test_an_nvcc_whose_steps_are_not_known_compiles_in_one_piece_and_says_so(tmp_path):
    """The split build reads nvcc's --dryrun; steps of another shape (another CUDA) fall
    back to the one plain nvcc command, and the log says why."""
    from mpkbuild.util.nvcc_steps import split_compile
    nvcc = tmp_path / "nvcc"
    nvcc.write_text("#!/bin/sh\n"
                    "case \" $* \" in *' --dryrun '*) echo '#$ _HERE_=/x' >&2; echo '#$ sometool a b' >&2; exit 0;; esac\n"
                    "while [ \"$1\" != -o ]; do shift; done; echo built > \"$2\"\n")
    nvcc.chmod(0o755)
    out = tmp_path / "lib.so"
    ok, log = split_compile([str(nvcc), str(tmp_path / "k.cu"), "-o", str(out)], tmp_path / "steps")
    assert ok and out.read_text() == "built\n"
    assert log.startswith("(not split: this nvcc's --dryrun has other steps: StopIteration")


@pytest.mark.gpu
@needs_tree
@pytest.mark.nvcc
def test_a_count_kept_across_iterations_fails_at_iteration_2_in_v1(tmp_path):
    """fault_kept_count (a per-task count in a __device__ global, never reset): each v1
    launch is one iteration and the global outlives it, so iteration 2 writes input + 1."""
    root = _fault_project(tmp_path / "p")
    d = tmp_path / "mk"
    lib = _built("fault_kept_count", d, root)
    res, out = _run_runtime(root, "fault_kept_count", lib, tmp_path)
    r = res["variants"]["r512_c256"]
    assert res["verdict"] == "fail" and r["check"] == "numeric" and r["iteration"] == 2, (res["message"], out)
    assert "r512_c256 iteration 2 of 3 output fault_kept_count.output:" in res["message"]


def test_no_megakernel_runs_before_validate_passed(project):
    """The runtime gate needs validate's verdict (test mode first): -n lists validate before
    it, the gate node reads validate.verdict, and a validate that did not pass blocks it as
    it blocks perf."""
    from mpkbuild import stages
    assert "validate" in stages.BY_NAME["runtime"].gate.needs_pass
    assert "validate" in stages.closure("runtime")
    run = project.scons("-n", "kernel=rmsnorm_v2", "stage=runtime", f"mpk_root={PINNED}")
    listed = run.stdout.split("\n")
    gate = next(i for i, l in enumerate(listed) if l.startswith("runtime rmsnorm_v2"))
    assert any(l.startswith("validate rmsnorm_v2") for l in listed[:gate]), listed


def test_runtime_state_is_fed_to_the_runtime_not_to_the_task():
    """embedding_tokens_v2 reads the step's tokens from the runtime: its graph's layer hands
    the task the table and the output only, the tokens tensor is fed as MPK's tokens meta
    tensor (runtime_state), and the runner still makes (and checks against) every tensor."""
    k = load_kernel(REPO, "embedding_tokens_v2", write_cache=False)
    p = runtime.plan(k.spec.data, config.SHIPPED_WIRING)
    for g in p["graphs"]:
        (layer,) = g["layers"]
        assert g["num_tensors"] == 3 and g["runtime_state"] == [-1, 0]
        assert layer["num_inputs"] == 1 and layer["tensors"][:2] == [1, 2]
        assert layer["spec_tensors"] == [0, 1, 2] and layer["metadata"] == 0
    text = runtime.render(k, config.SHIPPED_WIRING, None)
    assert "runtime_config.tokens + runtime_config.step[0]" in text
    assert "meta[m] = tensors[t];" in text


def test_task_metadata_is_set_per_task_as_the_wired_builder_sets_it():
    import copy
    k = load_kernel(REPO, "rmsnorm_v2", write_cache=False)
    spec = copy.deepcopy(k.spec.data)
    spec["codegen"]["task_metadata"] = ["request_id", "kv_idx"]
    spec["wiring"]["tile_indexed"] = False
    p = runtime.plan(spec, config.SHIPPED_WIRING)
    assert {l["metadata"] for g in p["graphs"] for l in g["layers"]} == {1 | 4}
    call = " ".join(" ".join(p["dispatch"][0]["call"]).split())
    assert ("task_desc->task_metadata.request_id, task_desc->task_metadata.kv_idx, 0, "
            "kernel::mpkbuild_rmsnorm_v2::rmsnorm_v2_spec::task_smem());") in call


def test_ours_against_the_incumbent_is_held_row_by_row_on_rows_of_varied_magnitude():
    """Issue 59 item 8: the head to head's float inputs get rows of very different magnitude
    (runtime.generators wins where it names one; ids keep theirs), and ours against the
    incumbent is held to rel_max within every row: a 5% difference on a row a thousand times
    smaller than the largest (another eps on a near-zero row) passes the output-wide figures
    and fails here, naming the row."""
    import torch
    from mpkbuild.runners.common import random_tensor
    from mpkbuild.runners.runtime import ROW_SCALES, head_to_head_generators
    from mpkbuild.runners.validate import compare
    side = {"codegen": {"inputs": [{"name": "x"}, {"name": "ids"}, {"name": "w"}, {"name": "tokens", "runtime": "tokens"}]},
            "generators": {"x": {"dist": "normal", "mean": 0.0, "std": 2.0}, "ids": {"dist": "randint", "low": 0, "high": 9}}}
    gens = head_to_head_generators(side, {"w": {"dist": "uniform", "low": 1.0, "high": 2.0}})
    assert gens == {"x": {"dist": "normal", "mean": 0.0, "std": 2.0, "row_scales": ROW_SCALES},
                    "w": {"dist": "uniform", "low": 1.0, "high": 2.0}}
    g = torch.Generator().manual_seed(1)
    x = random_tensor([64, 256], torch.float32, gens["x"], g, device="cpu")
    peaks = x.abs().amax(dim=1)
    assert peaks.max() / peaks.min() > 1e3                        # rows span decades
    ref = x.to(torch.float64)
    out = x.clone()                                               # the output's dtype: float32
    small = int(peaks.argmin())
    out[small] *= 1.05
    vcfg = {"compare": "tolerance", "cos_min": 0.999, "rel_max": 3e-2}
    assert compare(out, ref, vcfg)[1] is None                     # the output-wide figures pass
    numbers, problem = compare(out, ref, {**vcfg, "per_row": True})
    assert problem.startswith(f"row {small}: rel 5.0") and numbers["worst_row"] == small, problem


def test_row_scales_are_refused_on_integer_draws_and_backwards_bounds(tmp_path):
    import shutil
    from mpkbuild.model.spec import SpecError
    from mpkbuild.stages import load_spec
    root = tmp_path / "p"
    shutil.copytree(REPO / "specs", root / "specs")
    shutil.copytree(REPO / "kernels", root / "kernels")
    spec = root / "specs" / "embedding_v2.yaml"
    text = spec.read_text()
    for edit, words in ((lambda t: t.replace("dist: randint,", "dist: randint, row_scales: [0.1, 10],", 1),
                         "row_scales scales float draws"),
                        (lambda t: t.replace("dist: normal,", "dist: normal, row_scales: [10, 0.1],", 1),
                         "the low scale must be below the high one")):
        spec.write_text(edit(text))
        with pytest.raises(SpecError) as err:
            load_spec(spec, root)
        assert words in err.value.message and err.value.path[-1] == "row_scales", err.value


def test_the_incumbent_is_also_timed_at_its_other_configurations_and_judged_at_its_best(monkeypatch):
    """Issue 59 item 7: rmsnorm_hopper at 8 rows runs at its builder default (one row a
    task) and at 2, 4 and 8 rows a task, each set up and launched in the same rounds. Where
    4 rows a task is MPK's fastest, a rule `against: best` judges ours against that and says
    so; the default rule is unchanged. A configuration whose output disagrees is left out
    (MPK's task cannot run that way), never ours' failure."""
    if not (PINNED / "src" / "kernel" / "task_register.cc").is_file():
        pytest.skip("../shared/mirage (the pinned MPK tree) is absent")
    run = _stand_in(monkeypatch, PINNED, names=("decode_r8_h4096",))
    sides = [g.get("side") for g in run.payload["graphs"] if g.get("of") == "decode_r8_h4096"]
    assert sides == ["rmsnorm_hopper", "rmsnorm_hopper@rows_per_task=2", "rmsnorm_hopper@rows_per_task=4",
                     "rmsnorm_hopper@rows_per_task=8"]
    # per task: ours 1.0 us; the builder's one row a task 2.0; four rows a task 0.5 (x2 tasks)
    res = run(task_us={"ours": 1.0, "rmsnorm_hopper": 2.0, "rmsnorm_hopper@rows_per_task=4": 1.5},
              skew={"rmsnorm_hopper@rows_per_task=8": 1.5})
    h = res["variants"]["decode_r8_h4096"]["head_to_head"]
    assert res["verdict"] == "pass", res["message"]
    assert list(h["incumbents"]) == ["rmsnorm_hopper", "rmsnorm_hopper@rows_per_task=2",
                                     "rmsnorm_hopper@rows_per_task=4"]
    assert "rows_per_task=8" in next(iter(h["dropped"])) and "against ours" in h["dropped"]["rmsnorm_hopper@rows_per_task=8"]
    from mpkbuild.stages.runtime import judge
    rules = [{"variants": "decode_*", "max_vs_incumbent": 1.0},
             {"variants": "decode_*", "max_vs_incumbent": 1.0, "against": "best"}]
    out = judge.judge(res, rules, ["decode_r8_h4096"])
    h = out["variants"]["decode_r8_h4096"]["head_to_head"]
    assert h["best"] == {"rmsnorm_hopper": "rmsnorm_hopper@rows_per_task=4"}
    # 8 tasks of 1.0 against 8 of 2.0 (default): 0.5x; against 2 tasks of 1.5 (its best): 2.67x
    assert h["incumbents"]["rmsnorm_hopper"]["vs"]["makespan"]["ratio"] == pytest.approx(0.5, rel=0.05)
    assert out["verdict"] == "fail" and len(out["problems"]) == 1, out["message"]
    assert "rmsnorm_hopper at its best (rows_per_task=4)'s" in out["problems"][0]
    from mpkbuild.stages.runtime.report import head_to_head_table
    rows = {r["incumbent"]: r for r in head_to_head_table(out, None)}
    assert rows["rmsnorm_hopper@rows_per_task=4"]["flag"] == "MPK's task at its best: rows_per_task=4"
    assert rows["rmsnorm_hopper@rows_per_task=8"]["why"].startswith("left out, it disagrees with ours")


def test_where_the_worker_is_production_shaped_the_other_configurations_run_in_the_minimal_one(monkeypatch):
    """The production worker holds what production holds: an incumbent's other
    configurations are compiled into the minimal worker only (megakernel_parts.cu.j2) and set
    up in its library, each paired with ours there; the builder's default stays beside ours
    in the production worker."""
    if not (PINNED / "src" / "kernel" / "task_register.cc").is_file():
        pytest.skip("../shared/mirage (the pinned MPK tree) is absent")
    run = _stand_in(monkeypatch, PINNED, names=("decode_r8_h4096",))
    res = run(task_us={"ours": 1.0, "rmsnorm_hopper": 2.0},
              minimal={"task_us": {"ours": 0.9, "rmsnorm_hopper@rows_per_task=2": 5.0,
                                   "rmsnorm_hopper@rows_per_task=4": 1.5, "rmsnorm_hopper@rows_per_task=8": 10.0}})
    main, small = run.made[-2:]
    h = res["variants"]["decode_r8_h4096"]["head_to_head"]
    alt = [i for i, g in enumerate(run.payload["graphs"]) if not g.get("default", True)]
    assert {c for c in small.calls if c.startswith("setup")} >= {f"setup {i} 128x16" for i in alt}
    assert not {c for c in main.calls if c.startswith("setup")} & {f"setup {i} 128x16" for i in alt}
    assert h["incumbents"]["rmsnorm_hopper@rows_per_task=4"]["worker"] == "minimal"
    assert "worker" not in h["incumbents"]["rmsnorm_hopper"]
    from mpkbuild.stages.runtime import judge
    out = judge.judge(res, [{"variants": "decode_*", "max_vs_incumbent": 1.0, "against": "best"}],
                      ["decode_r8_h4096"])
    h = out["variants"]["decode_r8_h4096"]["head_to_head"]
    # the message quotes ours as it was paired: in the minimal worker, beside that configuration
    ours_there = h["minimal"]["figures"]["makespan"]["median"]
    theirs = h["incumbents"]["rmsnorm_hopper@rows_per_task=4"]["figures"]["makespan"]["median"]
    assert ours_there < 0.95 * h["ours_figures"]["makespan"]["median"]
    assert (f"in-runtime makespan {ours_there:.2f} us is" in out["problems"][0]
            and f"rows_per_task=4)'s {theirs:.2f} us (both in the worker of the variant alone)" in out["problems"][0]), out["problems"]
    # 8 x 0.9 against 2 x 1.5, both in the minimal worker
    assert h["incumbents"]["rmsnorm_hopper@rows_per_task=4"]["vs"]["makespan"]["ratio"] == pytest.approx(7.2 / 3, rel=0.05)
    assert h["best"]["rmsnorm_hopper"] == "rmsnorm_hopper@rows_per_task=4"
    k = load_kernel(REPO, "rmsnorm_v2", write_cache=False)
    source = runtime.render(k, config.wiring_roots(REPO), PINNED)
    import re
    minimal_only = re.findall(r"#ifdef MPKB_MINIMAL_WORKER.*?#endif", source, re.S)
    assert any("rms_norm_hopper_impl<bfloat16, 4, 4096>(" in b for b in minimal_only), minimal_only
    assert not any("rms_norm_hopper_impl<bfloat16, 1, 4096>(" in b for b in minimal_only)
    assert "#ifndef MPKB_MINIMAL_WORKER" in source


def test_a_cold_head_to_head_says_what_it_asks_of_dram_and_when_a_limit_asks_past_the_ceiling():
    """In DRAM terms (issue 58: where a target cannot be met, say by how much): each side's
    bytes over its makespan, the ceiling measured for the mix, and what the 0.8x rule asks.
    linear_v2 on the H100 (tests/fixtures/runtime_h100): at large_m1_n28672_k8192 MPK's
    linear already moves 2.64 TB/s, so 0.8x of it asks 3.30, past the 3.21 measured."""
    from mpkbuild.stages import review
    from mpkbuild.stages.runtime.report import head_to_head_table
    fixture = REPO / "tests" / "fixtures" / "runtime_h100"
    rt, perf = (json.loads((fixture / f"{n}.json").read_text()) for n in ("runtime", "perf"))
    rows = {r["variant"]: r for r in head_to_head_table(rt, perf) if r["incumbent"] == "linear_swapAB_hopper"}
    large, m1 = rows["large_m1_n28672_k8192"]["dram"], rows["decode_m1_n14336_k4096"]["dram"]
    nbytes = perf["variants"]["large_m1_n28672_k8192"]["bytes"]
    theirs = rt["variants"]["large_m1_n28672_k8192"]["head_to_head"]["incumbents"]["linear_swapAB_hopper"]
    assert large["theirs_tbps"] == pytest.approx(nbytes / theirs["figures"]["makespan"]["median"] / 1e6)
    assert large["ceiling_tbps"] == perf["variants"]["large_m1_n28672_k8192"]["ceiling"]["Bps"] / 1e12
    assert [(a["limit"], round(a["tbps"], 2)) for a in large["asks"]] == [(0.8, 3.3)]
    assert large["asks"][0]["of_ceiling"] > 1 > m1["asks"][0]["of_ceiling"]
    # the configurations beside the default are MPK at another task count: no rule asks of them
    assert all("dram" not in r for r in head_to_head_table(rt, perf) if "@" in r["incumbent"])
    page = review.render_kernel(review.kernel_review("linear_v2", fixture, [], "h100", {},
                                                     {"runtime": fixture / "runtime.json",
                                                      "perf": fixture / "perf.json"}))
    assert "DRAM 2.61 / 2.64 TB/s, ceiling 3.21; **0.8x asks 3.30 TB/s, above the measured ceiling**" in page
    assert "DRAM 2.02 / 1.94 TB/s, ceiling 3.21; 0.8x asks 2.43 (76%)" in page


def test_the_dispatch_and_start_spread_say_how_long_the_runtime_took_to_get_every_task_going(monkeypatch):
    """Issue 58 asks where a loss's time goes: beside the makespan (first start to last end)
    and the slowest task, each side's dispatch (the graph's begin task's end, which fires the
    op's event, to the first start: left out of the makespan) and start spread (first start
    to last start), from the same profiler records, shown in the review, never judged. The
    stand-in runs a graph's tasks back to back on one worker, so its spread is every task but
    the last, end to end."""
    from mpkbuild.runners.runtime import op_figures
    from mpkbuild.stages import review
    from mpkbuild.stages.runtime.report import head_to_head_table
    # three tasks: two start together, one 4 µs later and runs 2 µs
    assert op_figures([(0, 5000), (100, 3000), (4000, 6000)]) == (6.0, 5.0, 4.0)
    if not (PINNED / "src" / "kernel" / "task_register.cc").is_file():
        pytest.skip("../shared/mirage (the pinned MPK tree) is absent")
    run = _stand_in(monkeypatch, PINNED, names=("decode_r1_h4096", "decode_r8_h4096"))
    res = _judged(run(task_us={"ours": 1.0, "rmsnorm_hopper": 2.0}),
                  [{"variants": "*", "max_vs_incumbent": 1.0}], ["decode_r1_h4096", "decode_r8_h4096"])
    h = res["variants"]["decode_r8_h4096"]["head_to_head"]
    tasks = res["variants"]["decode_r8_h4096"]["tasks"]
    inc = h["incumbents"]["rmsnorm_hopper"]
    # ours: tasks - 1 spans of ~1 µs and 50 ns gaps before the last starts; theirs ~2 µs each
    assert h["ours_figures"]["startspread"]["median"] == pytest.approx((tasks - 1) * 1.05, rel=0.03)
    assert inc["figures"]["startspread"]["median"] == pytest.approx((inc["tasks"] - 1) * 2.05, rel=0.03)
    # one task: it starts when it starts
    assert res["variants"]["decode_r1_h4096"]["head_to_head"]["ours_figures"]["startspread"]["median"] == 0
    # the dispatch: the stand-in's begin task ends 0.7 µs before the first task starts
    assert h["ours_figures"]["dispatch"]["median"] == inc["figures"]["dispatch"]["median"] == pytest.approx(0.7)
    assert set(inc["vs"]) == {"makespan", "slowcta"}             # shown, not judged
    row = next(r for r in head_to_head_table(res, None) if r["variant"] == "decode_r8_h4096")
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "runtime.json"
        path.write_text(json.dumps(res))
        page = review.render_kernel(review.kernel_review("rmsnorm_v2", Path(d), [], "h200", {}, {"runtime": path}))
    assert "| dispatch + start spread µs ours / theirs |" in page
    assert (f"| 0.70 + {row['startspread']['us']:.2f} / 0.70 + {row['incumbent_startspread']['us']:.2f} |"
            in page), page

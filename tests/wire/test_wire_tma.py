"""TMA as MPK does it (issue 58 item 2): a kernel that loads an input with TMA
(codegen.pipeline.copies naming a tensor) gets real tma.cuh cases in a real checkout --
the fill case builds the map with the checkout's own fill_tma_desc over the task's tile,
the create case makes it with create_tma_desc_for_tensor -- its registered call passes the
descriptor, and its TaskType number lies where MPK's init makes descriptors. The harness,
the wired checkout and the runtime gate's megakernel encode the same map for the same task
(checked on the generated code, with a recording cuTensorMapEncodeTiled: no GPU needed).
The fixture is tests/fixtures/pipeline's pipe_tma, given a wiring section here."""
from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import REPO, Project
from mpkbuild import wire
from mpkbuild.model.kernel import Kernel
from mpkbuild.stages import load_kernel
from mpkbuild.stages.runtime import megakernel
from mpkbuild.stages.wire import task_sources
from mpkbuild.util import config
from test_wire_real import (CLANG_FORMAT, MIRAGE, NVCC, check_clang_format_and_unwire, copy_tree,
                            execute_task_tu, nvcc, snapshot, wired_calls)

FIXTURE = REPO / "tests" / "fixtures" / "pipeline"
WIRING = config.SHIPPED_WIRING
WIRED = """
wiring:
  params:
    - {name: bands, test_value: 2}
    - {name: stages, test_value: 3}
  test_variant: r256_c256
"""

pytestmark = pytest.mark.skipif(not MIRAGE.is_dir(), reason=f"{MIRAGE} is absent (the pinned "
                                "Mirage trees are only on machines that carry ../shared)")


def project(dest: Path, extra: str = WIRED) -> Kernel:
    """The pipe_tma fixture with a wiring section, as a project of its own."""
    dest.mkdir(parents=True)
    shutil.copytree(FIXTURE / "kernels", dest / "kernels")
    (dest / "specs").mkdir()
    (dest / "specs/pipe_tma.yaml").write_text((FIXTURE / "specs/pipe_tma.yaml").read_text() + extra)
    return load_kernel(dest, "pipe_tma", write_cache=False)


@pytest.fixture(scope="module", params=["mpk", "main"])
def applied(request, tmp_path_factory):
    base = tmp_path_factory.mktemp(f"tma_{request.param}")
    k = project(base / "proj")
    root = copy_tree(request.param, base)
    pristine = snapshot(root)
    p = wire.plan(root, [k.spec.data], WIRING, ["pipe_tma"], sources={"pipe_tma": task_sources(k)})
    assert p.problems == [], p.problems
    wire.apply(p)
    return {"branch": request.param, "root": root, "pristine": pristine, "plan": p, "kernel": k}


def test_a_tma_kernel_gets_real_cases_a_descriptor_argument_and_a_tma_number(applied, tmp_path):
    root, p, k = applied["root"], applied["plan"], applied["kernel"]
    # MPK's init makes descriptors only for types in a TMA range: on SM100 that is 232-255,
    # not the 257-and-up a task without TMA takes first
    assert 150 < p.numbers["pipe_tma"]["sm_90a"] < 198
    assert 232 <= p.numbers["pipe_tma"]["sm_100a"] <= 255
    tma = (root / "include/mirage/persistent_kernel/tma.cuh").read_text()
    fill = re.search(r">>>mpk-wire:pipe_tma/sm_90a/tma_fill.*?<<<mpk-wire", tma, re.S).group(0)
    assert "if (param_id == 0) {" in fill and "static_cast<uint32_t>(32)" in fill
    assert "fill_tma_desc<bfloat16, 3, 3, 3, 2>(tma_desc," in fill      # 128-byte swizzle
    create = re.search(r">>>mpk-wire:pipe_tma/sm_90a/tma_create.*?<<<mpk-wire", tma, re.S).group(0)
    assert "create_tma_desc_for_tensor(task_desc, task_desc.inputs[0], 0, 0);" in create
    (task, code), = wired_calls(root, [k.spec.data])
    assert task == "TASK_PIPE_TMA_HOPPER"
    assert "task_desc->input_tma_desc_ptrs[0][0]," in code
    # applied twice identically, unwired byte-exactly
    again = wire.plan(root, [k.spec.data], WIRING, ["pipe_tma"], sources={"pipe_tma": task_sources(k)})
    assert again.empty
    other = tmp_path / "u"
    shutil.copytree(root, other)
    wire.unwire(other, ["pipe_tma"], WIRING)
    assert snapshot(other) == applied["pristine"]


@pytest.mark.skipif(CLANG_FORMAT is None, reason="clang-format (15, pip install -e .[test]) not on PATH")
def test_the_tma_cases_are_clang_format_clean(applied, tmp_path):
    check_clang_format_and_unwire(applied["root"], applied["branch"], applied["plan"], ["pipe_tma"], tmp_path)


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA 12.x/13.x) not on PATH")
def test_the_wired_tma_cases_and_call_compile_in_the_real_tree(applied, tmp_path):
    """tma.cuh and _execute_task with the wired call, under nvcc as the runtime compiles them,
    with no diagnostic the pristine tree does not have."""
    root, k = applied["root"], applied["kernel"]
    pristine = copy_tree(applied["branch"], tmp_path)
    tu = execute_task_tu(wired_calls(root, [k.spec.data]))
    jobs = [(root, "exec", tu), (pristine, "exec", execute_task_tu([])),
            (root, "tma", '#include "tma.cuh"\n'), (pristine, "tma", '#include "tma.cuh"\n')]
    with ThreadPoolExecutor(max_workers=2) as pool:
        exec_a, exec_p, tma_a, tma_p = pool.map(lambda j: nvcc(*j, tmp_path), jobs)
    assert tma_a - tma_p == set(), sorted(tma_a - tma_p)
    assert exec_a - exec_p == set(), sorted(exec_a - exec_p)


def test_a_tma_kernel_refuses_a_number_outside_the_tma_ranges(tmp_path):
    k = project(tmp_path / "proj", WIRED + "  number: {sm_90a: auto, sm_100a: 260}\n")
    root = copy_tree("mpk", tmp_path)
    before = snapshot(root)
    with pytest.raises(wire.NumberOutOfRange, match=r"outside the sm_100a TMA ranges \[\[232, 255\]\]"):
        wire.plan(root, [k.spec.data], WIRING, ["pipe_tma"], sources={"pipe_tma": task_sources(k)})
    assert snapshot(root) == before


# ------------------------------------------------------------ the same map on every side
# A recording encoder: each call prints what the driver would be asked to encode, the base
# address as an offset from the tensor's (the three sides place the tensor at BASE)
RECORDER = r"""
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <cuda.h>
#include <cuda_runtime.h>
static const uintptr_t BASE = 0x10000000;
extern "C" CUresult cuTensorMapEncodeTiled(CUtensorMap *, CUtensorMapDataType type, cuuint32_t rank,
    void *address, const cuuint64_t *dim, const cuuint64_t *strides, const cuuint32_t *box,
    const cuuint32_t *element_strides, CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
    CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
  printf("type %d rank %u at +%lu dims", (int)type, rank, (unsigned long)((uintptr_t)address - BASE));
  for (cuuint32_t i = 0; i < rank; i++) printf(" %lu", (unsigned long)dim[i]);
  printf(" strides");
  for (cuuint32_t i = 0; i + 1 < rank; i++) printf(" %lu", (unsigned long)strides[i]);
  printf(" box");
  for (cuuint32_t i = 0; i < rank; i++) printf(" %u", box[i]);
  printf(" element_strides");
  for (cuuint32_t i = 0; i < rank; i++) printf(" %u", element_strides[i]);
  printf(" interleave %d swizzle %d l2 %d oob %d\n", (int)interleave, (int)swizzle, (int)l2, (int)oob);
  return CUDA_SUCCESS;
}
extern "C" CUresult cuGetErrorString(CUresult, const char **text) {
  *text = "recorded";
  return CUDA_SUCCESS;
}
"""

# each input of a program sits at its own span from BASE, so a map names its tensor
SPAN = 1 << 32

# the harness without a driver: its entry-point lookup finds the recorder, its device
# allocation and copy are host memory, and no capture is running; every variant's maps
HARNESS_SIDE = RECORDER + r"""
static cudaError_t fake_entry_point(const char *, void **fn, unsigned int, unsigned long long,
                                    cudaDriverEntryPointQueryResult *found) {
  *fn = reinterpret_cast<void *>(&cuTensorMapEncodeTiled);
  *found = cudaDriverEntryPointSuccess;
  return cudaSuccess;
}
static cudaError_t fake_is_capturing(cudaStream_t, cudaStreamCaptureStatus *status) {
  *status = cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
#define cudaGetDriverEntryPointByVersion fake_entry_point
#define cudaStreamIsCapturing fake_is_capturing
#define cudaMalloc(p, n) (*(p) = static_cast<CUtensorMap *>(malloc(n)), cudaSuccess)
#define cudaMemcpy(d, s, n, kind) (memcpy((d), (s), (n)), cudaSuccess)
#include "harness.cu"
int main() {
  void *inputs[@inputs@];
  for (int i = 0; i < @inputs@; i++) inputs[i] = reinterpret_cast<void *>(BASE + static_cast<uintptr_t>(i) * @span@ull);
  const CUtensorMap *maps[8];
@calls@
  return 0;
}
"""

# MPK's side: each task's TensorDesc as the runtime gate's megakernel fills it (its layer
# plan), handed to the checkout's fill_tma_desc_by_task under `task_type`, for every map of
# every variant in the harness's order
MPK_SIDE = RECORDER + r"""
#include "tma.cuh"
using namespace mirage::runtime;
struct Map { const char *variant; int param, input, tasks; long stride, rows, cols, row_stride; };
static const Map kMaps[] = {
@maps@
};
int main() {
  const char *last = "";
  for (const Map &m : kMaps) {
    if (strcmp(last, m.variant) != 0) printf("variant %s\n", last = m.variant);
    for (int t = 0; t < m.tasks; t++) {
      FullTaskDesc task(static_cast<TaskType>(@task_type@), 0);
      TensorDesc desc;
      desc.num_dims = 2;
      desc.base_ptr = reinterpret_cast<char *>(BASE + static_cast<uintptr_t>(m.input) * @span@ull) +
                      static_cast<size_t>(t) * m.stride;
      desc.dim[0] = m.rows;
      desc.dim[1] = m.cols;
      desc.stride[0] = m.row_stride;
      desc.stride[1] = 1;
      CUtensorMap map;
      fill_tma_desc_by_task(&map, task, desc, m.param);
    }
  }
  return 0;
}
"""


def run_side(name: str, source: str, values: dict, includes: list[Path], tmp_path: Path) -> list[str]:
    """One side's program (its @name@ filled from values), built and run: its encoder calls."""
    for key, value in values.items():
        source = source.replace(f"@{key}@", str(value))
    tu = tmp_path / f"{name}_side.cu"         # not harness.cu: it includes that one
    tu.write_text(source)
    exe = tmp_path / f"{name}_side"
    r = subprocess.run([NVCC, "-std=c++17", "-arch=sm_90a", "-DMIRAGE_BACKEND_USE_CUDA", "-DMPK_ENABLE_TMA",
                        "--expt-relaxed-constexpr", *(f"-I{d}" for d in includes),
                        f"-I{MIRAGE}/deps/cutlass/include", f"-I{MIRAGE}/deps/json/include",
                        "-o", str(exe), str(tu)], capture_output=True, text=True)
    assert r.returncode == 0, f"{name}:\n{r.stderr[-3000:]}"
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines()


def same_maps(k: Kernel, task_type: str, tmp_path: Path, first: dict | None = None) -> dict[str, list[str]]:
    """The encoder calls of the three sides for every map of every variant of k:
    {"harness": [...], "wired": [...], "gate": [...]}, each a 'variant V' line before a
    variant's calls. `first`: the spec of a kernel with other maps that takes the gate's
    first task type (461), k the second (460)."""
    from mpkbuild.stages import generate
    from mpkbuild.util import tma
    root = copy_tree("mpk", tmp_path)
    wire.apply(wire.plan(root, [k.spec.data], WIRING, [k.name], sources={k.name: task_sources(k)}))
    gen = tmp_path / "gen"
    gen.mkdir()
    for role in ("harness", "spec_header", "body"):
        text = generate.render_file(role, k.spec.sections["codegen"], k.spec.file, k.body_source, k.root)
        (gen / Path(k.rel.generated[role]).name).write_text(text)
    # the gate's shadow tma.cuh, beside which nothing else is: its quoted includes find the
    # checkout's headers through -I
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    types = [([k.spec.data], megakernel.TMA_LABEL, 461, megakernel.TYPE_SYMBOL)]
    if first is not None:
        types = [([first], *types[0][1:]), ([k.spec.data], f"{megakernel.TMA_LABEL}_1", 460, "")]
    (shadow / "tma.cuh").write_bytes(megakernel.gate_tma_header(root, types, WIRING))
    cg = k.spec.data["codegen"]
    names = [t["name"] for t in cg["inputs"]]
    n = len(cg["inputs"]) + len(cg["outputs"])
    calls, maps = [], []
    for variant in cg["variants"]:
        calls.append(f'  printf("variant {variant}\\n");\n'
                     f"  if ({k.name}_maps_{variant}(inputs, maps, nullptr) != 0) return 1;")
        layer = megakernel._layer(k.spec.data, variant, 0, list(range(n)))
        assert layer["tma"]
        for name in tma.tensors(cg):
            i = layer["tensor_names"].index(name)
            maps.append(f'  {{"{variant}", {i}, {names.index(name)}, {layer["tasks"]}, {layer["strides"][i]}, '
                        f'{layer["tma_dims"][i][0]}, {layer["tma_dims"][i][1]}, {layer["row_strides"][i]}}},')
    runtime_dir = root / "include/mirage/persistent_kernel"
    common = {"span": SPAN}
    return {"harness": run_side("harness", HARNESS_SIDE, {**common, "inputs": len(names), "calls": "\n".join(calls)},
                                [gen], tmp_path),
            "wired": run_side("wired", MPK_SIDE, {**common, "maps": "\n".join(maps), "task_type": task_type},
                              [root / "include", runtime_dir], tmp_path),
            "gate": run_side("gate", MPK_SIDE, {**common, "maps": "\n".join(maps), "task_type": types[-1][2]},
                             [shadow, root / "include", runtime_dir], tmp_path)}


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA 12.x/13.x) not on PATH")
def test_the_harness_the_wired_checkout_and_the_gate_encode_the_same_map(tmp_path):
    """For every task of every variant: the harness's map, the map the wired checkout's
    fill_tma_desc_by_task makes from the TensorDesc the runtime gate's megakernel fills, and
    the one the gate's own tma.cuh (the wire's cases under the gate's task type) makes,
    are the same encoder call: rank, dims, byte strides, box, swizzle, everything."""
    k = project(tmp_path / "proj")
    sides = same_maps(k, "TASK_PIPE_TMA_HOPPER", tmp_path)
    assert sides["harness"] == sides["wired"] == sides["gate"], sides
    # the map is the one the spec says: bf16 (type 9), rank 5, the task's rows at its own
    # offset, a 32 x 64 box, 128-byte swizzle (3); r256_c256's second task
    first = sides["harness"].index("variant r256_c256")
    assert sides["harness"][first + 2] == ("type 9 rank 5 at +32768 dims 256 64 1 1 1 strides 512 0 0 0 "
                                           "box 64 32 1 1 1 element_strides 1 1 1 1 1 "
                                           "interleave 0 swizzle 3 l2 0 oob 0")
    assert len(sides["harness"]) == 2 + 4 + 4                     # two variants of 4 tasks


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA 12.x/13.x) not on PATH")
def test_the_tma_linear_s_maps_are_the_same_on_every_side(tmp_path):
    """The catalog's TMA linear (two maps a task, x and W, both 128-byte swizzled): the
    same check over every variant, the harness against the checkout and the gate."""
    k = load_kernel(REPO, "linear_v2", write_cache=False)
    sides = same_maps(k, "TASK_LINEAR_V2_HOPPER", tmp_path)
    assert sides["harness"] == sides["wired"] == sides["gate"]
    first = sides["harness"].index("variant decode_m8_n4096_k4096")
    x, w = sides["harness"][first + 1], sides["harness"][first + 1 + 128]  # 128 tasks of 32 rows
    assert x == ("type 9 rank 5 at +0 dims 4096 8 1 1 1 strides 8192 0 0 0 box 64 8 1 1 1 "
                 "element_strides 1 1 1 1 1 interleave 0 swizzle 3 l2 0 oob 0")
    assert w == (f"type 9 rank 5 at +{SPAN} dims 4096 32 1 1 1 strides 8192 0 0 0 box 64 32 1 1 1 "
                 "element_strides 1 1 1 1 1 interleave 0 swizzle 3 l2 0 oob 0")


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA 12.x/13.x) not on PATH")
def test_a_kernel_under_the_gates_second_task_type_makes_its_own_maps(tmp_path):
    """A block whose TMA kernels load through different maps: the TMA linear under the
    gate's second task type, beside the fixture (another box, one map) under the first,
    makes the maps its harness and the wired checkout make, not the fixture's."""
    k = load_kernel(REPO, "linear_v2", write_cache=False)
    first = project(tmp_path / "proj").spec.data
    sides = same_maps(k, "TASK_LINEAR_V2_HOPPER", tmp_path, first=first)
    assert sides["harness"] == sides["wired"] == sides["gate"]


def _unswizzled(linear: dict) -> dict:
    """A TMA linear with x unswizzled (as it was before 2026-12-05): other maps, another kernel."""
    other = copy.deepcopy(linear)
    other["kernel"] = other["wiring"]["layer"] = "linear_unswizzled"
    next(c for c in other["codegen"]["pipeline"]["copies"] if c["name"] == "x")["swizzle"] = 0
    return other


def test_kernels_that_load_the_same_maps_share_a_gate_task_type_and_others_get_their_own(tmp_path):
    """MPK makes a TMA task's maps in its task type's tma.cuh case. linear_residual_v2
    beside rmsnorm_linear_v2 (the same x and W boxes; the residual and the norm weight are
    no maps) or a kernel that loads none shares the gated kernel's type, and the header is
    the one linear_residual_v2 alone gets but for the kernels it names; linear_v2 (32-row W
    boxes where nt is an odd multiple of 32) or a kernel that loads x unswizzled gets a type
    of its own, with its own cases under its own label."""
    root = copy_tree("mpk", tmp_path)
    residual, fused, norm, linear = (load_kernel(REPO, n, write_cache=False).spec.data
                                     for n in ("linear_residual_v2", "rmsnorm_linear_v2", "rmsnorm_v2", "linear_v2"))
    groups = megakernel.task_type_groups
    assert groups([residual, fused, norm], WIRING) == [["linear_residual_v2", "rmsnorm_linear_v2", "rmsnorm_v2"]]
    assert groups([residual, linear, fused], WIRING) == [["linear_residual_v2", "rmsnorm_linear_v2"], ["linear_v2"]]
    # a gated kernel that loads none: the first kernel that does takes its type's case
    assert groups([norm, linear, residual], WIRING) == [["rmsnorm_v2", "linear_v2"], ["linear_residual_v2"]]
    one = lambda specs, i=0: (specs, "MPKB_TMA_TASK" + (f"_{i}" if i else ""), 461 - i,
                              "MPKB_TASK_TYPE" + (f"_{i}" if i else ""))
    alone = megakernel.gate_tma_header(root, [one([residual])], WIRING).decode()
    both = megakernel.gate_tma_header(root, [one([residual, fused])], WIRING).decode()
    assert "linear_residual_v2, rmsnorm_linear_v2 (megakernel.cu" in both
    assert both.replace("linear_residual_v2, rmsnorm_linear_v2 (", "linear_residual_v2 (") == alone
    other = _unswizzled(residual)
    two = megakernel.gate_tma_header(root, [one([residual]), one([other], 1)], WIRING).decode()
    assert "constexpr TaskType MPKB_TMA_TASK = static_cast<TaskType>(461);" in two
    assert "constexpr TaskType MPKB_TMA_TASK_1 = static_cast<TaskType>(460);" in two
    # each label has its case in both switches (the fill and the create), the unswizzled
    # x's fill under the second (fill_tma_desc's B, M, S: 3, 3, 3 a 128-byte swizzle)
    assert two.count("case MPKB_TMA_TASK:") == two.count("case MPKB_TMA_TASK_1:") == 2
    second = two[two.index("case MPKB_TMA_TASK_1:"):]
    second = second[:second.index("break;")]
    assert "// x: no swizzle" in second and "fill_tma_desc<bfloat16, 0, 0, 0, 2>" in second
    assert "// weight: 128-byte swizzle" in second and "fill_tma_desc<bfloat16, 3, 3, 3, 2>" in second
    assert "fill_tma_desc<bfloat16, 0, 0, 0, 2>" not in alone


def test_a_block_of_tma_kernels_with_other_maps_is_planned_with_a_task_type_each(tmp_path):
    """A block of linear_v2 and a linear that loads x unswizzled: the plan gives the second
    kernel the next free number of the Hopper range (196 on the pinned tree, 195 where the
    checkout's enum uses 196), its dispatch branch and layers name its type, megakernel.cu
    declares it, and the shadow tma.cuh makes its maps under it."""
    root = copy_tree("mpk", tmp_path)
    k = load_kernel(REPO, "linear_v2", write_cache=False)
    spec = copy.deepcopy(k.spec.data)
    other = _unswizzled(spec)
    spec["runtime"]["blocks"] = [{"name": "two_linears", "batches": [8], "cos_min": 0.999, "rel_max": 3e-2,
                                  "layers": [{"kernel": "linear_v2", "variant": "decode_m{batch}_n4096_k4096",
                                              "incumbent": "linear_swapAB_hopper"},
                                             {"kernel": "linear_unswizzled", "variant": "decode_m{batch}_n4096_k4096",
                                              "incumbent": "linear_swapAB_hopper"}]}]
    p = megakernel.plan(spec, WIRING, {"linear_unswizzled": other}, root)
    assert [(t["symbol"], t["number"], t["kernels"]) for t in p["task_types"]] == \
        [("MPKB_TASK_TYPE", 197, ["linear_v2"]), ("MPKB_TASK_TYPE_1", 196, ["linear_unswizzled"])]
    block = next(g for g in p["graphs"] if g["name"] == "block:two_linears:b8")
    assert [l["task_type"] for l in block["layers"]] == ["MPKB_TASK_TYPE", "MPKB_TASK_TYPE_1"]
    assert {d["task_type"] for d in p["dispatch"] if d["kernel"] == "linear_unswizzled"} == {"MPKB_TASK_TYPE_1"}
    header = root / "include/mirage/persistent_kernel/runtime_header.h"
    header.write_text(header.read_text().replace("  TASK_HOPPER_TASK_END = 198,",
                                                 "  TASK_SOMEONE_ELSES = 196,\n  TASK_HOPPER_TASK_END = 198,"))
    p = megakernel.plan(spec, WIRING, {"linear_unswizzled": other}, root)
    assert [t["number"] for t in p["task_types"]] == [197, 195]

    class K:                       # what render_all reads of a kernel
        def __init__(self, data):
            self.name, self.spec = data["kernel"], type("S", (), {"data": data})
    files = megakernel.render_all(K(spec), WIRING, root, [K(other)])
    source = files["megakernel.cu"].decode()
    assert "constexpr int MPKB_TASK_TYPE = 197;" in source
    assert "constexpr int MPKB_TASK_TYPE_1 = 195;  // linear_unswizzled" in source
    assert "task_desc->task_type == MPKB_TASK_TYPE_1 &&" in source
    tma_text = files["shadow/tma.cuh"].decode()
    assert "constexpr TaskType MPKB_TMA_TASK_1 = static_cast<TaskType>(195);" in tma_text


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA 12.x/13.x) not on PATH")
def test_the_runtime_gate_builds_a_tma_kernel_into_the_real_persistent_kernel(tmp_path):
    """`stage=runtime` with mpk_root= up to the megakernel's compile: the shadow tma.cuh holds
    the wire's two cases under the gate's task type, the layer fills the TensorDesc the map
    is made from, the library builds; -n predicts the shadow header with the rest and an edit
    of the box re-makes it."""
    k = project(tmp_path / "proj")
    for name in ("SConstruct", "site_scons", "pyproject.toml"):
        src = REPO / name
        (shutil.copytree(src, k.root / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
         if src.is_dir() else shutil.copy2(src, k.root / name))
    proj = Project(k.root)
    checkout = copy_tree("mpk", tmp_path)
    (tmp_path / "deps").symlink_to(MIRAGE / "deps")        # CUTLASS and json, beside it as in ../shared
    mpk = f"mpk_root={checkout}"
    proj.scons("-k", "stage=runtime", "kernel=pipe_tma", mpk, check=False, timeout=900)
    shadow = (k.root / "build/pipe_tma/runtime/shadow/tma.cuh").read_text()
    assert shadow.count("case MPKB_TMA_TASK: {") == 2
    assert "constexpr TaskType MPKB_TMA_TASK = static_cast<TaskType>(" in shadow
    source = (k.root / "build/pipe_tma/runtime/megakernel.cu").read_text()
    assert "task_desc->input_tma_desc_ptrs[0][0]" in source
    assert (k.root / "build/pipe_tma/runtime/sm_90a/libpipe_tma_mpk.so").is_file()
    # the worker as built, which every figure of the gate is measured in
    worker = json.loads((k.root / "build/pipe_tma/runtime/sm_90a/worker.json").read_text())
    assert "worker_kernel" in worker["entry"] and worker["registers"] > 0, worker
    # a box edit the audit accepts: the shadow header and the megakernel are re-made, as -n says
    proj.edit("specs/pipe_tma.yaml", "box_rows: 32", "box_rows: 64")
    run = proj.scons("-n", "stage=runtime", "kernel=pipe_tma", mpk, check=False)
    listed = run.stdout.splitlines()
    assert "megakernel pipe_tma" in listed and "megakernel-compile pipe_tma sm_90a" in listed, run.stdout + run.stderr
    proj.scons("-k", "stage=runtime", "kernel=pipe_tma", mpk, check=False, timeout=900)
    assert "static_cast<uint32_t>(64)," in (k.root / "build/pipe_tma/runtime/shadow/tma.cuh").read_text()
    # the gate's task type is a number the checkout's enum leaves free: an entry that takes
    # it makes the megakernel stale, and the next render takes the next free one
    assert "constexpr int MPKB_TASK_TYPE = 197;" in (k.root / "build/pipe_tma/runtime/megakernel.cu").read_text()
    enum = checkout / "include/mirage/persistent_kernel/runtime_header.h"
    enum.write_text(enum.read_text().replace("  TASK_HOPPER_TASK_END = 198,",
                                             "  TASK_SOMEONE_ELSES = 197,\n  TASK_HOPPER_TASK_END = 198,"))
    run = proj.scons("-n", "stage=runtime", "kernel=pipe_tma", mpk, check=False)
    assert "megakernel pipe_tma" in run.stdout.splitlines(), run.stdout + run.stderr
    proj.scons("-k", "stage=runtime", "kernel=pipe_tma", mpk, check=False, timeout=900)
    assert "constexpr int MPKB_TASK_TYPE = 196;" in (k.root / "build/pipe_tma/runtime/megakernel.cu").read_text()
    assert "static_cast<TaskType>(196);" in (k.root / "build/pipe_tma/runtime/shadow/tma.cuh").read_text()

"""The wire stage for Runtime-V2 (runtime=v2) against the pinned v2 tree (../shared/mirage/v2),
in a temporary copy: the v2 registration (an entry of the SM100 range, the body and spec
header under tasks/blackwell_v2/, its include in dispatch_v2.cuh, the register function,
graph.cc's branch, runtime.cc's name map and task_offset line, the Python layer's v2 branch)
of every catalog kernel at once (kernel=all: our installed files are mpkbuild_<kernel>.cuh, so
none is one of upstream's own <op>_v2.cuh) applied twice identically, unwired byte-exact,
compiled (g++ of the C++ files; nvcc of the v2 dispatch unit for sm_100a), clang-format clean;
every clash of a run (a file, a name or a number an upstream v2 task has) is refused, all
together and each under its kernel; a tree without v2 is refused."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mpkbuild import wire
from mpkbuild.model.kernel import Kernel
from mpkbuild.stages.wire import task_sources
from mpkbuild.wire.errors import NameClash, NumberClash, TargetMissing
from mpkbuild.stages import load_kernel
from mpkbuild.util import tma

from conftest import REPO
from test_wire_real import (CLANG_FORMAT, CUDA_INCLUDES, MIRAGE, NVCC, WIRING,
                            check_clang_format_and_unwire, copy_tree, execute_task_tu, gxx,
                            snapshot, wired_calls)

pytestmark = pytest.mark.skipif(not (MIRAGE / "v2").is_dir(), reason=f"{MIRAGE}/v2 is absent "
                                "(the pinned Runtime-V2 tree is only where ../shared is)")
# every catalog kernel (rmsnorm_v2, silu_mul_v2 and embedding_v2 are also upstream v2 tasks'
# names: our files are installed under the surface's install_stem)
# (a kernel that loads with TMA is not wired on Runtime-V2: its wiring makes no maps yet)
FREE = tuple(sorted(p.stem for p in (REPO / "specs").glob("*.yaml")
                   if not tma.tensors(load_kernel(REPO, p.stem, write_cache=False).spec.data["codegen"])))
TMA_KERNELS = tuple(sorted(set(p.stem for p in (REPO / "specs").glob("*.yaml")) - set(FREE)))


def _catalog(names=FREE + TMA_KERNELS):
    ks = [load_kernel(REPO, n, write_cache=False) for n in names]
    return [k.spec.data for k in ks], {k.name: task_sources(k) for k in ks}


@pytest.fixture(scope="module")
def applied(tmp_path_factory):
    base = tmp_path_factory.mktemp("real_v2")
    root = copy_tree("v2", base)
    pristine = snapshot(root)
    specs, sources = _catalog()
    p = wire.plan(root, specs, WIRING, list(FREE), sources=sources, runtime="v2")
    assert p.problems == [], p.problems
    wire.apply(p)
    return {"root": root, "pristine": pristine, "plan": p, "specs": specs, "sources": sources}


def test_a_kernel_that_loads_with_tma_is_refused_on_v2_and_nothing_changes(tmp_path):
    """Its v2 wiring would make no tensor maps: one clear refusal, the checkout untouched
    (other kernels plan on v2 with its spec among theirs: test above)."""
    assert TMA_KERNELS
    root = copy_tree("v2", tmp_path)
    before = snapshot(root)
    specs, sources = _catalog()
    with pytest.raises(wire.Unsupported, match="the Runtime-V2 wiring makes no tensor maps yet"):
        wire.plan(root, specs, WIRING, list(TMA_KERNELS), sources=sources, runtime="v2")
    assert snapshot(root) == before


def test_v2_registration_applies_twice_identically_and_unwires_to_the_snapshot(applied, tmp_path):
    root, p = applied["root"], applied["plan"]
    # v2 tasks: the SM100 range above the TMA sub-range, after upstream's 281-286
    assert sorted(n["v2"] for n in p.numbers.values()) == list(range(287, 287 + len(FREE)))
    header = (root / "include/mirage/persistent_kernel/runtime_header.h").read_text()
    assert "TASK_ARGMAX_V2_V2 = 288," in header
    pk = root / "include/mirage/persistent_kernel"
    assert (pk / "tasks/blackwell_v2/mpkbuild_argmax_v2.cuh").is_file()
    # upstream's own tasks of the catalog's names are untouched beside ours
    for name in ("rmsnorm_v2", "silu_mul_v2", "embedding_v2"):
        assert (pk / f"tasks/blackwell_v2/{name}.cuh").read_bytes() == \
            (MIRAGE / "v2/include/mirage/persistent_kernel/tasks/blackwell_v2" / f"{name}.cuh").read_bytes()
        assert (pk / f"tasks/blackwell_v2/mpkbuild_{name}.cuh").is_file()
    dispatch = (pk / "dispatch_v2.cuh").read_text()
    ours = dispatch.index('#include "mirage/persistent_kernel/tasks/blackwell_v2/mpkbuild_argmax_v2.cuh"')
    assert dispatch.index("embedding_v2.cuh") < ours < dispatch.index("// Forward decl")
    layer = (root / "python/mirage/mpk/persistent_kernel.py").read_text()
    assert 'assert getattr(self, "use_v2_runtime", False)' in layer
    assert not (pk / "tasks/hopper/mpkbuild_argmax_v2.cuh").exists()       # no v1 registration
    again = wire.plan(root, applied["specs"], WIRING, list(FREE), sources=applied["sources"], runtime="v2")
    assert again.empty
    other = tmp_path / "u"
    shutil.copytree(root, other)
    wire.unwire(other, list(FREE), WIRING)
    assert snapshot(other) == applied["pristine"]


@pytest.mark.skipif(not CUDA_INCLUDES, reason="no CUDA toolkit headers (nvcc --dryrun finds none)")
def test_v2_cpp_files_compile_with_no_new_diagnostic(applied, tmp_path):
    root = applied["root"]
    pristine = copy_tree("v2", tmp_path)
    files = ["src/kernel/graph.cc", "src/kernel/task_register.cc", "src/kernel/runtime.cc"]
    with ThreadPoolExecutor(max_workers=2) as pool:
        after = list(pool.map(lambda f: gxx(root, f), files))
        before = list(pool.map(lambda f: gxx(pristine, f), files))
    for f, a, b in zip(files, after, before):
        assert a - b == set(), f"{f}: new diagnostics {sorted(a - b)}"


def _nvcc_v2(root: Path, name: str, source: str, out: Path) -> set[str]:
    """nvcc -arch=sm_100a -c of one v2 dispatch unit (Blackwell, Runtime-V2 as
    persistent_kernel.py compiles it: USE_RUNTIME_V2, persistent_kernel_v2.cuh and the
    checkout's dispatch_v2.cuh with every v2 task). The v1 Blackwell task header, which no
    v2 task uses and whose sampling task needs curand (not in every CUDA install), is
    replaced by an empty one beside a copy of persistent_kernel.cuh; the edited files are
    compiled as they are."""
    pk = root / "include/mirage/persistent_kernel"
    shadow = out / f"shadow_{root.parent.name}_{name}"
    (shadow / "tasks/blackwell").mkdir(parents=True)
    shutil.copyfile(pk / "persistent_kernel.cuh", shadow / "persistent_kernel.cuh")
    (shadow / "tasks/blackwell/task_header.cuh").write_text("#pragma once\n#include <map>\n#include <string>\n")
    tu = shadow / f"{name}.cu"
    tu.write_text(source)
    r = subprocess.run([NVCC, "-std=c++17", "-arch=sm_100a", "-DMIRAGE_BACKEND_USE_CUDA",
                        "-DMIRAGE_GRACE_BLACKWELL", "-DMPK_TARGET_CC=100", "-DMPK_ENABLE_TMA",
                        "-DMODE_OFFLINE", "-DUSE_RUNTIME_V2", "-DMAX_WORKER_PER_SCHEDULER=4",
                        "-DMIRAGE_USE_CUTLASS_KERNEL=0", "-DMPK_MAX_NUM_BATCHED_REQUESTS=1",
                        "-DMPK_MAX_NUM_BATCHED_TOKENS=8", "-DMPK_MAX_NUM_PAGES=16",
                        "-DMPK_MAX_SEQ_LENGTH=512", "-DMPK_PAGE_SIZE=64", "--expt-relaxed-constexpr",
                        f"-I{shadow}", f"-I{root}/include", f"-I{pk}",
                        f"-I{MIRAGE}/deps/cutlass/include", f"-I{MIRAGE}/deps/json/include",
                        "-c", "-o", "/dev/null", str(tu)], capture_output=True, text=True)
    text = (r.stdout + r.stderr).replace(str(root) + "/", "").replace(str(shadow) + "/", "")
    text = text.replace(tu.name, "TU.cu")
    assert "fatal error" not in text and "catastrophic error" not in text, \
        f"{name} was not compiled, it stopped at:\n{text[-2000:]}"
    return {re.sub(r"\(\d+\)", "", ln) for ln in text.splitlines() if "error" in ln or "warning" in ln}


@pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA 12.8+) not on PATH")
def test_the_v2_dispatch_unit_compiles_for_sm100a_with_no_new_diagnostic(applied, tmp_path):
    """The unit persistent_kernel.py builds for a v2 graph: the wired calls (their template
    arguments from each kernel's test variant) in _execute_task after the v2 driver. A copy
    with a template argument the body's static_assert refuses must give a new error: the
    check reaches the installed bodies."""
    root = applied["root"]
    pristine = copy_tree("v2", tmp_path / "p")
    calls = wired_calls(root, [s for s in applied["specs"] if s["kernel"] in FREE], "v2")
    tu = execute_task_tu(calls, v2=True)
    broken = tu.replace("argmax_v2_task<129280>", "argmax_v2_task<129281>")
    assert broken != tu
    jobs = [(root, "exec", tu), (pristine, "exec", execute_task_tu([], v2=True)), (root, "broken", broken)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        after, before, bad = pool.map(lambda j: _nvcc_v2(*j, tmp_path), jobs)
    assert after - before == set(), f"v2 _execute_task: new diagnostics {sorted(after - before)}"
    assert any("static assertion failed" in d and "argmax_v2.cuh" in d for d in bad - after), sorted(bad - after)


@pytest.mark.skipif(CLANG_FORMAT is None, reason="clang-format (15, pip install -e .[test]) not on PATH")
def test_v2_blocks_are_clang_format_clean_and_unwire_survives_a_format_pass(applied, tmp_path):
    check_clang_format_and_unwire(applied["root"], "v2", applied["plan"], list(FREE), tmp_path)


def test_the_v2_layer_compiles(applied, tmp_path):
    py = applied["root"] / "python/mirage/mpk/persistent_kernel.py"
    r = subprocess.run([sys.executable, "-c", f"import ast; ast.parse(open({str(py)!r}).read())"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_every_clash_of_a_run_is_refused_together_each_under_its_kernel(tmp_path):
    """Files of the checkout's own where two kernels' bodies go: one refusal naming both,
    each under its own kernel, and nothing written."""
    root = copy_tree("v2", tmp_path)
    folder = root / "include/mirage/persistent_kernel/tasks/blackwell_v2"
    for name in ("rmsnorm_v2", "embedding_v2"):
        shutil.copy(folder / f"{name}.cuh", folder / f"mpkbuild_{name}.cuh")
    before = snapshot(root)
    specs, sources = _catalog()
    with pytest.raises(NameClash) as exc:
        wire.plan(root, specs, WIRING, list(FREE), sources=sources, runtime="v2")
    msg = str(exc.value)
    assert msg.startswith("2 clashes with the checkout or between kernels, each under its kernel:"), msg
    for name in ("rmsnorm_v2", "embedding_v2"):
        assert (f"\n  {name}: include/mirage/persistent_kernel/tasks/blackwell_v2/mpkbuild_{name}.cuh: "
                "already exists and was not written by mpkbuild: it is the checkout's own file "
                "(namespace kernel::") in msg, msg
        assert f"{name}/v2/body wants that path" in msg
    # a task name or a number of an upstream v2 task: refused, naming the line that has it
    specs, sources = _catalog(("argmax_v2",))
    spec = dict(specs[0], wiring={**specs[0]["wiring"], "task_name": {"v2": "silu_mul_v2"}})
    with pytest.raises(NameClash, match=r"argmax_v2: include/mirage/kernel/task_register.h:\d+: task_name "
                                        r"'silu_mul_v2' wanted "
                                        r"by kernel argmax_v2 \(v2\) is already defined there "
                                        r"\(not wired by mpkbuild\)"):
        wire.plan(root, [spec], WIRING, ["argmax_v2"], sources=sources, runtime="v2")
    spec = dict(specs[0], wiring={**specs[0]["wiring"], "number": {"v2": 282}})
    with pytest.raises(NumberClash, match="TASK_SILU_MUL_V2"):
        wire.plan(root, [spec], WIRING, ["argmax_v2"], sources=sources, runtime="v2")
    assert snapshot(root) == before


def test_runtime_v2_on_a_tree_without_v2_is_refused(tmp_path):
    root = copy_tree("mpk", tmp_path)
    before = snapshot(root)
    specs, sources = _catalog(("argmax_v2",))
    with pytest.raises(TargetMissing, match="runtime_v2.cuh: missing in mpk_root .*: runtime=v2 "
                                            "wires into Runtime-V2, which this checkout does not have"):
        wire.plan(root, specs, WIRING, ["argmax_v2"], sources=sources, runtime="v2")
    assert snapshot(root) == before

"""The wire stage against the pinned real Mirage trees (../shared/mirage): every catalog
kernel at once on each branch, in a temporary copy (the shared trees are read-only)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mpkbuild import wire
from mpkbuild.model.kernel import Kernel, discover
from mpkbuild.stages.wire import task_sources

from conftest import REPO
from mpkbuild.util import config, tma
from mpkbuild.stages import load_kernel
MIRAGE = REPO.parent / "shared" / "mirage"
WIRING = config.SHIPPED_WIRING
# clang-format from the environment the tests run in (the venv's, pip install -e .[test])
CLANG_FORMAT = shutil.which("clang-format", path=os.pathsep.join(
    [os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
NVCC = shutil.which("nvcc")


def cuda_include_dirs() -> list[str]:
    """The CUDA include folders nvcc itself passes its host compiler (`nvcc --dryrun`'s
    INCLUDES and SYSTEM_INCLUDES), so a wrapper script on PATH finds the real toolkit."""
    if NVCC is None:
        return []
    r = subprocess.run([NVCC, "--dryrun", "-x", "cu", "-c", "/dev/null", "-o", "/dev/null"],
                       capture_output=True, text=True)
    out = []
    for line in (r.stdout + r.stderr).splitlines():
        m = re.match(r'#\$ (?:SYSTEM_)?INCLUDES="?(.*?)"?\s*$', line)
        if m:
            out += [os.path.normpath(d) for d in re.findall(r'"?(/[^"\s]+)"?', m.group(1))]
    return [d for d in dict.fromkeys(out) if os.path.isfile(os.path.join(d, "cuda_runtime.h"))
            or os.path.isdir(d)]


CUDA_INCLUDES = cuda_include_dirs()

pytestmark = pytest.mark.skipif(not MIRAGE.is_dir(), reason=f"{MIRAGE} is absent (the pinned "
                                "Mirage trees are only on machines that carry ../shared)")


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def copy_tree(branch: str, dst: Path) -> Path:
    out = dst / branch
    shutil.copytree(MIRAGE / branch, out, copy_function=shutil.copyfile)
    subprocess.run(["chmod", "-R", "u+w", str(out)], check=True)
    return out


def catalog():
    ks = [load_kernel(REPO, n, write_cache=False) for n in discover(REPO)]
    ks = [k for k in ks if k.has_wiring]
    return [k.spec.data for k in ks], {k.name: task_sources(k) for k in ks}


def gxx(root: Path, rel: str) -> set[str]:
    """g++ -fsyntax-only diagnostics of one file, paths made relative (comparable). A file
    that stops at a fatal error (a header not found) was not checked at all: that fails
    the test, it is never compared with another such stop."""
    inc = [f"-I{root}/include", f"-I{root}/include/mirage/persistent_kernel",
           f"-I{MIRAGE}/deps/cutlass/include", f"-I{MIRAGE}/deps/json/include",
           *(f"-I{d}" for d in CUDA_INCLUDES)]
    r = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", "-DMIRAGE_BACKEND_USE_CUDA", *inc,
                        str(root / rel)], capture_output=True, text=True)
    assert "fatal error" not in r.stderr, f"{rel} was not compiled, it stopped at:\n" + "\n".join(
        ln for ln in r.stderr.splitlines() if "fatal error" in ln)
    lines = r.stderr.replace(str(root) + "/", "").splitlines()
    return {re.sub(r":\d+:\d+:", ":", ln) for ln in lines if "error" in ln or "warning" in ln}


def nvcc(root: Path, name: str, source: str, out: Path) -> set[str]:
    """nvcc (device and host front ends, no object kept) of one translation unit placed in
    the runtime folder: its error/warning lines, paths and line numbers dropped."""
    pk = root / "include/mirage/persistent_kernel"
    # the applied and the pristine copy are both named after the branch: the unit's name
    # must tell them apart, or two compiles running at once overwrite each other's source
    tu = out / f"{root.parent.name}_{root.name}_{name}.cu"
    tu.write_text(source)
    r = subprocess.run([NVCC, "-std=c++17", "-arch=sm_90a", "-DMIRAGE_BACKEND_USE_CUDA",
                        "-DMIRAGE_GRACE_HOPPER", "-DMPK_ENABLE_TMA", "-DMODE_OFFLINE",
                        "-DMAX_WORKER_PER_SCHEDULER=4", "-DMIRAGE_USE_CUTLASS_KERNEL=0",
                        "-DMPK_MAX_NUM_BATCHED_REQUESTS=1", "-DMPK_MAX_NUM_BATCHED_TOKENS=8",
                        "-DMPK_MAX_NUM_PAGES=16", "-DMPK_MAX_SEQ_LENGTH=512", "-DMPK_PAGE_SIZE=64",
                        "--expt-relaxed-constexpr",
                        f"-I{root}/include", f"-I{pk}",
                        f"-I{MIRAGE}/deps/cutlass/include", f"-I{MIRAGE}/deps/json/include",
                        "-c", "-o", "/dev/null", str(tu)], capture_output=True, text=True)
    text = (r.stdout + r.stderr).replace(str(root) + "/", "").replace(str(out) + "/", "")
    text = text.replace(tu.name, "TU.cu")
    assert "fatal error" not in text and "catastrophic error" not in text, \
        f"{name} was not compiled, it stopped at:\n{text[-2000:]}"
    return {re.sub(r"\(\d+\)", "", ln) for ln in text.splitlines()
            if "error" in ln or "warning" in ln}


def wired_calls(root: Path, specs: list[dict], target: str = "sm_90a") -> list[tuple[str, str]]:
    """(TASK_X, code) for every register_fn block of one target (an arch, or v2) in
    task_register.cc: the code string the register function hands to
    register_task_variant, its $ filled with the kernel's
    test variant (codegen.variants[wiring.test_variant] over codegen.params), the values the
    layer's tensors and params would give."""
    text = (root / "src/kernel/task_register.cc").read_text()
    out = []
    for s in specs:
        cg, w = s["codegen"], s["wiring"]
        syms = {**(cg.get("params") or {}), **cg["variants"][w.get("test_variant", min(cg["variants"]))]}
        m = re.search(rf"// >>>mpk-wire:{s['kernel']}/{target}/register_fn.*?\n(.*?)"
                      rf"// <<<mpk-wire:{s['kernel']}/{target}/register_fn", text, re.S)
        assert m, f"{s['kernel']}: no {target} register_fn block"
        code = []
        block = re.sub(r'"\s*\n\s*"', "", m.group(1))   # "a"\n "b": one literal (clang-format's split)
        for fmt, args in re.findall(r'code\.e\(\s*"((?:[^"\\]|\\.)*)"((?:,\s*[^;]*)?)\);', block):
            for a in [x.strip() for x in args.split(",") if x.strip()]:
                fmt = fmt.replace("$", str(syms[a]), 1)     # KeyError: an arg we cannot value
            code.append(fmt.replace('\\"', '"'))
        task = re.search(r"register_task_variant\((TASK_\w+)", m.group(1)).group(1)
        out.append((task, "\n".join(code)))
    return out


def execute_task_tu(calls: list[tuple[str, str]], v2: bool = False) -> str:
    """What runtime.cc's print_task_graph emits: persistent_kernel.cuh (and, for Runtime-V2,
    persistent_kernel_v2.cuh, as persistent_kernel.py adds it), then _execute_task with one
    branch per registered variant (task type, variant 0)."""
    lines = ['#include "persistent_kernel.cuh"', *(['#include "persistent_kernel_v2.cuh"'] if v2 else []),
             "__device__ __forceinline__",
             "void _execute_task(TaskDesc const* task_desc, RuntimeConfig const &runtime_config) {"]
    for i, (task, code) in enumerate(calls):
        lines += [f"  {'if' if i == 0 else 'else if'} (task_desc->task_type == {task} && "
                  "task_desc->variant_id == 0) {", code, "  }"]
    return "\n".join(lines + ["}", ""])


@pytest.fixture(scope="module", params=["mpk", "main"])
def applied(request, tmp_path_factory):
    branch = request.param
    base = tmp_path_factory.mktemp(f"real_{branch}")
    root = copy_tree(branch, base)
    pristine = snapshot(root)
    specs, sources = catalog()
    names = sorted(s["kernel"] for s in specs)
    p = wire.plan(root, specs, WIRING, names, sources=sources)
    assert p.problems == [], p.problems
    wire.apply(p)
    return {"branch": branch, "root": root, "pristine": pristine, "plan": p,
            "specs": specs, "sources": sources, "names": names}


def test_all_kernels_apply_twice_identically_and_unwire_to_the_snapshot(applied, tmp_path):
    root, p = applied["root"], applied["plan"]
    assert sorted(p.numbers) == applied["names"] and len(p.numbers) == len(list((REPO / "specs").glob("*.yaml")))
    for nums in p.numbers.values():
        assert 150 < nums["sm_90a"] < 198
        assert 230 < nums["sm_100a"] < 298
    # SM100 takes the non-TMA numbers (257 and up) first; a kernel that loads with TMA the
    # TMA sub-range (MPK's init makes descriptors only there)
    loads = {s["kernel"] for s in applied["specs"] if tma.tensors(s["codegen"])}
    assert loads, "the catalog has a TMA kernel"
    assert all(232 <= p.numbers[k]["sm_100a"] <= 255 for k in loads)
    sm100 = sorted(n["sm_100a"] for k, n in p.numbers.items() if k not in loads)
    assert sm100[0] >= 257 or applied["branch"] == "mpk"
    wired = snapshot(root)
    again = wire.plan(root, applied["specs"], WIRING, applied["names"], sources=applied["sources"])
    assert again.empty
    # unwire on a copy of the applied tree: byte-identical to the pristine snapshot
    other = tmp_path / "u"
    shutil.copytree(root, other)
    wire.unwire(other, applied["names"], WIRING)
    assert snapshot(other) == applied["pristine"]
    assert snapshot(root) == wired
    body = root / "include/mirage/persistent_kernel/tasks/hopper/mpkbuild_rmsnorm_v2.cuh"
    assert "rmsnorm_v2_task" in body.read_text()
    if applied["branch"] == "main":
        assert any("test_mode" in n and "not supported on this checkout" in n for n in p.notes)


@pytest.mark.skipif(not CUDA_INCLUDES, reason="no CUDA toolkit headers (nvcc --dryrun finds none): "
                    "the C++ files include cuda_runtime.h")
def test_cpp_files_compile_with_no_new_diagnostic(applied, tmp_path):
    root = applied["root"]
    pristine = copy_tree(applied["branch"], tmp_path)
    files = ["src/kernel/graph.cc", "src/kernel/task_register.cc", "src/kernel/runtime.cc"]
    with ThreadPoolExecutor(max_workers=2) as pool:
        after = list(pool.map(lambda f: gxx(root, f), files))
        before = list(pool.map(lambda f: gxx(pristine, f), files))
    for f, a, b in zip(files, after, before):
        assert a - b == set(), f"{f}: new diagnostics {sorted(a - b)}"


@pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA 12.x/13.x) not on PATH")
def test_tma_and_execute_task_compile_under_nvcc_with_no_new_diagnostic(applied, tmp_path):
    """nvcc -arch=sm_90a -c -o /dev/null (cicc and the host front end; about 10 s for tma.cuh
    and 20 s for the runtime TU on one core) of tma.cuh, and of the translation unit
    runtime.cc generates: persistent_kernel.cuh (Hopper, TMA, offline mode, the -D values
    persistent_kernel.py passes, so the pristine tree compiles clean and templates are
    instantiated) followed by _execute_task holding every wired Hopper call, its template
    arguments from the kernel's test variant. The pristine snapshot's TU is the same minus
    the calls. A copy of the applied TU with a template argument the body's static_assert
    rejects must give a new error: the check reaches the installed bodies' instantiation
    (checked on the mpk snapshot only; the bodies are the same on both). Blackwell (sm_100a)
    is not compiled here: it would double the time."""
    root, specs = applied["root"], applied["specs"]
    pristine = copy_tree(applied["branch"], tmp_path)
    calls = wired_calls(root, specs)
    assert len(calls) == len(specs)
    tu = execute_task_tu(calls)
    broken = tu.replace("argmax_v2_task<129280>", "argmax_v2_task<129281>")
    assert broken != tu
    tma = '#include "tma.cuh"\n'
    jobs = [(root, "exec", tu), (pristine, "exec", execute_task_tu([])), (root, "tma", tma),
            (pristine, "tma", tma)]
    if applied["branch"] == "mpk":        # the reach check once: the bodies are the same
        jobs.append((root, "broken", broken))
    with ThreadPoolExecutor(max_workers=2) as pool:
        exec_a, exec_p, tma_a, tma_p, *bad = pool.map(lambda j: nvcc(*j, tmp_path), jobs)
    assert tma_a - tma_p == set(), f"tma.cuh: new diagnostics {sorted(tma_a - tma_p)}"
    assert exec_a - exec_p == set(), f"_execute_task: new diagnostics {sorted(exec_a - exec_p)}"
    for b in bad:
        assert any("static assertion failed" in d and "argmax_v2.cuh" in d for d in b - exec_a), \
            sorted(b - exec_a)


def check_clang_format_and_unwire(applied_root: Path, branch: str, plan, names, tmp_path: Path) -> None:
    """Every line clang-format would change inside our marked blocks (upstream has a few
    violations of its own, which do not count) fails; then a format pass over the touched
    files leaves unwire working, and the result equals the pristine tree given the same pass
    (where upstream is clean, that is the snapshot)."""
    root = tmp_path / "f"
    shutil.copytree(applied_root, root)
    cpp = [r for r in plan.changes if r.endswith((".h", ".cc", ".cuh"))]
    r = subprocess.run([CLANG_FORMAT, "--dry-run", "-Werror", *cpp], cwd=root,
                       capture_output=True, text=True)
    ours = []
    for m in re.finditer(r"^(\S+?):(\d+):\d+: error", r.stderr, re.M):
        lines = (root / m.group(1)).read_text().splitlines()
        n = int(m.group(2)) - 1
        opened = [i for i in range(n, -1, -1) if "mpk-wire" in lines[i]]
        if opened and ">>>mpk-wire:" in lines[opened[0]]:
            ours.append(f"{m.group(1)}:{n + 1}: {lines[n]}")
    assert ours == []
    subprocess.run([CLANG_FORMAT, "-i", *cpp], cwd=root, check=True)
    wire.unwire(root, names, WIRING)      # no block was touched: unwire still works
    pristine = copy_tree(branch, tmp_path / "p")
    existing = [r for r in cpp if (pristine / r).is_file()]
    subprocess.run([CLANG_FORMAT, "-i", *existing], cwd=pristine, check=True)
    assert snapshot(root) == snapshot(pristine)


@pytest.mark.skipif(CLANG_FORMAT is None, reason="clang-format (15, pip install -e .[test]) not on PATH")
def test_blocks_are_clang_format_clean_and_unwire_survives_a_format_pass(applied, tmp_path):
    check_clang_format_and_unwire(applied["root"], applied["branch"], applied["plan"],
                                  applied["names"], tmp_path)


def test_touched_python_files_compile(applied, tmp_path):
    root = applied["root"]
    py = [str(root / r) for r in applied["plan"].changes if r.endswith(".py")]
    assert py
    # bytecode goes to tmp_path, not into the shared applied tree other tests compare
    r = subprocess.run([sys.executable, "-m", "py_compile", *py], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPYCACHEPREFIX": str(tmp_path / "pyc")})
    assert r.returncode == 0, r.stderr


def test_bad_inputs_leave_the_copy_untouched(applied, tmp_path):
    specs, sources, names = applied["specs"], applied["sources"], applied["names"]
    root = copy_tree(applied["branch"], tmp_path)
    before = snapshot(root)
    graph = root / "src/kernel/graph.cc"
    text = graph.read_text()
    graph.write_text(text.replace("  else {\n", "  else /* moved */ {\n"))   # anchor gone
    with pytest.raises(wire.AnchorNotFound, match="graph.cc: site graph_branch is not supported"):
        wire.plan(root, specs, WIRING, names, sources=sources)
    graph.write_text(text)
    tma = root / "include/mirage/persistent_kernel/tma.cuh"
    tma.chmod(0o444)                                               # read-only target
    p = wire.plan(root, specs, WIRING, names, sources=sources)
    with pytest.raises(wire.TargetReadOnly):
        wire.apply(p)
    tma.chmod(0o644)
    clash = [dict(s) for s in specs]
    for s in clash:
        s["wiring"] = {**s["wiring"], "number": {"sm_90a": 160, "sm_100a": "auto"}} \
            if s["kernel"] in ("rmsnorm_v2", "linear_v2") else s["wiring"]
    with pytest.raises(wire.NumberClash, match="160"):
        wire.plan(root, clash, WIRING, names, sources=sources)
    assert snapshot(root) == before
    # half-deleted marker in an applied copy: refused, nothing changes
    wired = tmp_path / "w"
    shutil.copytree(applied["root"], wired)
    g = wired / "src/kernel/graph.cc"
    g.write_text(re.sub(r".*<<<mpk-wire:rmsnorm_v2/sm_90a/graph_branch\n", "", g.read_text()))
    mid = snapshot(wired)
    with pytest.raises(wire.MarkerError):
        wire.plan(wired, specs, WIRING, names, sources=sources)
    with pytest.raises(wire.MarkerError):
        wire.unwire(wired, names, WIRING)
    assert snapshot(wired) == mid


def test_missing_target_file_is_one_clear_error_and_changes_nothing(applied, tmp_path):
    specs, sources, names = applied["specs"], applied["sources"], applied["names"]
    root = copy_tree(applied["branch"], tmp_path)
    (root / "include/mirage/kernel/task_register.h").unlink()   # a target outside `layout`
    before = snapshot(root)
    with pytest.raises(wire.TargetMissing) as exc:
        p = wire.plan(root, specs, WIRING, names, sources=sources)
        wire.apply(p)
    msg = str(exc.value)
    assert msg.startswith("include/mirage/kernel/task_register.h: file missing in mpk_root"), msg
    assert msg.count("file missing") == 1
    assert snapshot(root) == before


def test_scons_wires_every_catalog_kernel_into_a_real_checkout(applied, tmp_path):
    """The build as a user runs it: `scons kernel=all stage=wire mpk_root=<copy> apply=1` in a
    copy of the project with every catalog kernel, against a copy of the snapshot."""
    from conftest import copy_project
    project = copy_project(tmp_path / "proj", kernels=None)
    root = copy_tree(applied["branch"], tmp_path)
    run = project.scons("kernel=all", "stage=wire", f"mpk_root={root}", "apply=1", timeout=600)
    assert run.returncode == 0
    graph = (root / "src/kernel/graph.cc").read_text()
    register = (root / "src/kernel/task_register.cc").read_text()
    enum = (root / "include/mirage/persistent_kernel/runtime_header.h").read_text()
    for name in applied["names"]:
        for arch in ("sm_90a", "sm_100a"):
            for text, site in ((graph, "graph_branch"), (register, "register_fn"), (enum, "enum")):
                assert f">>>mpk-wire:{name}/{arch}/{site}:" in text, f"{name}/{arch}/{site}"
        assert (root / f"include/mirage/persistent_kernel/tasks/hopper/mpkbuild_{name}.cuh").is_file()
    # the same result as the library's all-at-once apply in the fixture
    assert snapshot(root) == snapshot(applied["root"])

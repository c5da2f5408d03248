"""The runtime gate: the generated megakernel against the pinned MPK tree.

CPU: every catalog kernel's megakernel compiles with nvcc against ../shared/mirage/mpk (one
compile per kernel, all in parallel); the graph the compiled builder makes is checked
against the plan (task and event counts, triggers, the last event); the hang phase is read
from the runtime's counters. GPU (marked): every kernel passes 3+ iterations in the
persistent kernel, the chain too.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PINNED = REPO.parent / "shared" / "mirage" / "mpk"
sys.path.insert(0, str(REPO / "site_scons"))

from mpkbuild.model.kernel import Kernel, discover  # noqa: E402
from mpkbuild.stages import generate, runtime  # noqa: E402

needs_tree = pytest.mark.skipif(not (PINNED / "include").is_dir(),
                                reason="../shared/mirage (the pinned MPK tree) is absent")
KERNELS = [k for k in discover(REPO) if "wiring" in Kernel.load(REPO, k, write_cache=False).spec.data]


def _materialise(name: str, out: Path) -> Path:
    k = Kernel.load(REPO, name, write_cache=False)
    prod = runtime.producer_for(k, {})
    for x in [k] + ([prod] if prod else []):
        sec = x.spec.sections["codegen"]
        for role, fn in (("body", f"{x.name}.cuh"), ("spec_header", f"{x.name}_spec.h")):
            (out / fn).write_text(generate.render_file(role, sec, x.spec.file, x.body_source, x.root))
    (out / "megakernel.cu").write_text(runtime.render(k, REPO / "wiring", PINNED, prod))
    return out


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
        ok, log, took = runtime.compile_megakernel(checkout, d / "megakernel.cu", [d], lib, d / "log")
        return name, (ok, log, took, lib)

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return dict(pool.map(one, KERNELS))


def test_grid_is_mpks():
    assert runtime.grid_for(132) == (128, 16)     # H200 / H100 SXM
    assert runtime.grid_for(148) == (128, 80)
    assert runtime.grid_for(170) == (144, 104)
    from mpkbuild.runners import runtime as side  # noqa: F401  (needs torch)


def test_plan_expands_to_the_documented_graph():
    k = Kernel.load(REPO, "rmsnorm_v2", write_cache=False)
    p = runtime.plan(k.spec.data, REPO / "wiring")
    assert [g["name"] for g in p["graphs"]] == list(k.spec.data["codegen"]["variants"])
    for g in p["graphs"]:
        tasks, events = runtime.expand(g)
        n = g["layers"][0]["tasks"]
        assert [t["type"] for t in tasks[:2]] == ["terminate", "begin"]
        assert len(tasks) == n + 2 and len(events) == 3
        assert events[0]["type"] == "termination"
        assert events[1] == {"type": "launch_dependent", "triggers": 1, "first": 2, "last": 2 + n}
        assert events[-1] == {"type": "end_of_graph", "triggers": n}
        assert all(t["trigger"] == 2 for t in tasks[2:])
        assert [t["offset"] for t in tasks[2:]] == list(range(n))


def test_call_is_the_wired_one():
    k = Kernel.load(REPO, "linear_v2", write_cache=False)
    p = runtime.plan(k.spec.data, REPO / "wiring")
    call = p["dispatch"][0]["call"]
    assert call[0] == "if (threadIdx.x < linear_v2_spec::THREADS) {"
    assert "task_desc->task_metadata.task_offset," in " ".join(call)
    assert "$" not in " ".join(call)


def test_chain_plan_feeds_the_producer_output():
    k = Kernel.load(REPO, "linear_v2", write_cache=False)
    prod = runtime.producer_for(k, {})
    p = runtime.plan(k.spec.data, REPO / "wiring", prod.spec.data)
    chain = p["graphs"][-1]
    assert chain["name"].startswith("chain:rmsnorm_v2.")
    first, second = chain["layers"]
    # the producer's output tensor is the consumer's first input
    assert second["tensors"][0] == first["tensors"][first["num_inputs"]]
    tasks, events = runtime.expand(chain)
    assert events[2]["type"] == "launch_massive" and events[2]["triggers"] == first["tasks"]
    assert events[-1] == {"type": "end_of_graph", "triggers": second["tasks"]}


def test_hang_phase_from_runtime_counters():
    pytest.importorskip("torch")
    from mpkbuild.runners.runtime import hang_phase
    g = {"layers": [{"tasks": 8}]}
    assert hang_phase("events 0 0 0; workers 0; schedulers 1", g, 0).startswith("launch")
    assert hang_phase("events 0 1 5; workers 1; schedulers 1", g, 2).startswith("iteration 2 (5 of 8")
    assert hang_phase("events 0 1 8; workers 1; schedulers 1", g, 1).startswith("termination")


@needs_tree
@pytest.mark.nvcc
def test_every_catalog_megakernel_compiles(compiled):
    bad = {n: "\n".join(l for l in r[1].splitlines() if "error" in l)[:800]
           for n, r in compiled.items() if not r[0]}
    assert not bad, bad
    for name, (ok, log, took, lib) in compiled.items():
        assert lib.stat().st_size > 0
        assert "worker_kernel" in log            # ptxas -v named the runtime's kernels
        assert "0 bytes spill stores" in log


@needs_tree
@pytest.mark.nvcc
def test_compiled_builder_makes_the_planned_graph(compiled):
    """The C++ builder (loaded without a GPU) against the Python plan, every graph."""
    pytest.importorskip("torch")
    from mpkbuild.runners.runtime import Megakernel, describe
    for name, (ok, log, took, lib) in compiled.items():
        k = Kernel.load(REPO, name, write_cache=False)
        prod = runtime.producer_for(k, {})
        p = runtime.plan(k.spec.data, REPO / "wiring", prod.spec.data if prod else None)
        m = Megakernel(str(lib))
        assert m.graphs == [g["name"] for g in p["graphs"]]
        for gi, g in enumerate(p["graphs"]):
            d = describe(m, gi)
            tasks, events = runtime.expand(g)
            assert len(d["tasks"]) == len(tasks), (name, g["name"])
            assert len(d["events"]) == len(events)
            assert d["tasks"][0]["type"] == 0 and d["tasks"][1]["type"] == 10
            assert d["tasks"][1]["trigger"] == 1
            assert [t["trigger"] for t in d["tasks"][2:]] == [t["trigger"] for t in tasks[2:]]
            assert [t["offset"] for t in d["tasks"][2:]] == [t["offset"] for t in tasks[2:]]
            assert d["events"][0]["type"] == 911 and d["events"][1]["type"] == 903
            assert d["events"][-1]["type"] == 910           # the last event ends the graph
            assert d["events"][-1]["triggers"] == g["layers"][-1]["tasks"]


@pytest.mark.gpu
@needs_tree
@pytest.mark.nvcc
def test_every_kernel_passes_in_the_persistent_kernel(compiled, tmp_path):
    for name, (ok, log, took, lib) in compiled.items():
        k = Kernel.load(REPO, name, write_cache=False)
        job = {"root": str(REPO), "library": str(lib), "kernel": name,
               "runtime": runtime.job_payload(k), "result_file": str(tmp_path / f"{name}.json")}
        (tmp_path / f"{name}.job").write_text(json.dumps(job))
        proc = subprocess.run([sys.executable, "-m", "mpkbuild.runners.runtime",
                               str(tmp_path / f"{name}.job")], cwd=REPO, timeout=600,
                              env={**os.environ, "PYTHONPATH": str(REPO / "site_scons")},
                              capture_output=True, text=True)
        res = json.loads((tmp_path / f"{name}.json").read_text())
        assert res["verdict"] == "pass", (name, res["message"], proc.stdout[-2000:])
        for g, r in res["variants"].items():
            assert r["iterations"] >= 3 and r["spans"]["count"] == r["tasks"]

"""The body contract, stated once and held before the GPU (issue 43): a rendered body that
takes its identity from blockIdx, synchronises the whole block or hard-codes its thread
count is refused at generate, naming the line; the previous generated body is kept; the
docs state the contract the generated header defines."""
import re

import pytest

from conftest import REPO
from mpkbuild.stages.generate import lint_body
from mpkbuild.util import config

K = "rmsnorm_v2"
BODY = f"kernels/{K}/{K}.cuh.j2"
GEN = f"build/{K}/gen/{K}.cuh"


@pytest.mark.parametrize("line, rule", [
    ("  const int row = blockIdx.x;", "identity from the block"),
    ("  const int n = gridDim.x;", "identity from the block"),
    ("  __syncthreads();", "a barrier over the whole block"),
    ('  asm volatile("bar.sync 0;");', "a barrier over the whole block"),
    ("  for (int i = threadIdx.x; i < n; i += blockDim.x) {}", "the block's size"),
    ("constexpr int THREADS = 128;", "a literal thread count"),
    ('  asm volatile("bar.sync 3, 128;");', "a named barrier of its own"),
    ("  cutlass::arch::NamedBarrier wg(128, 2);", "a named barrier of its own"),
    ("__device__ unsigned int runs_of[64];", "state kept in a __device__ global"),
    ("static __device__ float kept;", "state kept in a __device__ global"),
])
def test_each_rule_names_the_line(line, rule):
    text = "#pragma once\n// blockIdx and __syncthreads() in a comment are not code\n" + line + "\n"
    (problem,) = lint_body(text, "k", "build/k/gen/k.cuh")
    assert problem.startswith(f"build/k/gen/k.cuh:3: {rule} (")


def test_the_contract_as_written_passes_and_allow_is_per_line():
    ok = ("constexpr int THREADS = k_spec::THREADS;\n  k_spec::task_barrier();\n"
          "__device__ __forceinline__ float twice(float x) { return 2 * x; }\n"
          "__device__ const float table[2] = {1.f, 2.f};\n")
    assert lint_body(ok, "k", "f") == []
    assert lint_body("  __syncthreads();  // mpk-lint: allow (a fault fixture)\n", "k", "f") == []


@pytest.mark.nvcc
def test_a_body_that_breaks_the_contract_stops_at_generate_and_keeps_the_old_output(project):
    project.scons("stage=compile")
    good = project.path(GEN).read_text()
    project.edit(BODY, "  (void)task_index;", "  const int row_of_block = blockIdx.x;\n  (void)task_index;")
    dry = project.scons("-n", "stage=compile").stdout.split("\n")
    assert f"generate {K} {K}.cuh" in dry
    status = project.scons("status", "stage=compile").stdout
    assert "would fail" in status and "identity from the block" in status
    run = project.scons("stage=compile", check=False)
    assert run.returncode != 0
    assert re.search(rf"{GEN}:\d+: identity from the block \(const int row_of_block = blockIdx.x;\)", run.stderr)
    assert project.path(GEN).read_text() == good          # the previous body, as it was
    assert f"compile {K} sm_90a" not in run.actions


def test_the_docs_state_the_contract_the_header_defines():
    """adding-a-kernel.md and the spec reference say what K_spec.h provides, and neither tells a body
    to use what the lint refuses."""
    header = (REPO / "site_scons/mpkbuild/templates/spec_header.h.j2").read_text()
    for name in ("THREADS", "WORKER_THREADS", "task_barrier()", "task_smem()"):
        assert re.search(rf"\b{re.escape(name.rstrip('()'))}\b", header), name
    for doc in ("docs/adding-a-kernel.md", "docs/spec.md"):
        text = (REPO / doc).read_text()
        assert "task_barrier()" in text and "never `__syncthreads()`" in text, doc
        assert "ends with `__syncthreads()`" not in text, doc


@pytest.mark.nvcc
def test_the_harness_has_a_worker_mode_guarded_as_the_registered_call(project):
    """validate's worker mode runs the body as MPK's worker does: a WORKER_THREADS block, the
    body behind the very guard the wire stage puts in the registered call, several tasks per
    block; the library exports its launcher for every variant."""
    import subprocess
    import yaml
    from mpkbuild.util.config import MPK_WORKER_THREADS, WORKER_MODE_BLOCKS
    project.scons("stage=compile")
    harness = project.path(f"build/{K}/gen/harness.cu").read_text()
    guard = yaml.safe_load((config.SHIPPED_WIRING / "surface.yaml").read_text())["call"]["guard"]
    guard = guard.replace("{{ spec }}", config.spec_namespace(K))
    variants = yaml.safe_load((REPO / f"specs/{K}.yaml").read_text())["codegen"]["variants"]
    for v in variants:
        start = harness.index(f"{K}__{v}__worker(")
        kernel = harness[harness.rindex("__global__", 0, start):harness.index("\nextern", start)]
        # blocks of any size validate asks for, up to Runtime-V2's (config.WORKER_MODE_BLOCKS)
        assert f"__launch_bounds__({max(WORKER_MODE_BLOCKS)}, 1)" in kernel
        assert kernel.count(guard) == 2                  # the SMEM poison and the task call
        assert "task += static_cast<int>(gridDim.x)" in kernel
        assert "<<<*blocks, threads, smem_bytes," in harness
    assert WORKER_MODE_BLOCKS == (MPK_WORKER_THREADS, 352)
    spec_h = project.path(f"build/{K}/gen/{K}_spec.h").read_text()
    assert f"constexpr int WORKER_THREADS = {MPK_WORKER_THREADS};" in spec_h
    lib = project.path(f"build/{K}/sm_90a/lib{K}.so")
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True,
                             text=True, check=True).stdout
    for v in variants:
        assert re.search(rf"\bT {K}_launch_worker_{v}$", symbols, re.M), v

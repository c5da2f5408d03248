"""Paths and fixed settings that the rest of the package imports (one place to change them)."""
from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent
TEMPLATE_DIR = PACKAGE_DIR / "templates"

BUILD_DIRNAME = "build"
SPEC_DIRNAME = "specs"
KERNEL_DIRNAME = "kernels"

ARCHS = ("sm_90a", "sm_100a")
# MPK's worker block on both archs (WORKER_NUM_THREADS in persistent_kernel.cuh); a task
# body runs on its spec's codegen.threads of them
MPK_WORKER_THREADS = 256
# compute capability (major, minor) -> the arch whose library runs on it
ARCH_FOR_CC = {(9, 0): "sm_90a", (10, 0): "sm_100a"}

NVCC_BASE_FLAGS = (
    "-std=c++17", "-O3", "-shared", "-Xcompiler", "-fPIC", "-lineinfo", "-Xptxas", "-v",
)

DEFAULT_COS_MIN = 0.999
DEFAULT_REL_MAX = 3e-2
DEFAULT_GATE_TIMEOUT_S = 300

# Spec limits: any input loads (or is refused) in bounded time and memory. Documented in
# README.md's spec section; the loader's messages name them.
MAX_SPEC_BYTES = 256 * 1024          # a spec file (the catalog's are ~3 KB)
MAX_SOURCE_BYTES = 1024 * 1024       # a reference/baseline .py the loader parses
MAX_YAML_NODES = 20_000              # scalars + mappings + sequences in one spec
MAX_YAML_DEPTH = 16                  # nesting of mappings/sequences (the schema needs 6)
MAX_VARIANTS = 256                   # each is a __global__ + launchers in one harness.cu
MAX_TIMEOUT_S = 24 * 3600            # a gate watchdog that never fires is no watchdog
INT32_MAX = 2**31 - 1                # symbols, params, grid: `constexpr int` in K_spec.h
FLOAT32_MAX = 3.4028234663852886e38  # float params: `constexpr float` in K_spec.h

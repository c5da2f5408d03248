"""Paths and fixed settings that the rest of the package imports (one place to change them)."""
from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent
TEMPLATE_DIR = PACKAGE_DIR / "templates"

BUILD_DIRNAME = "build"
SPEC_DIRNAME = "specs"
KERNEL_DIRNAME = "kernels"
WIRING_DIRNAME = "wiring"               # the registration surface: wiring/surface.yaml
WIRING_SURFACE = "surface.yaml"
WIRING_TEMPLATES = "templates"

ARCHS = ("sm_90a", "sm_100a")
FLOAT32_MAX = 3.4028234663852886e38  # float params: `constexpr float` in K_spec.h
# The one dtype table: a spec dtype's size, its C++ type in generated code, its torch dtype
# (by name: the build never imports torch) and what a generator may draw (float: the largest
# finite magnitude; int: the lowest and highest value)
DTYPES = {
    "bf16": {"bytes": 2, "ctype": "__nv_bfloat16", "torch": "bfloat16", "range": 3.3895313892515355e38},
    "fp16": {"bytes": 2, "ctype": "__half", "torch": "float16", "range": 65504.0},
    "fp32": {"bytes": 4, "ctype": "float", "torch": "float32", "range": FLOAT32_MAX},
    "int32": {"bytes": 4, "ctype": "int32_t", "torch": "int32", "range": (-2**31, 2**31 - 1)},
    "int64": {"bytes": 8, "ctype": "int64_t", "torch": "int64", "range": (-2**63, 2**63 - 1)},
}
CTYPES = {name: d["ctype"] for name, d in DTYPES.items()}
DTYPE_BYTES = {name: d["bytes"] for name, d in DTYPES.items()}
# MPK's worker block on both archs (WORKER_NUM_THREADS in persistent_kernel.cuh); a task
# body runs on its spec's codegen.threads of them
MPK_WORKER_THREADS = 256
# Runtime-V2's worker block (runtime_v2.cuh NUM_THREADS: 8 compute warps, then the
# controller, prefetch and event warps); a task runs on the 256 threads of the compute warps
V2_BLOCK_THREADS = 352
# the runtimes a build can target (runtime=, default v1: MPK's scheduler and workers; v2:
# the static-plan Runtime-V2), and the file whose presence says a checkout has v2
RUNTIMES = ("v1", "v2")
V2_MARKER = "include/mirage/persistent_kernel/runtime_v2.cuh"
# the runtime gate's profiler buffer: entries per worker (the v2 megakernel's marks too)
PROFILE_ENTRIES_PER_WORKER = 4096
# validate's worker mode runs each trial's tasks in blocks of both sizes
WORKER_MODE_BLOCKS = (MPK_WORKER_THREADS, V2_BLOCK_THREADS)
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

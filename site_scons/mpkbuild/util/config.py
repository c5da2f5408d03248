"""Paths and fixed settings that the rest of the package imports (one place to change them)."""
from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent
TEMPLATE_DIR = PACKAGE_DIR / "templates"

# What the package ships and reads as data (the wheel carries it): the registration surface
# (surface.yaml and its templates), the GPU profiles every project knows, the spec schema
DATA_DIR = PACKAGE_DIR / "data"
SHIPPED_WIRING = DATA_DIR / "wiring"
SHIPPED_PROFILES = DATA_DIR / "gpu_profiles"
SPEC_SCHEMA_FILE = DATA_DIR / "spec.schema.json"
WIRING_SURFACE = "surface.yaml"
WIRING_TEMPLATES = "templates"

# A project's folders, relative to its root (the folder of its SConstruct): these defaults,
# or what its mpkbuild.yaml says (model/project.py reads that file and calls use_layout once,
# before anything is planned). Read them as config.<NAME> at call time, never imported by name.
PROJECT_FILE = "mpkbuild.yaml"
BUILD_DIRNAME = "build"                 # everything the tool writes
SPEC_DIRNAME = "specs"                  # specs/<kernel>.yaml: what makes a kernel
KERNEL_DIRNAME = "kernels"              # where `new=` puts a kernel's body and reference
PROFILE_DIRNAME = "gpu_profiles"        # the project's own GPU profiles (beside the shipped)
TUNED_DIRNAME = "tuned"                 # tuned/<gpu>/K.json (committed)
HISTORY_DIRNAME = "perf_history"        # perf_history/<gpu>/K.json: accepted perf results
WIRING_DIRNAME = "wiring"               # optional: extends or overrides the shipped surface
# the mpkbuild.yaml key of each folder, and the name above it takes
LAYOUT_KEYS = {"build": "BUILD_DIRNAME", "specs": "SPEC_DIRNAME", "kernels": "KERNEL_DIRNAME",
               "gpu_profiles": "PROFILE_DIRNAME", "tuned": "TUNED_DIRNAME",
               "perf_history": "HISTORY_DIRNAME", "wiring": "WIRING_DIRNAME"}
DEFAULT_LAYOUT = {key: globals()[name] for key, name in LAYOUT_KEYS.items()}


def use_layout(folders: dict[str, str]) -> None:
    """Set the project's folders (mpkbuild.yaml keys; those not given take the defaults)."""
    for key, name in LAYOUT_KEYS.items():
        globals()[name] = folders.get(key, DEFAULT_LAYOUT[key])


def wiring_roots(root) -> tuple[Path, ...]:
    """The wiring surfaces a project wires with, the project's first: its wiring/ folder (when
    it has one) extends or overrides the shipped one (wire/surface.py merges them)."""
    own = Path(root) / WIRING_DIRNAME
    return (own, SHIPPED_WIRING) if own.is_dir() else (SHIPPED_WIRING,)

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
# The namespace a kernel's body and spec header live in, in the harness, the runtime gate and
# the wired checkout alike: upstream's tasks live in namespace kernel (v2's in kernel::v2,
# kernel::rmsnorm_v2, ...), and the mpkbuild_ prefix is one upstream never uses (as the
# wiring surface's install_stem), so ours never merges into one of theirs.
def body_namespace(kernel: str) -> str:
    return f"kernel::mpkbuild_{kernel}"


def spec_namespace(kernel: str) -> str:
    """Where a kernel's generated spec header puts its constants (spec_header.h.j2)."""
    return f"{body_namespace(kernel)}::{kernel}_spec"


# Runtime state a body may read (codegen.inputs[].runtime): an input tensor that MPK does
# not hand the task as a pointer of its layer but that the runtime keeps for the whole batch.
# The harness, the gates and the reference see it as the input tensor it is (whole: every
# task gets all of it); the wired call passes the runtime's own (wiring/surface.yaml
# call.runtime_inputs), and the runtime gate feeds it to the runtime as MPK's meta tensor.
RUNTIME_INPUTS = {
    "tokens": {"dtype": "int64", "meta_index": 1,
               "what": "the step's tokens (RuntimeConfig::tokens from step[0], as MPK's embedding "
                       "reads them with input_source 0)"},
}
# Task metadata a body may take (codegen.task_metadata), in the order the body takes them
# (ints after its tensors): each the task's index on grid x (bid.x), set by the builder as
# MPK's own sets request_id and expert_offset for its attention and MoE tasks. They share
# FullTaskDesc::TaskMetadata's union with task_offset: the bytes each occupies there, and
# the largest index its type holds.
TASK_METADATA = {"request_id": {"bytes": (0, 2), "max": 2**15 - 1},      # int16_t
                 "expert_offset": {"bytes": (0, 4), "max": 2**31 - 1},    # int
                 "kv_idx": {"bytes": (2, 4), "max": 2**16 - 1}}          # uint16_t


def task_metadata(codegen: dict) -> list[str]:
    """The metadata a body takes (codegen.task_metadata), in the order it takes them."""
    return [m for m in TASK_METADATA if m in (codegen.get("task_metadata") or [])]


# SMEM as MPK's Runtime-V2 plans a task's: whole 16 KB pages, at most 14 of them and at most
# 224256 bytes in all (what the runtime gives a task; MAX_DYNAMIC_SHARED_MEMORY_SIZE), a
# region taking pages of its own unless it says it may share them (can_pack)
SMEM_PAGE_BYTES = 16384
SMEM_MAX_PAGES = 14
SMEM_MAX_BYTES = 224256


# compute capability (major, minor) -> the arch whose library runs on it
ARCH_FOR_CC = {(9, 0): "sm_90a", (10, 0): "sm_100a"}

NVCC_BASE_FLAGS = (
    "-std=c++17", "-O3", "-shared", "-Xcompiler", "-fPIC", "-lineinfo", "-Xptxas", "-v",
)

DEFAULT_COS_MIN = 0.999
DEFAULT_REL_MAX = 3e-2
DEFAULT_GATE_TIMEOUT_S = 300

# Spec limits: any input loads (or is refused) in bounded time and memory. Documented in
# docs/spec.md; the loader's messages name them.
MAX_SPEC_BYTES = 256 * 1024          # a spec file (the catalog's are ~3 KB)
MAX_SOURCE_BYTES = 1024 * 1024       # a reference/baseline .py the loader parses
MAX_YAML_NODES = 20_000              # scalars + mappings + sequences in one spec
MAX_YAML_DEPTH = 16                  # nesting of mappings/sequences (the schema needs 6)
MAX_VARIANTS = 256                   # each is a __global__ + launchers in one harness.cu
MAX_TIMEOUT_S = 24 * 3600            # a gate watchdog that never fires is no watchdog
INT32_MAX = 2**31 - 1                # symbols, params, grid: `constexpr int` in K_spec.h

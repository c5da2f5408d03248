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

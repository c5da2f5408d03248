"""The nvcc toolchain as a fact: what every node that compiles or runs compiled code
depends on (the compile stage, the GPU gates, the runtime gate's megakernel)."""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

from mpkbuild.util import config

# nvcc reads these from the environment and adds them to every command line it runs
NVCC_ENV_FLAGS = ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS")


def toolchain_fingerprint(nvcc: str = "nvcc") -> str:
    """'nvcc 13.0.88 (cuda_13.0.r13.0/compiler.36424714_0), host gcc (Debian 12.2.0-14) 12.2.0',
    or 'nvcc: not found'; with ' with NVCC_APPEND_FLAGS=...' when the environment adds flags,
    since they change what nvcc builds as much as a flag on the command line does (status
    names the change). The host compiler is nvcc's (NVCC_CCBIN, else the gcc on PATH): it
    builds the host side and its version is handed to the device front end (cicc's
    --gnu_version), so two machines with one nvcc and another gcc build different binaries."""
    extra = tuple(f"{name}={value}" for name in NVCC_ENV_FLAGS if (value := os.environ.get(name, "")).strip())
    return _fingerprint(nvcc, os.environ.get("NVCC_CCBIN") or "gcc", os.environ.get("PATH", ""), extra)


@functools.lru_cache(maxsize=None)
def _fingerprint(nvcc: str, ccbin: str, path: str, extra: tuple[str, ...]) -> str:
    """Per process and environment: every compiling node asks (800 times at 200 kernels),
    and finding the host compiler on PATH is a stat per PATH entry (~40 ms in all)."""
    host = shutil.which(os.path.join(ccbin, "gcc") if os.path.isdir(ccbin) else ccbin, path=path)
    return (_nvcc_version(nvcc) + f", host {_host_version(host)}"
            + (f" with {' '.join(extra)}" if extra else ""))


def _ask_version(exe: str | None, name: str) -> tuple[str | None, str | None]:
    """(`exe --version`'s output, None), or (None, why there is none: '<name>: not found'
    or '<name>: unusable (...)')."""
    if exe is None:
        return None, f"{name}: not found"
    try:
        return subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60).stdout, None
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"{name}: unusable ({exc})"


@functools.lru_cache(maxsize=None)
def _host_version(exe: str | None) -> str:
    """The first line of the host compiler's --version (per executable: PATH may change)."""
    out, why = _ask_version(exe, os.path.basename(exe) if exe else "gcc")
    return why or (out.splitlines() or ["?"])[0].strip()


@functools.lru_cache(maxsize=None)
def _nvcc_version(nvcc: str) -> str:
    out, why = _ask_version(shutil.which(nvcc), "nvcc")
    if why:
        return why
    version = re.search(r"release [\d.]+, V([\d.]+)", out)
    build = re.search(r"Build (\S+)", out)
    return f"nvcc {version.group(1) if version else '?'} ({build.group(1) if build else '?'})"


def toolkit_copies(tool: str) -> list:
    """Where a CUDA toolkit keeps `tool` (compute-sanitizer, ncu): $CUDA_HOME, $CUDA_PATH,
    /usr/local/cuda, each's bin/, in that order (they may not exist)."""
    roots = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")] + ["/usr/local/cuda"]
    return [Path(r) / "bin" / tool for r in roots if r]


_FLAGS = " ".join(config.NVCC_BASE_FLAGS)


def toolchain_fact() -> str:
    return f"toolchain: {toolchain_fingerprint()}; flags: {_FLAGS}"



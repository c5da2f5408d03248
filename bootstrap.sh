#!/usr/bin/env bash
# Sets up .venv with everything the build and the tests need (idempotent).
# CPU machines get the CPU build of torch 2.13.0 (pip takes it from this machine's disk);
# nothing here downloads a multi-GB CUDA torch. On a GPU box with torch preinstalled, the
# venv sees the system's torch instead (--system-site-packages) and leaves it as it is.
set -euo pipefail
cd "$(dirname "$0")"
step() { echo "bootstrap: $*" >&2; }
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    step "1/3 .venv over this machine's torch (it has a CUDA GPU)"
    python3 -m venv --system-site-packages .venv
else
    step "1/3 .venv, then the CPU build of torch 2.13.0 (about a minute)"
    python3 -m venv .venv
    .venv/bin/python -m pip install -q "torch==2.13.0" numpy
fi
step "2/3 mpkbuild and what the build and the tests use (SCons, jinja2, networkx, pytest, dask, clang-format)"
.venv/bin/python -m pip install -q -e ".[test,dask]"
step "3/3 check"
.venv/bin/python -c 'import mpkbuild, SCons, torch; print("mpkbuild ready: torch", torch.__version__)'

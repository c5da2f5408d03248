"""Shared helpers for the wire stage's tests (no tests here).

Paths, the two kernels' specs (rmsnorm_v2 from specs/, silu_mul_v1 written here), a fresh
copy of the fixture MPK tree, byte snapshots of a tree, and building/running the fixture's
C++ driver and Python layers.
"""
from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from conftest import REPO
from mpkbuild.util import config
WIRING = config.SHIPPED_WIRING
FIXTURE = REPO / "tests" / "fixtures" / "mpk_tree"

SILU_MUL = {
    "kernel": "silu_mul_v1",
    "op": "silu_mul",
    "family": "D",
    "archs": ["sm_90a", "sm_100a"],
    "codegen": {
        "threads": 128,
        "params": {},
        "template_params": ["cols"],
        "variants": {"r8_c2048": {"rows": 8, "cols": 2048}},
        "grid": ["rows"],
        "inputs": [
            {"name": "gate", "dtype": "bf16", "shape": ["rows", "cols"], "partition": [0, -1]},
            {"name": "up", "dtype": "bf16", "shape": ["rows", "cols"], "partition": [0, -1]},
        ],
        "outputs": [
            {"name": "out", "dtype": "bf16", "shape": ["rows", "cols"], "partition": [0, -1]},
        ],
    },
    # explicit numbers: 160 (Hopper, TMA range), 257 (SM100, outside its TMA sub-range)
    "wiring": {"number": {"sm_90a": 160, "sm_100a": 257},
               "params": [{"name": "act_kind", "test_value": 0}],
               "call": {"template_args": ["cols", "act_kind"]},
               "tile_indexed": False},
}


def rmsnorm_spec() -> dict:
    return yaml.safe_load((REPO / "specs" / "rmsnorm_v2.yaml").read_text())


def silu_spec() -> dict:
    return copy.deepcopy(SILU_MUL)


def fresh_tree(tmp_path: Path) -> Path:
    dst = tmp_path / "mpk"
    shutil.copytree(FIXTURE, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def coherence(root: Path) -> list[str]:
    """Every disagreement in the checkout at root, as plan() judges a would-be result."""
    from mpkbuild.wire.checkout import Checkout
    from mpkbuild.wire.coherence import problems_of
    from mpkbuild.wire.surface import load_surface
    return problems_of(Checkout(Path(root), load_surface(WIRING)))


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def build_driver(root: Path) -> Path:
    exe = root / "driver_bin"
    srcs = sorted(str(p) for p in (root / "src" / "kernel").glob("*.cc"))
    cmd = ["g++", "-std=c++17", "-Wall", "-Werror", "-I", str(root / "include"), *srcs,
           str(root / "driver" / "driver.cc"), "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return exe


def run_driver(exe: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe), *args], capture_output=True, text=True)


def run_python(root: Path, code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root / "python"), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, *args] if args else [sys.executable, "-c", code],
                          capture_output=True, text=True, env=env, cwd=root)

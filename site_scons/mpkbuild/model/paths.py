"""Every path the build owns, written down once as repo-relative strings.

The graph declares these strings as they are (planning 200 kernels built ~6000 pathlib
paths only to turn them back into strings); a Kernel's paths are root / the same strings
(model/kernel.py derives them, it spells none of its own).
"""
from __future__ import annotations

from pathlib import Path

from mpkbuild.util import config
from mpkbuild.util.fsutil import repo_rel


class Layout:
    """Where a kernel's files are, repo-relative (str). One instance per Kernel (k.rel)."""

    def __init__(self, name: str, data: dict):
        self.name = name
        self.build_dir = f"{config.BUILD_DIRNAME}/{name}"
        self.spec_json = f"{self.build_dir}/spec.json"
        self.gen_dir = f"{self.build_dir}/gen"
        # generated file role -> path: the spec header, the body, the harness
        self.generated = {"spec_header": f"{self.gen_dir}/{name}_spec.h",
                          "body": f"{self.gen_dir}/{name}.cuh",
                          "harness": f"{self.gen_dir}/harness.cu"}
        self.wiring_dir = f"{self.build_dir}/wiring"
        self.wire_result = f"{self.wiring_dir}/wire.json"
        self.review = f"{self.build_dir}/review.md"
        self.review_json = f"{self.build_dir}/review.json"
        self.junit = f"{self.build_dir}/junit.xml"
        self.body_source = repo_rel(data["codegen"]["body"])

    def section_file(self, section: str) -> str:
        return f"{self.build_dir}/spec/{section}.json"

    def arch_dir(self, arch: str) -> str:
        return f"{self.build_dir}/{arch}"

    def library(self, arch: str) -> str:
        return f"{self.arch_dir(arch)}/lib{self.name}.so"

    def resources(self, arch: str) -> str:
        return f"{self.arch_dir(arch)}/resources.json"

    def compile_log(self, arch: str) -> str:
        return f"{self.arch_dir(arch)}/compile.log"

    def gpu_dir(self, gpu_key: str) -> str:
        return f"{self.build_dir}/gpu/{gpu_key}"

    def gate_result(self, gate: str, gpu_key: str) -> str:
        return f"{self.gpu_dir(gpu_key)}/{gate}.json"

    def gate_verdict(self, gate: str, gpu_key: str) -> str:
        """The verdict word only: what a later gate depends on (not the whole result)."""
        return f"{self.gpu_dir(gpu_key)}/{gate}.verdict"

    def gate_log(self, gate: str, gpu_key: str) -> str:
        return f"{self.gpu_dir(gpu_key)}/{gate}.log"

    def gate_stamp(self, gate: str, gpu_key: str) -> str:
        """Exists only while the gate's verdict is pass; what later stages and exit codes key on."""
        return f"{self.gpu_dir(gpu_key)}/{gate}.ok"


def bandwidth_rel(gpu_key: str) -> str:
    """The GPU's measured copy bandwidth, repo-relative: one derived node per GPU, shared by
    every kernel."""
    return f"{config.BUILD_DIRNAME}/gpu/{gpu_key}/bandwidth.json"


def bandwidth_file(root: Path | str, gpu_key: str) -> Path:
    return Path(root) / bandwidth_rel(gpu_key)


def summary_file(root: Path | str) -> Path:
    return Path(root) / config.BUILD_DIRNAME / "review.md"

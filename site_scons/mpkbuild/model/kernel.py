"""A kernel as the build sees it: its validated spec plus every path it owns.

The layout is written down once, in `Layout`, as repo-relative strings: the graph declares
those strings as they are (planning 200 kernels built ~6000 pathlib paths only to turn
them back into strings). Kernel's Path properties are root / the same strings, for the
actions and runners, which open files; nobody else joins path strings.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from mpkbuild.util import config
from mpkbuild.util.fsutil import repo_rel
from mpkbuild.model.spec import LoadedSpec, load_spec_cached, save_spec_cache


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


@dataclass(frozen=True)
class Kernel:
    """Frozen; its layout is computed once per kernel (k.rel)."""

    root: Path
    spec: LoadedSpec                       # what the build uses (tuned values applied, if any)
    base_spec: LoadedSpec | None = None    # the spec as written, when `spec` has tuned values
    tuned: dict | None = None              # the tuned file applied: path, sha256, applied, skipped

    @property
    def base(self) -> LoadedSpec:
        """The spec's own values (what the tune stage searches from)."""
        return self.base_spec or self.spec

    @classmethod
    def load(cls, root: Path | str, name: str, write_cache: bool = True) -> "Kernel":
        root = Path(root)
        return cls(root=root, spec=load_spec_cached(root / config.SPEC_DIRNAME / f"{name}.yaml", root,
                                                    cls.cache_path(root, name), write=write_cache))

    @staticmethod
    def cache_path(root: Path, name: str) -> Path:
        """The last full load of the spec (see spec.load_spec_cached)."""
        return Path(root) / config.BUILD_DIRNAME / name / ".spec-cache.json"

    def save_spec_cache(self) -> None:
        if not self.base.from_cache:
            save_spec_cache(self.base, self.cache_path(self.root, self.name), self.root)

    @property
    def name(self) -> str:
        return self.spec.name

    @cached_property
    def rel(self) -> Layout:
        """Every path below, repo-relative: what the graph declares."""
        return Layout(self.name, self.spec.data)

    @property
    def archs(self) -> tuple[str, ...]:
        return tuple(sorted(self.spec.data["archs"]))

    @property
    def variants(self) -> tuple[str, ...]:
        return tuple(self.spec.data["codegen"]["variants"])

    # ---- sources
    @property
    def spec_file(self) -> Path:
        return self.root / self.spec.file

    @property
    def body_source(self) -> Path:
        return self.root / self.rel.body_source

    @property
    def body_is_template(self) -> bool:
        return self.spec.data["codegen"]["body"].endswith(".j2")

    # ---- derived: root / the layout's strings
    @property
    def build_dir(self) -> Path:
        return self.root / self.rel.build_dir

    @property
    def spec_json(self) -> Path:
        return self.root / self.rel.spec_json

    def section_file(self, section: str) -> Path:
        return self.root / self.rel.section_file(section)

    @property
    def gen_dir(self) -> Path:
        return self.root / self.rel.gen_dir

    @property
    def generated(self) -> dict[str, Path]:
        """Generated file role -> path: the spec header, the body, the harness."""
        return {role: self.root / p for role, p in self.rel.generated.items()}

    def arch_dir(self, arch: str) -> Path:
        return self.root / self.rel.arch_dir(arch)

    def library(self, arch: str) -> Path:
        return self.root / self.rel.library(arch)

    def resources(self, arch: str) -> Path:
        return self.root / self.rel.resources(arch)

    def compile_log(self, arch: str) -> Path:
        return self.root / self.rel.compile_log(arch)

    def gpu_dir(self, gpu_key: str) -> Path:
        return self.root / self.rel.gpu_dir(gpu_key)

    def gate_result(self, gate: str, gpu_key: str) -> Path:
        return self.root / self.rel.gate_result(gate, gpu_key)

    def gate_log(self, gate: str, gpu_key: str) -> Path:
        return self.root / self.rel.gate_log(gate, gpu_key)

    def gate_stamp(self, gate: str, gpu_key: str) -> Path:
        """Exists only while the gate's verdict is pass; what later stages and exit codes key on."""
        return self.root / self.rel.gate_stamp(gate, gpu_key)

    @property
    def wiring_dir(self) -> Path:
        return self.root / self.rel.wiring_dir

    @property
    def wire_result(self) -> Path:
        return self.root / self.rel.wire_result

    @property
    def has_wiring(self) -> bool:
        return "wiring" in self.spec.sections

    @property
    def review(self) -> Path:
        return self.root / self.rel.review


def discover(root: Path | str) -> list[str]:
    """Kernel names: one per specs/*.yaml."""
    return sorted(p.name[:-5] for p in (Path(root) / config.SPEC_DIRNAME).glob("*.yaml"))


def bandwidth_rel(gpu_key: str) -> str:
    """The GPU's measured copy bandwidth, repo-relative: one derived node per GPU, shared by
    every kernel."""
    return f"{config.BUILD_DIRNAME}/gpu/{gpu_key}/bandwidth.json"


def bandwidth_file(root: Path | str, gpu_key: str) -> Path:
    return Path(root) / bandwidth_rel(gpu_key)


def summary_file(root: Path | str) -> Path:
    return Path(root) / config.BUILD_DIRNAME / "review.md"

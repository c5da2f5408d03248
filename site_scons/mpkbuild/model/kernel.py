"""A kernel as the build sees it: its validated spec plus every path it owns.

Paths are properties so the layout is written down once; the SCons tool, the runners and
status all ask a Kernel where things are instead of joining strings themselves.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from mpkbuild.util import config
from mpkbuild.model.spec import LoadedSpec, load_spec_cached, save_spec_cache


def _memo(method):
    """A path method remembered per kernel and arguments: declaring the graph asks each
    kernel for the same few paths over and over (~10 times each at 200 kernels)."""
    name = method.__name__

    @functools.wraps(method)
    def remembered(self, *args):
        memo = self.__dict__.get("_paths")
        if memo is None:
            memo = self.__dict__["_paths"] = {}    # frozen: set beside the fields, as cached_property does
        key = (name, *args)
        try:
            return memo[key]
        except KeyError:
            value = memo[key] = method(self, *args)
            return value
    return remembered


@dataclass(frozen=True)
class Kernel:
    """Frozen; the paths used in hot loops are computed once per kernel (and arguments)."""

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
            save_spec_cache(self.base, self.cache_path(self.root, self.name))

    @property
    def name(self) -> str:
        return self.spec.name

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
        return self.root / self.spec.data["codegen"]["body"]

    @property
    def body_is_template(self) -> bool:
        return self.spec.data["codegen"]["body"].endswith(".j2")

    @property
    def reference_file(self) -> Path:
        return self.root / self.spec.data["validate"]["reference"].rsplit(":", 1)[0]

    @property
    def baseline_file(self) -> Path:
        return self.root / self.spec.data["perf"]["baseline"].rsplit(":", 1)[0]

    # ---- derived
    @cached_property
    def build_dir(self) -> Path:
        return self.root / config.BUILD_DIRNAME / self.name

    @cached_property
    def spec_json(self) -> Path:
        return self.build_dir / "spec.json"

    @_memo
    def section_file(self, section: str) -> Path:
        return self.build_dir / "spec" / f"{section}.json"

    @cached_property
    def gen_dir(self) -> Path:
        return self.build_dir / "gen"

    @cached_property
    def generated(self) -> dict[str, Path]:
        """Generated file role -> path: the spec header, the body, the harness."""
        return {
            "spec_header": self.gen_dir / f"{self.name}_spec.h",
            "body": self.gen_dir / f"{self.name}.cuh",
            "harness": self.gen_dir / "harness.cu",
        }

    @_memo
    def arch_dir(self, arch: str) -> Path:
        return self.build_dir / arch

    @_memo
    def library(self, arch: str) -> Path:
        return self.arch_dir(arch) / f"lib{self.name}.so"

    @_memo
    def resources(self, arch: str) -> Path:
        return self.arch_dir(arch) / "resources.json"

    @_memo
    def gpu_dir(self, gpu_key: str) -> Path:
        return self.build_dir / "gpu" / gpu_key

    @_memo
    def gate_result(self, gate: str, gpu_key: str) -> Path:
        return self.gpu_dir(gpu_key) / f"{gate}.json"

    @_memo
    def gate_log(self, gate: str, gpu_key: str) -> Path:
        return self.gpu_dir(gpu_key) / f"{gate}.log"

    @_memo
    def gate_stamp(self, gate: str, gpu_key: str) -> Path:
        """Exists only while the gate's verdict is pass; what later stages and exit codes key on."""
        return self.gpu_dir(gpu_key) / f"{gate}.ok"

    @property
    def wiring_dir(self) -> Path:
        return self.build_dir / "wiring"

    @property
    def wire_result(self) -> Path:
        return self.wiring_dir / "wire.json"

    @property
    def has_wiring(self) -> bool:
        return "wiring" in self.spec.sections

    @property
    def review(self) -> Path:
        return self.build_dir / "review.md"


def discover(root: Path | str) -> list[str]:
    """Kernel names: one per specs/*.yaml."""
    return sorted(p.name[:-5] for p in (Path(root) / config.SPEC_DIRNAME).glob("*.yaml"))


def bandwidth_file(root: Path | str, gpu_key: str) -> Path:
    """The GPU's measured copy bandwidth: one derived node per GPU, shared by every kernel."""
    return Path(root) / config.BUILD_DIRNAME / "gpu" / gpu_key / "bandwidth.json"


def summary_file(root: Path | str) -> Path:
    return Path(root) / config.BUILD_DIRNAME / "review.md"

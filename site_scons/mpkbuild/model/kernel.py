"""A kernel as the build sees it: its validated spec plus every path it owns.

The paths are model/paths.Layout's repo-relative strings (k.rel, what the graph declares);
`k.<path>` is root / the same string, for the actions and runners, which open files.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from mpkbuild.util import config
from mpkbuild.model.paths import Layout
from mpkbuild.model.spec import LoadedSpec, SpecLoader


@dataclass(frozen=True)
class Kernel:
    """Frozen; its layout is computed once per kernel (k.rel). Any path of the layout is
    also an attribute here, as a Path under root: k.library("sm_90a"), k.generated["body"]."""

    root: Path
    spec: LoadedSpec                       # what the build uses (tuned values applied, if any)
    base_spec: LoadedSpec | None = None    # the spec as written, when `spec` has tuned values
    tuned: dict | None = None              # the tuned file applied: path, sha256, applied, skipped
    loader: SpecLoader | None = field(default=None, repr=False, compare=False)  # what loaded it

    def __getattr__(self, name: str):
        # only for the layout's names (never for fields: an unpickling instance has none yet)
        if name.startswith("_") or name in ("root", "spec", "base_spec", "tuned", "rel", "loader"):
            raise AttributeError(name)
        value = getattr(self.rel, name)
        if callable(value):
            return lambda *args: self.root / value(*args)
        if isinstance(value, dict):
            return {key: self.root / p for key, p in value.items()}
        return self.root / value

    @property
    def base(self) -> LoadedSpec:
        """The spec's own values (what the tune stage searches from)."""
        return self.base_spec or self.spec

    @classmethod
    def load(cls, root: Path | str, name: str, loader: SpecLoader, write_cache: bool = True) -> "Kernel":
        root = Path(root)
        return cls(root=root, loader=loader,
                   spec=loader.load_cached(root / config.SPEC_DIRNAME / f"{name}.yaml", root,
                                           cls.cache_path(root, name), write=write_cache))

    def sibling(self, name: str) -> "Kernel":
        """Another kernel of this project, loaded as this one was (its cache not written)."""
        return Kernel.load(self.root, name, self.loader, write_cache=False)

    @staticmethod
    def cache_path(root: Path, name: str) -> Path:
        """The last full load of the spec (see SpecLoader.load_cached)."""
        return Path(root) / config.BUILD_DIRNAME / name / ".spec-cache.json"

    def save_spec_cache(self) -> None:
        if not self.base.from_cache:
            self.loader.save_cache(self.base, self.cache_path(self.root, self.name), self.root)

    @property
    def name(self) -> str:
        return self.spec.name

    @cached_property
    def rel(self) -> Layout:
        """Every path, repo-relative: what the graph declares."""
        return Layout(self.name, self.spec.data)

    @property
    def archs(self) -> tuple[str, ...]:
        return tuple(sorted(self.spec.data["archs"]))

    @property
    def variants(self) -> tuple[str, ...]:
        return tuple(self.spec.data["codegen"]["variants"])

    @property
    def spec_file(self) -> Path:
        return self.root / self.spec.file

    @property
    def include_dirs(self) -> list[Path]:
        """codegen.include_dirs as folders (relative ones are the repository's)."""
        return [Path(os.path.normpath(self.root / d)) for d in self.spec.data["codegen"].get("include_dirs", [])]

    @property
    def body_is_template(self) -> bool:
        return self.spec.data["codegen"]["body"].endswith(".j2")

    @property
    def has_wiring(self) -> bool:
        return "wiring" in self.spec.sections


def discover(root: Path | str) -> list[str]:
    """Kernel names: one per specs/*.yaml."""
    return sorted(p.name[:-5] for p in (Path(root) / config.SPEC_DIRNAME).glob("*.yaml"))

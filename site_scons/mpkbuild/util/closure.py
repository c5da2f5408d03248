"""The mpkbuild source files a module runs: its import closure, read from the code itself.

A gate's result depends on the code of the runner that made it, and a hand-kept list of
that code goes wrong as soon as a runner imports one more module. Imports inside functions
count too (a lazy import still runs), and so does every package `__init__` on the way.
Only modules of this package are followed; torch and the standard library are facts of
the toolchain and the GPU fingerprint, not files of this repository.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

from mpkbuild.util import config

PACKAGE = "mpkbuild"


def _file_of(module: str) -> Path | None:
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    base = config.PACKAGE_DIR.joinpath(*parts[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imports(path: Path, module: str) -> set[str]:
    """Every mpkbuild module `path` (the module `module`) may import, absolute names."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            found.add(origin)
            found.update(f"{origin}.{alias.name}" for alias in node.names)   # `from pkg import module`
    return {name for name in found if name.split(".")[0] == PACKAGE}


@functools.lru_cache(maxsize=None)
def module_files(module: str) -> tuple[Path, ...]:
    """The files `import module` runs from this package, sorted (the module's own included)."""
    seen: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        parts = name.split(".")
        for i in range(1, len(parts) + 1):        # the packages on the way run first
            prefix = ".".join(parts[:i])
            path = _file_of(prefix)
            if path is not None and prefix not in seen:
                seen[prefix] = path
                todo.extend(_imports(path, prefix))
    return tuple(sorted(set(seen.values())))

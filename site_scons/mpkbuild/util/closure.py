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
import hashlib
import json
import os
import sys
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


# Parsing every module of the package costs ~0.3 s, on every build and status: what each
# module imports is kept beside Python's own bytecode cache, keyed by the module's bytes.
_CACHE_FILE = config.PACKAGE_DIR / "__pycache__" / "mpkbuild-imports.json"
_cache: dict | None = None
_cache_dirty = False


def _load_cache() -> dict:
    global _cache
    if _cache is None:
        try:
            _cache = json.loads(_CACHE_FILE.read_text())
            if not isinstance(_cache, dict):
                _cache = {}
        except (OSError, ValueError):
            _cache = {}
    return _cache


def _save_cache() -> None:
    """Best effort, as Python's own .pyc files: a read-only package just parses again."""
    global _cache_dirty
    if not _cache_dirty or sys.dont_write_bytecode:
        return
    _cache_dirty = False
    tmp = _CACHE_FILE.with_name(f".{_CACHE_FILE.name}.{os.getpid()}.tmp")
    try:
        _CACHE_FILE.parent.mkdir(exist_ok=True)
        tmp.write_text(json.dumps(_cache, sort_keys=True))
        os.replace(tmp, _CACHE_FILE)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass


def _imports(path: Path, module: str) -> set[str]:
    """Every mpkbuild module `path` (the module `module`) may import, absolute names."""
    global _cache_dirty
    data = path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    cache = _load_cache()
    hit = cache.get(module)
    if isinstance(hit, list) and len(hit) == 2 and hit[0] == sha:
        return set(hit[1])
    found = _parse_imports(data, path, module)
    cache[module] = [sha, sorted(found)]
    _cache_dirty = True
    return found


def _parse_imports(data: bytes, path: Path, module: str) -> set[str]:
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(data, str(path))):
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
    _save_cache()
    return tuple(sorted(set(seen.values())))

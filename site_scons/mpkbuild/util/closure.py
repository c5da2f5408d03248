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
import re
from pathlib import Path

from mpkbuild.util import config

PACKAGE = "mpkbuild"


@functools.lru_cache(maxsize=None)
def _file_of(module: str) -> Path | None:
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    base = config.PACKAGE_DIR.joinpath(*parts[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


# Only the import statements are parsed (every line that starts one, with its
# parenthesised or backslashed continuation): parsing whole modules cost ~0.3 s per build
# and status. An import-like line inside a string counts too, which can only add a file.
_IMPORT_LINE = re.compile(r"^[ \t]*(?:from[ \t]+[\w.]+[ \t]+import\b|import[ \t]+[\w.])")


def _import_statements(text: str) -> list[str]:
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        if _IMPORT_LINE.match(lines[i]):
            stmt = lines[i].split("#", 1)[0].strip()
            while (stmt.count("(") > stmt.count(")") or stmt.endswith("\\")) and i + 1 < len(lines):
                i += 1
                stmt = stmt.rstrip("\\") + " " + lines[i].split("#", 1)[0].strip()
            out.append(stmt)
        i += 1
    return out


@functools.lru_cache(maxsize=None)
def _imports(path: Path, module: str) -> frozenset[str]:
    """Every mpkbuild module `path` (the module `module`) may import, absolute names. Once
    per process, as module_files: the code running is the code that was read."""
    return frozenset(_parse_imports(path.read_text(), path, module))


def _parse_imports(text: str, path: Path, module: str) -> set[str]:
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    nodes = []
    for stmt in _import_statements(text):
        try:
            nodes.extend(ast.parse(stmt).body)
        except SyntaxError:       # an import-like line of prose inside a string
            continue
    for node in nodes:
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

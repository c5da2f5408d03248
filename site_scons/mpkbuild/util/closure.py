"""The mpkbuild source files a module runs: its import closure, read from the code itself.

A gate's result depends on the code of the runner that made it, and a hand-kept list of
that code goes wrong as soon as a runner imports one more module. Imports inside functions
count too (a lazy import still runs), and so does every package `__init__` on the way.
Only modules of this package are followed; torch and the standard library are facts of
the toolchain and the GPU fingerprint, not files of this repository.

The walk stops at PLUMBING: the modules that plan and dispatch (the stage table, the graph
model, the command line, status, the SCons tool) and never compute an output's bytes. What
they decide reaches SCons as a node's sources and facts; a change of how they dispatch is
the declared ACTION_VERSION (the action signature every node shares).

A stage's code fact is the digest of its closure's code, each module normalised to its
syntax tree without comments or docstrings (:func:`normalised_digest`, kept per file's
bytes by :class:`CodeDigests`): a comment or docstring
edit re-runs nothing, any other edit re-runs exactly the nodes whose closure holds it.
"""
from __future__ import annotations

import ast
import functools
import json
import re
from pathlib import Path

from mpkbuild.util import config
from mpkbuild.util.fsutil import sha256_bytes, write_json_atomic

PACKAGE = "mpkbuild"
# Bump when a change to the plumbing (or to how every action is called) changes what the
# actions produce: it is the action signature SCons records for every node (site_tools/mpk.py)
ACTION_VERSION = "mpkbuild action 2"
PLUMBING = frozenset({"mpkbuild.stages", "mpkbuild.stages.table", "mpkbuild.model.graph", "mpkbuild.cli",
                      "mpkbuild.sconsign", "mpkbuild.status", "mpkbuild.dagview", "mpkbuild.util.console"})


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
    """The files `import module` runs from this package, sorted (the module's own
    included), the plumbing left out (the module itself is never left out)."""
    seen: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        parts = name.split(".")
        for i in range(1, len(parts) + 1):        # the packages on the way run first
            prefix = ".".join(parts[:i])
            if prefix in PLUMBING and prefix != module:
                continue
            path = _file_of(prefix)
            if path is not None and prefix not in seen:
                seen[prefix] = path
                todo.extend(_imports(path, prefix))
    return tuple(sorted(set(seen.values())))


def closure_of(modules) -> tuple[Path, ...]:
    """The union of the modules' closures, sorted."""
    return tuple(sorted({p for m in modules for p in module_files(m)}))


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def normalised_digest(data: bytes) -> str:
    """sha256 of the module's syntax tree without comments, docstrings or layout: two
    sources that differ only there have the same digest. A file that does not parse is
    its bytes' digest (it changes the code; the import then fails loudly)."""
    try:
        tree = ast.parse(data)
    except (SyntaxError, ValueError):
        return sha256_bytes(b"unparsed:" + data)
    return sha256_bytes(ast.dump(_strip_docstrings(tree)).encode())


class CodeDigests:
    """Each package file's normalised digest, remembered by the sha256 of its bytes in a
    small cache file (build/.code-digests.json): a planning run hashes the bytes (~6 ms
    for the package) and parses only files whose bytes it has not seen (~0.5 s for all).
    The same file keeps, per code fact, the files it was made of, so status can name the
    module whose edit changed a fact."""

    def __init__(self, cache_file: Path | None = None):
        self.cache_file = cache_file
        self._by_bytes: dict[str, str] = {}
        self.facts: dict[str, dict[str, str]] = {}      # fact digest -> {file: digest}
        self._dirty = False
        self._files: dict[Path, str] = {}
        self._digests: dict[tuple, str] = {}
        if cache_file is not None:
            try:
                data = json.loads(cache_file.read_text())
                self._by_bytes, self.facts = dict(data["bytes"]), dict(data["facts"])
            except (OSError, ValueError, TypeError, KeyError):
                self._by_bytes, self.facts = {}, {}

    def file(self, path: Path) -> str:
        if path not in self._files:
            data = path.read_bytes()
            raw = sha256_bytes(data)
            digest = self._by_bytes.get(raw)
            if digest is None:
                digest = self._by_bytes[raw] = normalised_digest(data)
                self._dirty = True
            self._files[path] = digest
        return self._files[path]

    def files(self, modules) -> dict[str, str]:
        """{package-relative path: normalised digest} over the modules' closure."""
        return {p.relative_to(config.PACKAGE_DIR).as_posix(): self.file(p) for p in closure_of(modules)}

    def digest(self, modules) -> str:
        """One digest for the code of the modules' closure (names and trees)."""
        key = tuple(modules)
        if key not in self._digests:
            files = self.files(modules)
            out = sha256_bytes(json.dumps(files, sort_keys=True).encode())[:16]
            if out not in self.facts:
                self.facts[out] = files
                self._dirty = True
            self._digests[key] = out
        return self._digests[key]

    def changed_files(self, old: str, new: str) -> list[str] | None:
        """The files whose code differs between two facts' digests (None: the old one is
        not remembered)."""
        a, b = self.facts.get(old), self.facts.get(new)
        if a is None or b is None:
            return None
        return sorted(f for f in set(a) | set(b) if a.get(f) != b.get(f))

    def save(self) -> None:
        """Write the cache (a build does; status and -n only read it)."""
        if not self._dirty or self.cache_file is None:
            return
        current = set(self._files.values())
        by_bytes = self._by_bytes if len(self._by_bytes) <= 2000 else \
            {r: d for r, d in self._by_bytes.items() if d in current}
        facts = self.facts if len(self.facts) <= 500 else \
            {d: f for d, f in self.facts.items() if d in set(self._digests.values())}
        write_json_atomic(self.cache_file, {"bytes": by_bytes, "facts": facts})
        self._dirty = False

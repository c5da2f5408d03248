"""A spec section: one top-level part of the spec and the stage that owns it.

The model loads a spec (model/spec.py) but does not know what its stages' sections mean:
each stage hands the loader its `Section` (the stage table's `section=`), which says the
JSON Schema of its part, the checks the schema cannot express, and what its section file
carries for the stages that read it. The helpers below are what those checks may ask
about the repository and the names they declare.
"""
from __future__ import annotations

import ast
import functools
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from mpkbuild.util import config
from mpkbuild.util.fsutil import read_bytes, sha256_bytes

# a problem: (field path from the spec's top, message); a check yields them in the order
# it finds them, and the loader reports the first with its file and line
Problem = tuple[tuple, str]


@dataclass(frozen=True, eq=False)
class Section:
    """`key` is the top-level field; its section file (build/K/spec/<key>.json) holds it
    and the `carries` fields beside it, so a stage reading it needs no other file.
    `check(data, root)` sees the whole spec (defaults filled, schema-valid) and yields
    Problems; it reads other sections only where its own field refers to them. What a
    check reads besides the spec is declared, so a cached load (SpecLoader.load_cached)
    re-checks it: the `file.py:function`s it names (`functions`), the other repository
    files it names (`files`), and the bytes of anything else (`outside`, by root)."""
    key: str
    schema: dict
    check: Callable[[dict, Path], Iterable[Problem]] | None = None
    required: bool = False
    carries: tuple[str, ...] = ()
    functions: Callable[[dict], Iterable[str]] | None = None
    files: Callable[[dict], Iterable[str]] | None = None
    outside: Callable[[Path], bytes] | None = None

    @property
    def keys(self) -> tuple[str, ...]:
        return (*self.carries, self.key)


DTYPE_RANGE = {name: d["range"] for name, d in config.DTYPES.items()}
INT64_MAX = 2**63 - 1


def short(value, limit: int = 60) -> str:
    """A value as a message may show it: a 100,000-item list is not one line."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def generator_problems(where: tuple, gens: dict, input_names: dict):
    for gname, gen in gens.items():
        if gname not in input_names:
            yield (*where, gname), f"no input named {gname!r} (inputs: {', '.join(input_names)})"
            continue
        need = {"normal": ("mean", "std"), "uniform": ("low", "high"), "randint": ("low", "high")}[gen["dist"]]
        for key in need:
            if key not in gen:
                yield (*where, gname, key), f"dist {gen['dist']} needs {key!r}"
        if gen["dist"] != "normal" and "low" in gen and "high" in gen and gen["low"] >= gen["high"]:
            yield (*where, gname), "low must be below high"
        if "step" in gen and gen["dist"] == "randint":
            yield (*where, gname, "step"), "step rounds normal or uniform draws; randint is already whole"
        if "row_scales" in gen:
            lo, hi = gen["row_scales"]
            if gen["dist"] == "randint":
                yield (*where, gname, "row_scales"), "row_scales scales float draws; randint is ids or counts"
            elif not lo < hi:
                yield (*where, gname, "row_scales"), f"[{lo}, {hi}]: the low scale must be below the high one"
        dtype = input_names[gname]["dtype"]
        is_int = dtype.startswith("int")
        if is_int != (gen["dist"] == "randint"):
            yield (*where, gname, "dist"), (f"input {gname!r} is {dtype}: "
                                            + ("use randint" if is_int else "randint is for integer inputs"))
            continue
        for key in ("mean", "std", "low", "high", "step"):
            if key not in gen:
                continue
            value = gen[key]
            if is_int:
                lo, hi = DTYPE_RANGE[dtype]
                if not float(value).is_integer():
                    yield (*where, gname, key), f"randint bound {value!r} is not a whole number"
                elif not lo <= value <= hi + (key == "high"):     # high is exclusive
                    yield (*where, gname, key), f"{short(value)} is outside {dtype}'s range {lo}..{hi}"
            elif abs(value) > DTYPE_RANGE[dtype]:
                yield (*where, gname, key), (f"{value!r} is beyond {dtype}'s largest finite value "
                                             f"{DTYPE_RANGE[dtype]:g}")


def function_problem(root: Path, ref: str, known: dict | None = None) -> str | None:
    """None if `file.py:func` names an existing top-level function, else why not. known:
    as for python_defs."""
    rel, func = ref.rsplit(":", 1)
    defs = python_defs(root, rel, known)[1]
    if isinstance(defs, str):
        return defs
    if func not in defs:
        return f"{rel} has no top-level function {func!r} (found: {', '.join(sorted(defs)) or 'none'})"
    return None


def python_defs(root: Path, rel: str, known: dict | None = None) -> tuple[str | None, frozenset | str]:
    """A Python file the spec names: (the sha256 of its bytes, the names of its top-level
    functions), or (None or the sha256, why it cannot be used). known: {sha256: names}
    from the spec cache; bytes with a known digest are not parsed again (the same bytes
    define the same names), any others are."""
    target = inside_repo(root, rel)
    if target is None:
        return None, f"{rel!r} escapes the repository"
    try:
        st = target.stat()
    except OSError:
        st = None
    if st is None or not stat.S_ISREG(st.st_mode):
        return None, f"file {rel} does not exist"
    if st.st_size > config.MAX_SOURCE_BYTES:
        return None, (f"{rel} is {st.st_size} bytes, more than the {config.MAX_SOURCE_BYTES} "
                      "a reference may be")
    try:
        raw = read_bytes(str(target))
    except OSError as exc:
        return None, f"cannot read {rel}: {exc.strerror}"
    digest = sha256_bytes(raw)
    if known and digest in known:
        return digest, frozenset(known[digest])
    return digest, top_level_functions(raw, rel)


@functools.lru_cache(maxsize=None)
def top_level_functions(raw: bytes, rel: str) -> frozenset | str:
    """The names defined at the top level of a file with these bytes (parsed once per
    content), or why it cannot be read: any bytes give a message, never a traceback."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        return f"{rel}:{line} is not UTF-8 text (byte 0x{raw[exc.start]:02x})"
    try:
        tree = ast.parse(text, filename=rel)
    except SyntaxError as exc:
        return f"{rel}:{exc.lineno} does not parse: {exc.msg}"
    except (ValueError, RecursionError, MemoryError) as exc:
        return f"{rel} does not parse: {type(exc).__name__}: {str(exc)[:80]}"
    return frozenset(n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))


@functools.lru_cache(maxsize=None)
def _resolved(path: Path) -> Path:
    return path.resolve()


def inside_repo(root: Path, rel: str) -> Path | None:
    """root/rel with every symlink followed, as resolve() gives it; None outside the repository."""
    if rel.startswith("/") or "\\" in rel:
        return None
    base = str(_resolved(root))
    target = realpath_under(base, rel)
    if target != base and not target.startswith(base + os.sep):
        return None
    return Path(target)


def realpath_under(base: str, rel: str) -> str:
    """os.path.realpath(base/rel) for a base resolved already: only rel's own components
    are looked at (one lstat each, not one per component of the whole path); the first
    symlink or ".." hands the whole path to realpath."""
    path = base.rstrip(os.sep)
    for part in rel.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            return os.path.realpath(os.path.join(base, rel))
        path = f"{path}{os.sep}{part}"
        try:
            if stat.S_ISLNK(os.lstat(path).st_mode):
                return os.path.realpath(os.path.join(base, rel))
        except OSError:
            pass                     # a missing component stays as it is, as in realpath
    return path or os.sep


# C++ (and CUDA's) keywords: a name the generated code declares must be none of them
CPP_KEYWORDS = frozenset("""
alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t
char32_t class compl concept const consteval constexpr constinit const_cast continue co_await
co_return co_yield decltype default delete do double dynamic_cast else enum explicit export
extern false float for friend goto if inline int long mutable namespace new noexcept not not_eq
nullptr operator or or_eq private protected public register reinterpret_cast requires return
short signed sizeof static static_assert static_cast struct switch template this thread_local
throw true try typedef typeid typename union unsigned using virtual void volatile wchar_t while
xor xor_eq restrict dim3 size_t std""".split())


# CUDA's built-in variables: a parameter or namespace of that name hides or clashes with them
CUDA_BUILTINS = frozenset({"threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize"})


def cpp_reserved(name: str) -> str | None:
    """Why a name cannot be a C++ identifier the generated code declares, or None."""
    if name in CPP_KEYWORDS:
        return "a C++ keyword"
    if name in CUDA_BUILTINS:
        return "a CUDA built-in variable"
    if name.startswith("__") or "__" in name or (name.startswith("_") and name[1:2].isupper()):
        return "reserved in C++ (a double underscore, or an underscore and a capital)"
    return None


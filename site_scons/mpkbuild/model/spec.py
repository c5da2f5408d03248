"""The spec stage: load specs/<K>.yaml, validate it, normalise it, split it into sections.

A bad spec raises one :class:`SpecError` naming file, line and field path, before anything
is written. The normalised form drops cosmetic fields (descriptions) and fills defaults, so
a comment or description edit changes no section and therefore no signature.
"""
from __future__ import annotations

import ast
import copy
import fnmatch
import keyword
import functools
import json
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from mpkbuild.model import schema
from mpkbuild.model.yamlpos import format_path, line_for
from mpkbuild.util import config, expr
from mpkbuild.util.expr import grid_size, tensor_shape, variant_symbols
from mpkbuild.util.fsutil import dump_json, read_bytes, sha256_bytes, sha256_json, write_json_atomic

# yaml (in .yamlpos) and jsonschema are imported by load_spec only: a no-op build or a
# status reads cached specs and never needs them.

# Section name -> the top-level spec keys it holds. Each stage reads only its sections
# (the stage table, stages/__init__.py), so editing one section re-runs only the stages that read it.
SECTIONS = {
    "codegen": ("kernel", "op", "family", "codegen"),
    "generators": ("generators",),
    "validate": ("validate",),
    "perf": ("perf",),
    "runtime": ("runtime",),
}
# present only when the spec has the last key; archs ride along (the wire stage renders per arch)
OPTIONAL_SECTIONS = {"wiring": ("archs", "wiring"),
                     # the tune stage reads the spec's own codegen (never a tuned one) with it
                     "tune": ("kernel", "op", "family", "codegen", "tune")}
COSMETIC_KEYS = {"description"}
# what a generator may draw for an input of each dtype: float -> largest finite magnitude,
# int -> (lowest, highest) value
DTYPE_RANGE = {name: d["range"] for name, d in config.DTYPES.items()}
INT64_MAX = 2**63 - 1
DTYPE_BYTES = config.DTYPE_BYTES


class SpecError(Exception):
    """A spec that cannot be built: names the file, the line and the field path."""

    def __init__(self, file: str, line: int, path, message: str):
        self.file, self.line, self.path, self.message = file, line, tuple(path), message
        super().__init__(f"{file}:{line}: {format_path(self.path)}: {message}")


@dataclass(frozen=True)
class LoadedSpec:
    """A validated spec: normalised data plus one signature per section."""

    file: str                       # repo-relative path of the YAML
    data: dict                      # normalised (defaults filled, cosmetic fields dropped)
    sections: dict                  # section name -> dict
    signatures: dict                # section name -> sha256 of its canonical JSON
    source_sha: str = ""            # sha256 of the YAML bytes it was loaded from
    from_cache: bool = False        # True when load_spec_cached reused the last full load

    def cache_record(self, root: Path | None = None) -> dict:
        """What the spec stage writes to build/K/spec.json (and load_spec_cached reads):
        with the wiring surfaces it was checked against (root's), when given."""
        return {"file": self.file, "spec": self.data, "sections": self.sections,
                "signatures": self.signatures, "source_sha": self.source_sha,
                "loader": loader_version(),
                **({"surface": surface_digest(root)} if root is not None else {})}

    @functools.cached_property
    def digest(self) -> str:
        """sha256 of the normalised data (the spec node's fact). Not a field: a spec made
        from this one with other data (replace(), tuned values) computes its own; a fresh
        spec cache hands it over (load_spec_cached)."""
        # compact separators keep json on its C encoder (indent=2 falls back to pure Python)
        return sha256_bytes(json.dumps(self.data, sort_keys=True, separators=(",", ":")).encode())

    @property
    def name(self) -> str:
        return self.data["kernel"]


def _strip_cosmetic(obj):
    if isinstance(obj, dict):
        return {k: _strip_cosmetic(v) for k, v in obj.items() if k not in COSMETIC_KEYS}
    if isinstance(obj, list):
        return [_strip_cosmetic(v) for v in obj]
    return obj


def _short(value, limit: int = 60) -> str:
    """A value as a message may show it: a 100,000-item list is not one line."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


_LIMIT_NOTES = {config.INT32_MAX: " (it becomes a C++ int)",
                config.MAX_VARIANTS: " (the variant cap: each is a kernel in one harness)"}


def _schema_error(err) -> tuple[tuple, str]:
    """Turn a jsonschema error into (field path, plain message) pointing at the bad field."""
    path = tuple(err.absolute_path)
    if err.validator in ("maxItems", "maxProperties"):
        what = "items" if err.validator == "maxItems" else "entries"
        return path, (f"has {len(err.instance)} {what}, at most {err.validator_value}"
                      + _LIMIT_NOTES.get(err.validator_value, ""))
    if err.validator == "maxLength":
        return path, f"is {len(err.instance)} characters long, at most {err.validator_value}"
    if err.validator in ("maximum", "minimum", "exclusiveMinimum", "exclusiveMaximum"):
        words = {"maximum": "above the maximum", "minimum": "below the minimum",
                 "exclusiveMinimum": "not above", "exclusiveMaximum": "not below"}[err.validator]
        return path, (f"{_short(err.instance)} is {words} {err.validator_value}"
                      + _LIMIT_NOTES.get(err.validator_value, ""))
    if "propertyNames" in err.schema_path and isinstance(err.instance, str):
        return path + (err.instance,), f"name {err.instance!r} is not a C identifier"
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        allowed = set(err.schema.get("properties", {}))
        extra = sorted(k for k in err.instance if k not in allowed)
        if extra:
            hint = f" (allowed: {', '.join(sorted(allowed))})" if allowed else ""
            return path + (extra[0],), f"unknown field {_short(extra[0])}{hint}"
    if err.validator == "required":
        missing = [k for k in err.validator_value if k not in err.instance]
        return path + (missing[0],), f"missing required field {missing[0]!r}"
    if err.validator == "type":
        want = err.validator_value
        want = " or ".join(want) if isinstance(want, list) else want
        return path, f"expected {want}, got {type(err.instance).__name__} {_short(err.instance)}"
    if err.validator == "pattern":
        what = "a C identifier" if err.validator_value == schema.C_IDENT else \
            f"a value matching {err.validator_value}"
        return path, f"{_short(err.instance)} is not {what}"
    if err.validator == "enum":
        return path, f"{_short(err.instance)} is not one of {err.validator_value}"
    return path, err.message if len(err.message) <= 200 else err.message[:197] + "..."


def _generator_problems(where: tuple, gens: dict, input_names: dict):
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
                    yield (*where, gname, key), f"{_short(value)} is outside {dtype}'s range {lo}..{hi}"
            elif abs(value) > DTYPE_RANGE[dtype]:
                yield (*where, gname, key), (f"{value!r} is beyond {dtype}'s largest finite value "
                                             f"{DTYPE_RANGE[dtype]:g}")


def _py_function_exists(root: Path, ref: str, known: dict | None = None) -> str | None:
    """None if `file.py:func` names an existing top-level function, else why not. known:
    as for _python_defs."""
    rel, func = ref.rsplit(":", 1)
    defs = _python_defs(root, rel, known)[1]
    if isinstance(defs, str):
        return defs
    if func not in defs:
        return f"{rel} has no top-level function {func!r} (found: {', '.join(sorted(defs)) or 'none'})"
    return None


def _python_defs(root: Path, rel: str, known: dict | None = None) -> tuple[str | None, frozenset | str]:
    """A Python file the spec names: (the sha256 of its bytes, the names of its top-level
    functions), or (None or the sha256, why it cannot be used). known: {sha256: names}
    from the spec cache; bytes with a known digest are not parsed again (the same bytes
    define the same names), any others are."""
    target = _inside_repo(root, rel)
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
    return digest, _top_level_functions(raw, rel)


@functools.lru_cache(maxsize=None)
def _top_level_functions(raw: bytes, rel: str) -> frozenset | str:
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


def _inside_repo(root: Path, rel: str) -> Path | None:
    """root/rel with every symlink followed, as resolve() gives it; None outside the repository."""
    if rel.startswith("/") or "\\" in rel:
        return None
    base = str(_resolved(root))
    target = _realpath_under(base, rel)
    if target != base and not target.startswith(base + os.sep):
        return None
    return Path(target)


def _realpath_under(base: str, rel: str) -> str:
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
# what the generated spec header declares in namespace <K>_spec (params and variant
# namespaces live there too), and in each variant's namespace (its symbols live there)
SPEC_HEADER_NAMES = frozenset({"THREADS", "WORKER_THREADS", "SMEM_BUDGET", "SMEM_TOTAL", "SMEM_TOTAL_MAX",
                               "SMEM_BASE_ALIGN", "SMEM_BASE_PAD", "task_barrier", "task_smem"})
VARIANT_NAMES = frozenset({"GRID", "SMEM_TOTAL"})


# CUDA's built-in variables: a parameter or namespace of that name hides or clashes with them
CUDA_BUILTINS = frozenset({"threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize"})


def _cpp_reserved(name: str) -> str | None:
    """Why a name cannot be a C++ identifier the generated code declares, or None."""
    if name in CPP_KEYWORDS:
        return "a C++ keyword"
    if name in CUDA_BUILTINS:
        return "a CUDA built-in variable"
    if name.startswith("__") or "__" in name or (name.startswith("_") and name[1:2].isupper()):
        return "reserved in C++ (a double underscore, or an underscore and a capital)"
    return None


def _cpp_name_problems(cg: dict):
    """Every name the generated code declares: no keyword, no reserved name, and no clash
    with another name in the same C++ scope (params become upper-case constexprs beside
    THREADS and the SMEM constants; a variant is a namespace there too; its symbols are
    upper-case constexprs beside GRID)."""
    regions = {f"SMEM_{r['name'].upper()}_{s}" for r in cg.get("smem", {}).get("regions", [])
               for s in ("OFFSET", "BYTES", "ALIGN")}
    taken = {n: "a name the spec header defines" for n in SPEC_HEADER_NAMES | regions}
    for pname in cg["params"]:
        upper = pname.upper()
        why = _cpp_reserved(upper) or taken.get(upper)
        if why is None and keyword.iskeyword(pname):
            why = "a Python keyword (params are passed to the reference by name)"
        if why:
            yield ("codegen", "params", pname), f"{pname!r} becomes the C++ constant {upper}, which is {why}"
        taken.setdefault(upper, f"param {pname!r}'s constant")
    for vname, binding in cg["variants"].items():
        why = _cpp_reserved(vname) or taken.get(vname)
        if why:
            yield ("codegen", "variants", vname), f"variant {vname!r} becomes a C++ namespace and is {why}"
        seen = {n: "a name each variant's namespace defines" for n in VARIANT_NAMES | regions}
        for sym in binding:
            upper = sym.upper()
            why = _cpp_reserved(upper) or seen.get(upper)
            if why:
                yield ("codegen", "variants", vname, sym), (f"symbol {sym!r} becomes the C++ constant "
                                                            f"{vname}::{upper}, which is {why}")
            seen.setdefault(upper, f"symbol {sym!r}'s constant")
    for kind in ("inputs", "outputs"):
        for i, t in enumerate(cg[kind]):
            why = _cpp_reserved(t["name"]) or ("the harness's own argument" if t["name"] == "spans" else None)
            if why is None and keyword.iskeyword(t["name"]):
                why = "a Python keyword (tensors are passed to the reference by name)"
            if why:
                yield ("codegen", kind, i, "name"), f"tensor {t['name']!r} is a C++ parameter name and is {why}"


def _runtime_input_problems(kind: str, i: int, t: dict):
    """A runtime input is one the runtime has, of its type, and whole for every task."""
    rt = config.RUNTIME_INPUTS[t["runtime"]]
    if kind != "inputs":
        yield ("codegen", kind, i, "runtime"), "only an input can be runtime state"
    elif t["dtype"] != rt["dtype"]:
        yield ("codegen", kind, i, "dtype"), (f"{t['runtime']} is {rt['what']}: its dtype is "
                                              f"{rt['dtype']}, not {t['dtype']}")
    elif any(p != -1 for p in t["partition"]):
        yield ("codegen", kind, i, "partition"), (
            f"{t['runtime']} is runtime state, which MPK hands every task whole: its partition "
            f"is all -1 (the body finds its part from task_index), not {t['partition']}")


def _task_metadata_problems(cg: dict):
    """Metadata fields that would share TaskMetadata's bytes (a union)."""
    meta = cg.get("task_metadata") or []
    for a, name in enumerate(meta):
        lo, hi = config.TASK_METADATA[name]["bytes"]
        for other in meta[a + 1:]:
            olo, ohi = config.TASK_METADATA[other]["bytes"]
            if lo < ohi and olo < hi:
                yield ("codegen", "task_metadata", meta.index(other)), (
                    f"{other} and {name} share TaskMetadata's bytes (a union): MPK's tasks "
                    "take one or the other")


def _semantic_errors(data: dict, root: Path, stem: str):
    """Checks the schema cannot express. Yields (path, message); the first one is reported."""
    if data["kernel"] != stem:
        yield ("kernel",), f"kernel name {data['kernel']!r} must equal the spec file's stem {stem!r}"
    why = _cpp_reserved(data["kernel"])
    if why:
        yield ("kernel",), (f"kernel name {data['kernel']!r} names the generated C++ (its namespace, "
                            f"task function and entry points) and is {why}")
    cg = data["codegen"]
    body = cg["body"]
    target = _inside_repo(root, body)
    if target is None:
        yield ("codegen", "body"), f"{body!r} escapes the repository"
    elif not (body.endswith(".cuh") or body.endswith(".cuh.j2")):
        yield ("codegen", "body"), f"{body!r} must be a .cuh or a .cuh.j2 template"
    elif not target.is_file():
        yield ("codegen", "body"), f"file {body} does not exist"
    for i, d in enumerate(cg.get("include_dirs", [])):
        if "\x00" in d or not (root / d).is_dir():
            yield ("codegen", "include_dirs", i), f"{d!r} is not a folder (relative to the repository, or absolute)"
    if cg["threads"] % 32:
        yield ("codegen", "threads"), f"threads={cg['threads']} is not a multiple of the warp size 32"
    if cg["threads"] > config.MPK_WORKER_THREADS:
        yield ("codegen", "threads"), (f"threads={cg['threads']} is more than MPK's worker block of "
                                       f"{config.MPK_WORKER_THREADS} threads (WORKER_NUM_THREADS on Hopper "
                                       "and Blackwell), on whose first codegen.threads the body runs")
    yield from _cpp_name_problems(cg)
    consts = {"threads": cg["threads"], **{k: v for k, v in cg["params"].items()
                                          if not isinstance(v, bool)}}
    for pname, value in cg["params"].items():
        if isinstance(value, bool):
            continue
        if isinstance(value, int) and not -2**31 <= value <= config.INT32_MAX:
            yield ("codegen", "params", pname), (f"{_short(value)} does not fit the C++ int it "
                                                 f"becomes ({-2**31}..{config.INT32_MAX})")
        elif isinstance(value, float) and abs(value) > config.FLOAT32_MAX:
            yield ("codegen", "params", pname), (f"{value!r} does not fit the C++ float it becomes "
                                                 f"(|x| <= {config.FLOAT32_MAX:g})")
    # tensors
    names = set()
    shapes = {t["name"]: t["shape"] for kind in ("inputs", "outputs") for t in cg[kind]}
    for kind in ("inputs", "outputs"):
        for i, t in enumerate(cg[kind]):
            if t["name"] in names:
                yield ("codegen", kind, i, "name"), f"tensor name {t['name']!r} is used twice"
            names.add(t["name"])
            if len(t["partition"]) != len(t["shape"]):
                yield ("codegen", kind, i, "partition"), (
                    f"partition has {len(t['partition'])} entries but shape has {len(t['shape'])} dims")
            if t["partition"].count(0) > 1:
                yield ("codegen", kind, i, "partition"), "at most one dim can be split across grid x"
            if "runtime" in t:
                yield from _runtime_input_problems(kind, i, t)
    yield from _task_metadata_problems(cg)
    # per-variant partition overrides
    runtime_inputs = {t["name"]: t["runtime"] for t in cg["inputs"] if "runtime" in t}
    claimed = {}                            # (variant, tensor) -> the override index that set it
    for i, rule in enumerate(cg.get("overrides", [])):
        matched = fnmatch.filter(cg["variants"], rule["variants"])
        if not matched:
            yield ("codegen", "overrides", i, "variants"), f"{rule['variants']!r} matches no variant"
        for tname, part in rule["partition"].items():
            where = ("codegen", "overrides", i, "partition", tname)
            if tname not in shapes:
                yield where, f"no tensor named {tname!r} (tensors: {', '.join(shapes)})"
                continue
            if tname in runtime_inputs:
                yield where, (f"{tname} is runtime state ({runtime_inputs[tname]}): every task "
                              "gets all of it, in every variant")
                continue
            if len(part) != len(shapes[tname]):
                yield where, f"partition has {len(part)} entries but {tname}'s shape has {len(shapes[tname])} dims"
            if part.count(0) > 1:
                yield where, "at most one dim can be split across grid x"
            for vname in matched:
                if (vname, tname) in claimed:
                    yield where, (f"variant {vname!r} already takes {tname}'s partition from "
                                  f"codegen.overrides[{claimed[vname, tname]}]")
                claimed[vname, tname] = i
    # variants
    template_params = cg["template_params"]
    for vname, binding in cg["variants"].items():
        shadow = sorted(set(binding) & set(consts))
        if shadow:
            yield ("codegen", "variants", vname, shadow[0]), (
                f"variant symbol {shadow[0]!r} shadows a codegen param or 'threads'")
        symbols = {**consts, **binding}
        for tp in template_params:
            if tp not in binding:
                yield ("codegen", "variants", vname), f"template parameter {tp!r} is not bound"
        for i, rule in enumerate(cg["tiling"]):
            if rule["symbol"] not in binding:
                yield ("codegen", "tiling", i, "symbol"), (
                    f"symbol {rule['symbol']!r} is not bound by variant {vname!r}")
                continue
            try:   # static_assert'ed as C++ int arithmetic in K_spec.h
                mult = expr.evaluate(rule["multiple_of"], symbols, cpp_int=True)
            except expr.ExprError as exc:
                yield ("codegen", "tiling", i, "multiple_of"), str(exc)
                continue
            value = binding[rule["symbol"]]
            if not isinstance(mult, int) or mult <= 0 or value % mult:
                yield ("codegen", "variants", vname, rule["symbol"]), (
                    f"{rule['symbol']}={value} does not tile: it must be a multiple of "
                    f"{rule['multiple_of']} = {mult} (codegen.tiling[{i}])")
        try:
            blocks = expr.evaluate(cg["min_blocks_per_sm"], symbols)
        except expr.ExprError as exc:
            yield ("codegen", "min_blocks_per_sm"), f"variant {vname}: {exc}"
            continue
        if not isinstance(blocks, int) or not 1 <= blocks <= 32:
            yield ("codegen", "min_blocks_per_sm"), (
                f"variant {vname}: min_blocks_per_sm = {blocks!r} is not an integer in 1..32")
        try:
            grid = expr.evaluate(cg["grid"][0], symbols)
        except expr.ExprError as exc:
            yield ("codegen", "grid", 0), f"variant {vname}: {exc}"
            continue
        if not isinstance(grid, int) or grid < 1:
            yield ("codegen", "grid", 0), f"variant {vname}: grid = {grid!r} is not a positive integer"
            continue
        if grid > config.INT32_MAX:
            yield ("codegen", "grid", 0), (f"variant {vname}: grid = {grid} does not fit the C++ int "
                                           f"GRID (at most {config.INT32_MAX})")
            continue
        for name in cg.get("task_metadata") or []:
            if grid - 1 > config.TASK_METADATA[name]["max"]:
                yield ("codegen", "grid", 0), (
                    f"variant {vname}: {grid} tasks, but task_metadata {name} holds task "
                    f"indices up to {config.TASK_METADATA[name]['max']}")
        tensors = variant_tensors(cg, vname)
        for kind in ("inputs", "outputs"):
            for i, t in enumerate(tensors[kind]):
                for d, extent in enumerate(t["shape"]):
                    try:
                        n = expr.evaluate(extent, symbols)
                    except expr.ExprError as exc:
                        yield ("codegen", kind, i, "shape", d), f"variant {vname}: {exc}"
                        continue
                    if not isinstance(n, int) or n < 1:
                        yield ("codegen", kind, i, "shape", d), (
                            f"variant {vname}: extent {extent!r} = {n!r} is not a positive integer")
                    elif n > config.INT32_MAX:
                        yield ("codegen", kind, i, "shape", d), (
                            f"variant {vname}: extent {extent!r} = {n} is more than "
                            f"{config.INT32_MAX} (kernels index a dim with int)")
                    elif d < len(t["partition"]) and t["partition"][d] == 0 and grid > n:
                        # more tasks than the split dim has elements: the grid is what is wrong
                        yield ("codegen", "grid", 0), (
                            f"variant {vname}: {grid} tasks ({cg['grid'][0]}) but {t['name']}'s split "
                            f"dim {d} ({extent} = {n}) has only {n} elements to give them")
                    elif d < len(t["partition"]) and t["partition"][d] == 0 and n % grid:
                        yield ("codegen", kind, i, "shape", d), (
                            f"variant {vname}: dim {d} ({extent} = {n}) is split over {grid} tasks "
                            f"but is not a multiple of it" + _partition_origin(cg, vname, t["name"]))
                try:
                    nbytes = DTYPE_BYTES[t["dtype"]] * _product(expr.evaluate(e, symbols) for e in t["shape"])
                except expr.ExprError:
                    continue                        # reported above
                if isinstance(nbytes, int) and nbytes > INT64_MAX:
                    yield ("codegen", kind, i, "shape"), (
                        f"variant {vname}: {t['name']} is {nbytes} bytes, more than a 64-bit "
                        "byte offset can address")
    yield from _split_problems(cg, consts)
    # smem: region sizes may use variant symbols, so the plan is checked for every variant
    for i, region in enumerate(cg["smem"]["regions"]):
        if region["align"] & (region["align"] - 1):
            yield ("codegen", "smem", "regions", i, "align"), f"alignment {region['align']} is not a power of two"
    for vname, binding in cg["variants"].items():
        try:
            smem_layout(cg["smem"], {**consts, **binding})
        except SmemPlanError as exc:
            # plain-number regions fail the same way for every variant: no variant to name
            varies = any(not isinstance(r["bytes"], int) for r in cg["smem"]["regions"][:exc.index + 1])
            yield exc.path, f"variant {vname}: {exc}" if varies else str(exc)
            break
    # validate
    v = data["validate"]
    why = _py_function_exists(root, v["reference"])
    if why:
        yield ("validate", "reference"), f"reference {v['reference']!r}: {why}"
    input_names = {t["name"]: t for t in cg["inputs"]}
    perf_gens = data["perf"].get("generators", {})
    for where, gens in ((("generators",), data["generators"]),
                        (("perf", "generators"), perf_gens),
                        (("runtime", "generators"), data["runtime"].get("generators", {}))):
        yield from _generator_problems(where, gens, input_names)
    for tname, t in input_names.items():
        if t["dtype"].startswith("int") and tname not in data["generators"]:
            yield ("generators",), f"integer input {tname!r} needs a generator (randint)"
    # perf
    p = data["perf"]
    why = _py_function_exists(root, p["baseline"])
    if why:
        yield ("perf", "baseline"), f"baseline {p['baseline']!r}: {why}"
    names = ["torch"]
    for i, b in enumerate(p.get("baselines", [])):
        why = _py_function_exists(root, b["function"])
        if why:
            yield ("perf", "baselines", i, "function"), f"baseline {b['function']!r}: {why}"
        if b["name"] in names:
            yield ("perf", "baselines", i, "name"), (
                f"baseline name {b['name']!r} is taken" +
                (" (torch is perf.baseline's)" if b["name"] == "torch" else ""))
        names.append(b["name"])
    parts = ([(("perf", "bytes", "read"), p["bytes"]["read"]), (("perf", "bytes", "write"), p["bytes"]["write"])]
             if isinstance(p["bytes"], dict) else [(("perf", "bytes"), p["bytes"])])
    for where, text in parts:
        for vname, binding in cg["variants"].items():
            try:
                nbytes = expr.evaluate(text, {**consts, **binding})
            except expr.ExprError as exc:
                yield where, f"variant {vname}: {exc}"
                break
            positive = where[-1] != "write"          # a read-only kernel writes (almost) nothing
            if not isinstance(nbytes, (int, float)) or nbytes < 0 or (positive and nbytes == 0):
                yield where, f"variant {vname}: {where[-1]} = {nbytes!r} is not {'positive' if positive else 'a count'}"
            elif nbytes > INT64_MAX:
                yield where, f"variant {vname}: {where[-1]} = {nbytes:g} is more than 2**63 - 1"
    for i, rule in enumerate(p["thresholds"]):
        if "baseline" in rule and rule["baseline"] not in names:
            yield ("perf", "thresholds", i, "baseline"), (
                f"baseline {rule['baseline']!r} is not one of {', '.join(names)}")
        if not fnmatch.filter(cg["variants"], rule["variants"]):
            yield ("perf", "thresholds", i, "variants"), f"{rule['variants']!r} matches no variant"
        if not any(k in rule for k in ("min_bandwidth_fraction", "max_time_vs_baseline", "max_us")):
            yield ("perf", "thresholds", i), "a threshold needs at least one limit"
    # levers and the tune space
    yield from _tune_problems(data, consts)
    # wiring (owned by the wire stage)
    from mpkbuild.wire import incumbents
    for path, message in incumbents.check_section(data):
        yield path, message
    if "wiring" in data:
        from mpkbuild.wire import section as wire
        for path, message in wire.check_section(data, config.wiring_roots(root)):
            yield tuple(str(path).split(".")), message


def tuned_variants(data: dict) -> list[str]:
    """The variants tune.variants' globs select, in spec order."""
    globs = data["tune"]["variants"]
    return [v for v in data["codegen"]["variants"] if any(fnmatch.fnmatch(v, g) for g in globs)]


def _tune_problems(data: dict, consts: dict):
    cg = data["codegen"]
    levers = cg.get("levers", {})
    for name in levers:
        clash = name in consts or any(name in b for b in cg["variants"].values())
        if clash:
            yield ("codegen", "levers", name), f"lever {name!r} shadows a param, 'threads' or a variant symbol"
    if "tune" not in data:
        return
    t = data["tune"]
    for i, glob in enumerate(t["variants"]):
        if not fnmatch.filter(cg["variants"], glob):
            yield ("tune", "variants", i), f"{glob!r} matches no variant"
    chosen = tuned_variants(data)
    for sym, values in t["space"].items():
        where = ("tune", "space", sym)
        if sym in levers:
            if not all(isinstance(v, bool) for v in values):
                yield where, f"lever {sym!r} takes true/false, got {_short(values)}"
            continue
        if sym in consts:
            yield where, f"{sym!r} is a codegen param or 'threads', not a variant symbol (tune variant symbols or levers)"
            continue
        unbound = [v for v in chosen if sym not in cg["variants"][v]]
        if unbound:
            yield where, (f"{sym!r} is neither a lever nor a symbol of every tuned variant "
                          f"(not bound by {unbound[0]!r})")
            continue
        for value in values:
            if isinstance(value, bool) or not 0 <= value <= config.INT32_MAX:
                yield where, f"{_short(value)} is not a symbol value (an integer 0..{config.INT32_MAX})"
                break
    for i, text in enumerate(t["constraints"]):
        for vname in chosen:
            symbols = {**consts, **cg["variants"][vname],
                       **{k: int(v.get("default", False)) for k, v in levers.items()}}
            try:
                expr.holds(text, symbols)
            except expr.ExprError as exc:
                yield ("tune", "constraints", i), f"variant {vname}: {exc}"
                break


def _product(values) -> int | float:
    out = 1
    for v in values:
        out *= v
    return out


def surface_digest(root) -> str:
    """The bytes of the wiring surfaces a spec's wiring section is checked against (the
    project's wiring/surface.yaml over the shipped one): a cached load is fresh only for the
    surfaces it was checked with."""
    parts = []
    for folder in config.wiring_roots(root):
        try:
            parts.append(read_bytes(str(folder / "surface.yaml")))
        except OSError:
            parts.append(b"(none)")
    return sha256_bytes(b"\0".join(parts))


@functools.lru_cache(maxsize=None)
def loader_version() -> str:
    """Changes whenever the code that validates and normalises specs changes (the import
    closure of this module: schema, expressions, the wire section's checks). Once per
    process: the loader code running is the code that was read."""
    from mpkbuild.util.closure import module_files
    return sha256_bytes(b"".join(f.read_bytes() for f in module_files(__name__)))


def _python_refs(data: dict) -> tuple[str, ...]:
    """Every `file.py:function` the spec names (reference, baseline, extra baselines)."""
    return (data["validate"]["reference"], data["perf"]["baseline"],
            *(b["function"] for b in data["perf"].get("baselines", [])))


def _python_version() -> str:
    """What parses is the running Python's: known function names are kept per version."""
    return "%d.%d" % sys.version_info[:2]


def load_spec_cached(path: Path | str, root: Path | str, cache: Path, write: bool = True) -> LoadedSpec:
    """Like load_spec, but reuse the last full load's result when the YAML's bytes and the
    loader are unchanged (parsing and schema-checking hundreds of specs would dominate a
    no-op build). The cache is refreshed by every full load, so a comment edit costs one
    slow load, not one per run. Files the spec names are still checked on every load, as
    a full load checks them (a body that became a symlink out of the repository is refused
    however fresh the cache); any problem falls through to the full load, which names it.
    A Python file whose bytes have the sha256 the cache records keeps the function names
    recorded for them; other bytes are parsed."""
    root, path = Path(root), Path(path)
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > config.MAX_SPEC_BYTES:
            raise OSError("not a spec the cache can hold")     # the full load says why
        raw = read_bytes(str(path))
        cached = json.loads(read_bytes(str(cache)).decode("utf-8"))
        fresh = (cached.get("source_sha") == sha256_bytes(raw) and cached.get("loader") == loader_version()
                 and cached.get("surface") == surface_digest(root))
    except (OSError, ValueError):
        fresh = False
    if fresh:
        data = cached["spec"]
        record = cached.get("python_defs") or {}
        known = record.get("defs") if record.get("python") == _python_version() else None
        body = _inside_repo(root, data["codegen"]["body"])
        if body is not None and body.is_file() and _functions_exist(root, _python_refs(data), known):
            spec = LoadedSpec(file=cached["file"], data=data, sections=cached["sections"],
                              signatures=cached["signatures"], source_sha=cached["source_sha"],
                              from_cache=True)
            if isinstance(cached.get("digest"), str):
                spec.__dict__["digest"] = cached["digest"]     # computed from this same data
            return spec
    spec = load_spec(path, root)            # reports any problem with file and line
    if write:
        save_spec_cache(spec, cache, root)
    return spec


def _functions_exist(root: Path, refs, known: dict | None) -> bool:
    """Whether every `file.py:function` names a top-level function; each file read once."""
    defs_of: dict[str, frozenset | str] = {}
    for ref in refs:
        rel, func = ref.rsplit(":", 1)
        if rel not in defs_of:
            defs_of[rel] = _python_defs(root, rel, known)[1]
        if isinstance(defs_of[rel], str) or func not in defs_of[rel]:
            return False
    return True


def save_spec_cache(spec: LoadedSpec, cache: Path, root: Path) -> None:
    """The spec's full load with its digest, and the function names of the Python files it
    names by the sha256 of the bytes they were read from."""
    defs = {}
    for rel in dict.fromkeys(ref.rsplit(":", 1)[0] for ref in _python_refs(spec.data)):
        digest, names = _python_defs(root, rel)
        if digest is not None and not isinstance(names, str):
            defs[digest] = sorted(names)
    record = {**spec.cache_record(root), "digest": spec.digest,
              "python_defs": {"python": _python_version(), "defs": defs}}
    try:
        write_json_atomic(cache, record, only_if_changed=True)
    except OSError:
        pass                                # a read-only tree still builds, just slower


@functools.lru_cache(maxsize=None)
def _validator():
    """Draft 2020-12 with integers that are integers: JSON Schema counts 16.0 as one, and a
    16.0 would be written as `16.0` into C++ where an int belongs (or break the loader)."""
    import jsonschema
    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine(
        "integer", lambda _checker, x: isinstance(x, int) and not isinstance(x, bool))
    return jsonschema.validators.extend(base, type_checker=checker)


def load_spec(path: Path | str, root: Path | str) -> LoadedSpec:
    """Load and validate one spec; raise SpecError (file, line, field) on the first problem."""
    root = Path(root)
    path = Path(path)
    try:
        rel = str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        rel = str(path)
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise SpecError(rel, 1, (), "a spec must be a regular file (this is a "
                            f"{'FIFO' if stat.S_ISFIFO(st.st_mode) else 'folder' if stat.S_ISDIR(st.st_mode) else 'special file'}"
                            "); nothing was read")
        size = st.st_size
        if size > config.MAX_SPEC_BYTES:
            raise SpecError(rel, 1, (), f"spec is {size} bytes, more than the {config.MAX_SPEC_BYTES} "
                                        "a spec may be")
        raw_bytes = path.read_bytes()
    except OSError as exc:
        raise SpecError(rel, 1, (), f"cannot read spec: {exc.strerror}") from None
    try:
        text = raw_bytes.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw_bytes.count(b"\n", 0, exc.start) + 1
        col = exc.start - (raw_bytes.rfind(b"\n", 0, exc.start) + 1) + 1
        raise SpecError(rel, line, (), f"not UTF-8 text: byte 0x{raw_bytes[exc.start]:02x} "
                                       f"at column {col}") from None
    import jsonschema
    from mpkbuild.model.yamlpos import YamlPosError, load_with_lines
    try:
        raw, lines = load_with_lines(text)
    except YamlPosError as exc:
        raise SpecError(rel, exc.line, exc.path, exc.message) from None
    if not isinstance(raw, dict):
        what = "empty" if raw is None else f"a YAML {type(raw).__name__}"
        raise SpecError(rel, 1, (), f"a spec must be a YAML mapping (this one is {what})")
    sch = schema.full_schema()
    errors = sorted(_validator()(sch).iter_errors(raw),
                    key=lambda e: (line_for(lines, tuple(e.absolute_path)), list(map(str, e.absolute_path))))
    if errors:
        fpath, message = _schema_error(errors[0])
        raise SpecError(rel, line_for(lines, fpath), fpath, message)
    data = copy.deepcopy(raw)
    schema.fill_defaults(data, sch)
    for fpath, message in _semantic_errors(data, root, path.name.rsplit(".", 1)[0]):
        raise SpecError(rel, line_for(lines, fpath), fpath, message)
    # canonical (key-sorted) order, as the section files on disk have it: whoever renders
    # from this in memory (status, -n) sees exactly what the build reads back
    data = json.loads(dump_json(_strip_cosmetic(data)))
    sections = {name: {k: data[k] for k in keys} for name, keys in SECTIONS.items()}
    for name, keys in OPTIONAL_SECTIONS.items():
        if keys[-1] in data:
            sections[name] = {k: data[k] for k in keys}
    signatures = {name: sha256_json(sec) for name, sec in sections.items()}
    return LoadedSpec(file=rel, data=data, sections=sections, signatures=signatures,
                      source_sha=sha256_bytes(raw_bytes))


class SmemPlanError(ValueError):
    """A region size that does not evaluate, is not positive, or overruns the budget."""

    def __init__(self, index: int, field: str | None, message: str):
        self.index = index
        self.path = ("codegen", "smem", "regions", index) + ((field,) if field else ())
        super().__init__(message)


def smem_layout(smem: dict, symbols: dict) -> tuple[list[dict], int]:
    """Lay the regions out in order at their alignment for one variant's symbols:
    ([{name, offset, bytes, align}], total). Raises SmemPlanError."""
    regions, total = [], 0
    for i, region in enumerate(smem["regions"]):
        try:
            nbytes = expr.evaluate(region["bytes"], symbols)
        except expr.ExprError as exc:
            raise SmemPlanError(i, "bytes", str(exc)) from None
        if not isinstance(nbytes, int) or nbytes <= 0:
            raise SmemPlanError(i, "bytes", f"{region['bytes']!r} = {nbytes!r} is not a positive integer")
        offset = -(-total // region["align"]) * region["align"]
        total = offset + nbytes
        if total > smem["budget"]:
            raise SmemPlanError(i, None, f"SMEM over budget: regions up to {region['name']!r} need "
                                         f"{total} bytes, budget is {smem['budget']}")
        regions.append({"name": region["name"], "offset": offset, "bytes": nbytes, "align": region["align"]})
    pages = smem_pages(smem, regions)
    if sum(n for _, n in pages) > config.SMEM_MAX_PAGES:
        table = ", ".join(f"{name} {n}" for name, n in pages)
        raise SmemPlanError(len(regions) - 1, None, (
            f"SMEM needs {sum(n for _, n in pages)} pages of {config.SMEM_PAGE_BYTES // 1024} KB, "
            f"MPK gives a task at most {config.SMEM_MAX_PAGES}: pages by region: {table} (a region "
            "takes pages of its own unless it says can_pack: true)"))
    return regions, total


def smem_pages(smem: dict, regions: list[dict]) -> list[tuple[str, int]]:
    """(region, pages) as Runtime-V2 plans them: each region whole pages of its own, the
    packable ones (can_pack) together in shared pages ("packed: a+b" for that group)."""
    page = config.SMEM_PAGE_BYTES
    out, packed, span = [], [], 0
    for declared, r in zip(smem["regions"], regions):
        if declared.get("can_pack"):
            span = -(-span // r["align"]) * r["align"] + r["bytes"]
            packed.append(r["name"])
        else:
            out.append((r["name"], -(-r["bytes"] // page)))
    if packed:
        out.append(("packed: " + "+".join(packed), -(-span // page)))
    return out


def variant_tensors(codegen: dict, variant: str) -> dict:
    """{"inputs": [...], "outputs": [...]} for one variant: the declared tensors with the
    partitions codegen.overrides gives that variant (the loader allows one per tensor)."""
    override = {}
    for rule in codegen.get("overrides", []):
        if fnmatch.fnmatch(variant, rule["variants"]):
            override.update(rule["partition"])
    return {kind: [{**t, "partition": override[t["name"]]} if t["name"] in override else t
                   for t in codegen[kind]] for kind in ("inputs", "outputs")}


_PROBES = (2, 3, 5, 7)


def _bindings_beyond(cg: dict, consts: dict):
    """(variant, binding) for bindings the spec allows beyond its listed variants: each
    variant with one symbol scaled by, or set to, a small prime, kept where every tiling
    rule holds and the grid is a positive integer. A split that divides only for the listed
    values holds by accident, and the next variant someone adds breaks it."""
    for vname, binding in cg["variants"].items():
        for sym in binding:
            for p in _PROBES:
                for value in (binding[sym] * p, p):
                    probe = {**binding, sym: value}
                    symbols = {**consts, **probe}
                    try:
                        ok = all(probe[r["symbol"]] % expr.evaluate(r["multiple_of"], symbols, cpp_int=True) == 0
                                 for r in cg["tiling"] if r["symbol"] in probe)
                        grid = expr.evaluate(cg["grid"][0], symbols)
                    except (expr.ExprError, TypeError, ZeroDivisionError):
                        continue
                    if ok and isinstance(grid, int) and grid >= 1:
                        yield vname, probe, symbols, grid


def _split_problems(cg: dict, consts: dict):
    """What must hold for every variant, not only the listed ones: a split dim is a multiple
    of the grid, and an output split over no dim is written by one task, or the spec says
    the tasks share it (shared_by_tasks: tiles found from task_index, or accumulation)."""
    listed = [(v, b, {**consts, **b}) for v, b in cg["variants"].items()]
    try:
        listed = [(v, b, s, expr.evaluate(cg["grid"][0], s)) for v, b, s in listed]
    except expr.ExprError:
        return                                   # reported per variant
    for vname, probe, symbols, grid in listed + list(_bindings_beyond(cg, consts)):
        is_listed = probe == cg["variants"][vname]
        where_from = (f"variant {vname}" if is_listed else
                      f"variant {vname} with " + ", ".join(f"{k}={probe[k]}" for k in probe
                                                         if probe[k] != cg["variants"][vname][k]))
        tensors = variant_tensors(cg, vname)
        for kind in ("inputs", "outputs"):
            for i, t in enumerate(tensors[kind]):
                part = t["partition"]
                if kind == "outputs" and 0 not in part and grid > 1 and not t.get("shared_by_tasks"):
                    yield ("codegen", kind, i, "partition"), (
                        f"output {t['name']} is split over no dim, so each of the {grid} tasks of "
                        f"{where_from} (grid {cg['grid'][0]} = {grid}) gets all of it: split the "
                        "dim the grid counts (0 in partition), or say shared_by_tasks: true if the "
                        "body finds its own part from task_index or accumulates into it")
                    return
                if 0 not in part or is_listed:
                    continue                     # the listed variants are checked one by one
                d = part.index(0)
                try:
                    n = expr.evaluate(t["shape"][d], symbols)
                except expr.ExprError:
                    continue
                if isinstance(n, int) and (n < grid or n % grid):
                    yield ("codegen", kind, i, "partition"), (
                        f"{t['name']}'s dim {d} ({t['shape'][d]}) is split over the grid "
                        f"({cg['grid'][0]}), which divides it for the listed variants only: for "
                        f"{where_from} (a binding the tiling rules allow) it is {n} over {grid} "
                        "tasks. Split the dim the grid counts, or add the tiling rule that "
                        "makes it divide" + _partition_origin(cg, vname, t["name"]))
                    return


def _partition_origin(codegen: dict, variant: str, tensor: str) -> str:
    for i, rule in enumerate(codegen.get("overrides", [])):
        if tensor in rule["partition"] and fnmatch.fnmatch(variant, rule["variants"]):
            return f" (partition from codegen.overrides[{i}])"
    return ""

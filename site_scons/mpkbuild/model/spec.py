"""Loading a spec: specs/<K>.yaml read, checked, normalised and split into section files.

The model does not know what the stages' sections mean. A `SpecLoader` is made from the
sections the stage table declares (model/section.Section: each stage's schema fragment,
checks and section file), and adds only the kernel's identity (name, op, family, archs)
and the generators every stage draws its inputs from, with the rules that span sections.
A bad spec raises one :class:`SpecError` naming file, line and field path, before anything
is written. The normalised form drops cosmetic fields (descriptions) and fills defaults, so
a comment or description edit changes no section and therefore no signature.
"""
from __future__ import annotations

import copy
import functools
import json
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from mpkbuild.model import schema
from mpkbuild.model.section import (Section, cpp_reserved, generator_problems, inside_repo,
                                    python_defs, short)
from mpkbuild.model.yamlpos import format_path, line_for
from mpkbuild.util import config
from mpkbuild.util.fsutil import dump_json, read_bytes, sha256_bytes, sha256_json, write_json_atomic

# yaml (in .yamlpos) and jsonschema are imported by a full load only: a no-op build or a
# status reads cached specs and never needs them.

COSMETIC_KEYS = {"description"}


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
    from_cache: bool = False        # True when SpecLoader.load_cached reused the last full load
    loader: str = ""                # the version of the loader that checked it

    def cache_record(self, outside: str | None = None) -> dict:
        """What the spec stage writes to build/K/spec.json (and load_cached reads): with
        the digest of the files outside the spec its checks read, when given."""
        return {"file": self.file, "spec": self.data, "sections": self.sections,
                "signatures": self.signatures, "source_sha": self.source_sha,
                "loader": self.loader, **({"outside": outside} if outside is not None else {})}

    @functools.cached_property
    def digest(self) -> str:
        """sha256 of the normalised data (the spec node's fact). Not a field: a spec made
        from this one with other data (replace(), tuned values) computes its own; a fresh
        spec cache hands it over (load_cached)."""
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
        return path, (f"{short(err.instance)} is {words} {err.validator_value}"
                      + _LIMIT_NOTES.get(err.validator_value, ""))
    if "propertyNames" in err.schema_path and isinstance(err.instance, str):
        return path + (err.instance,), f"name {err.instance!r} is not a C identifier"
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        allowed = set(err.schema.get("properties", {}))
        extra = sorted(k for k in err.instance if k not in allowed)
        if extra:
            hint = f" (allowed: {', '.join(sorted(allowed))})" if allowed else ""
            return path + (extra[0],), f"unknown field {short(extra[0])}{hint}"
    if err.validator == "required":
        missing = [k for k in err.validator_value if k not in err.instance]
        return path + (missing[0],), f"missing required field {missing[0]!r}"
    if err.validator == "type":
        want = err.validator_value
        want = " or ".join(want) if isinstance(want, list) else want
        return path, f"expected {want}, got {type(err.instance).__name__} {short(err.instance)}"
    if err.validator == "pattern":
        what = "a C identifier" if err.validator_value == schema.C_IDENT else \
            f"a value matching {err.validator_value}"
        return path, f"{short(err.instance)} is not {what}"
    if err.validator == "enum":
        return path, f"{short(err.instance)} is not one of {err.validator_value}"
    return path, err.message if len(err.message) <= 200 else err.message[:197] + "..."

















# the kernel's identity, which every section file may carry, and the generators
IDENTITY_SCHEMA = {
    "kernel": {"type": "string", "pattern": schema.C_IDENT,
               "description": "kernel name; must equal the spec file's stem"},
    "op": {"type": "string", "pattern": schema.C_IDENT},
    "family": {"enum": ["A", "B", "C", "D", "E"],
               "description": "A pipeline, B consumer+typed SMEM regions, C monolithic SMEM, "
                              "D no SMEM (elementwise), E helper fused in a host kernel"},
    "description": {"type": "string", "description": "cosmetic: not part of any signature"},
    "archs": {"type": "array", "minItems": 1, "uniqueItems": True,
              "items": {"enum": list(config.ARCHS)}},
}
GENERATORS = Section("generators", {
    "type": "object", "default": {}, "maxProperties": 16,
    "description": "input name -> random distribution (validate and perf); "
                   "float inputs default to normal(0, 1)",
    "propertyNames": {"pattern": schema.C_IDENT},
    "additionalProperties": schema.GENERATOR})


def _identity_problems(data: dict, stem: str):
    if data["kernel"] != stem:
        yield ("kernel",), f"kernel name {data['kernel']!r} must equal the spec file's stem {stem!r}"
    why = cpp_reserved(data["kernel"])
    if why:
        yield ("kernel",), (f"kernel name {data['kernel']!r} names the generated C++ (its namespace, "
                            f"task function and entry points) and is {why}")


def _generator_problems(data: dict):
    """The generators draw the codegen section's inputs: they span both."""
    inputs = {t["name"]: t for t in data["codegen"]["inputs"]}
    yield from generator_problems(("generators",), data["generators"], inputs)
    for tname, t in inputs.items():
        if t["dtype"].startswith("int") and tname not in data["generators"]:
            yield ("generators",), f"integer input {tname!r} needs a generator (randint)"


def _python_version() -> str:
    """What parses is the running Python's: known function names are kept per version."""
    return "%d.%d" % sys.version_info[:2]


class SpecLoader:
    """Loads specs made of these sections (the stage table's, in its order, after the
    generators). Once per process per loader: the code checking is the code that was read."""

    def __init__(self, sections):
        self.sections: tuple[Section, ...] = (GENERATORS, *sections)

    @functools.cached_property
    def schema(self) -> dict:
        """The whole spec schema: the identity and every section's fragment."""
        return schema.compose(IDENTITY_SCHEMA, ["kernel", "op", "family", "archs"], self.sections)

    @functools.cached_property
    def version(self) -> str:
        """Changes whenever the code that validates and normalises specs changes: the
        import closure of this module and of every section's module."""
        from mpkbuild.util.closure import closure_of
        modules = [__name__, *(s.check.__module__ for s in self.sections if s.check)]
        return sha256_bytes(b"".join(f.read_bytes() for f in closure_of(modules)))

    def outside(self, root) -> str:
        """The digest of what the sections' checks read besides the spec (the wiring
        surfaces): a cached load is fresh only for the same bytes."""
        return sha256_bytes(b"\0".join(s.outside(Path(root)) for s in self.sections if s.outside))

    def functions(self, data: dict) -> tuple[str, ...]:
        """Every `file.py:function` the spec names."""
        return tuple(ref for s in self.sections if s.functions and s.key in data for ref in s.functions(data))

    def files(self, data: dict) -> tuple[str, ...]:
        """Every other repository file the spec names (the task body)."""
        return tuple(f for s in self.sections if s.files and s.key in data for f in s.files(data))

    def problems(self, data: dict, root: Path, stem: str):
        """Checks the schema cannot express, in order; the first one is reported."""
        yield from _identity_problems(data, stem)
        for s in self.sections:
            if s.check and s.key in data:
                yield from s.check(data, root)
        yield from _generator_problems(data)

    def load_cached(self, path: Path | str, root: Path | str, cache: Path, write: bool = True) -> LoadedSpec:
        """Like load, but reuse the last full load's result when the YAML's bytes, the
        loader and what its checks read outside the spec are unchanged (parsing and
        schema-checking hundreds of specs would dominate a no-op build). The cache is
        refreshed by every full load, so a comment edit costs one slow load, not one per
        run. Files the spec names are still checked on every load, as a full load checks
        them (a body that became a symlink out of the repository is refused however fresh
        the cache); any problem falls through to the full load, which names it. A Python
        file whose bytes have the sha256 the cache records keeps the function names
        recorded for them; other bytes are parsed."""
        root, path = Path(root), Path(path)
        try:
            st = path.stat()
            if not stat.S_ISREG(st.st_mode) or st.st_size > config.MAX_SPEC_BYTES:
                raise OSError("not a spec the cache can hold")     # the full load says why
            raw = read_bytes(str(path))
            cached = json.loads(read_bytes(str(cache)).decode("utf-8"))
            fresh = (cached.get("source_sha") == sha256_bytes(raw) and cached.get("loader") == self.version
                     and cached.get("outside") == self.outside(root))
        except (OSError, ValueError):
            fresh = False
        if fresh:
            data = cached["spec"]
            record = cached.get("python_defs") or {}
            known = record.get("defs") if record.get("python") == _python_version() else None
            if self._named_files_exist(root, data, known):
                spec = LoadedSpec(file=cached["file"], data=data, sections=cached["sections"],
                                  signatures=cached["signatures"], source_sha=cached["source_sha"],
                                  from_cache=True, loader=self.version)
                if isinstance(cached.get("digest"), str):
                    spec.__dict__["digest"] = cached["digest"]     # computed from this same data
                return spec
        spec = self.load(path, root)            # reports any problem with file and line
        if write:
            self.save_cache(spec, cache, root)
        return spec

    def _named_files_exist(self, root: Path, data: dict, known: dict | None) -> bool:
        """Whether every file the spec names is still a file of the repository, and every
        `file.py:function` a top-level function; each Python file read once."""
        for rel in self.files(data):
            target = inside_repo(root, rel)
            if target is None or not target.is_file():
                return False
        defs_of: dict[str, frozenset | str] = {}
        for ref in self.functions(data):
            rel, func = ref.rsplit(":", 1)
            if rel not in defs_of:
                defs_of[rel] = python_defs(root, rel, known)[1]
            if isinstance(defs_of[rel], str) or func not in defs_of[rel]:
                return False
        return True

    def save_cache(self, spec: LoadedSpec, cache: Path, root: Path) -> None:
        """The spec's full load with its digest, and the function names of the Python files
        it names by the sha256 of the bytes they were read from."""
        defs = {}
        for rel in dict.fromkeys(ref.rsplit(":", 1)[0] for ref in self.functions(spec.data)):
            digest, names = python_defs(root, rel)
            if digest is not None and not isinstance(names, str):
                defs[digest] = sorted(names)
        record = {**spec.cache_record(self.outside(root)), "digest": spec.digest,
                  "python_defs": {"python": _python_version(), "defs": defs}}
        try:
            write_json_atomic(cache, record, only_if_changed=True)
        except OSError:
            pass                                # a read-only tree still builds, just slower

    def load(self, path: Path | str, root: Path | str) -> LoadedSpec:
        """Load and check one spec; raise SpecError (file, line, field) on the first problem."""
        rel, raw_bytes, raw, lines = _read(path, root)
        sch = self.schema
        errors = sorted(_validator()(sch).iter_errors(raw),
                        key=lambda e: (line_for(lines, tuple(e.absolute_path)), list(map(str, e.absolute_path))))
        if errors:
            fpath, message = _schema_error(errors[0])
            raise SpecError(rel, line_for(lines, fpath), fpath, message)
        data = copy.deepcopy(raw)
        schema.fill_defaults(data, sch)
        for fpath, message in self.problems(data, Path(root), Path(path).name.rsplit(".", 1)[0]):
            raise SpecError(rel, line_for(lines, fpath), fpath, message)
        # canonical (key-sorted) order, as the section files on disk have it: whoever renders
        # from this in memory (status, -n) sees exactly what the build reads back
        data = json.loads(dump_json(_strip_cosmetic(data)))
        sections = {s.key: {k: data[k] for k in s.keys} for s in self.sections if s.key in data}
        signatures = {name: sha256_json(sec) for name, sec in sections.items()}
        return LoadedSpec(file=rel, data=data, sections=sections, signatures=signatures,
                          source_sha=sha256_bytes(raw_bytes), loader=self.version)


def error_at(path: Path | str, root: Path | str, field: tuple, message: str) -> SpecError:
    """The error for a field of a spec file that a check outside its own load found (another
    spec it names, say), at the field's line."""
    rel, _, _, lines = _read(path, root)
    return SpecError(rel, line_for(lines, tuple(field)), tuple(field), message)


@functools.lru_cache(maxsize=None)
def _validator():
    """Draft 2020-12 with integers that are integers: JSON Schema counts 16.0 as one, and a
    16.0 would be written as `16.0` into C++ where an int belongs (or break the loader)."""
    import jsonschema
    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine(
        "integer", lambda _checker, x: isinstance(x, int) and not isinstance(x, bool))
    return jsonschema.validators.extend(base, type_checker=checker)


def _read(path: Path | str, root: Path | str) -> tuple[str, bytes, dict, dict]:
    """(repo-relative name, bytes, YAML mapping, field path -> line) of a spec file."""
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
    from mpkbuild.model.yamlpos import YamlPosError, load_with_lines
    try:
        raw, lines = load_with_lines(text)
    except YamlPosError as exc:
        raise SpecError(rel, exc.line, exc.path, exc.message) from None
    if not isinstance(raw, dict):
        what = "empty" if raw is None else f"a YAML {type(raw).__name__}"
        raise SpecError(rel, 1, (), f"a spec must be a YAML mapping (this one is {what})")
    return rel, raw_bytes, raw, lines

"""Loading wiring/surface.yaml: the registration surface as data.

The package ships one (data/wiring/); a project's own wiring/ folder extends or overrides
it (config.wiring_roots): its surface.yaml is merged over the shipped one key by key (a
site by its id, an arch, scan regex or requirement by its name; `drop: true` removes a
site, `null` an entry) and its templates/ shadow the shipped templates of the same name.

Owns the :class:`Surface` object (archs with their enum ranges and TMA sub-ranges, the
layout files that identify a checkout, the marker format, one :class:`Site` per edit, and
the scan regexes) and the jinja2 environment over wiring/templates with StrictUndefined.
Every template or pattern problem surfaces as a :class:`TemplateError` or
:class:`SurfaceError` naming the file and line, never as a bare jinja2 or re exception.
"""
from __future__ import annotations

import re
import traceback
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from ..util import config
from ..util.config import WIRING_SURFACE as SURFACE_FILE, WIRING_TEMPLATES as TEMPLATE_DIR
from ..util.templates import same_bytes_loader
from .errors import SurfaceError, TemplateError

if TYPE_CHECKING:
    import jinja2
_SITE_KEYS = {"id", "file", "per_arch", "anchor", "where", "indent", "comment", "template",
              "when", "scope", "kind", "claim", "optional", "join", "needs", "runtime"}
_MAPPING_KEYS = ("archs", "scan", "requires", "call", "python", "marker")   # merged by name
_REQUIRE_KEYS = {"file", "scope", "pattern", "what", "if_used"}
_WHEN = {None, "tma", "tile_indexed", "task_metadata", "no_runtime_state", "own_layer", "port"}


@dataclass(frozen=True)
class Arch:
    name: str                  # sm_90a
    dir: str                   # hopper
    tag: str                   # HOPPER (default task type suffix)
    title: str                 # Hopper (task_header group comment)
    cc: int                    # 90 (what the Python layer switches on)
    range_begin: str           # enum placeholder names; numbers lie strictly between
    range_end: str
    tma_ranges: tuple[tuple[int, int], ...]
    auto_ranges: tuple[tuple[int, int], ...] = ()   # where "auto" looks, preferred first
    runtime: str = "v1"        # v2: a Runtime-V2 target (runtime=v2 wires it)

    def in_tma(self, number: int) -> bool:
        return any(lo <= number <= hi for lo, hi in self.tma_ranges)

    def as_dict(self) -> dict:
        return {"name": self.name, "dir": self.dir, "tag": self.tag, "title": self.title,
                "cc": self.cc, "range_begin": self.range_begin, "range_end": self.range_end}


@dataclass(frozen=True)
class Site:
    id: str
    file: str                  # jinja2 text: may use {{ arch.* }} and {{ kernel }}
    template: str
    comment: str
    per_arch: bool = True
    kind: str = "insert"       # insert | new_file
    anchor: str | None = None  # jinja2 text rendering to a regex
    scope: str | None = None
    where: str = "before"
    indent: int = 0
    when: str | None = None
    claim: tuple | None = None  # (scan key, wiring value name) checked for clashes
    optional: str | None = None  # why a checkout may lack it (then the site is skipped)
    join: str | None = None    # regex: an anchor line it matches closes the block before it
    needs: tuple[str, ...] = ()  # requirements (Surface.requires) the checkout must meet
    runtime: str | None = None   # v1 or v2: only for that runtime's targets; None: both


@dataclass(frozen=True)
class Requirement:
    """Something of the checkout a site's code uses (a field, a function): checked before a
    block that needs it is written, so a checkout without it is "not supported", never a
    tree that does not compile."""
    id: str
    file: str                  # relative to the checkout
    pattern: str               # a regex over the code (whitespace-insensitive: \s+ there)
    what: str                  # what the code needs, for the message
    scope: str | None = None   # regex: only inside the braces after the first line matching it
    if_used: str | None = None  # regex: checked only for a block whose code matches it


@dataclass(frozen=True)
class Surface:
    root: Path                 # the first wiring folder (the project's, when it has one)
    archs: dict                # name -> Arch
    layout: tuple[str, ...]
    marker_begin: str
    marker_end: str
    sites: tuple[Site, ...]
    scan: dict                 # name -> compiled regex
    call: dict
    python: dict
    requires: dict = None      # id -> Requirement
    roots: tuple = ()          # every wiring folder, the project's first: templates are
                               # looked up in that order
    install_stem: str = "{{ kernel }}"   # our installed files' name (jinja2 over kernel)
    marker_read: tuple = ()    # (begin, end) of older marker formats, still recognised

    def stem(self, kernel: str) -> str:
        """The name a kernel's installed files take in the checkout (install_stem)."""
        return self.text(self.install_stem, "install_stem", kernel=kernel)

    def _template_dirs(self) -> tuple[str, ...]:
        return tuple(str(r / TEMPLATE_DIR) for r in (self.roots or (self.root,)))

    def env(self) -> "jinja2.Environment":
        return _env(self._template_dirs())

    def _template_rel(self, template: str) -> str:
        for r in self.roots or (self.root,):
            if (r / TEMPLATE_DIR / template).is_file():
                return f"{r.name}/{TEMPLATE_DIR}/{template}"
        return f"{self.root.name}/{TEMPLATE_DIR}/{template}"

    def text(self, source: str, where: str, **ctx) -> str:
        """Render a short jinja2 string from surface.yaml (a path or an anchor pattern)."""
        import jinja2
        try:
            return _string_template(self._template_dirs(), source).render(**ctx)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"{self.root.name}/{SURFACE_FILE}", None,
                                f"{where}: {source!r}: {exc}") from exc

    def render(self, template: str, ctx: dict) -> str:
        """Render wiring/templates/<template>; errors name the template file and line."""
        import jinja2
        rel = self._template_rel(template)
        try:
            tmpl = self.env().get_template(template)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(rel, exc.lineno, f"syntax error: {exc.message}") from exc
        except jinja2.TemplateNotFound:
            raise TemplateError(rel, None, "template file not found (fix the site's "
                                "`template` in surface.yaml)") from None
        try:
            return tmpl.render(**ctx)
        except jinja2.TemplateError as exc:
            raise TemplateError(rel, _template_line(exc, template), str(exc)) from exc


def _template_line(exc: BaseException, template: str) -> int | None:
    """The template line an error was raised at, from jinja2's rewritten traceback."""
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename and frame.filename.replace("\\", "/").endswith("/" + template):
            line = frame.lineno
    return line


def _cstr(text: str) -> str:
    """A C++ string literal for text."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@lru_cache(maxsize=8)
def _env(template_dirs: tuple[str, ...]) -> "jinja2.Environment":
    import jinja2      # imported on first use: a status or no-op that checks no wiring never does
    env = jinja2.Environment(loader=same_bytes_loader(template_dirs),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.filters["cstr"] = _cstr
    return env


@lru_cache(maxsize=1024)
def _string_template(template_dirs: tuple[str, ...], source: str) -> "jinja2.Template":
    """A surface string compiled once: planning renders the same few hundred times."""
    return _env(template_dirs).from_string(source)


def _need(data: dict, key: str, where: str):
    if key not in data:
        raise SurfaceError(f"{SURFACE_FILE}: {where}: missing key {key!r}")
    return data[key]


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise SurfaceError(f"{path}: cannot read the wiring surface: {exc.strerror}") from None


def _read(path: Path, text: str) -> dict:
    import yaml
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SurfaceError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise SurfaceError(f"{path}: must be a mapping")
    return data


def _merge(base: dict, over: dict, path: Path) -> dict:
    """A project's surface.yaml over the shipped one (see the module docstring)."""
    out = dict(base)
    for key, value in over.items():
        if key == "sites":
            if not isinstance(value, list):
                raise SurfaceError(f"{path}: sites: must be a list of sites")
            sites = list(base.get("sites") or [])
            for i, site in enumerate(value):
                if not isinstance(site, dict) or "id" not in site:
                    raise SurfaceError(f"{path}: sites[{i}]: a site needs an id (the shipped "
                                       "site it replaces, or a new one)")
                at = next((j for j, s in enumerate(sites) if s.get("id") == site["id"]), None)
                if site.get("drop") is True:
                    if at is None:
                        raise SurfaceError(f"{path}: sites[{i}]: drop: no site {site['id']!r} to drop")
                    del sites[at]
                elif at is None:
                    sites.append(site)
                else:
                    sites[at] = site
            out["sites"] = sites
        elif key in _MAPPING_KEYS:
            if not isinstance(value, dict):
                raise SurfaceError(f"{path}: {key}: must be a mapping")
            merged = dict(base.get(key) or {})
            for name, entry in value.items():
                if entry is None:
                    merged.pop(name, None)
                else:
                    merged[name] = entry
            out[key] = merged
        elif key == "version" and value != base.get("version"):
            raise SurfaceError(f"{path}: version {value!r}: the shipped surface is version "
                               f"{base.get('version')!r}")
        else:
            out[key] = value
    return out


def load_surface(wiring_root) -> Surface:
    """Read and check the wiring surface: one wiring folder, or several (the project's
    first, the shipped one last; config.wiring_roots), merged. Raises SurfaceError naming
    the bad entry."""
    roots = (Path(wiring_root),) if isinstance(wiring_root, (str, Path)) else tuple(Path(r) for r in wiring_root)
    with_file = [r for r in roots if (r / SURFACE_FILE).is_file()]
    if not with_file:
        raise SurfaceError(f"{roots[-1] / SURFACE_FILE}: cannot read the wiring surface: no such file")
    return _surface(roots, tuple((r / SURFACE_FILE, _text(r / SURFACE_FILE)) for r in with_file))


@lru_cache(maxsize=8)
def _surface(roots: tuple[Path, ...], files: tuple[tuple[Path, str], ...]) -> Surface:
    """load_surface's parse, once per process for the same files' text: planning a build
    asks for it once per layer of every megakernel (129 parses, 5 of status's 6 s, on this
    repository's catalog). Nothing changes a Surface once made."""
    last, text = files[-1]
    data = _read(last, text)
    for path, text in reversed(files[:-1]):
        data = _merge(data, _read(path, text), path)
    root = roots[0]
    archs = _archs(data)
    sites = _sites(data)
    scan = _scan(data, sites)
    requires = _requires(data, sites)
    marker = _need(data, "marker", "top level")
    return Surface(root=root, roots=roots, archs=archs, layout=tuple(_need(data, "layout", "top level")),
                   marker_begin=_need(marker, "begin", "marker"),
                   marker_end=_need(marker, "end", "marker"),
                   marker_read=tuple((m["begin"], m["end"]) for m in marker.get("read") or ()), sites=tuple(sites), scan=scan,
                   call=_need(data, "call", "top level"), python=_need(data, "python", "top level"),
                   requires=requires, install_stem=str(data.get("install_stem", "{{ kernel }}")))


def _archs(data: dict) -> dict:
    archs = {}
    for name, a in _need(data, "archs", "top level").items():
        try:
            archs[name] = Arch(name=name, dir=a["dir"], tag=a["tag"], title=a["title"],
                               cc=int(a["cc"]), range_begin=a["range_begin"],
                               range_end=a["range_end"],
                               tma_ranges=tuple((int(lo), int(hi)) for lo, hi in a["tma_ranges"]),
                               auto_ranges=tuple((int(lo), int(hi))
                                                 for lo, hi in a.get("auto_ranges", ())),
                               runtime=a.get("runtime", "v1"))
            if archs[name].runtime not in config.RUNTIMES:
                raise ValueError(f"runtime {archs[name].runtime!r} (one of {', '.join(config.RUNTIMES)})")
        except (KeyError, TypeError, ValueError) as exc:
            raise SurfaceError(f"{SURFACE_FILE}: archs.{name}: bad or missing field {exc}") from None
    return archs


def _sites(data: dict) -> list:
    sites, seen = [], set()
    for i, s in enumerate(_need(data, "sites", "top level")):
        where = f"sites[{i}]"
        extra = set(s) - _SITE_KEYS
        if extra:
            raise SurfaceError(f"{SURFACE_FILE}: {where}: unknown keys {sorted(extra)}")
        for key in ("id", "file", "template", "comment"):
            _need(s, key, where)
        if s["id"] in seen:
            raise SurfaceError(f"{SURFACE_FILE}: {where}: duplicate site id {s['id']!r}")
        seen.add(s["id"])
        kind = s.get("kind", "insert")
        if kind not in ("insert", "new_file"):
            raise SurfaceError(f"{SURFACE_FILE}: {where}: kind must be insert or new_file")
        if kind == "insert" and "anchor" not in s:
            raise SurfaceError(f"{SURFACE_FILE}: {where}: an insert site needs an anchor")
        if s.get("where", "before") not in ("before", "after"):
            raise SurfaceError(f"{SURFACE_FILE}: {where}: where must be before or after")
        if s.get("runtime") not in (None, *config.RUNTIMES):
            raise SurfaceError(f"{SURFACE_FILE}: {where}: runtime must be one of {', '.join(config.RUNTIMES)}")
        if s.get("when") not in _WHEN:
            raise SurfaceError(f"{SURFACE_FILE}: {where}: when must be one of "
                               f"{', '.join(sorted(w for w in _WHEN if w))}")
        sites.append(Site(id=s["id"], file=s["file"], template=s["template"],
                          comment=s["comment"], per_arch=bool(s.get("per_arch", True)),
                          kind=kind, anchor=s.get("anchor"), scope=s.get("scope"),
                          where=s.get("where", "before"), indent=int(s.get("indent", 0)),
                          when=s.get("when"), optional=s.get("optional"), join=s.get("join"),
                          needs=tuple(s.get("needs") or ()), runtime=s.get("runtime"),
                          claim=(s["claim"]["scan"], s["claim"]["value"]) if s.get("claim") else None))
    return sites


def _scan(data: dict, sites: list) -> dict:
    """The surface's regexes, compiled; a site's claim names one of them."""
    scan = {}
    for key, pattern in _need(data, "scan", "top level").items():
        try:
            scan[key] = re.compile(pattern, re.M)
        except re.error as exc:
            raise SurfaceError(f"{SURFACE_FILE}: scan.{key}: bad regex {pattern!r}: {exc}") from None
    for site in sites:
        if site.claim and (site.claim[0] not in scan
                           or site.claim[1] not in ("task_type", "task_name", "layer")):
            raise SurfaceError(f"{SURFACE_FILE}: site {site.id}: claim {site.claim} needs a "
                               "scan key and one of task_type, task_name, layer")
    return scan


def _requires(data: dict, sites: list) -> dict:
    """What a checkout must have for a site (`requires`), every site's `needs` among them."""
    requires = {}
    for rid, r in (data.get("requires") or {}).items():
        if not isinstance(r, dict) or set(r) - _REQUIRE_KEYS or not {"file", "pattern", "what"} <= set(r):
            raise SurfaceError(f"{SURFACE_FILE}: requires.{rid}: needs file, pattern and what "
                               f"(and may have scope); got {sorted(r) if isinstance(r, dict) else r!r}")
        for key in ("pattern", "scope", "if_used"):
            if r.get(key) is not None:
                try:
                    re.compile(r[key])
                except re.error as exc:
                    raise SurfaceError(f"{SURFACE_FILE}: requires.{rid}.{key}: bad regex: {exc}") from None
        requires[rid] = Requirement(rid, r["file"], r["pattern"], r["what"], r.get("scope"),
                                    r.get("if_used"))
    for site in sites:
        unknown = [n for n in site.needs if n not in requires]
        if unknown:
            raise SurfaceError(f"{SURFACE_FILE}: site {site.id}: needs {unknown}, which "
                               "`requires` does not define")
        if site.join is not None:
            try:
                re.compile(site.join)
            except re.error as exc:
                raise SurfaceError(f"{SURFACE_FILE}: site {site.id}: join: bad regex: {exc}") from None
    return requires

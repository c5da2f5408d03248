"""Rendering a kernel's wiring into marked blocks and build-folder fragments.

Owns the template context (one flat dict per site and arch, built from a resolved
:class:`Wiring`), the `when` rules (a tma.cuh case only for numbers inside a TMA range, a
task_offset line only for tile-indexed tasks), block keys and target paths, and the pure
:func:`render` used for build/<K>/wiring/. Rendering reads no checkout: "auto" numbers stay
unnumbered here and are filled in by :mod:`.patch` once the checkout's enum is known.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from .markers import Markers, block_key, indent_body
from .section import Wiring, resolve
from .surface import Site, Surface, load_surface


@dataclass(frozen=True)
class RenderedBlock:
    key: str
    site: Site
    arch: str | None
    file: str            # path relative to the MPK checkout
    body: str            # indented body lines (the site's default indent: the fragment)
    text: str            # body wrapped in its marker lines
    raw: str = ""        # the template's output, unindented (placed in a checkout at its indent)
    raw_joined: str | None = None   # the same when the anchor line closes it (site.join)
    port: str | None = None  # the layer a port site's scope names (wiring.port)

    @property
    def fragment_name(self) -> str:
        suffix = PurePosixPath(self.file).suffix
        return f"{self.site.id}.{self.arch}{suffix}" if self.arch else f"{self.site.id}{suffix}"


def site_file(surface: Surface, site: Site, arch: str | None, kernel: str) -> str:
    ctx = {"kernel": kernel, "stem": surface.stem(kernel),
           "arch": surface.archs[arch].as_dict() if arch else {}}
    return surface.text(site.file, f"site {site.id} file", **ctx)


def context(w: Wiring, surface: Surface, arch: str | None, numbers: dict,
            sources: dict | None = None, joined: bool = False) -> dict:
    """Everything a template may use; StrictUndefined makes any other name an error.
    `joined`: the block goes before an anchor line that also closes it (`} else {`)."""
    sources = sources or {}
    ctx = {
        "joined": joined,
        "body_source": sources.get("body", "// (body not rendered: no task sources given)\n"),
        "spec_header_source": sources.get("spec_header",
                                          "// (spec header not rendered: no task sources given)\n"),
        "kernel": w.kernel, "stem": surface.stem(w.kernel), "op": w.op, "layer": w.layer,
        "num_inputs": w.num_inputs, "num_outputs": w.num_outputs,
        "tensors": [dict(t) for t in w.tensors], "params": [dict(p) for p in w.params],
        "dims": list(w.dims), "call_lines": list(w.call_lines),
        "tile_indexed": w.tile_indexed, "maps": [dict(m) for m in w.maps],
        "test": dict(w.test), "runtime": w.runtime,
        "task_metadata": list(w.task_metadata),
        "archs": [{**surface.archs[a].as_dict(), "task_type": w.task_type[a],
                   "task_name": w.task_name[a], "number": numbers.get(a)} for a in w.archs],
    }
    if arch:
        ctx.update(arch=surface.archs[arch].as_dict(), task_type=w.task_type[arch],
                   task_name=w.task_name[arch], register_fn=w.register_fn(arch),
                   number=numbers.get(arch))
    return ctx


def applies(site: Site, w: Wiring) -> bool:
    """Whether the site is one of this kernel's, as far as the wiring alone says (a tma.cuh
    case also waits for its number: _wanted)."""
    if site.runtime is not None and site.runtime != w.runtime:
        return False
    if site.when == "tile_indexed":
        return w.tile_indexed
    if site.when == "task_metadata":
        return w.tile_indexed or bool(w.task_metadata)
    if site.when == "no_runtime_state":
        return not w.runtime_inputs
    if site.when == "own_layer":
        return not w.ports_layer
    if site.when == "port":
        return w.ports_layer
    return True


def _wanted(site: Site, w: Wiring, surface: Surface, arch: str | None, numbers: dict) -> bool:
    if not applies(site, w):
        return False
    if site.when == "tma":              # a kernel that loads with TMA is numbered in a TMA range
        n = numbers.get(arch)
        return bool(w.maps) or (isinstance(n, int) and surface.archs[arch].in_tma(n))
    return True


def render_blocks(w: Wiring, surface: Surface, numbers: dict | None = None,
                  sources: dict | None = None) -> list[RenderedBlock]:
    """The kernel's blocks in surface order (sites, then archs in spec order)."""
    numbers = {a: n for a, n in (numbers or {}).items() if isinstance(n, int)}
    markers = Markers(surface.marker_begin, surface.marker_end, surface.marker_read)
    out = []
    for site in surface.sites:
        for arch in (w.archs if site.per_arch else (None,)):
            if not _wanted(site, w, surface, arch, numbers):
                continue
            indent = 0 if site.kind == "new_file" else site.indent
            raw = surface.render(site.template, context(w, surface, arch, numbers, sources))
            joined = surface.render(site.template, context(w, surface, arch, numbers, sources, True)) \
                if site.join else None
            body = indent_body(raw, indent)
            key = block_key(w.kernel, arch, site.id)
            out.append(RenderedBlock(key=key, site=site, arch=arch,
                                     file=site_file(surface, site, arch, w.kernel), body=body,
                                     text=markers.make(key, body, indent, site.comment),
                                     raw=raw, raw_joined=joined, port=w.port))
    return out


def render(spec: dict, wiring_root, numbers: dict | None = None,
           sources: dict | None = None, runtime: str = "v1") -> dict[str, str]:
    """Fragments by file name (`enum.sm_90a.h`, `layer.py`, ...): pure and deterministic.

    `numbers` ({arch: int}) fills "auto" TaskType numbers; without it an auto entry renders
    with a placeholder comment and no tma.cuh case (the number decides whether one is due),
    except for a kernel that loads with TMA, whose number is always in a TMA range.
    """
    surface = load_surface(wiring_root)
    w = resolve(spec, surface, runtime)
    fixed = {a: n for a, n in w.number.items() if isinstance(n, int)}
    fixed.update(numbers or {})
    return {b.fragment_name: b.body for b in render_blocks(w, surface, fixed, sources)}

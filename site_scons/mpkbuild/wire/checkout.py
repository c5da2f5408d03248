"""Reading an MPK checkout: layout check, file text, marked blocks, anchors, the enum.

Owns everything that looks at an `mpk_root` without changing it: refusing a folder that is
not a checkout of the expected layout (:class:`NotACheckout`), reading target files (as
text with their line endings kept), finding marked blocks, locating a site's anchor line
(scope + regex, ignoring lines inside marked blocks; :class:`AnchorNotFound` and
:class:`AnchorAmbiguous` name file and pattern), and listing the `enum TaskType` entries
with the kernel that owns each one (None when not wired by mpkbuild).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .errors import AnchorAmbiguous, AnchorNotFound, NotACheckout, SurfaceError, TargetMissing
from .markers import Block, Markers, split_key
from .surface import Site, Surface


@dataclass(frozen=True)
class EnumEntry:
    name: str
    number: int
    line: int              # 1-based
    owner: str | None      # kernel whose marked block holds it, or None
    arch: str | None = None  # the arch of that block


class Checkout:
    """A read-only view of one MPK checkout; file reads are cached.

    `overlay` ({path: text or None}) makes it a view of a would-be checkout: those paths
    read as the given text (None: absent), so a plan's result can be checked unwritten."""

    def __init__(self, root: Path | str, surface: Surface, overlay: dict | None = None):
        self.root = Path(root)
        self.surface = surface
        self.markers = Markers(surface.marker_begin, surface.marker_end, surface.marker_read)
        self._text: dict[str, str | None] = dict(overlay or {})
        if not self.root.is_dir():
            raise NotACheckout(f"mpk_root {self.root}: not a folder; pass the root of a "
                               "mirage checkout (the folder holding include/ and src/)")
        missing = [p for p in surface.layout if not (self.root / p).is_file()]
        if missing:
            raise NotACheckout(f"mpk_root {self.root} is not an MPK checkout of the expected "
                               f"layout: missing {', '.join(missing)} (check the path, or the "
                               "`layout` list in wiring/surface.yaml if the runtime moved)")

    def path(self, rel: str) -> Path:
        return self.root / rel

    def text(self, rel: str) -> str | None:
        if rel not in self._text:
            p = self.path(rel)
            self._text[rel] = p.read_bytes().decode("utf-8") if p.is_file() else None
        return self._text[rel]

    def need_text(self, rel: str, why: str) -> str:
        text = self.text(rel)
        if text is None:
            raise TargetMissing(self.older_layout(rel) or
                                f"{rel}: file missing in mpk_root {self.root} ({why}); the "
                                "checkout is incomplete or the runtime moved it (then update "
                                "wiring/surface.yaml)")
        return text

    def older_layout(self, rel: str) -> str | None:
        """Where a file the surface expects sits one folder up (python/mirage/persistent_kernel.py
        for python/mirage/mpk/persistent_kernel.py): an older layout of the tree, said as such."""
        p = Path(rel)
        if len(p.parts) < 3 or not (self.root / p.parent.parent / p.name).is_file():
            return None
        return (f"mpk_root {self.root}: not supported: {p.name} at {p.parent.parent.as_posix()}/, "
                f"expected {p.parent.as_posix()}/ (an older layout of the tree; wire a checkout "
                "of the layout wiring/surface.yaml describes, or extend the surface in the "
                "project's wiring/)")

    def blocks(self, rel: str) -> list[Block]:
        text = self.text(rel)
        return [] if text is None else self.markers.find(text.splitlines(keepends=True), rel)

    def site(self, site_id: str) -> Site:
        for s in self.surface.sites:
            if s.id == site_id:
                return s
        raise SurfaceError(f"surface.yaml: no site with id {site_id!r} (the wire stage needs it)")

    def visible_lines(self, rel: str, hide_kernels=None) -> list[tuple[int, str]]:
        """(1-based line, text) of lines outside marked blocks of hide_kernels (all if None)."""
        text = self.text(rel) or ""
        lines = text.splitlines(keepends=True)
        hidden = set()
        for b in self.markers.find(lines, rel):
            if hide_kernels is None or b.kernel in hide_kernels:
                hidden.update(range(b.start, b.end + 1))
        return [(i + 1, ln) for i, ln in enumerate(lines) if i not in hidden]

    def enum_entries(self) -> list[EnumEntry]:
        rel = site_file_plain(self.surface, self.site("enum"))
        text = self.need_text(rel, "it holds enum TaskType")
        lines = text.splitlines(keepends=True)
        owner = {}
        for b in self.markers.find(lines, rel):
            for i in range(b.start, b.end + 1):
                owner[i] = split_key(b.key)[:2]
        scope = self.surface.scan["enum_scope"]
        start = next((i for i, ln in enumerate(lines) if scope.search(ln)), None)
        if start is None:
            raise AnchorNotFound(f"{rel}: no line matching {scope.pattern!r} (enum TaskType); "
                                 "update scan.enum_scope in wiring/surface.yaml")
        out = []
        for i in range(start, len(lines)):
            if i > start and re.match(r"^\s*\};", lines[i]):
                break
            m = self.surface.scan["enum_entry"].search(lines[i])
            if m:
                k, a = owner.get(i, (None, None))
                out.append(EnumEntry(m.group(1), int(m.group(2)), i + 1, k, a))
        return out

    def find_anchor(self, rel: str, lines: list[str], site: Site, anchor: str, scope: str | None) -> int:
        """Index of the anchor line in lines (outside every marked block). Anchors and scopes
        match the line as normalised_line has it: not one layout's whitespace."""
        blocks = self.markers.find(lines, rel)
        hidden = {i for b in blocks for i in range(b.start, b.end + 1)}
        lines = [normalised_line(ln, rel) for ln in lines]
        first = 0
        if scope:
            sc = re.compile(scope)
            first = next((i for i, ln in enumerate(lines) if i not in hidden and sc.search(ln)), None)
            if first is None:
                raise AnchorNotFound(f"{rel}: site {site.id} is not supported on this checkout: no "
                                     f"line matches its scope {scope!r}. The runtime's layout "
                                     "changed? Update the site in wiring/surface.yaml")
        end = len(lines)
        if scope and rel.endswith(".py"):     # a Python scope is its def's indented body
            depth = len(lines[first]) - len(lines[first].lstrip())
            head, parens = first, 0
            for head in range(first, len(lines)):  # the header ends where its brackets close
                parens += sum(lines[head].count(c) for c in "([{") - sum(lines[head].count(c) for c in ")]}")
                if parens <= 0 and lines[head].rstrip().endswith(":"):
                    break
            end = next((i for i in range(head + 1, len(lines)) if lines[i].strip()
                        and len(lines[i]) - len(lines[i].lstrip()) <= depth), len(lines))
        rx = re.compile(anchor)
        hits = [i for i in range(first, end) if i not in hidden and rx.search(lines[i])]
        if not hits:
            where = f" after the line matching {scope!r}" if scope else ""
            raise AnchorNotFound(f"{rel}: site {site.id} is not supported on this checkout: no "
                                 f"line matches its anchor {anchor!r}{where}. The runtime's "
                                 "layout changed? Update the site in wiring/surface.yaml")
        if len(hits) > 1 and not scope:
            raise AnchorAmbiguous(f"{rel}: anchor for site {site.id} matches lines "
                                  f"{', '.join(str(h + 1) for h in hits)} ({anchor!r}); tighten "
                                  "it or add a scope in wiring/surface.yaml")
        return hits[0]


    def meets(self, req) -> bool:
        """Whether the checkout has what a Requirement names (whitespace-insensitive; with a
        scope, inside the braces that follow the scope's first line)."""
        text = self.text(req.file)
        if text is None:
            return False
        if req.scope:
            m = re.search(req.scope, text, re.M)
            if m is None:
                return False
            text = braced(text, m.end())
        return re.search(req.pattern, text, re.M) is not None


def normalised_line(line: str, rel: str) -> str:
    """A line as anchors see it: runs of whitespace are one space, and a C++ line's indent
    is one space or none (whether it is indented at all is structure, a top-level
    definition; how far is clang-format's choice); a Python line keeps its indent, which is
    structure."""
    body = " ".join(line.split())
    lead = line[:len(line) - len(line.lstrip())]
    if rel.endswith(".py"):
        return lead.expandtabs(8) + body
    return (" " if lead.strip("\r\n") else "") + body


def braced(text: str, start: int) -> str:
    """The text from the first "{" at or after start to its matching "}" (to the end when
    unbalanced)."""
    i = text.find("{", start)
    if i < 0:
        return ""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j + 1]
    return text[i:]


def indent_of(line: str) -> int:
    """The width of a line's leading spaces (a tab counts as 8, as clang-format's TabWidth)."""
    expanded = line.expandtabs(8)
    return len(expanded) - len(expanded.lstrip(" "))


def site_file_plain(surface: Surface, site: Site) -> str:
    """A site's file when it depends on neither arch nor kernel (the enum header)."""
    return surface.text(site.file, f"site {site.id} file", arch={}, kernel="")

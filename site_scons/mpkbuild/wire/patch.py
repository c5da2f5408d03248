"""Plans and applies marked-block edits to an MPK checkout; unwires them again.

Owns :class:`Plan` (the new text of every file that would change, the TaskType numbers,
the numbered fragments, and :meth:`Plan.diff`), :func:`plan` (read-only: resolve all specs,
check names and numbers across them, render the planned kernels' blocks, replace existing
blocks in place, insert new ones at their anchors, drop blocks the spec no longer wants),
:func:`apply` (refuses if a file changed since planning, then commits all files through
:mod:`.fsio`) and :func:`plan_unwire`/:func:`unwire`. A block whose text no longer matches
the sha in its begin marker was edited by hand: :class:`DriftError` with the diff, and no
file is written.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path

import os
import re

from .checkout import Checkout, indent_of, normalised_line
from .coherence import problems_of
from ..util.config import V2_MARKER
from .errors import (AnchorNotFound, DriftError, Incoherent, NameClash, StalePlan,
                     TargetMissing, Unsupported, WireError)
from .fsio import commit
from .markers import Block, comment_style, indent_body, same_code, split_key
from .numbering import assign_numbers, check_names
from .ports import check_ports
from .blocks import RenderedBlock, render_blocks, site_file
from .section import resolve
from .style import restyle
from .surface import load_surface


# sites whose text is the kernel's generated body or spec header (need `sources`)
_SOURCE_SITES = ("body", "spec_header")


@dataclass(frozen=True)
class FileChange:
    path: str                 # relative to mpk_root
    old: str | None           # None: the file does not exist yet
    new: str | None           # None: the file is deleted


@dataclass
class Plan:
    mpk_root: Path
    kernels: tuple[str, ...]
    numbers: dict = field(default_factory=dict)      # kernel -> {arch: number}
    changes: dict = field(default_factory=dict)      # path -> FileChange (changed files only)
    fragments: dict = field(default_factory=dict)    # kernel -> {fragment name: text}
    notes: list = field(default_factory=list)        # sites skipped, upstream incoherence
    problems: list = field(default_factory=list)     # incoherence the plan itself would add
    files: dict = field(default_factory=dict)        # kernel -> changed paths holding (or that held) its blocks

    @property
    def new_contents(self) -> dict[str, str | None]:
        return {p: c.new for p, c in sorted(self.changes.items())}

    @property
    def empty(self) -> bool:
        return not self.changes

    def diff(self) -> str:
        """Unified diff of every change, files in path order ('' when nothing changes)."""
        return "".join(_udiff(c.old, c.new, c.path) for _, c in sorted(self.changes.items()))


def _udiff(old: str | None, new: str | None, rel: str, a: str = "a/", b: str = "b/") -> str:
    return "".join(difflib.unified_diff(
        (old or "").splitlines(keepends=True), (new or "").splitlines(keepends=True),
        fromfile=f"{a}{rel}" if old is not None else "/dev/null",
        tofile=f"{b}{rel}" if new is not None else "/dev/null"))


def _candidate_files(co: Checkout, kernels) -> set[str]:
    """Every file a block of these kernels could be in (all archs, all sites)."""
    out = set()
    for site in co.surface.sites:
        for arch in (co.surface.archs if site.per_arch else (None,)):
            for k in kernels:
                out.add(site_file(co.surface, site, arch, k))
    return out


class _Editor:
    """Edits one file's text in memory; collects drift instead of raising at once."""

    def __init__(self, co: Checkout, rel: str, kernels: set[str], drift: list, notes: list):
        self.co, self.rel, self.kernels, self.drift, self.notes = co, rel, kernels, drift, notes
        self.old = co.text(rel)

    def _unsupported(self, rb: RenderedBlock, what: str) -> None:
        self.notes.append(f"{self.rel}: site {rb.site.id} of {rb.key} is not supported on this "
                          f"checkout ({what}; {rb.site.optional}): skipped")

    def _drifted(self, block: Block, new_body: str | None) -> bool:
        # any text that no longer matches the marker's sha is a hand edit, even when it
        # happens to equal the new render (auto numbering would otherwise adopt a
        # hand-edited number as the kernel's own)
        if not block.drifted:
            return False
        shown = _udiff(block.body, new_body or "", self.rel, "current/", "rendered/") or (
            "the hand-edited text (it equals the new render, but the marker's sha does not "
            "vouch for it):\n" + "".join(f"  {line}" for line in block.body.splitlines(keepends=True)))
        self.drift.append(
            f"{self.rel}:{block.start + 1}: block {block.key} was edited by hand (its text no "
            f"longer matches sha={block.sha})\n" + shown)
        return True

    def edit(self, wanted: list[RenderedBlock]) -> str | None:
        if any(b.site.kind == "new_file" for b in wanted) or self._is_own_file():
            folder = os.path.dirname(self.rel)
            if self.old is None and wanted and not self.co.path(folder).is_dir():
                if wanted[0].site.optional:
                    self._unsupported(wanted[0], f"folder {folder}/ is missing")
                    return None
                raise TargetMissing(f"{folder}/: folder missing in mpk_root {self.co.root} "
                                    f"({self.rel} of {wanted[0].key} goes there); this checkout "
                                    "does not support that site, or update wiring/surface.yaml")
            return self._new_file(wanted)
        if self.old is None and wanted and all(b.site.optional for b in wanted):
            for rb in wanted:
                self._unsupported(rb, "file missing")
            return None
        if self.old is None:
            if wanted:
                raise TargetMissing(self.co.older_layout(self.rel) or
                                    f"{self.rel}: file missing in mpk_root {self.co.root} (site "
                                    f"{wanted[0].site.id} of {wanted[0].key} goes there); the "
                                    "checkout is incomplete, or update wiring/surface.yaml")
            return None
        lines = self.old.splitlines(keepends=True)
        keys = {b.key for b in wanted}
        find = self.co.markers.find
        stale = [b for b in find(lines, self.rel) if b.kernel in self.kernels and b.key not in keys]
        for b in sorted(stale, key=lambda b: -b.start):
            if not self._drifted(b, None):
                del lines[b.start:b.end + 1]
        for rb in wanted:
            if not self._supported(rb):
                continue
            current = {b.key: b for b in find(lines, self.rel)}
            ctx = {"arch": self.co.surface.archs[rb.arch].as_dict() if rb.arch else {},
                   "kernel": split_key(rb.key)[0], "port": rb.port}
            anchor = self.co.surface.text(rb.site.anchor, f"site {rb.site.id} anchor", **ctx)
            scope = self.co.surface.text(rb.site.scope, f"site {rb.site.id} scope", **ctx) \
                if rb.site.scope else None
            try:
                i = self.co.find_anchor(self.rel, lines, rb.site, anchor, scope)
            except AnchorNotFound as exc:
                if rb.key in current:           # ours already: keep its place and indent
                    b = current[rb.key]
                    self._replace(lines, b, rb, _placed(self.co, rb, indent_of(lines[b.start]),
                                                        indent_of(lines[b.start]), False))
                    continue
                if not rb.site.optional:
                    raise
                self._unsupported(rb, str(exc).split(": ", 1)[-1].split(". ")[0])
                continue
            if rb.site.where == "after" and not lines[i].endswith("\n"):
                raise WireError(f"{self.rel}:{i + 1}: anchor line for site {rb.site.id} is "
                                "the last line and has no newline; add one, then re-run")
            new = self._place(lines, i, rb, current.get(rb.key))
            if rb.key in current:
                self._replace(lines, current[rb.key], rb, new)
                continue
            at = i + 1 if rb.site.where == "after" else i
            lines[at:at] = new[1].splitlines(keepends=True)
        return "".join(lines)

    def _supported(self, rb: RenderedBlock) -> bool:
        """Whether the checkout has what the block's code uses (Surface.requires): a block
        whose site is optional is skipped with a note, any other refuses the plan."""
        for rid in rb.site.needs:
            req = self.co.surface.requires[rid]
            if req.if_used and not re.search(req.if_used, rb.raw):
                continue
            if self.co.meets(req):
                continue
            if rb.site.optional:
                self._unsupported(rb, req.what)
                return False
            raise Unsupported(f"{self.rel}: site {rb.site.id} of {rb.key} is not supported on this "
                              f"checkout: {req.what} (looked for in {req.file}); nothing was written")
        return True

    def _place(self, lines: list[str], i: int, rb: RenderedBlock,
               existing: Block | None) -> tuple[str, str]:
        """The block as it goes in at anchor line i: at the indent of the code around it
        (before: the anchor's; after: the next code line's), joined to an anchor line that
        also closes it (site.join: `} else {`), its markers where clang-format puts them."""
        anchor = lines[i]
        joined = bool(rb.site.join and rb.raw_joined is not None
                      and re.search(rb.site.join, normalised_line(anchor, self.rel)))
        if rb.site.where == "after":
            nxt = next((ln for ln in lines[i + 1:] if ln.strip() and not self.co.markers.is_marker(ln)), None)
            base = indent_of(nxt) if nxt is not None and not nxt.lstrip().startswith(("}", ")", "]")) \
                else indent_of(anchor)
            return _placed(self.co, rb, base, base, False)
        base = indent_of(anchor)
        if not joined:
            return _placed(self.co, rb, base, base, False)
        # the markers sit inside the branch the block closes: at its inner indent
        prev_i = (existing.start if existing is not None else i) - 1
        prev = next((lines[j] for j in range(prev_i, -1, -1) if lines[j].strip()), None)
        inner = indent_of(prev) if prev is not None and indent_of(prev) > base else base + 2
        return _placed(self.co, rb, base, inner, True)

    def _replace(self, lines: list[str], b: Block, rb: RenderedBlock, new: tuple[str, str]) -> None:
        """An existing block of ours: left as it is when its code is the new code (however
        the tree's owner formatted it), replaced when the code changed, refused when it was
        edited by hand. new: (body, text) as _placed gives it."""
        body, text = new
        if self._drifted(b, body):
            return
        if same_code(b.body, body, comment_style(self.rel)):
            return
        lines[b.start:b.end + 1] = text.splitlines(keepends=True)

    def _is_own_file(self) -> bool:
        """True when the whole file is one block of a planned kernel (a new_file site)."""
        if self.old is None:
            return False
        lines = self.old.splitlines(keepends=True)
        blocks = self.co.markers.find(lines, self.rel)
        return (len(blocks) == 1 and blocks[0].start == 0 and blocks[0].end == len(lines) - 1
                and blocks[0].kernel in self.kernels)

    def _new_file(self, wanted: list[RenderedBlock]) -> str | None:
        rb = wanted[0] if wanted else None
        if self.old is None:
            return rb.text if rb else None
        if not self._is_own_file():
            raise NameClash(f"{rb.key.split('/')[0]}: {self.rel}: already exists and was not "
                            "written by mpkbuild: it is "
                            f"the checkout's own{_what_it_holds(self.old)}, and {rb.key} wants "
                            "that path; the file is named after the kernel, so rename the kernel "
                            "(or move the checkout's file away)")
        b = self.co.markers.find(self.old.splitlines(keepends=True), self.rel)[0]
        if self._drifted(b, rb.body if rb else None):
            return self.old
        if rb and same_code(b.body, rb.body, comment_style(self.rel)):
            return self.old            # its code is the new code (its markers may be older)
        return rb.text if rb else None


def _placed(co: Checkout, rb: RenderedBlock, base: int, marker_indent: int,
            joined: bool) -> tuple[str, str]:
    """A rendered block at an indent, (body, text): its body at `base`, its markers at
    `marker_indent`."""
    body = indent_body(rb.raw_joined if joined else rb.raw, base)
    return body, co.markers.make(rb.key, body, marker_indent, rb.site.comment)


def _build(co: Checkout, kernels: list[str], blocks: list[RenderedBlock],
           notes: list | None = None, clashes: list | None = None) -> dict[str, FileChange]:
    """Every file's new text; refuses (NameClash) with every clash of the run, the names
    check_names found and the files taken, each under its kernel."""
    by_file: dict[str, list[RenderedBlock]] = {}
    for b in blocks:
        by_file.setdefault(b.file, []).append(b)
    drift: list[str] = []
    notes = [] if notes is None else notes
    clashes = [] if clashes is None else clashes
    changes = {}
    for rel in sorted(set(by_file) | _candidate_files(co, kernels)):
        ed = _Editor(co, rel, set(kernels), drift, notes)
        try:
            new = ed.edit(by_file.get(rel, []))
        except NameClash as exc:
            clashes.append(str(exc))
            continue
        if new != ed.old:
            changes[rel] = FileChange(rel, ed.old, new)
    if clashes:
        raise NameClash(clashes[0] if len(clashes) == 1 else
                        f"{len(clashes)} clashes with the checkout or between kernels, each under "
                        "its kernel:\n  " + "\n  ".join(clashes))
    if drift:
        raise DriftError(f"refusing to touch {co.root}: {len(drift)} marked block(s) were "
                         "edited by hand. Move the change into the spec or wiring/templates, or "
                         "delete the block (both marker lines too) to let apply re-create it. "
                         "Nothing was changed.", "\n".join(drift))
    return changes


def _judge(co: Checkout, p: Plan) -> Plan:
    """Check coherence on the would-be result before anything is written.

    A problem the untouched checkout already has is upstream's: a note. One that only the
    result has is this plan's: ``p.problems``, and :func:`apply` refuses the plan."""
    after = Checkout(co.root, co.surface, overlay=p.new_contents)
    held = {rel: {b.kernel for side in (co, after) for b in side.blocks(rel)} for rel in p.changes}
    p.files = {k: sorted(rel for rel, kernels in held.items() if k in kernels) for k in p.kernels}
    before = problems_of(co)
    old = {_unplaced(x) for x in before}
    p.problems = [x for x in problems_of(after) if _unplaced(x) not in old]
    if before:
        p.notes.append(f"{len(before)} coherence problem(s) already upstream (not ours):\n  "
                       + "\n  ".join(before))
    return p


_NAMESPACE = re.compile(r"^\s*namespace\s+(\w+)\s*\{", re.M)


def _what_it_holds(text: str) -> str:
    """' file (namespace kernel::rmsnorm_v2)': which upstream code a clashing file is."""
    names = _NAMESPACE.findall(text or "")
    inner = [n for n in names if n != "kernel"]
    if not names:
        return " file"
    return f" file (namespace {'kernel::' if 'kernel' in names and inner else ''}{(inner or names)[0]})"


def _unplaced(problem: str) -> str:
    """A problem without its line numbers (inserting blocks moves them)."""
    return re.sub(r":\d+:", ":", problem)


def plan(mpk_root, specs: list[dict], wiring_root, kernels: list[str],
         sources: dict | None = None, renumber: bool = False, runtime: str = "v1") -> Plan:
    """What applying these kernels' wiring would change; reads, never writes.

    `specs` are ALL kernels' normalized specs (names and explicit numbers of the others
    are reserved); `kernels` are the ones to wire. `sources` maps a kernel to its rendered
    body and spec header ({"body": ..., "spec_header": ...}, see mpkbuild.stages.wire.task_sources);
    a kernel without them gets its registration edits only, and a note saying so.
    `renumber`: an already-wired "auto" kernel whose number was taken since moves to the
    next free one (otherwise that is a NumberClash naming both entries).
    `runtime`: v1 wires each kernel for its archs; v2 for the Runtime-V2 target (the
    checkout must have it: runtime_v2.cuh).
    """
    surface = load_surface(wiring_root)
    co = Checkout(mpk_root, surface)
    wirings = {}
    for spec in specs:
        k = spec.get("kernel")
        if k in wirings:
            raise NameClash(f"two specs name kernel {k!r}; kernel names must be unique")
        wirings[k] = resolve(spec, surface, runtime)
    missing = [k for k in kernels if k not in wirings]
    if missing:
        raise WireError(f"no spec for kernel(s) {', '.join(missing)} among "
                        f"{', '.join(sorted(wirings)) or 'none'}")
    kernels = sorted(set(kernels))
    for k in kernels:
        if runtime != "v1" and wirings[k].maps:
            raise Unsupported(f"{k} loads {', '.join(m['tensor'] for m in wirings[k].maps)} with TMA: "
                              "the Runtime-V2 wiring makes no tensor maps yet; wire it for v1 "
                              "(without runtime=). Nothing was changed")
    if runtime == "v2" and not co.path(V2_MARKER).is_file():
        raise TargetMissing(f"{V2_MARKER}: missing in mpk_root "
                            f"{co.root}: runtime=v2 wires into Runtime-V2, which this checkout "
                            "does not have (wire it without runtime=, for v1)")
    clashes = check_names(co, wirings, kernels)
    unported = check_ports(co, wirings, kernels)     # their port blocks have no place to go
    clashes += [m for k in sorted(unported) for m in unported[k]]
    # the surface has a site (the test-mode test) a kernel reading runtime state goes without
    stateless = any(s.when == "no_runtime_state" and s.runtime in (None, runtime) for s in surface.sites)
    numbers = assign_numbers(co, wirings, kernels, renumber)
    blocks, fragments, notes = [], {}, []
    for k in kernels:
        src = (sources or {}).get(k)
        kb = render_blocks(wirings[k], surface, numbers[k], src)
        if k in unported:
            kb = [b for b in kb if b.site.when != "port"]
        if wirings[k].runtime_inputs and stateless:
            notes.append(f"{k}: no test-mode test (it reads runtime state, "
                         f"{', '.join(n for n, _ in wirings[k].runtime_inputs)}, which that "
                         "test cannot feed; the runtime gate runs it inside the persistent kernel)")
        if src is None:
            kb = [b for b in kb if b.site.id not in _SOURCE_SITES]
            notes.append(f"{k}: no task sources given to plan(): its body and spec header "
                         "are not installed (the wire stage always gives them)")
        blocks += kb
        fragments[k] = {b.fragment_name: b.body for b in kb}
    changes = _build(co, kernels, blocks, notes, clashes)
    changes = restyle(co, changes, set(kernels), notes)      # in the tree's own clang-format style
    return _judge(co, Plan(Path(mpk_root), tuple(kernels), numbers, changes, fragments, notes))


def plan_unwire(mpk_root, kernels: list[str], wiring_root) -> Plan:
    """What removing every block of these kernels would change; reads, never writes."""
    co = Checkout(mpk_root, load_surface(wiring_root))
    kernels = sorted(set(kernels))
    return _judge(co, Plan(Path(mpk_root), tuple(kernels), {}, _build(co, kernels, []), {}))


def wired_kernels(mpk_root, wiring_root) -> set[str]:
    """The kernels with marked blocks in the checkout, read from the files every wired kernel
    has a block in (the enum, the register and dispatch files, not a kernel's own files):
    how a kernel that no spec names any more (renamed, removed) is still found to unwire."""
    co = Checkout(mpk_root, load_surface(wiring_root))
    shared = {site_file(co.surface, site, arch, "") for site in co.surface.sites if site.kind != "new_file"
              for arch in (co.surface.archs if site.per_arch else (None,))}
    return {b.kernel for rel in shared for b in co.blocks(rel)}


def apply(plan: Plan, what: str = "apply") -> list[str]:
    """Write the plan's files (all or nothing, journaled: fsio.commit); returns the changed
    paths. what: the run, as the journal names it."""
    root = Path(plan.mpk_root)
    if plan.problems:
        raise Incoherent(f"refusing to write {root}: the result would be incoherent "
                         f"({len(plan.problems)} problem(s) the checkout does not have now):\n  "
                         + "\n  ".join(plan.problems) + "\nNothing was changed")
    for rel, c in plan.changes.items():
        p = root / rel
        now = p.read_bytes().decode("utf-8") if p.is_file() else None
        if now != c.old:
            raise StalePlan(f"{rel}: changed since the plan was made; plan again. Nothing "
                            "was changed")
    commit(root, {r: c.new for r, c in plan.changes.items() if c.new is not None},
           [r for r, c in plan.changes.items() if c.new is None],
           what=f"{what} {','.join(plan.kernels)}")
    return sorted(plan.changes)


def unwire(mpk_root, kernels: list[str], wiring_root) -> Plan:
    """Remove every marked block of these kernels; each file returns to its unwired bytes."""
    p = plan_unwire(mpk_root, kernels, wiring_root)
    apply(p, "unwire")
    return p


def gate_tma_text(mpk_root, kernels: list[tuple[dict, str]], wiring_root, declaration: str) -> str:
    """The checkout's tma.cuh as the runtime gate compiles it for kernels that load with
    TMA, `kernels` as (spec, label): their own blocks (a wired checkout's, under the wired
    task types) left out, `declaration` (the gate's task types, named by the labels) before
    the fill function, and the wire stage's two cases of each kernel, rendered as `apply`
    renders them, under its label, before each switch's default, in order. Reads the
    checkout, writes nothing."""
    surface = load_surface(wiring_root)
    co = Checkout(mpk_root, surface)
    sites = [s for s in surface.sites if s.when == "tma"]
    resolved = []
    for spec, label in kernels:
        w = resolve(spec, surface)
        arch = next((a for a in w.archs if surface.archs[a].cc == 90), None)
        if arch is None:
            raise WireError(f"{w.kernel}: no sm_90 target among its archs {list(w.archs)}; the "
                            "runtime gate runs sm_90a")
        resolved.append((w, arch, label))
    rel = site_file(surface, sites[0], resolved[0][1], resolved[0][0].kernel)
    lines = co.need_text(rel, "the TMA switch").splitlines(keepends=True)
    ours = {w.kernel for w, _, _ in resolved}
    for b in sorted(co.markers.find(lines, rel), key=lambda b: -b.start):
        if b.kernel in ours:
            del lines[b.start:b.end + 1]
    first = None
    for w, arch, label in resolved:
        blocks = {b.site.id: b for b in render_blocks(w, surface) if b.arch == arch and b.site.when == "tma"}
        for site in sites:
            ctx = {"arch": surface.archs[arch].as_dict(), "kernel": w.kernel, "port": None}
            scope = surface.text(site.scope, f"site {site.id} scope", **ctx)
            i = co.find_anchor(rel, lines, site, surface.text(site.anchor, f"site {site.id} anchor", **ctx), scope)
            raw = blocks[site.id].raw.replace(w.task_type[arch], label)
            lines[i:i] = indent_body(raw, indent_of(lines[i])).splitlines(keepends=True)
            head = next(j for j in range(len(lines)) if re.search(scope, normalised_line(lines[j], rel)))
            first = head if first is None else min(first, head)
    lines[first:first] = declaration.splitlines(keepends=True)
    return "".join(lines)

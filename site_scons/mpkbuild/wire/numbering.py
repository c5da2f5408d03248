"""TaskType numbers and name claims: uniqueness across the checkout and across specs.

Owns :func:`check_names` (a task type, task name, register function or layer that another
kernel's spec or an existing checkout entry already uses is a :class:`NameClash` naming
both claimants) and :func:`assign_numbers`: explicit numbers are checked against the arch
range read from the checkout's enum placeholders (:class:`NumberOutOfRange`), every existing
entry and every other spec (:class:`NumberClash`); "auto" keeps the number this kernel
already holds in the checkout when it is still free, else takes the lowest free number in
the range (:class:`NoFreeNumber` when none is left). Entries inside the planned kernels' own
marked blocks do not count as taken: they are about to be replaced.
"""
from __future__ import annotations

from .checkout import Checkout, EnumEntry
from .errors import AnchorNotFound, NameClash, NoFreeNumber, NumberClash, NumberOutOfRange
from .blocks import applies, site_file
from .section import Wiring


def _value(w: Wiring, name: str, arch: str | None) -> str:
    if name == "layer":
        return w.layer
    return getattr(w, name)[arch]


def check_names(checkout: Checkout, wirings: dict[str, Wiring], planned: list[str]) -> list[str]:
    """Every name two kernels, or a kernel and the checkout, both claim: one message each,
    starting with the kernel that wants it (the plan refuses them all together)."""
    clashes = []
    seen: dict[tuple, tuple] = {}
    for k in sorted(wirings):
        for kind, value, arch in wirings[k].claims():
            prev = seen.get((kind, value))
            if prev and prev[0] != k:
                clashes.append(f"{k}: {kind} {value!r} is claimed by two kernels: {prev[0]} "
                               f"({prev[1] or 'all archs'}) and {k} ({arch or 'all archs'}); "
                               "rename one in its spec's wiring section")
            seen.setdefault((kind, value), (k, arch))
    for site in checkout.surface.sites:
        if not site.claim:
            continue
        scan_key, value_name = site.claim
        rx = checkout.surface.scan[scan_key]
        for k in planned:
            w = wirings[k]
            if not applies(site, w):        # a name it never writes is not its claim
                continue
            for arch in (w.archs if site.per_arch else (None,)):
                rel = site_file(checkout.surface, site, arch, k)
                want = _value(w, value_name, arch)
                for lineno, line in checkout.visible_lines(rel, hide_kernels=set(planned)):
                    m = rx.search(line)
                    if m and m.group(1) == want:
                        owner = _owner(checkout, rel, lineno)
                        clashes.append(
                            f"{k}: {rel}:{lineno}: {value_name} {want!r} wanted by kernel {k} "
                            f"({arch or 'all archs'}) is already defined there "
                            f"({'by kernel ' + owner if owner else 'not wired by mpkbuild'}); "
                            f"choose another wiring.{value_name} in specs/{k}.yaml")
    return clashes


def _owner(checkout: Checkout, rel: str, lineno: int) -> str | None:
    for b in checkout.blocks(rel):
        if b.start < lineno - 1 < b.end:
            return b.kernel
    return None


def arch_range(checkout: Checkout, entries: list[EnumEntry], arch: str) -> tuple[int, int]:
    a = checkout.surface.archs[arch]
    by_name = {e.name: e.number for e in entries}
    for ph in (a.range_begin, a.range_end):
        if ph not in by_name:
            rel = site_file(checkout.surface, checkout.site("enum"), None, "")
            raise AnchorNotFound(f"{rel}: range placeholder {ph} for {arch} not found in enum "
                                 "TaskType; update archs in wiring/surface.yaml")
    return by_name[a.range_begin], by_name[a.range_end]


def _auto_ranges(checkout: Checkout, arch: str, lo: int, hi: int, tma: bool) -> tuple:
    """Where "auto" looks: a task that loads with TMA only in the arch's TMA ranges (MPK's
    generated init makes descriptors for those numbers alone), any other task in its
    auto_ranges (the whole range where surface.yaml names none)."""
    a = checkout.surface.archs[arch]
    return (a.tma_ranges if tma else a.auto_ranges) or ((lo + 1, hi - 1),)


def auto_candidates(checkout: Checkout, arch: str, lo: int, hi: int, tma: bool = False):
    """Numbers "auto" may take, preferred first, inside (lo, hi)."""
    for a, b in _auto_ranges(checkout, arch, lo, hi, tma):
        yield from range(max(a, lo + 1), min(b, hi - 1) + 1)


def _ranges_text(checkout: Checkout, arch: str, lo: int, hi: int, tma: bool = False) -> str:
    return ", then ".join(f"{max(a, lo + 1)}-{min(b, hi - 1)}"
                          for a, b in _auto_ranges(checkout, arch, lo, hi, tma))


def assign_numbers(checkout: Checkout, wirings: dict[str, Wiring],
                   planned: list[str], renumber: bool = False) -> dict[str, dict[str, int]]:
    """{kernel: {arch: number}} for the planned kernels; raise on any clash. An "auto"
    kernel already wired keeps its number; when that number was taken since (the owner
    added an entry there), that is a NumberClash naming both, unless `renumber`."""
    entries = checkout.enum_entries()
    rel = site_file(checkout.surface, checkout.site("enum"), None, "")
    planned_set = set(planned)
    taken = {e.number: e for e in entries if e.owner not in planned_set}
    explicit = _explicit_numbers(wirings)
    out: dict[str, dict[str, int]] = {k: {} for k in planned}
    used: dict[int, tuple[str, str]] = {}
    for k in sorted(planned):
        w = wirings[k]
        for a in w.archs:
            if w.number[a] != "auto":
                out[k][a] = _explicit_in_range(checkout, entries, rel, taken, k, w, a)
                used[out[k][a]] = (k, a)
    autos = [(k, a) for k in sorted(planned) for a in wirings[k].archs
             if wirings[k].number[a] == "auto"]
    # first pass: an auto entry keeps the number its own block holds, if still free
    held = {(e.owner, e.arch): e.number for e in entries if e.owner in planned_set}
    for k, a in autos:
        lo, hi = arch_range(checkout, entries, a)
        prev = held.get((k, a))
        if prev is None or not lo < prev < hi:
            continue
        if wirings[k].maps and not checkout.surface.archs[a].in_tma(prev):
            continue                      # it loads with TMA now: the second pass moves it
        if prev not in set(taken) | set(explicit) | set(used):
            out[k][a] = prev
            used[prev] = (k, a)
        elif not renumber:                # with renumber the second pass gives it the next free one
            raise _kept_number_clash(entries, rel, taken, explicit, used, k, a, prev)
    # second pass: the rest take the lowest free number of the first of their arch's
    # auto sub-ranges that has one (the whole range where surface.yaml names none)
    for k, a in autos:
        if a in out[k]:
            continue
        lo, hi = arch_range(checkout, entries, a)
        busy = set(taken) | set(explicit) | set(used)
        tma = bool(wirings[k].maps)
        n = next((i for i in auto_candidates(checkout, a, lo, hi, tma) if i not in busy), None)
        if n is None:
            raise NoFreeNumber(f"{rel}: no free TaskType number left for kernel {k} ({a}) in "
                               f"{_ranges_text(checkout, a, lo, hi, tma)}"
                               f"{' (it loads with TMA)' if tma else ''}; free one, extend the "
                               "range, or give an explicit wiring.number")
        out[k][a] = n
        used[n] = (k, a)
    return out


def _explicit_numbers(wirings: dict[str, Wiring]) -> dict[int, tuple[str, str]]:
    """number -> (kernel, arch) of every explicit number, planned kernel or not; a number
    claimed twice is a NumberClash."""
    explicit: dict[int, tuple[str, str]] = {}
    for k in sorted(wirings):
        for a, n in wirings[k].number.items():
            if n == "auto":
                continue
            if n in explicit and explicit[n][0] != k:
                o = explicit[n]
                raise NumberClash(f"TaskType number {n} is claimed by two kernels: {o[0]} "
                                  f"({o[1]}, {wirings[o[0]].task_type[o[1]]}) and {k} ({a}, "
                                  f"{wirings[k].task_type[a]}); give one of them another number "
                                  "or \"auto\"")
            if n in explicit:
                raise NumberClash(f"TaskType number {n} is claimed twice by kernel {k} "
                                  f"({explicit[n][1]} and {a}); each arch needs its own")
            explicit[n] = (k, a)
    return explicit


def _explicit_in_range(checkout: Checkout, entries, rel: str, taken: dict, k: str, w: Wiring,
                       a: str) -> int:
    """A planned kernel's explicit number, inside its arch's range and not taken."""
    n = w.number[a]
    lo, hi = arch_range(checkout, entries, a)
    if not lo < n < hi:
        ar = checkout.surface.archs[a]
        raise NumberOutOfRange(
            f"specs/{k}.yaml: wiring.number.{a} = {n} is outside the {a} range: "
            f"strictly between {ar.range_begin} = {lo} and {ar.range_end} = {hi} in "
            f"{rel}; pick a number in range or \"auto\"")
    ar = checkout.surface.archs[a]
    if w.maps and not ar.in_tma(n):
        raise NumberOutOfRange(
            f"specs/{k}.yaml: wiring.number.{a} = {n} is outside the {a} TMA ranges "
            f"{[list(r) for r in ar.tma_ranges]}, and {k} loads {', '.join(m['tensor'] for m in w.maps)} "
            "with TMA: MPK's generated init makes a task's descriptors only for those numbers; "
            "pick one there or \"auto\"")
    if n in taken:
        e = taken[n]
        raise NumberClash(
            f"TaskType number {n} wanted by kernel {k} ({a}, {w.task_type[a]}) is "
            f"already taken by {e.name} at {rel}:{e.line} "
            f"({'wired by kernel ' + e.owner if e.owner else 'not wired by mpkbuild'}); "
            "pick a free number or \"auto\"")
    return n


def _kept_number_clash(entries, rel: str, taken: dict, explicit: dict, used: dict, k: str, a: str,
                       prev: int) -> "NumberClash":
    """An auto kernel's held number now claimed by another: moving it would change what code
    built against it expects."""
    mine = next(e for e in entries if e.owner == k and e.arch == a)
    other = taken.get(prev)
    who = (f"{other.name} at {rel}:{other.line} "
           f"({'wired by kernel ' + other.owner if other.owner else 'not wired by mpkbuild'})"
           if other is not None else
           f"kernel {(explicit.get(prev) or used.get(prev))[0]}'s explicit number")
    return NumberClash(
        f"TaskType number {prev} of kernel {k} ({a}: {mine.name} at {rel}:{mine.line}) is now "
        f"also claimed by {who}. Moving {k} to another number would change what code built "
        f"against it expects: free {prev}, give {k} an explicit wiring.number, or pass "
        "renumber=1 to move it to the next free number. Nothing was changed")

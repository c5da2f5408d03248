"""The wire stage's exceptions: one class per failure kind, all under :class:`WireError`.

Each message names the file (relative to the MPK checkout or the wiring folder), the anchor
or field involved, the bad value, and what to do about it, so the SCons tool can print it
as is. Callers that only care that wiring failed catch :class:`WireError`.
"""
from __future__ import annotations


class WireError(Exception):
    """Base class: anything the wire stage refuses to do."""


class SurfaceError(WireError):
    """wiring/surface.yaml is unreadable or malformed (a layout-description bug)."""


class TemplateError(WireError):
    """A wiring template failed to parse or render; names the template file and line."""

    def __init__(self, template: str, line: int | None, message: str):
        self.template, self.line = template, line
        where = f"{template}:{line}" if line else template
        super().__init__(f"{where}: {message}")


class SectionError(WireError):
    """The spec's wiring section is semantically wrong; carries (field path, message) pairs."""

    def __init__(self, kernel: str, problems: list[tuple[str, str]]):
        self.kernel, self.problems = kernel, list(problems)
        lines = "; ".join(f"{p}: {m}" for p, m in self.problems)
        super().__init__(f"spec {kernel}: {lines}")


class NotACheckout(WireError):
    """mpk_root is missing or does not have the MPK layout the surface describes."""


class TargetMissing(WireError):
    """A file the surface names is absent from the checkout."""


class TargetReadOnly(WireError):
    """A file that would change cannot be written."""


class WireBusy(WireError):
    """Another wire run is writing the checkout (its journal is there, its writer alive)."""


class AnchorNotFound(WireError):
    """The anchor line a site inserts at is not in its target file."""


class AnchorAmbiguous(WireError):
    """The anchor regex matches more than one line (add a scope or tighten it)."""


class MarkerError(WireError):
    """A marked block is broken: a begin without its end (half deleted), or the reverse."""


class DriftError(WireError):
    """A marked block was edited by hand; carries the diff, nothing was changed."""

    def __init__(self, message: str, diff: str):
        self.diff = diff
        super().__init__(f"{message}\n{diff}" if diff else message)


class NumberClash(WireError):
    """Two claimants want one TaskType number; the message names both."""


class NameClash(WireError):
    """Two claimants want one name (task type, task name, register function, layer)."""


class NumberOutOfRange(WireError):
    """An explicit TaskType number lies outside its arch's range."""


class NoFreeNumber(WireError):
    """"auto" found no free number left in the arch's range."""


class Incoherent(WireError):
    """The planned result would break the registration files' agreement; nothing written."""


class StalePlan(WireError):
    """A target file changed between plan() and apply(); plan again."""


class Unsupported(WireError):
    """The checkout lacks what a block's code needs (a field, a function): nothing is
    written, rather than a tree that does not compile."""

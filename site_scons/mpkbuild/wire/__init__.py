"""The wire stage: a kernel's MPK registration edits as derived, idempotent marked blocks.

The registration surface (target files per arch, anchors, marker style, templates) is data
in the project's `wiring/` folder (`wiring/surface.yaml` + `wiring/templates/*.j2`); this
package only interprets it. Public API (everything else is internal):

- ``WIRING_SCHEMA`` -- JSON Schema (draft 2020-12) of a spec's ``wiring`` section.
- ``check_section(spec, wiring_root=None) -> list[tuple[str, str]]`` -- semantic errors as
  (field path such as ``"wiring.task_type.sm_90a"``, message); ``[]`` when fine.
- ``render(spec, wiring_root, numbers=None) -> dict[str, str]`` -- fragments by file name
  (``enum.sm_90a.h``, ``register_fn.sm_100a.cc``, ``layer.py``, ...). Pure, deterministic.
- ``write_fragments(out_dir, fragments) -> list[str]`` -- atomic, only-if-changed writes
  into the build folder; returns the names that changed.
- ``plan(mpk_root, specs, wiring_root, kernels) -> Plan`` -- read-only: ``specs`` are all
  kernels' specs (clashes between kernels are errors), ``kernels`` those to wire.
  ``Plan.diff()`` is a unified diff, ``Plan.new_contents`` maps path -> new text (None =
  delete), ``Plan.numbers`` the TaskType numbers, ``Plan.fragments`` numbered fragments.
- ``apply(plan) -> list[str]`` -- writes the plan (journaled: temp files, then renames; all
  files checked writable first); refuses if a file changed since planning.
- ``recover(mpk_root) -> str | None`` -- finishes or rolls back a run that was killed
  (its journal in the checkout), saying which; None when there was none.
- ``unwire(mpk_root, kernels, wiring_root) -> Plan`` -- removes every block of the kernels;
  ``plan_unwire`` is its dry run. ``wired_kernels(mpk_root, wiring_root)`` names every kernel
  with blocks in the checkout, spec or no spec.
- ``plan`` checks the would-be result's coherence (coherence.problems_of: the enum, the
  name map, graph.cc's branches, the register functions and tma.cuh agree):
  ``Plan.problems`` are the ones the plan would add (``apply`` refuses such a plan),
  ``Plan.notes`` what it skipped and what was incoherent upstream already.

Nothing here writes outside the build folder except :func:`apply` and :func:`unwire`.
Every failure is a :class:`WireError` subclass (see :mod:`.errors`).
"""
from __future__ import annotations

import importlib

# The public names, from the submodule that defines each. They load on first use (PEP 562):
# the spec loader needs only section.py, and a module's code input is the closure of what it
# imports (util/closure.py), so code that uses the wire engine imports its submodules by name.
_EXPORTS = {
    "write_fragments": "fsio", "recover": "fsio",
    "Plan": "patch", "apply": "patch", "plan": "patch", "plan_unwire": "patch", "unwire": "patch",
    "wired_kernels": "patch",
    "render": "blocks",
    "WIRING_SCHEMA": "section", "check_section": "section",
    **{name: "errors" for name in (
        "AnchorAmbiguous", "AnchorNotFound", "DriftError", "Incoherent", "MarkerError", "NameClash",
        "NoFreeNumber", "NotACheckout", "NumberClash", "NumberOutOfRange", "SectionError",
        "StalePlan", "SurfaceError", "TargetMissing", "TargetReadOnly", "TemplateError", "Unsupported",
        "WireBusy", "WireError")},
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)

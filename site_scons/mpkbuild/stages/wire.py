"""The wire stage as the build runs it: fragments always, a checkout diff on request, and
edits to the checkout only with apply=1.

Writes build/<K>/wiring/ (fragments/, mpk.diff, wire.json). Only :func:`run_wire` with
``apply=True`` touches anything outside build/, through :func:`mpkbuild.wire.apply` /
:func:`mpkbuild.wire.unwire`, which write each file via a temp file and a rename.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mpkbuild.model.graph import Node
from mpkbuild.model.kernel import Kernel
from mpkbuild.util import config
from mpkbuild.util.console import say
from mpkbuild.util.fsutil import dump_json, sha256_bytes, write_atomic, write_json_atomic


@dataclass(frozen=True)
class WireRequest:
    mpk_root: Path | None     # an MPK checkout, or None: render fragments only
    apply: bool               # write the edits into the checkout
    unwire: bool              # remove this kernel's blocks instead of adding them

    def describe(self) -> str:
        """The request as a fact the wire node depends on (changing it re-runs wire)."""
        if self.mpk_root is None:
            return "render"
        return f"mpk_root={self.mpk_root}; apply={int(self.apply)}; unwire={int(self.unwire)}"


class WireGateFailed(Exception):
    """Applied edits left the checkout incoherent, or the wiring could not be made."""


def task_sources(k: Kernel) -> dict:
    """The body and spec header wire installs: the generate stage's render, in memory."""
    from mpkbuild.stages import generate
    section = k.spec.sections["codegen"]
    return {role: generate.render_file(role, section, k.spec.file, k.body_source, k.root)
            for role in ("body", "spec_header")}


def render_manifest(k: Kernel, request: WireRequest, wiring_root: Path) -> tuple[dict, dict]:
    """Render mode (no checkout): (manifest, fragments), computed without writing anything."""
    from mpkbuild.wire import blocks  # the engine loads only when a wire node runs or is predicted
    fragments = blocks.render(k.spec.data, wiring_root, sources=task_sources(k))
    manifest = {"mode": "render", "verdict": "pass",
                "message": f"{len(fragments)} fragments rendered; give mpk_root= for "
                           "TaskType numbers and a diff against a checkout"}
    return _finish(manifest, k, request, fragments), fragments


def _finish(manifest: dict, k: Kernel, request: WireRequest, fragments: dict) -> dict:
    manifest.update(kernel=k.name, request=request.describe(),
                    fragments={n: sha256_bytes(t.encode()) for n, t in sorted(fragments.items())})
    return manifest


def run_wire(k: Kernel, all_specs: list[dict], request: WireRequest, wiring_root: Path) -> dict:
    """Run the stage for one kernel; returns the manifest written to build/<K>/wiring/wire.json."""
    from mpkbuild.wire import errors, fsio, patch
    frag_dir = k.wiring_dir / "fragments"
    diff_path = k.wiring_dir / "mpk.diff"
    k.wire_result.unlink(missing_ok=True)
    try:
        if request.mpk_root is None:
            manifest, fragments = render_manifest(k, request, wiring_root)
            fsio.write_fragments(frag_dir, fragments)
        else:
            root = request.mpk_root
            if request.unwire:
                plan = patch.plan_unwire(root, [k.name], wiring_root)
                fragments = {}
            else:
                plan = patch.plan(root, all_specs, wiring_root, [k.name],
                                 sources={k.name: task_sources(k)})
                fragments = plan.fragments.get(k.name, {})
                fsio.write_fragments(frag_dir, fragments)
            write_atomic(diff_path, plan.diff())
            changed = sorted(c for c in plan.new_contents)
            # coherence was judged on the would-be result: refuse before writing anything
            if plan.problems:
                raise WireGateFailed(f"{k.name}: the result would be incoherent ("
                                     f"{'nothing was written' if request.apply else 'diff only'}):"
                                     "\n  " + "\n  ".join(plan.problems))
            if request.apply:
                patch.apply(plan)
            verb = ("unwired from" if request.unwire else "applied to") if request.apply else \
                ("would unwire from" if request.unwire else "would change")
            manifest = {"mode": "unwire" if request.unwire else ("apply" if request.apply else "diff"),
                        "verdict": "pass", "mpk_root": str(root),
                        "numbers": plan.numbers.get(k.name, {}), "files": changed,
                        "coherence": [], "notes": list(plan.notes),
                        "diff": str(diff_path.relative_to(k.build_dir)),
                        "message": f"{verb} {len(changed)} files in {root}"
                                   + ("" if request.apply else " (apply=1 writes them)")
                                   + "".join(f"\n            note: {n}" for n in plan.notes)}
    except errors.WireError as exc:     # drift errors carry their diff in the message
        raise WireGateFailed(f"{k.name}: {exc}") from exc
    if request.mpk_root is not None:
        manifest = _finish(manifest, k, request, fragments)
    write_json_atomic(k.wire_result, manifest)
    return manifest


# ---------------------------------------------------------------- the stage's nodes
def nodes(g, k, stage: str) -> None:
    if not k.has_wiring:
        g.requested[(k.name, stage)] = []
        return
    from mpkbuild import stages
    request = g.wire_request
    node = g.add(Node(f"wire {k.name}", "wire", stage, k.name, (k.rel.wire_result,),
                      (*(k.rel.section_file(s) for s in stages.BY_NAME[stage].reads),
                       k.rel.body_source, g.pkg("templates", "spec_header.h.j2"),
                       *wiring_files(g)),
                      (f"wire: {request.describe()}", g.stage_code(stage)),
                      side_effects=(g.rel(g.root / config.BUILD_DIRNAME / ".wire-in-use"),),
                      always="mpk_root= is given: the checkout is re-planned on every run"
                      if request.mpk_root is not None else None, verdict_at=0))
    g.requested[(k.name, stage)] = list(node.targets)


def wiring_files(g) -> list[str]:
    """What the wire stage reads of wiring/: surface.yaml and the templates folder (a
    note or another file beside them re-runs nothing)."""
    folder = g.root / config.WIRING_DIRNAME
    return [g.rel(folder / config.WIRING_SURFACE),
            *sorted(g.rel(p) for p in (folder / config.WIRING_TEMPLATES).rglob("*") if p.is_file())]


def all_wired_kernels(build) -> list[Kernel]:
    """Every kernel with a wiring section: TaskType numbers and names must not clash."""
    from mpkbuild.model.kernel import discover
    out = []
    for name in discover(build.root):
        k = build.kernels.get(name) or Kernel.load(build.root, name)
        if k.has_wiring:
            out.append(k)
    return out


def run(build, info, target, source) -> int:
    k = build.kernels[info["MPK_KERNEL"]]
    request = build.wire_request
    specs = [x.spec.data for x in all_wired_kernels(build)] if request.mpk_root else []
    try:
        manifest = run_wire(k, specs, request, k.root / "wiring")
    except WireGateFailed as exc:
        return build.fail(str(exc))
    say(f"          wire {k.name}: {manifest['message']}")
    return 0


def predict(node, k, predictor) -> dict | None:
    """Render mode is computed in memory; against a checkout it re-plans on every run."""
    if predictor.wire_request.mpk_root is not None:
        return None
    manifest, _ = render_manifest(k, predictor.wire_request, predictor.wiring_root)
    return {node.targets[0]: dump_json(manifest).encode()}


ACTIONS = {"wire": run}

"""The wire stage as the build runs it: fragments always, a checkout diff on request, and
edits to the checkout only with apply=1.

Writes build/<K>/wiring/ (fragments/, mpk.diff, wire.json). Against a checkout the whole
request is one plan (:func:`run_plan`): every requested kernel is planned and checked, and
only then, with apply=1, written, all of it through :func:`mpkbuild.wire.apply` (journaled in
the checkout: a kill at any instant is finished or rolled back by the next run, wire/fsio.py)
or nothing: a refusal in any kernel leaves the checkout byte-identical. The preview shows the
numbers apply would write.
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
    renumber: bool = False    # an already-wired kernel whose number was taken moves
    runtime: str = "v1"       # the runtime the registration and the runtime gate target

    def describe(self) -> str:
        """The request as a fact the wire node depends on (changing it re-runs wire)."""
        tail = f"; runtime={self.runtime}" if self.runtime != "v1" else ""
        if self.mpk_root is None:
            return "render" + tail
        return (f"mpk_root={self.mpk_root}; apply={int(self.apply)}; unwire={int(self.unwire)}"
                + ("; renumber=1" if self.renumber else "") + tail)


@dataclass
class RunPlan:
    """The one plan of a build's wire request against a checkout: every requested kernel
    planned and checked together (numbers, names, permissions, the would-be tree's
    coherence), then written together or not at all. The first wire node of the run makes
    it; every wire node reports its kernel's part (wire nodes share a side effect, so
    SCons runs them one at a time)."""
    kernels: tuple[str, ...]
    plan: object = None                 # wire.patch.Plan
    error: str | None = None            # why nothing was (or would be) written
    applied: bool = False
    noted: bool = False                 # the run's notes were printed once


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
    fragments = blocks.render(k.spec.data, wiring_root, sources=task_sources(k),
                              runtime=request.runtime)
    manifest = {"mode": "render", "verdict": "pass",
                "message": f"{len(fragments)} fragments rendered; give mpk_root= for "
                           "TaskType numbers and a diff against a checkout"}
    return _finish(manifest, k, request, fragments), fragments


def _finish(manifest: dict, k: Kernel, request: WireRequest, fragments: dict) -> dict:
    manifest.update(kernel=k.name, request=request.describe(),
                    fragments={n: sha256_bytes(t.encode()) for n, t in sorted(fragments.items())})
    return manifest


def run_plan(build, request: WireRequest, wiring_root: Path) -> RunPlan:
    """This build's RunPlan (made once): every kernel of the request that has a wiring
    section, planned together against every wired spec (numbers and names must not clash)."""
    cached = getattr(build, "wire_run", None)
    if cached is not None:
        return cached
    from mpkbuild.wire import errors, patch
    mine = [k for k in build.kernels.values() if k.has_wiring]
    run = RunPlan(tuple(sorted(k.name for k in mine)))
    try:
        wired = all_wired_kernels(build)
        named = {x.name for x in wired}
        # blocks of kernels no spec here names (renamed or removed): an unwire of every
        # kernel takes them too; any other run leaves them and says so
        strays = sorted(patch.wired_kernels(request.mpk_root, wiring_root) - named)
        whole = set(run.kernels) == named
        if request.unwire:
            run.plan = patch.plan_unwire(request.mpk_root, [*run.kernels, *(strays if whole else [])],
                                         wiring_root)
        else:
            run.plan = patch.plan(request.mpk_root, [x.spec.data for x in wired], wiring_root,
                                  list(run.kernels), sources={k.name: task_sources(k) for k in mine},
                                  renumber=request.renumber, runtime=request.runtime)
        if strays:
            run.plan.notes.append(stray_note(strays, request.unwire and whole, request.apply))
        # coherence was judged on the would-be result: refuse before writing anything
        if run.plan.problems:
            run.error = ("the result would be incoherent:\n  " + "\n  ".join(run.plan.problems))
        elif request.apply:
            patch.apply(run.plan, "unwire" if request.unwire else "apply")
            run.applied = True
    except errors.WireError as exc:       # drift errors carry their diff in the message
        run.error = str(exc)
    build.wire_run = run
    return run


def run_wire(k: Kernel, run: RunPlan | None, request: WireRequest, wiring_root: Path) -> dict:
    """Write one kernel's manifest (build/<K>/wiring/wire.json): its fragments, and against
    a checkout its part of the run's plan. Raises WireGateFailed when the run's plan was
    refused (then nothing was written to the checkout, for any kernel)."""
    from mpkbuild.wire import fsio
    frag_dir = k.wiring_dir / "fragments"
    diff_path = k.wiring_dir / "mpk.diff"
    k.wire_result.unlink(missing_ok=True)
    if request.mpk_root is None:
        manifest, fragments = render_manifest(k, request, wiring_root)
        fsio.write_fragments(frag_dir, fragments)
        write_json_atomic(k.wire_result, manifest)
        return manifest
    root = request.mpk_root
    others = [n for n in run.kernels if n != k.name]
    together = f" (planned together with {', '.join(others)})" if others else ""
    if run.error is not None:
        # the run's error, not this kernel's: each clash in it names its own kernel
        raise WireGateFailed(f"wire ({', '.join(run.kernels)}): {run.error}\n"
                             f"{'Nothing was written to ' + str(root) if request.apply else 'diff only'}"
                             f" for any kernel of this run")
    plan = run.plan
    fragments = plan.fragments.get(k.name, {})
    if not request.unwire:
        fsio.write_fragments(frag_dir, fragments)
    write_atomic(diff_path, plan.diff())
    files = plan.files.get(k.name, [])
    verb = ("unwired from" if request.unwire else "applied to") if request.apply else \
        ("would unwire from" if request.unwire else "would change")
    notes = [] if run.noted else list(plan.notes)
    run.noted = True
    manifest = {"mode": "unwire" if request.unwire else ("apply" if request.apply else "diff"),
                "verdict": "pass", "mpk_root": str(root),
                "numbers": plan.numbers.get(k.name, {}), "files": files, "run": list(run.kernels),
                "coherence": [], "notes": list(plan.notes),
                "diff": str(diff_path.relative_to(k.build_dir)),
                "message": f"{verb} {len(files)} files in {root}{together}"
                           + (f"; numbers {', '.join(f'{a} {n}' for a, n in sorted(plan.numbers.get(k.name, {}).items()))}"
                              if plan.numbers.get(k.name) else "")
                           + ("" if request.apply else
                              f" (the diff of the whole run: {k.rel.wiring_dir}/mpk.diff; apply=1 writes it)")
                           + "".join(f"\n            note: {_short_note(n)}" for n in notes)}
    manifest = _finish(manifest, k, request, fragments)
    write_json_atomic(k.wire_result, manifest)
    return manifest


def stray_note(strays: list[str], taken: bool, applied: bool) -> str:
    """What a run says of the checkout's blocks of kernels no spec of the project names."""
    which = f"{', '.join(strays)} (no spec of this project names {'it' if len(strays) == 1 else 'them'}: renamed or removed)"
    if taken:
        return f"{'unwired' if applied else 'would unwire'} too: the blocks of {which}"
    return (f"the checkout holds blocks of {which}; this run leaves them: an unwire of every "
            "kernel (`scons stage=wire mpk_root=... unwire=1 apply=1`, no kernel=) removes them too")


def _short_note(note: str) -> str:
    """A note as the build prints it: the upstream problems counted, not listed (wire.json
    keeps them whole)."""
    head, sep, rest = note.partition(":\n")
    if sep and "already upstream" in head:
        return f"{head} (listed in wire.json)"
    return note


# ---------------------------------------------------------------- the stage's nodes
def nodes(g, k, stage: str) -> None:
    if not k.has_wiring:
        g.requested[(k.name, stage)] = []
        return
    from mpkbuild.stages import table as stages
    from mpkbuild.stages.generate import template_inputs
    request = g.wire_request
    node = g.add(Node(f"wire {k.name}", "wire", stage, k.name, (k.rel.wire_result,),
                      (*(k.rel.section_file(s) for s in stages.BY_NAME[stage].reads),
                       k.rel.body_source, *template_inputs(g, k, "spec_header"),
                       *wiring_files(g)),
                      (f"wire: {request.describe()}", g.stage_code(stage)),
                      side_effects=(g.rel(g.root / config.BUILD_DIRNAME / ".wire-in-use"),),
                      always="mpk_root= is given: the checkout is re-planned on every run"
                      if request.mpk_root is not None else None, verdict_at=0, column="wire"))
    g.requested[(k.name, stage)] = list(node.targets)


def wiring_files(g) -> list[str]:
    """What the wire stage reads of the wiring folders (the project's wiring/, the shipped
    surface): surface.yaml and the templates folder of each (a note or another file beside
    them re-runs nothing)."""
    out = []
    for folder in config.wiring_roots(g.root):
        if (folder / config.WIRING_SURFACE).is_file():
            out.append(g.rel(folder / config.WIRING_SURFACE))
        out += sorted(g.rel(p) for p in (folder / config.WIRING_TEMPLATES).rglob("*") if p.is_file())
    return out


def all_wired_kernels(build) -> list[Kernel]:
    """Every kernel with a wiring section: TaskType numbers and names must not clash."""
    from mpkbuild.model.kernel import discover
    out = []
    for name in discover(build.root):
        k = build.kernels.get(name) or build.load_kernel(name)
        if k.has_wiring:
            out.append(k)
    return out


def run(build, info, target, source) -> int:
    k = build.kernels[info["MPK_KERNEL"]]
    request = build.wire_request
    wiring_root = config.wiring_roots(k.root)
    run_ = run_plan(build, request, wiring_root) if request.mpk_root is not None else None
    try:
        manifest = run_wire(k, run_, request, wiring_root)
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

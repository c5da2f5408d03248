"""The review stage: one page per kernel and a summary over kernels, from the gate results.

Data first (:func:`kernel_review`), text second (the jinja2 templates): the same dict can
feed other views. Every verdict shown comes from a result file; a gate without one is
shown as not run, never as passed.
"""
from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from mpkbuild.model.graph import Node
from mpkbuild.model.paths import summary_file
from mpkbuild.stages.generate import render_template
from mpkbuild.stages.table import BY_NAME, FIGURE_TIERS, GPU_GATES, STAGES
from mpkbuild.util import config
from mpkbuild.util.fsutil import read_json, write_atomic, write_json_atomic


REPORTING = tuple(s for s in STAGES if s.report)       # the stages with a part, in table order
GATE_SECTION = config.TEMPLATE_DIR / "review_gate.md.j2"


def _rel(path: Path, start: Path) -> str:
    return os.path.relpath(path, start)


@dataclass
class ReviewInputs:
    """What one kernel's review reads; each stage's report takes its part from it."""
    name: str
    build_dir: Path
    archs: tuple
    gpu_key: str | None
    resources: dict                 # arch -> its resources.json
    results: dict                   # gate -> its result file (the gates the build has for it)
    wire_result: Path | None = None
    waiting: dict = field(default_factory=dict)   # gate -> why it cannot run on this GPU profile
    kernel: object = None           # the Kernel (a tuned file's part reads it), when built

    def rel(self, path: Path) -> str:
        return _rel(path, self.build_dir)


# a part's fields the frame, JUnit and the summary read, besides what its template reads:
# heading-less parts render their whole section; `counted`: verdicts the overall is made of;
# `cases`: JUnit testcases [name, verdict, message, tier or None]; `cells`: summary columns
def _gate_part(gate: str, inputs: ReviewInputs, parsed: dict, report) -> dict | None:
    """A GPU gate's part: its verdict and message from its result, evidence links, and what
    its report adds; pending TIER-1 where this GPU profile cannot run it, never passed."""
    if gate in inputs.waiting:
        verdict, message, res, log, js = "pending TIER-1", inputs.waiting[gate], None, None, None
    elif gate in inputs.results:
        path = inputs.results[gate]
        res = parsed[gate]
        verdict = res["verdict"] if res else "not run"
        message = (res or {}).get("message", "no result: the gate has not run on this GPU")
        log, js = inputs.rel(path.with_suffix(".log")), inputs.rel(path)
    else:
        return None
    tiers: dict = {}                # "TIER-1 (in-runtime, production grid)" -> its figures
    for fig, t in report.TIERS.items():
        tiers.setdefault(f"{t} ({FIGURE_TIERS[t]})", []).append(fig)
    part = {"verdict": verdict, "message": message, "result": res or {}, "log": log, "json": js,
            "tiers": tiers, "decides": report.DECIDES, "counted": [verdict],
            "cases": [[gate, verdict, message, report.DECIDES]], "cells": {gate: verdict}}
    if res:
        extra = report.review(res, parsed)
        part["cells"].update(extra.pop("cells", {}))
        part.update(extra)
    return part


def kernel_review(name: str, build_dir: Path, archs, gpu_key: str | None,
                  resources: dict[str, Path], results: dict[str, Path],
                  wire_result: Path | None = None, waiting: dict[str, str] | None = None,
                  kernel=None) -> dict:
    """Everything review.md shows for one kernel: each reporting stage's part, in table order.
    waiting: gate -> why it cannot run on this GPU profile (pending TIER-1)."""
    inputs = ReviewInputs(name, build_dir, tuple(archs), gpu_key, resources, results, wire_result,
                          dict(waiting or {}), kernel)
    parsed = {gate: read_json(path) for gate, path in results.items()}
    parts = {}
    for row in REPORTING:
        report = _report(row.name)
        part = _gate_part(row.name, inputs, parsed, report) if row.gate else report.part(inputs)
        if part is not None:
            parts[row.name] = part
    decided_by = _decided_by(parts)
    verdicts = [v for stage, p in parts.items() if stage in decided_by["counted"] for v in p["counted"]]
    overall = "pass" if verdicts and all(v == "pass" for v in verdicts) else \
        ("fail" if any(v in ("fail", "hang", "crash") for v in verdicts) else
         ("unsure" if any(v == "unsure" for v in verdicts) else "incomplete"))
    return {"kernel": name, "gpu_key": gpu_key, "overall": overall, "decided_by": decided_by, "parts": parts}


def _decided_by(parts: dict) -> dict:
    """Which parts the headline verdict is made of: every correctness verdict, and of the
    speed verdicts only the TIER-1 ones where a TIER-1 gate ran (the others corroborate)."""
    ran = [s for s, p in parts.items() if p.get("decides") == "TIER-1"
           and p["verdict"] not in ("not run", "pending TIER-1")]
    speed = [s for s, p in parts.items() if p.get("decides")]
    judged = ran or speed
    tier = "TIER-1" if ran else (parts[judged[0]]["decides"] if judged else None)
    text = (f"{tier} ({FIGURE_TIERS[tier]}): {', '.join(judged)}" if tier else "no figure: correctness only")
    if ran and len(speed) > len(ran):
        text += f"; not counted, corroboration: {', '.join(s for s in speed if s not in ran)}"
    return {"tier": tier, "text": text,
            "counted": [s for s, p in parts.items() if not p.get("decides") or s in judged]}


def _fmt_us(x) -> str:
    return f"{x:.2f}" if isinstance(x, (int, float)) else "—"


def _report(stage: str):
    """The module of a reporting stage's part of the review (its row's `report`)."""
    import importlib
    return importlib.import_module(BY_NAME[stage].report)


@functools.lru_cache(maxsize=None)
def _helpers() -> dict:
    """The functions the reports give every review template (perf's ratio and limits)."""
    return {name: fn for row in REPORTING for name, fn in _report(row.name).HELPERS.items()}


def _fragment(report, name: str | None) -> Path | None:
    return Path(report.__file__).with_name(name) if name else None


def render_kernel(review: dict) -> str:
    """review.md: the frame, and each stage's part rendered from its own templates (a lead
    before the first section, its section in table order; a gate's section opens with its
    verdict, message and evidence, templates/review_gate.md.j2)."""
    context = {"r": review, "us": _fmt_us, **_helpers()}
    sections, leads = [], []
    for stage, p in review["parts"].items():
        report = _report(stage)
        body = _fragment(report, report.REVIEW)
        lead = _fragment(report, report.REVIEW_LEAD)
        text = render_template(body, {**context, "p": p, "g": p}) if body else ""
        if BY_NAME[stage].gate is not None:
            text = render_template(GATE_SECTION, {**context, "gate": stage, "g": p, "body": text})
        sections.append(text)
        if lead:
            leads.append(render_template(lead, {**context, "g": p}))
    return render_template(config.TEMPLATE_DIR / "review.md.j2", {**context, "sections": sections, "leads": leads})


def review_templates(g) -> list[str]:
    """Every template a kernel's review renders (its inputs): the frame and each gate's parts."""
    return [g.pkg("templates", "review.md.j2"), g.pkg("templates", GATE_SECTION.name),
            *(g.pkg(*parts) for parts in _fragment_parts())]


@functools.lru_cache(maxsize=None)
def _fragment_parts() -> tuple[tuple[str, ...], ...]:
    """Each stage's review templates as package paths (found once per process)."""
    out = []
    for row in REPORTING:
        report = _report(row.name)
        for name in (report.REVIEW, report.REVIEW_LEAD):
            if name:
                out.append(_fragment(report, name).resolve().relative_to(config.PACKAGE_DIR.resolve()).parts)
    return tuple(out)


def junit_xml(reviews: list[dict]) -> str:
    """JUnit XML for CI systems: one testsuite per kernel, the testcases each part names (a
    compile per arch, wire, each gate); fail/hang/crash are failures, unsure, pending and not
    run are skipped with their message (never a pass)."""
    from xml.sax.saxutils import quoteattr, escape
    lines = ['<?xml version="1.0" encoding="UTF-8"?>', "<testsuites>"]
    for r in reviews:
        cases = [tuple(c) for p in r["parts"].values() for c in p["cases"]]
        failures = sum(v in ("fail", "hang", "crash") for _, v, _, _ in cases)
        skipped = sum(v not in ("pass", "fail", "hang", "crash") for _, v, _, _ in cases)
        lines.append(f"  <testsuite name={quoteattr(r['kernel'])} tests=\"{len(cases)}\" "
                     f"failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\">")
        for name, verdict, message, tier in cases:
            lines.append(f"    <testcase classname={quoteattr('mpkbuild.' + r['kernel'])} name={quoteattr(name)}>")
            if tier:       # what its figures are worth (stages.table.FIGURE_TIERS)
                lines.append(f"      <properties><property name=\"tier\" value={quoteattr(tier)}/></properties>")
            if verdict in ("fail", "hang", "crash"):
                lines.append(f"      <failure type={quoteattr(verdict)} message={quoteattr(message[:500])}>"
                             f"{escape(message)}</failure>")
            elif verdict != "pass":
                lines.append(f"      <skipped message={quoteattr(f'{verdict}: {message}'[:500])}/>")
            lines.append("    </testcase>")
        lines.append("  </testsuite>")
    lines.append("</testsuites>")
    return "\n".join(lines) + "\n"


def write_kernel_review(review: dict, md_path: Path, json_path: Path, junit_path: Path | None = None) -> None:
    for row in REPORTING:       # what a stage writes beside review.md (perf's picture)
        report = _report(row.name)
        if report.FILES is not None:
            review.update(report.FILES(review, md_path.parent))
    write_json_atomic(json_path, review)
    if junit_path is not None:
        write_atomic(junit_path, junit_xml([review]))
    write_atomic(md_path, render_kernel(review))


def write_summary(review_jsons: list[Path], md_path: Path, junit_path: Path | None = None) -> None:
    reviews = [json.loads(p.read_text()) for p in review_jsons]
    if junit_path is not None:
        write_atomic(junit_path, junit_xml(reviews))
    # a column per cell any review's parts have, in table order (the runtime gate's only where
    # some review ran it: a gate no kernel had is no column of "not run")
    columns = list(dict.fromkeys(c for row in REPORTING for r in reviews
                                 for c in r["parts"].get(row.name, {}).get("cells", ())))
    rows = [{"kernel": r["kernel"], "overall": r["overall"],
             "cells": {c: t for p in r["parts"].values() for c, t in p["cells"].items()},
             "link": _rel(Path(p).with_name("review.md"), md_path.parent)}
            for r, p in zip(reviews, review_jsons)]
    write_atomic(md_path, render_template(config.TEMPLATE_DIR / "summary.md.j2",
                                          {"rows": rows, "columns": columns}))


# ---------------------------------------------------------------- the stage's nodes
def nodes(g, k, stage: str) -> None:
    # what each part reads: a stage's own files, and the result of each gate the graph has
    # for k (the runtime gate exists only with mpk_root=, profile only with its section)
    sources = [rel for row in REPORTING if row.gate is None for rel in _report(row.name).review_sources(g, k)]
    gates = [gate for gate in GPU_GATES if g.requested.get((k.name, gate))]
    sources += [k.rel.gate_result(gate, g.gpu_key) for gate in gates]
    from mpkbuild.stages.spec import tuned_fact
    # the tuned file is read (not depended on as a file: it is the tune stage's target, and
    # review does not run the tune): its hash is a fact, so a new tune re-runs the review
    # the gates this GPU profile cannot run (pending TIER-1): shown, never read
    waiting = g.waiting.get(k.name, {})
    node = g.add(Node(f"review {k.name}", "review", stage, k.name,
                      (k.rel.review, k.rel.review_json, k.rel.junit),
                      (*sources, *review_templates(g)),
                      (*tuned_fact(k), *(f"waits: {s}: {w}" for s, w in waiting.items()), g.stage_code(stage)),
                      opts=(("MPK_WAITS", json.dumps(waiting, sort_keys=True)),), column="review"))
    checks = [k.rel.gate_stamp(gate, g.gpu_key) for gate in gates]
    g.requested[(k.name, stage)] = [*node.targets, *checks]


def shared_nodes(g, kernels, with_summary: bool) -> None:
    """The summary over kernels (when every kernel is built)."""
    if not with_summary:
        return
    review_jsons = [k.rel.review_json for k in kernels]
    node = g.add(Node("review summary", "summary", "review", None,
                      (g.rel(summary_file(g.root)), g.rel(summary_file(g.root).with_name("junit.xml"))),
                      (*review_jsons, g.pkg("templates", "summary.md.j2")),
                      (g.stage_code("review"),), column="review"))
    g.summary_targets = list(node.targets)


def run_review(build, info, target, source) -> int:
    from mpkbuild.stages.gates import lock_for
    from mpkbuild.stages.generate import TemplateError
    k = build.kernels[info["MPK_KERNEL"]]
    key = info["MPK_GPU_KEY"]
    # the gates this node reads (the runtime gate only with mpk_root=): a gate the build
    # has no node for is not shown as "not run", which would make the kernel incomplete
    read = {os.path.realpath(s.abspath) for s in source if hasattr(s, "abspath")}   # files, not facts
    results = {g: k.gate_result(g, key) for g in GPU_GATES if os.path.realpath(k.gate_result(g, key)) in read}
    data = kernel_review(k.name, k.build_dir, k.archs, key, {a: k.resources(a) for a in k.archs},
                         results, k.wire_result if k.has_wiring else None,
                         json.loads(info.get("MPK_WAITS") or "{}"), kernel=k)
    # the inputs' signatures: the data changes whenever an input did, so the summary that
    # reads it re-runs exactly when a review ran (the exact dry run relies on that)
    data["inputs"] = lock_for(source, k.root)
    try:
        write_kernel_review(data, Path(target[0].abspath), Path(target[1].abspath),
                            Path(target[2].abspath))
    except TemplateError as exc:
        return build.fail(str(exc))
    return 0


def run_summary(build, info, target, source) -> int:
    write_summary([Path(s.abspath) for s in source if getattr(s, "abspath", "").endswith(".json")],
                  Path(target[0].abspath), Path(target[1].abspath))
    return 0


def predict(node, k, predictor) -> None:
    return None


ACTIONS = {"review": run_review, "summary": run_summary}

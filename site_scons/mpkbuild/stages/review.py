"""The review stage: one page per kernel and a summary over kernels, from the gate results.

Data first (:func:`kernel_review`), text second (the jinja2 templates): the same dict can
feed other views. Every verdict shown comes from a result file; a gate without one is
shown as not run, never as passed.
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from mpkbuild.model.graph import Node
from mpkbuild.model.paths import summary_file
from mpkbuild.stages.generate import render_template
from mpkbuild.stages.perf import report as perf_report
from mpkbuild.stages.table import BY_NAME, GPU_GATES
from mpkbuild.stages.tune.report import tune_review
from mpkbuild.util import config
from mpkbuild.util.fsutil import read_json, write_atomic, write_json_atomic


def _rel(path: Path, start: Path) -> str:
    return os.path.relpath(path, start)


def kernel_review(name: str, build_dir: Path, archs, gpu_key: str | None,
                  resources: dict[str, Path], results: dict[str, Path],
                  wire_result: Path | None = None, waiting: dict[str, str] | None = None) -> dict:
    """Everything review.md shows for one kernel. waiting: gate -> why it cannot run on this
    GPU profile (pending TIER-1): shown as such, never passed."""
    compile_rows = []
    for arch in archs:
        res = read_json(resources[arch])
        compile_rows.append({
            "arch": arch, "verdict": res["verdict"] if res else "not run",
            "toolchain": res["toolchain"] if res else "",
            "log": _rel(resources[arch].with_name("compile.log"), build_dir),
            "variants": res["variants"] if res else {}})
    gates = {}
    parsed = {gate: read_json(path) for gate, path in results.items()}
    for gate, path in results.items():
        res = parsed[gate]
        gates[gate] = {
            "verdict": res["verdict"] if res else "not run",
            "message": (res or {}).get("message", "no result: the gate has not run on this GPU"),
            "result": res or {},
            "log": _rel(path.with_suffix(".log"), build_dir),
            "json": _rel(path, build_dir)}
        report = _report(gate)
        if report is not None and res:
            gates[gate].update(report.review(res, parsed))
    for gate, why in (waiting or {}).items():
        gates[gate] = {"verdict": "pending TIER-1", "message": why, "result": {}, "log": None, "json": None}
    wire = None
    if wire_result is not None:
        res = read_json(wire_result)
        wire = {"verdict": res["verdict"] if res else "not run",
                "message": (res or {}).get("message", "the wire stage has not run"),
                "numbers": (res or {}).get("numbers", {}), "fragments": sorted((res or {}).get("fragments", {})),
                "json": _rel(wire_result, build_dir)}
    verdicts = [r["verdict"] for r in compile_rows] + [g["verdict"] for g in gates.values()]
    overall = "pass" if verdicts and all(v == "pass" for v in verdicts) else \
        ("fail" if any(v in ("fail", "hang", "crash") for v in verdicts) else
         ("unsure" if any(v == "unsure" for v in verdicts) else "incomplete"))
    return {"kernel": name, "gpu_key": gpu_key, "compile": compile_rows, "gates": gates,
            "wire": wire, "overall": overall, "tune": None}


def _fmt_us(x) -> str:
    return f"{x:.2f}" if isinstance(x, (int, float)) else "—"


def _report(gate: str):
    """The module of a gate's part of the review (its row's `report`), or None."""
    import importlib
    row = BY_NAME.get(gate)
    return importlib.import_module(row.report) if row is not None and row.report else None


def _fragment(report, name: str | None) -> Path | None:
    return Path(report.__file__).with_name(name) if report is not None and name else None


def render_kernel(review: dict) -> str:
    """review.md: the frame, and each gate's own part rendered from its stage's templates
    (a lead before the compile section, a section after its verdict)."""
    context = {"r": review, "us": _fmt_us, "limits": perf_report.limits_text, "ratio": perf_report.ratio_text}
    bodies, leads = {}, []
    for gate, g in review["gates"].items():
        report = _report(gate)
        body = _fragment(report, report.REVIEW if report else None)
        lead = _fragment(report, report.REVIEW_LEAD if report else None)
        bodies[gate] = render_template(body, {**context, "g": g}) if body else ""
        if lead:
            leads.append(render_template(lead, {**context, "g": g}))
    return render_template(config.TEMPLATE_DIR / "review.md.j2", {**context, "bodies": bodies, "leads": leads})


def review_templates(g) -> list[str]:
    """Every template a kernel's review renders (its inputs): the frame and each gate's parts."""
    return [g.pkg("templates", "review.md.j2"), *(g.pkg(*parts) for parts in _fragment_parts())]


@functools.lru_cache(maxsize=None)
def _fragment_parts() -> tuple[tuple[str, ...], ...]:
    """Each gate's review templates as package paths (found once per process)."""
    out = []
    for gate in GPU_GATES:
        report = _report(gate)
        for name in (report.REVIEW, report.REVIEW_LEAD) if report is not None else ():
            if name:
                out.append(_fragment(report, name).resolve().relative_to(config.PACKAGE_DIR.resolve()).parts)
    return tuple(out)


def junit_xml(reviews: list[dict]) -> str:
    """JUnit XML for CI systems: one testsuite per kernel, one testcase per gate (compile per
    arch, validate, perf, wire); fail/hang/crash are failures, unsure and not run are
    skipped with their message (never a pass)."""
    from xml.sax.saxutils import quoteattr, escape
    lines = ['<?xml version="1.0" encoding="UTF-8"?>', "<testsuites>"]
    for r in reviews:
        cases = [(f"compile {c['arch']}", c["verdict"], "") for c in r.get("compile", [])]
        cases += [(gate, g["verdict"], g.get("message", "")) for gate, g in r.get("gates", {}).items()]
        if r.get("wire"):
            cases.append(("wire", r["wire"]["verdict"], r["wire"].get("message", "")))
        failures = sum(v in ("fail", "hang", "crash") for _, v, _ in cases)
        skipped = sum(v not in ("pass", "fail", "hang", "crash") for _, v, _ in cases)
        lines.append(f"  <testsuite name={quoteattr(r['kernel'])} tests=\"{len(cases)}\" "
                     f"failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\">")
        for name, verdict, message in cases:
            lines.append(f"    <testcase classname={quoteattr('mpkbuild.' + r['kernel'])} name={quoteattr(name)}>")
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
    review["plot_note"] = perf_report.write_plot(review, md_path.with_name(perf_report.PLOT_NAME))
    review["plot"] = None if review["plot_note"] else perf_report.PLOT_NAME
    write_json_atomic(json_path, review)
    if junit_path is not None:
        write_atomic(junit_path, junit_xml([review]))
    write_atomic(md_path, render_kernel(review))


def write_summary(review_jsons: list[Path], md_path: Path, junit_path: Path | None = None) -> None:
    reviews = [json.loads(p.read_text()) for p in review_jsons]
    if junit_path is not None:
        write_atomic(junit_path, junit_xml(reviews))
    # a column per gate of the table the reviews have (wire, and the runtime gate only where
    # some review ran it: a gate no kernel had is no column of "not run")
    columns = ["wire"] * any(r.get("wire") for r in reviews) + [
        g for g in GPU_GATES if any(g in r["gates"] for r in reviews)]
    rows = [{"kernel": r["kernel"], "overall": r["overall"],
             "compile": {c["arch"]: c["verdict"] for c in r["compile"]},
             "gates": {**{g: v["verdict"] for g, v in r["gates"].items()},
                       **({"wire": r["wire"]["verdict"]} if r.get("wire") else {})},
             # None: no perf figures to compare; [] : every variant at or below torch
             "slower": ([f"{x['variant']} {x['ratio_hot']:.2f}×" for x in r["gates"]["perf"]["slower_than_baseline"]]
                        if "slower_than_baseline" in r["gates"].get("perf", {}) else None),
             "link": _rel(Path(p).with_name("review.md"), md_path.parent)}
            for r, p in zip(reviews, review_jsons)]
    write_atomic(md_path, render_template(config.TEMPLATE_DIR / "summary.md.j2",
                                          {"rows": rows, "columns": columns}))


# ---------------------------------------------------------------- the stage's nodes
def nodes(g, k, stage: str) -> None:
    sources = [k.rel.resources(a) for a in k.archs]
    if k.has_wiring:
        sources.append(k.rel.wire_result)
    # the gates the graph has for k (the runtime gate exists only with mpk_root=)
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
                         json.loads(info.get("MPK_WAITS") or "{}"))
    # the inputs' signatures: the data changes whenever an input did, so the summary that
    # reads it re-runs exactly when a review ran (the exact dry run relies on that)
    if k.tuned:
        path = k.root / k.tuned["path"]
        data["tune"] = tune_review(read_json(path), k.base.data["codegen"],
                                   {n: l["default"] for n, l in k.spec.data["codegen"].get("levers", {}).items()},
                                   _rel(path, k.build_dir))
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

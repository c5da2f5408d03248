"""The review stage: one page per kernel and a summary over kernels, from the gate results.

Data first (:func:`kernel_review`), text second (the jinja2 templates): the same dict can
feed other views. Every verdict shown comes from a result file; a gate without one is
shown as not run, never as passed.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from mpkbuild.model.graph import Node
from mpkbuild.model.kernel import summary_file
from mpkbuild.stages.generate import render_template
from mpkbuild.util import config
from mpkbuild.util.fsutil import read_json, write_atomic, write_json_atomic




def _rel(path: Path, start: Path) -> str:
    return os.path.relpath(path, start)


def kernel_review(name: str, build_dir: Path, archs, gpu_key: str | None,
                  resources: dict[str, Path], results: dict[str, Path],
                  wire_result: Path | None = None) -> dict:
    """Everything review.md shows for one kernel."""
    compile_rows = []
    for arch in archs:
        res = read_json(resources[arch])
        compile_rows.append({
            "arch": arch, "verdict": res["verdict"] if res else "not run",
            "toolchain": res["toolchain"] if res else "",
            "log": _rel(resources[arch].with_name("compile.log"), build_dir),
            "variants": res["variants"] if res else {}})
    gates = {}
    for gate, path in results.items():
        res = read_json(path)
        gates[gate] = {
            "verdict": res["verdict"] if res else "not run",
            "message": (res or {}).get("message", "no result: the gate has not run on this GPU"),
            "result": res or {},
            "log": _rel(path.with_suffix(".log"), build_dir),
            "json": _rel(path, build_dir)}
        if gate == "perf" and res:
            gates[gate]["slower_than_baseline"] = slower_than_baseline(res)
    wire = None
    if wire_result is not None:
        res = read_json(wire_result)
        wire = {"verdict": res["verdict"] if res else "not run",
                "message": (res or {}).get("message", "the wire stage has not run"),
                "numbers": (res or {}).get("numbers", {}), "fragments": sorted((res or {}).get("fragments", {})),
                "json": _rel(wire_result, build_dir)}
    verdicts = [r["verdict"] for r in compile_rows] + [g["verdict"] for g in gates.values()]
    overall = "pass" if verdicts and all(v == "pass" for v in verdicts) else \
        ("fail" if any(v in ("fail", "hang", "crash") for v in verdicts) else "incomplete")
    return {"kernel": name, "gpu_key": gpu_key, "compile": compile_rows, "gates": gates,
            "wire": wire, "overall": overall}


def slower_than_baseline(perf: dict) -> list[dict]:
    """Variants whose hot time is above the torch baseline's, with both figures (hot and
    cold) and the time limit the spec holds each to: the review says where the kernel does
    not beat torch, with the numbers, rather than leave it to a ratio in a table."""
    rows = []
    for name, r in (perf.get("variants") or {}).items():
        if not isinstance(r.get("vs_baseline_hot"), (int, float)) or r["vs_baseline_hot"] <= 1.0:
            continue
        limits = [rule for rule in r.get("limits", []) if "max_time_vs_baseline" in rule]
        tightest = min(limits, key=lambda rule: rule["max_time_vs_baseline"], default=None)
        rows.append({"variant": name, "hot_us": r["hot"]["median_us"],
                     "baseline_hot_us": r["baseline_hot"]["median_us"], "ratio_hot": r["vs_baseline_hot"],
                     "cold_us": (r.get("cold") or {}).get("median_us"),
                     "baseline_cold_us": (r.get("baseline_cold") or {}).get("median_us"),
                     "ratio_cold": r.get("vs_baseline_cold"),
                     "limit": tightest["max_time_vs_baseline"] if tightest else None,
                     "limit_figure": tightest.get("time_figure", "hot") if tightest else None,
                     "rules": [rule["variants"] for rule in limits]})
    return rows


def limits_text(limits: list[dict]) -> str:
    parts = []
    for rule in limits or []:
        cold = " (cold)" if rule.get("time_figure") == "cold" else ""
        if "max_time_vs_baseline" in rule:
            parts.append(f"≤ {rule['max_time_vs_baseline']:g}× torch{cold}")
        if "min_bandwidth_fraction" in rule:
            parts.append(f"≥ {rule['min_bandwidth_fraction']:.0%} BW")
        if "max_us" in rule:
            parts.append(f"≤ {rule['max_us']:g} µs{cold}")
    return ", ".join(parts) or "—"


def _fmt_us(x) -> str:
    return f"{x:.2f}" if isinstance(x, (int, float)) else "—"


def render_kernel(review: dict) -> str:
    return render_template(config.TEMPLATE_DIR / "review.md.j2",
                           {"r": review, "us": _fmt_us, "limits": limits_text})


def write_kernel_review(review: dict, md_path: Path, json_path: Path) -> None:
    write_json_atomic(json_path, review)
    write_atomic(md_path, render_kernel(review))


def write_summary(review_jsons: list[Path], md_path: Path) -> None:
    reviews = [json.loads(p.read_text()) for p in review_jsons]
    rows = [{"kernel": r["kernel"], "overall": r["overall"],
             "compile": {c["arch"]: c["verdict"] for c in r["compile"]},
             "gates": {g: v["verdict"] for g, v in r["gates"].items()},
             # None: no perf figures to compare; [] : every variant at or below torch
             "slower": ([f"{x['variant']} {x['ratio_hot']:.2f}×" for x in r["gates"]["perf"]["slower_than_baseline"]]
                        if "slower_than_baseline" in r["gates"].get("perf", {}) else None),
             "link": _rel(Path(p).with_name("review.md"), md_path.parent)}
            for r, p in zip(reviews, review_jsons)]
    write_atomic(md_path, render_template(config.TEMPLATE_DIR / "summary.md.j2", {"rows": rows}))


# ---------------------------------------------------------------- the stage's nodes
def nodes(g, k, stage: str) -> None:
    from mpkbuild.stages import GPU_GATES
    sources = [g.rel(k.resources(a)) for a in k.archs]
    if k.has_wiring:
        sources.append(g.rel(k.wire_result))
    # the runtime gate exists only with mpk_root= (stages/runtime.py)
    gates = [gate for gate in GPU_GATES if gate != "runtime" or g.requested.get((k.name, gate))]
    sources += [g.rel(k.gate_result(gate, g.gpu_key)) for gate in gates]
    node = g.add(Node(f"review {k.name}", "review", stage, k.name,
                      (g.rel(k.review), g.rel(k.review.with_suffix(".json"))),
                      (*sources, g.pkg("stages", "review.py"), g.pkg("templates", "review.md.j2"))))
    checks = [g.rel(k.gate_stamp(gate, g.gpu_key)) for gate in gates]
    g.requested[(k.name, stage)] = [*node.targets, *checks]


def shared_nodes(g, kernels, with_summary: bool) -> None:
    """The summary over kernels (when every kernel is built)."""
    if not with_summary:
        return
    review_jsons = [g.rel(k.review.with_suffix(".json")) for k in kernels]
    node = g.add(Node("review summary", "summary", "review", None, (g.rel(summary_file(g.root)),),
                      (*review_jsons, g.pkg("stages", "review.py"), g.pkg("templates", "summary.md.j2"))))
    g.summary_targets = list(node.targets)


def run_review(build, info, target, source) -> int:
    from mpkbuild.stages import GPU_GATES
    from mpkbuild.stages.gates import lock_for
    from mpkbuild.stages.generate import TemplateError
    k = build.kernels[info["MPK_KERNEL"]]
    key = info["MPK_GPU_KEY"]
    data = kernel_review(k.name, k.build_dir, k.archs, key, {a: k.resources(a) for a in k.archs},
                         {g: k.gate_result(g, key) for g in GPU_GATES},
                         k.wire_result if k.has_wiring else None)
    # the inputs' signatures: the data changes whenever an input did, so the summary that
    # reads it re-runs exactly when a review ran (the exact dry run relies on that)
    data["inputs"] = lock_for(source, k.root)
    try:
        write_kernel_review(data, Path(target[0].abspath), Path(target[1].abspath))
    except TemplateError as exc:
        return build.fail(str(exc))
    return 0


def run_summary(build, info, target, source) -> int:
    write_summary([Path(s.abspath) for s in source if s.abspath.endswith(".json")],
                  Path(target[0].abspath))
    return 0


def predict(node, k, predictor) -> None:
    return None


ACTIONS = {"review": run_review, "summary": run_summary}

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
from mpkbuild.stages.tune import spec_measurements
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
        if gate == "runtime" and res:
            gates[gate]["table"] = runtime_table(res, read_json(results["perf"]) if "perf" in results else None)
        if gate == "perf" and res:
            gates[gate]["slower_than_baseline"] = slower_than_baseline(res)
            gates[gate]["table"] = perf_table(res)
            gates[gate]["against_fastest"] = against_fastest(res)
            gates[gate]["state"] = gpu_state_text(res.get("gpu_state"))
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


def _cfg(values: dict | None) -> str:
    return " ".join(f"{k}={('on' if v else 'off') if isinstance(v, bool) else v}"
                    for k, v in (values or {}).items())


def _interval_us(e: dict | None) -> str | None:
    t = (e or {}).get("time_us")
    return f"{t['median']:.2f} [{t['lo']:.2f}, {t['hi']:.2f}]" if t else None


def tune_review(record: dict | None, codegen: dict, applied: dict | None, link: str) -> dict | None:
    """What won, what lost and by how much, per tuned variant; the levers' state."""
    if not record:
        return None
    levers = {name: {"default": bool(l.get("default")), "applied": bool((applied or {}).get(name, l.get("default"))),
                     "tuned": ("on" if record.get("levers", {}).get(name) else "off")
                     if name in record.get("levers", {}) else "not in the space"}
              for name, l in codegen.get("levers", {}).items()}
    variants = {}
    for v, w in (record.get("variants") or {}).items():
        rows = record.get("ledger", {}).get(v, [])
        losers = sorted((e for e in rows if e.get("cid") != w.get("cid") or e.get("cid") is None),
                        key=lambda e: (e.get("verdict") != "timed", e.get("vs_winner") or 0))
        timed = [e for e in losers if e.get("verdict") == "timed"]
        spec = next((e for e in rows if e.get("current")), None)
        variants[v] = {
            "config": _cfg(w.get("config")), "spec": _cfg(w.get("spec")), "from": w.get("from"),
            "time": _interval_us(w),
            # the spec's config, timed first and again after the others (stages/tune.py)
            "spec_times": [t for t in map(_interval_us, spec_measurements(spec)) if t] if spec else [],
            "vs_spec": f"{w['vs_spec']:.3f}×" if w.get("vs_spec") else None,
            "runner_up": (f"{_cfg(timed[0]['config'])}, +{100 * (timed[0]['vs_winner'] - 1):.1f}%"
                          if timed and timed[0].get("vs_winner") else None),
            "rejected": sum(1 for e in rows if e.get("verdict") == "rejected"),
            "losers": [{"config": _cfg(e.get("config")), "verdict": e.get("verdict"),
                        "time": _interval_us(e),
                        "vs_winner": f"{e['vs_winner']:.3f}×" if e.get("vs_winner") else None,
                        "message": (e.get("message") or "").replace("|", "/")[:160]} for e in losers]}
    return {"verdict": record.get("verdict", "?"), "message": record.get("message", ""),
            "figure": record.get("figure"), "interval": record.get("interval"), "levers": levers,
            "variants": variants, "file": link.rsplit("/", 1)[-1], "link": link}


def _range(values) -> list[float] | None:
    vals = [v for v in values or [] if isinstance(v, (int, float))]
    return [min(vals), max(vals)] if len(vals) >= 2 else None


def runtime_table(rt: dict, perf: dict | None) -> list[dict]:
    """One row per graph of the runtime gate: the in-runtime slowest task (median over the
    iterations, and its range) and median task, beside the harness's slowCTA (perf.json:
    median over its repeats, and its range).

    Noise, as judged here: each figure's spread is the range of its own repeated
    measurements (the slowest task of each runtime iteration; the slowest task of each
    harness repeat). A difference is flagged only when the two ranges do not overlap; with
    no range on either side (fewer than 2 measurements, or a perf.json from before the range
    was recorded) it is not judged. Overlap is not sameness: the runtime has few iterations,
    so its range is narrow, and the two run the task differently (the harness one block per
    task, the runtime's workers taking tasks from queues), so a flag says "look", not "bug"."""
    harness = (perf or {}).get("variants") or {}
    rows = []
    for name, r in (rt.get("variants") or {}).items():
        spans = r.get("spans") or {}
        h = (harness.get(name) or {}).get("slowcta") or {}
        row = {"variant": name, "verdict": r.get("verdict"), "tasks": r.get("tasks"),
               "iterations": r.get("iterations"),
               "slowest_us": spans.get("slowest_task_us"), "median_us": spans.get("median_us"),
               "range": _range(spans.get("per_iteration_slowest_us")),
               "harness_us": h.get("slowest_task_us"),
               "harness_range": h.get("slowest_range_us") if _range(h.get("slowest_range_us")) else None,
               "ratio": None, "flag": "not judged"}
        if isinstance(row["slowest_us"], (int, float)) and isinstance(row["harness_us"], (int, float)) \
                and row["harness_us"] > 0:
            row["ratio"] = row["slowest_us"] / row["harness_us"]
        if row["harness_us"] is None:
            row["flag"] = "no harness figure" if not name.startswith("chain:") else "chain (no harness figure)"
        elif row["range"] and row["harness_range"]:
            (a0, a1), (b0, b1) = row["range"], row["harness_range"]
            row["flag"] = ("runtime slower" if a0 > b1 else "runtime faster" if a1 < b0
                           else "within noise")
        rows.append(row)
    return rows


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


def _cmp(c) -> dict | None:
    if not c:
        return None
    return {"ratio": c.get("ratio"), "lo": c.get("lo"), "hi": c.get("hi"), "verdict": c.get("verdict"),
            "point": bool(c.get("point"))}


def perf_table(perf: dict) -> list[dict]:
    """One row per variant: ours hot/cold with their intervals, each baseline's time and its
    comparison (ratio, interval, faster/slower/same/unsure), the ceiling, the delta to the
    last accepted result, how the sampling ended."""
    from mpkbuild.stages.perfcheck import comparisons, time_interval
    rows = []
    for name, r in (perf.get("variants") or {}).items():
        vs = r.get("vs") or comparisons(r)
        row = {"variant": name, "figures": {}, "baselines": {}, "ceiling": r.get("ceiling"),
               "bw": {fig: r.get(f"{fig}_bandwidth_fraction") for fig in ("hot", "cold")},
               "history": r.get("history") or {}, "sampling": {}}
        for fig in ("hot", "cold"):
            if fig in r:
                med, lo, hi = time_interval(r[fig])
                row["figures"][fig] = {"us": med, "lo": lo, "hi": hi}
                smp = r[fig].get("sampling")
                if smp:
                    row["sampling"][fig] = {"samples": smp.get("samples"), "stop": smp.get("stop"),
                                            "half_width": smp.get("half_width"),
                                            "rejected": len(smp.get("rejected") or []),
                                            "clock_floor_mhz": smp.get("clock_floor_mhz"),
                                            "note": smp.get("clock_note")}
        names = list(r.get("baselines") or {}) or list(vs)
        for b in names:
            raw = (r.get("baselines") or {}).get(b) or {}
            entry = {"compile_s": raw.get("compile_s")}
            if raw.get("error"):
                entry["error"] = raw["error"]
            for fig in ("hot", "cold"):
                from mpkbuild.stages.perfcheck import baseline_figure
                bf = baseline_figure(r, b, fig)
                if bf:
                    entry[fig] = {"us": bf["median_us"], "vs": _cmp((vs.get(b) or {}).get(fig))}
            row["baselines"][b] = entry
        rows.append(row)
    return rows


def against_fastest(perf: dict) -> list[dict]:
    """Per variant and figure, the fastest baseline and how ours compares with it: the
    review says where the kernel is not faster than the best a user could pick."""
    out = []
    for row in perf_table(perf):
        for fig in ("hot", "cold"):
            timed = [(b, e[fig]) for b, e in row["baselines"].items() if fig in e]
            if not timed or fig not in row["figures"]:
                continue
            name, best = min(timed, key=lambda t: t[1]["us"])
            c = best["vs"] or {}
            out.append({"variant": row["variant"], "figure": fig, "baseline": name,
                        "baseline_us": best["us"], "us": row["figures"][fig]["us"],
                        "ratio": c.get("ratio"), "lo": c.get("lo"), "hi": c.get("hi"),
                        "point": c.get("point", False), "verdict": c.get("verdict", "unsure")})
    return out


def gpu_state_text(state: dict | None) -> list[str]:
    lines = []
    for when in ("start", "end"):
        s = (state or {}).get(when)
        if not s:
            continue
        if not s.get("available"):
            lines.append(f"{when}: {s.get('why') or 'NVML unavailable'}")
            continue
        reasons = ", ".join(s.get("throttle_reasons") or []) or "none"
        lines.append(f"{when}: SM {s.get('sm_clock_mhz')}/{s.get('max_sm_clock_mhz')} MHz, memory "
                     f"{s.get('mem_clock_mhz')}/{s.get('max_mem_clock_mhz')} MHz, {s.get('power_w')} W of "
                     f"{s.get('power_limit_w')} W limit, {s.get('temperature_c')} C, throttle: {reasons}")
    return lines


def ratio_text(c: dict | None) -> str:
    if not c or c.get("ratio") is None:
        return "—"
    if c.get("point"):
        return f"{c['ratio']:.2f}× {c['verdict']} (no interval)"
    return f"{c['ratio']:.3f}× [{c['lo']:.3f}, {c['hi']:.3f}] {c['verdict']}"


def limits_text(limits: list[dict]) -> str:
    parts = []
    for rule in limits or []:
        cold = " (cold)" if rule.get("time_figure") == "cold" else ""
        if "max_time_vs_baseline" in rule:
            parts.append(f"≤ {rule['max_time_vs_baseline']:g}× {rule.get('baseline', 'torch')}{cold}")
        if "min_bandwidth_fraction" in rule:
            parts.append(f"≥ {rule['min_bandwidth_fraction']:.0%} BW")
        if "max_us" in rule:
            parts.append(f"≤ {rule['max_us']:g} µs{cold}")
    return ", ".join(parts) or "—"


def _fmt_us(x) -> str:
    return f"{x:.2f}" if isinstance(x, (int, float)) else "—"


def render_kernel(review: dict) -> str:
    return render_template(config.TEMPLATE_DIR / "review.md.j2",
                           {"r": review, "us": _fmt_us, "limits": limits_text, "ratio": ratio_text})


PLOT_NAME = "perf.png"


def write_plot(review: dict, path: Path) -> str | None:
    """ours vs each baseline vs the ceiling, per variant (hot, and cold where timed), as a
    PNG beside review.md. Returns None when written, else why not (matplotlib missing, no
    perf figures): the review shows that note instead of the picture."""
    table = (review.get("gates", {}).get("perf") or {}).get("table")
    if not table:
        return "no perf figures"
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed here (`pip install matplotlib`): no picture"
    names = [row["variant"] for row in table]
    figs = [f for f in ("hot", "cold") if any(f in row["figures"] for row in table)]
    baselines = list(dict.fromkeys(b for row in table for b in row["baselines"]))
    fig, axes = plt.subplots(len(figs), 1, figsize=(max(6, 0.9 * len(names) + 2), 3.2 * len(figs)),
                             squeeze=False)
    width = 0.8 / (1 + len(baselines))
    for ax, f in zip(axes[:, 0], figs):
        series = [("ours", [row["figures"].get(f, {}).get("us") for row in table])]
        series += [(b, [(row["baselines"].get(b, {}).get(f) or {}).get("us") for row in table]) for b in baselines]
        for i, (label, values) in enumerate(series):
            xs = [j + (i - len(series) / 2 + 0.5) * width for j in range(len(names))]
            ax.bar([x for x, v in zip(xs, values) if v], [v for v in values if v], width, label=label)
        floor = [(row["figures"].get(f, {}).get("us") or 0) * (row["bw"].get(f) or 0) for row in table]
        ax.scatter(range(len(names)), [v if v else float("nan") for v in floor], marker="_", s=400,
                   color="black", zorder=3, label="ceiling (bytes / ceiling BW)")
        ax.set_yscale("log")
        ax.set_ylabel(f"{f} µs / launch")
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=7)
        ax.legend(fontsize=7)
    axes[0, 0].set_title(f"{review['kernel']} on {review.get('gpu_key')}: ours vs baselines vs ceiling")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return None


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
    review["plot_note"] = write_plot(review, md_path.with_name(PLOT_NAME))
    review["plot"] = None if review["plot_note"] else PLOT_NAME
    write_json_atomic(json_path, review)
    if junit_path is not None:
        write_atomic(junit_path, junit_xml([review]))
    write_atomic(md_path, render_kernel(review))


def write_summary(review_jsons: list[Path], md_path: Path, junit_path: Path | None = None) -> None:
    reviews = [json.loads(p.read_text()) for p in review_jsons]
    if junit_path is not None:
        write_atomic(junit_path, junit_xml(reviews))
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
    sources = [k.rel.resources(a) for a in k.archs]
    if k.has_wiring:
        sources.append(k.rel.wire_result)
    # the runtime gate exists only with mpk_root= (stages/runtime.py)
    gates = [gate for gate in GPU_GATES if gate != "runtime" or g.requested.get((k.name, gate))]
    sources += [k.rel.gate_result(gate, g.gpu_key) for gate in gates]
    from mpkbuild.stages.tune import tuned_fact
    # the tuned file is read (not depended on as a file: it is the tune stage's target, and
    # review does not run the tune): its hash is a fact, so a new tune re-runs the review
    node = g.add(Node(f"review {k.name}", "review", stage, k.name,
                      (k.rel.review, k.rel.review_json, k.rel.junit),
                      (*sources, g.pkg("stages", "review.py"), g.pkg("templates", "review.md.j2")),
                      tuned_fact(k)))
    checks = [k.rel.gate_stamp(gate, g.gpu_key) for gate in gates]
    g.requested[(k.name, stage)] = [*node.targets, *checks]


def shared_nodes(g, kernels, with_summary: bool) -> None:
    """The summary over kernels (when every kernel is built)."""
    if not with_summary:
        return
    review_jsons = [k.rel.review_json for k in kernels]
    node = g.add(Node("review summary", "summary", "review", None,
                      (g.rel(summary_file(g.root)), g.rel(summary_file(g.root).with_name("junit.xml"))),
                      (*review_jsons, g.pkg("stages", "review.py"), g.pkg("templates", "summary.md.j2"))))
    g.summary_targets = list(node.targets)


def run_review(build, info, target, source) -> int:
    from mpkbuild.stages import GPU_GATES
    from mpkbuild.stages.gates import lock_for
    from mpkbuild.stages.generate import TemplateError
    k = build.kernels[info["MPK_KERNEL"]]
    key = info["MPK_GPU_KEY"]
    # the gates this node reads (the runtime gate only with mpk_root=): a gate the build
    # has no node for is not shown as "not run", which would make the kernel incomplete
    read = {os.path.realpath(s.abspath) for s in source if hasattr(s, "abspath")}   # files, not facts
    results = {g: k.gate_result(g, key) for g in GPU_GATES
               if g != "runtime" or os.path.realpath(k.gate_result(g, key)) in read}
    data = kernel_review(k.name, k.build_dir, k.archs, key, {a: k.resources(a) for a in k.archs},
                         results,
                         k.wire_result if k.has_wiring else None)
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
    write_summary([Path(s.abspath) for s in source if s.abspath.endswith(".json")],
                  Path(target[0].abspath), Path(target[1].abspath))
    return 0


def predict(node, k, predictor) -> None:
    return None


ACTIONS = {"review": run_review, "summary": run_summary}

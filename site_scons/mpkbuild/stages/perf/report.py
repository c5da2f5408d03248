"""The perf stage's part of the review and of status: its tables (ours against every
baseline, with intervals; where it is slower than a baseline; the fastest baseline), the
GPU's state, the picture, and status's line against the accepted results."""
from __future__ import annotations

from pathlib import Path

from mpkbuild.model.graph import Node
from mpkbuild.stages.perf.judge import baseline_figure, comparisons, time_interval
from mpkbuild.util.fsutil import ReadOnce

REVIEW = "review.md.j2"           # this gate's section of review.md: every figure and baseline
REVIEW_LEAD = None
# the tier of each figure it shows, and of those its verdict judges (stages.table.FIGURE_TIERS)
TIERS: dict = {"hot": "diagnostic", "cold": "diagnostic", "slowcta": "TIER-2", "bandwidth": "diagnostic"}
DECIDES = "diagnostic"


def review(res: dict, results: dict) -> dict:
    """Its section, and the summary's column of the variants slower than torch."""
    part = section(res)
    slower = ", ".join(f"{x['variant']} {x['ratio_hot']:.2f}×" for x in part["slower_than_baseline"])
    return {**part, "cells": {"slower than torch": slower}}


def section(res: dict) -> dict:
    """What the review shows of a perf result beyond its verdict."""
    return {"slower_than_baseline": slower_than_baseline(res), "table": perf_table(res),
            "against_fastest": against_fastest(res), "placements": placement_rows(res),
            "bandwidth_marks": bandwidth_marks(res), "state": gpu_state_text(res.get("gpu_state"))}


def dram_figures(r: dict) -> tuple[str, ...]:
    """The timed figures of a variant that must come from DRAM, so that its ceiling holds
    them: cold, and hot unless one launch's working set is known to fit in the L2 (its
    replays may then be served from the L2 and read above any DRAM ceiling)."""
    hp = r.get("hot_placements") or {}
    in_l2 = bool(hp.get("working_set_bytes")) and hp["working_set_bytes"] <= hp.get("l2_bytes", 0)
    return tuple(fig for fig in ("hot", "cold") if fig in r and not (fig == "hot" and in_l2))


def bandwidth_marks(perf: dict) -> dict[str, dict[str, str]]:
    """Per variant and figure, what the review writes after its bandwidth: " (in L2)" for a
    hot figure that need not reach DRAM, " (above the ceiling)" for a DRAM figure over 100%
    (the GPU's measured ceiling for the mix is then not one)."""
    marks = {}
    for name, r in (perf.get("variants") or {}).items():
        dram = dram_figures(r)
        marks[name] = {fig: (" (in L2)" if fig not in dram else
                             " (above the ceiling)" if r.get(f"{fig}_bandwidth_fraction", 0.0) > 1.0 else "")
                       for fig in ("hot", "cold") if fig in r}
    return marks


def placement_rows(perf: dict) -> list[dict]:
    """Per variant timed over buffer placements: each placement's hot time with its
    interval, the spread, which one is judged, each baseline's ratio per placement, and
    whether the working set is near the L2 size (placement-sensitive)."""
    rows = []
    for name, r in (perf.get("variants") or {}).items():
        hp = r.get("hot_placements")
        if not hp:
            continue
        entries = []
        for e in hp["placements"]:
            med, lo, hi = time_interval(e["kernel"])
            entries.append({"placement": e["placement"], "us": med, "lo": lo, "hi": hi,
                            "ratios": {b: x["ratio"] for b, x in e["baselines"].items()}})
        meds = [e["us"] for e in entries]
        ws, l2 = hp.get("working_set_bytes"), hp.get("l2_bytes")
        rows.append({"variant": name, "statistic": hp["statistic"], "entries": entries,
                     "spread": max(meds) / min(meds) if min(meds) > 0 else None,
                     "judged": r["hot"].get("placement"), "sensitive": bool(hp.get("sensitive")),
                     "working_set_mib": ws / 2**20 if ws else None,
                     "l2_fraction": ws / l2 if ws and l2 else None})
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


PLOT_NAME = "perf.png"


def files(review: dict, folder: Path) -> dict:
    """The picture beside review.md, or the note saying why there is none."""
    note = write_plot(review, folder / PLOT_NAME)
    return {"plot_note": note, "plot": None if note else PLOT_NAME}


FILES = files                     # what it writes beside review.md (the picture)


def write_plot(review: dict, path: Path) -> str | None:
    """ours vs each baseline vs the ceiling, per variant (hot, and cold where timed), as a
    PNG beside review.md. Returns None when written, else why not (matplotlib missing, no
    perf figures): the review shows that note instead of the picture."""
    table = (review.get("parts", {}).get("perf") or {}).get("table")
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


def status_note(root: Path, node: Node, files: ReadOnce | None = None) -> str | None:
    """One line: the last perf result's times over the last accepted ones (perf_history/),
    the largest change per figure with its interval, and the regressions it confirmed."""
    res = (files or ReadOnce(root)).json(node.targets[0])
    if res is None or "history" not in res:
        return None
    hist = res.get("history")
    if not hist:
        return "no accepted result for this GPU (python -m mpkbuild.stages.perf.ledger accept " + f"{node.kernel})"
    parts = []
    for fig in ("hot", "cold"):
        ds = [(name, v["history"][fig]) for name, v in (res.get("variants") or {}).items()
              if fig in (v.get("history") or {})]
        if not ds:
            continue
        name, d = max(ds, key=lambda t: abs(t[1]["ratio"] - 1.0))
        worse = sum(d2["verdict"] in ("slower", "regressed") for _, d2 in ds)
        better = sum(d2["verdict"] == "faster" for _, d2 in ds)
        unsure = sum(d2["verdict"] in ("unsure", "unconfirmed") for _, d2 in ds)
        shown = "" if any(d2.get("judged", True) for _, d2 in ds) else " (shown, not judged)"
        parts.append(f"{fig}{shown} {better} faster, {worse} slower{f', {unsure} unsure' if unsure else ''} "
                     f"of {len(ds)}; largest {name} "
                     f"{d['ratio']:.3f}x [{d['lo']:.3f}, {d['hi']:.3f}] {d['verdict']}")
    regs = len(hist.get("regressions") or [])
    return (f"vs accepted {hist.get('accepted')}: " + "; ".join(parts) +
            f"; {regs} regression{'s' if regs != 1 else ''} confirmed")


# every review template may call these (the runtime gate's lead shows ratios and limits too)
HELPERS = {"limits": limits_text, "ratio": ratio_text}

"""The runtime gate's part of the review: per graph, the in-runtime slowCTA and median task
beside the harness's slowCTA, flagged where their ranges do not overlap."""
from __future__ import annotations

from mpkbuild.wire.incumbents import BLOCK_PREFIX

REVIEW = "review.md.j2"           # this gate's section of review.md: in-runtime vs harness
REVIEW_LEAD = "review_lead.md.j2"  # first on the page: the verdict inside MPK, head to head
# the tier of each figure it shows, and of those its verdict judges (stages.table.FIGURE_TIERS)
TIERS: dict = {"makespan": "TIER-1", "slowcta": "TIER-1", "median task": "TIER-1"}
DECIDES = "TIER-1"
HELPERS: dict = {}                # functions every review template may call
FILES = None                      # no file of its own beside review.md


def review(res: dict, results: dict) -> dict:
    """What the review shows of a runtime result beyond its verdict, beside perf's (results:
    every gate result the review reads, by stage)."""
    perf = results.get("perf")
    cold = any((r.get("head_to_head") or {}).get("hot") for r in (res.get("variants") or {}).values())
    return {"table": runtime_table(res, perf), "head_to_head": head_to_head_table(res, perf), "cold": cold}


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
            row["flag"] = "no harness figure" if not name.startswith(BLOCK_PREFIX) else "block (no harness figure)"
        elif row["range"] and row["harness_range"]:
            (a0, a1), (b0, b1) = row["range"], row["harness_range"]
            row["flag"] = ("runtime slower" if a0 > b1 else "runtime faster" if a1 < b0
                           else "within noise")
        rows.append(row)
    return rows


def _interval(fig: dict | None) -> dict | None:
    return {"us": fig["median"], "lo": fig["lo"], "hi": fig["hi"]} if fig else None


def head_to_head_table(rt: dict, perf: dict | None) -> list[dict]:
    """The runtime gate's verdict rows: per variant and incumbent, ours and the incumbent's
    in-runtime makespan and slowCTA with their intervals, ours / incumbent (ratio, interval,
    faster / slower / same / unsure), the numerics against the incumbent, and the harness's
    comparison with the fastest torch baseline (perf.json) beside it as corroboration,
    flagged where the two point opposite ways. A variant without an incumbent says why."""
    from mpkbuild.stages.perf.report import against_fastest
    harness = {}
    for row in against_fastest(perf or {}):
        if row["figure"] == "hot":
            harness[row["variant"]] = row
    rows = []
    for name, r in (rt.get("variants") or {}).items():
        h2h = r.get("head_to_head") or {}
        h = harness.get(name)
        for inc, x in (h2h.get("incumbents") or {}).items():
            figs = x.get("figures") or {}
            ours = h2h.get("ours_figures") or {}
            vs = x.get("vs") or {}
            row = {"variant": name, "incumbent": inc, "tasks": r.get("tasks"), "incumbent_tasks": x.get("tasks"),
                   "makespan": _interval(ours.get("makespan")), "incumbent_makespan": _interval(figs.get("makespan")),
                   "slowcta": _interval(ours.get("slowcta")), "incumbent_slowcta": _interval(figs.get("slowcta")),
                   "startspread": _interval(ours.get("startspread")),
                   "incumbent_startspread": _interval(figs.get("startspread")),
                   "dispatch": _interval(ours.get("dispatch")), "incumbent_dispatch": _interval(figs.get("dispatch")),
                   "vs_makespan": vs.get("makespan"), "vs_slowcta": vs.get("slowcta"),
                   "floor": (h2h.get("floor") or {}).get("makespan"),
                   "worker_effect": ((h2h.get("minimal") or {}).get("vs") or {}).get("makespan"),
                   "hot_vs_makespan": (((h2h.get("hot") or {}).get("incumbents") or {}).get(inc) or {})
                   .get("vs", {}).get("makespan"),
                   "numerics": {out: n.get("ours_vs_incumbent") for out, n in (x.get("numerics") or {}).items()},
                   "harness": h, "flag": ""}
            if x.get("worker") == "minimal":
                row["flag"] = "timed in the worker of the variant alone, against ours there"
            if not x.get("default", True) and (h2h.get("best") or {}).get(x.get("task")) == inc:
                row["flag"] = "; ".join(filter(None, [f"MPK's task at its best: {x['config']}", row["flag"]]))
            if h2h.get("hot") and x.get("default", True):       # cold: both sides stream from DRAM
                row["dram"] = dram_figures((perf or {}).get("variants", {}).get(name) or {},
                                           row["makespan"], row["incumbent_makespan"],
                                           [rule for rule in r.get("limits") or []
                                            if rule.get("incumbent") in (None, inc)
                                            and rule.get("against", "default") == "default"])
            verdict = (vs.get("makespan") or {}).get("verdict")
            if h and verdict in ("faster", "slower") and h["verdict"] in ("faster", "slower") \
                    and verdict != h["verdict"]:
                row["flag"] = (f"in-runtime {verdict} than {inc}, harness {h['verdict']} than "
                               f"{h['baseline']}")
            rows.append(row)
        for side, why in (h2h.get("dropped") or {}).items():
            rows.append({"variant": name, "incumbent": side, "why": f"left out, it disagrees with ours ({why})",
                         "harness": h})
        for m in r.get("no_incumbent") or []:
            rows.append({"variant": name, "incumbent": m["incumbent"] or "none", "why": m["why"],
                         "harness": h})
    return rows


def dram_figures(perf_variant: dict, ours: dict | None, theirs: dict | None, limits: list) -> dict | None:
    """A cold head to head in DRAM terms: the bytes the op moves (perf's count) over each
    side's makespan, the ceiling measured for its mix, and what each makespan rule's limit
    asks (the bytes over limit x the incumbent's makespan). A limit asking more than the
    ceiling is one no kernel is known to reach on this GPU: the review says so beside it."""
    nbytes, ceiling = perf_variant.get("bytes"), (perf_variant.get("ceiling") or {}).get("Bps")
    if not nbytes or not ceiling or not ours or not theirs or not ours["us"] or not theirs["us"]:
        return None
    tbps = lambda us: nbytes / (us * 1e-6) / 1e12              # noqa: E731
    asks = [{"limit": rule["max_vs_incumbent"], "tbps": tbps(rule["max_vs_incumbent"] * theirs["us"])}
            for rule in limits if rule.get("figure", "makespan") == "makespan" and "max_vs_incumbent" in rule]
    for a in asks:
        a["of_ceiling"] = a["tbps"] / (ceiling / 1e12)
    return {"ours_tbps": tbps(ours["us"]), "theirs_tbps": tbps(theirs["us"]), "ceiling_tbps": ceiling / 1e12,
            "asks": asks}


def status_note(root, node, files=None) -> str | None:
    """One line for `scons status`: the last runtime result against its incumbents, on the
    makespan: how many comparisons faster / slower / same / unsure, the closest one, and how
    many variants have no incumbent."""
    from mpkbuild.util.fsutil import ReadOnce
    res = (files or ReadOnce(root)).json(node.targets[0])
    if not res or not res.get("variants"):
        return None
    found, none = [], 0
    for name, r in res["variants"].items():
        for inc, x in ((r.get("head_to_head") or {}).get("incumbents") or {}).items():
            c = (x.get("vs") or {}).get("makespan")
            if c and c.get("ratio") is not None:
                found.append((name, inc, c))
        none += bool(r.get("no_incumbent"))
    if not found:
        return f"no head to head: {none} variants without an incumbent" if none else None
    words = [c["verdict"] for _, _, c in found]
    name, inc, c = max(found, key=lambda t: t[2]["ratio"])
    counts = ", ".join(f"{words.count(w)} {w}" for w in ("faster", "slower", "same", "unsure") if words.count(w))
    return (f"in-runtime vs incumbent (makespan): {counts} of {len(found)}; closest {name} vs {inc} "
            f"{c['ratio']:.3f}x [{c['lo']:.3f}, {c['hi']:.3f}]" + (f"; {none} without an incumbent" if none else ""))

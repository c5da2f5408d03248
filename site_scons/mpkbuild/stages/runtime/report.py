"""The runtime gate's part of the review: per graph, the in-runtime slowCTA and median task
beside the harness's slowCTA, flagged where their ranges do not overlap."""
from __future__ import annotations


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

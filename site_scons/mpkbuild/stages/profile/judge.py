"""The profile gate's verdict, made on the build side from ncu's figures: each variant's
bound, and whether it is the one the spec expects.

A variant is launch-bound when its duration is within `launch_factor` of the empty kernel's
(the launch floor measured in the same run): its time is the fixed cost of a launch, and no
change to its body shows. Otherwise the busiest unit against its ceiling bounds it: DRAM
against the GPU's measured bandwidth for the variant's read:write mix (the bandwidth node's,
util.perfspec.ceiling), the SMs against ncu's peak (sm__throughput: the busiest of the SM's
pipes and its memory units), each bounding at `bound_at` of its ceiling. A variant whose
busiest unit is below that is latency-bound: its warps wait (its top stall reasons say on
what). Standard library only: the build must not import torch.
"""
from __future__ import annotations

import fnmatch

from mpkbuild.util import perfspec

TOP_STALLS = 3


def classify(v: dict, ceilings: dict, floor_ns: float | None, bound_at: float, launch_factor: float) -> dict:
    """A variant's bound and the figures it was decided on."""
    ns = v.get("duration_ns") or 0.0
    read, write = v.get("dram_read_bytes") or 0.0, v.get("dram_write_bytes") or 0.0
    ceiling = perfspec.ceiling(ceilings, read, write)
    bps = (read + write) / (ns * 1e-9) if ns else 0.0
    dram = bps / ceiling["Bps"] if ceiling["Bps"] else 0.0
    sm = (v.get("sm_pct") or 0.0) / 100.0
    if floor_ns and ns <= launch_factor * floor_ns:
        bound, why = "launch", f"{ns / 1e3:.2f} µs is within {launch_factor:g}× the empty kernel's {floor_ns / 1e3:.2f} µs"
    elif max(dram, sm) >= bound_at:
        bound = "memory" if dram >= sm else "compute"
        why = (f"DRAM at {dram:.0%} of the measured {ceiling['mix']} ceiling" if bound == "memory"
               else f"SM throughput at {sm:.0%} of peak")
    else:
        bound, why = "latency", f"DRAM {dram:.0%} of its ceiling and SM {sm:.0%} of peak, both under {bound_at:.0%}"
    stalls = sorted(v.get("stalls", {}).items(), key=lambda kv: -kv[1])[:TOP_STALLS]
    return {"bound": bound, "why": why, "us": ns / 1e3, "dram_Bps": bps, "dram_of_ceiling": dram,
            "ceiling": ceiling, "sm_of_peak": sm, "occupancy_pct": v.get("occupancy_pct"),
            "top_stalls": [{"reason": r, "warps_per_issue": x} for r, x in stalls]}


def expected(spec: dict, payload: dict) -> list[str]:
    """What the thresholds are judged over: the profiled variants."""
    from mpkbuild.stages.profile.section import chosen
    return chosen(spec)


def judge(result: dict, thresholds: dict, expected: list[str], **_ignored) -> dict:
    """A `profiled` result into pass or fail: every expected bound met; anything else (a
    runner's crash, `unavailable`) is returned as it is."""
    if result.get("verdict") != "profiled":
        return result
    ceilings = {"copy_bandwidth_Bps": result["copy_bandwidth_Bps"], "ceilings_Bps": result.get("ceilings_Bps")}
    variants = {name: {**result["variants"][name],
                       **classify(result["variants"][name], ceilings, result.get("floor_ns"),
                                  thresholds["bound_at"], thresholds["launch_factor"])}
                for name in expected if name in result["variants"]}
    problems = []
    for rule in thresholds["expect"]:
        allowed = [rule["bound"]] if isinstance(rule["bound"], str) else list(rule["bound"])
        for name in fnmatch.filter(list(variants), rule["variants"]):
            v = variants[name]
            v.setdefault("expected", allowed)
            if v["bound"] not in allowed:
                problems.append(f"{name}: expected {' or '.join(allowed)}-bound, measured "
                                f"{v['bound']}-bound ({v['why']})")
    counts = {}
    for v in variants.values():
        counts[v["bound"]] = counts.get(v["bound"], 0) + 1
    summary = ", ".join(f"{n} {b}-bound" for b, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    if problems:
        message = f"{len(problems)} of {len(variants)} variants not bound as expected: " + "; ".join(problems)
    else:
        message = f"{len(variants)} variants profiled: {summary}"
    return {**result, "verdict": "fail" if problems else "pass", "variants": variants,
            "problems": problems, "bounds": counts, "message": message,
            "thresholds": thresholds}

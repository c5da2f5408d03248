"""The profile stage's part of the review: per profiled variant its bound, why, and the
figures ncu measured (review.md.j2 beside this module)."""
from __future__ import annotations

REVIEW = "review.md.j2"           # this gate's section of review.md, after its verdict line
REVIEW_LEAD = None
# the tier of each figure it shows, and of those its verdict judges (stages.table.FIGURE_TIERS)
TIERS: dict = {"ncu µs": "diagnostic", "DRAM": "diagnostic", "SM": "diagnostic"}
DECIDES = "diagnostic"
HELPERS: dict = {}                # functions every review template may call
FILES = None                      # no file of its own beside review.md


def review(res: dict, results: dict) -> dict:
    """The rows of the review's table, from a judged result (none from an unjudged one)."""
    rows = []
    for name, v in (res.get("variants") or {}).items():
        if "bound" not in v:
            continue
        rows.append({"variant": name, "bound": v["bound"], "why": v["why"], "us": v["us"],
                     "dram": f"{v['dram_Bps'] / 1e12:.2f} TB/s ({v['dram_of_ceiling']:.0%})",
                     "sm": f"{v['sm_of_peak']:.0%}",
                     "occupancy": "—" if v.get("occupancy_pct") is None else f"{v['occupancy_pct']:.0f}%",
                     "stalls": ", ".join(f"{s['reason']} {s['warps_per_issue']:.2f}" for s in v["top_stalls"]) or "—",
                     "expected": " or ".join(v["expected"]) if v.get("expected") else "—"})
    return {"rows": rows}

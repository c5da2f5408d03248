"""The validate stage's part of the review: per variant its worst cos and rel over the trials
(review.md.j2 beside this module, from the result alone)."""
from __future__ import annotations

REVIEW = "review.md.j2"           # this gate's section of review.md, after its verdict line
REVIEW_LEAD = None                # nothing before the compile section
# the tier of each figure it shows, and of those its verdict judges (stages.table.FIGURE_TIERS)
TIERS: dict = {}
DECIDES = None                    # a correctness verdict: it always counts
HELPERS: dict = {}                # functions every review template may call
FILES = None                      # no file of its own beside review.md


def review(res: dict, results: dict) -> dict:
    """What the review shows of a validate result beyond its verdict: the result is enough."""
    return {}

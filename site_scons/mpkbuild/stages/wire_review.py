"""The wire stage's part of the review: its verdict, the TaskType numbers it took and the
fragments it rendered (wire_review.md.j2). A kernel without wiring has no part."""
from __future__ import annotations

from mpkbuild.util.fsutil import read_json

REVIEW = "wire_review.md.j2"
REVIEW_LEAD = None
HELPERS: dict = {}                # functions every review template may call
FILES = None                      # no file of its own beside review.md


def review_sources(g, k) -> list[str]:
    return [k.rel.wire_result] if k.has_wiring else []


def part(inputs) -> dict | None:
    if inputs.wire_result is None:
        return None
    res = read_json(inputs.wire_result) or {}
    verdict = res.get("verdict", "not run")
    message = res.get("message", "the wire stage has not run")
    return {"verdict": verdict, "message": message, "numbers": res.get("numbers", {}),
            "fragments": sorted(res.get("fragments", {})), "json": inputs.rel(inputs.wire_result),
            # a wire that ran and failed (a clash, a checkout it cannot wire into) fails the
            # kernel's overall: it does not work on that tree; one not run (no mpk_root=, or
            # render only) leaves the overall to the gates
            "counted": [verdict] if verdict == "fail" else [],
            "cases": [["wire", verdict, message, None]], "cells": {"wire": verdict}}

"""The compile stage's part of the review: per target arch the resource gate's verdict and
toolchain, and each variant's registers, SMEM, stack and spills (compile_review.md.j2)."""
from __future__ import annotations

from mpkbuild.util.fsutil import read_json

REVIEW = "compile_review.md.j2"
REVIEW_LEAD = None
HELPERS: dict = {}                # functions every review template may call
FILES = None                      # no file of its own beside review.md


def review_sources(g, k) -> list[str]:
    """What the part reads: each arch's resources.json."""
    return [k.rel.resources(a) for a in k.archs]


def part(inputs) -> dict:
    rows = []
    for arch in inputs.archs:
        res = read_json(inputs.resources[arch])
        rows.append({"arch": arch, "verdict": res["verdict"] if res else "not run",
                     "toolchain": res["toolchain"] if res else "",
                     "log": inputs.rel(inputs.resources[arch].with_name("compile.log")),
                     "variants": res["variants"] if res else {}})
    return {"rows": rows, "counted": [r["verdict"] for r in rows],
            "cases": [[f"compile {r['arch']}", r["verdict"], "", None] for r in rows],
            "cells": {"compile": ", ".join(f"{r['arch']} {r['verdict']}" for r in rows)}}

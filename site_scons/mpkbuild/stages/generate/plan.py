"""The codegen section's plan for one variant: its tensors (overrides applied) and its SMEM
regions laid out as the generated header lays them out and the runtime pages them."""
from __future__ import annotations

import fnmatch

from mpkbuild.util import config, expr


class SmemPlanError(ValueError):
    """A region size that does not evaluate, is not positive, or overruns the budget."""

    def __init__(self, index: int, field: str | None, message: str):
        self.index = index
        self.path = ("codegen", "smem", "regions", index) + ((field,) if field else ())
        super().__init__(message)


def smem_layout(smem: dict, symbols: dict) -> tuple[list[dict], int]:
    """Lay the regions out in order at their alignment for one variant's symbols:
    ([{name, offset, bytes, align}], total). Raises SmemPlanError."""
    regions, total = [], 0
    for i, region in enumerate(smem["regions"]):
        try:
            nbytes = expr.evaluate(region["bytes"], symbols)
        except expr.ExprError as exc:
            raise SmemPlanError(i, "bytes", str(exc)) from None
        if not isinstance(nbytes, int) or nbytes <= 0:
            raise SmemPlanError(i, "bytes", f"{region['bytes']!r} = {nbytes!r} is not a positive integer")
        offset = -(-total // region["align"]) * region["align"]
        total = offset + nbytes
        if total > smem["budget"]:
            raise SmemPlanError(i, None, f"SMEM over budget: regions up to {region['name']!r} need "
                                         f"{total} bytes, budget is {smem['budget']}")
        regions.append({"name": region["name"], "offset": offset, "bytes": nbytes, "align": region["align"]})
    pages = smem_pages(smem, regions)
    if sum(n for _, n in pages) > config.SMEM_MAX_PAGES:
        table = ", ".join(f"{name} {n}" for name, n in pages)
        raise SmemPlanError(len(regions) - 1, None, (
            f"SMEM needs {sum(n for _, n in pages)} pages of {config.SMEM_PAGE_BYTES // 1024} KB, "
            f"MPK gives a task at most {config.SMEM_MAX_PAGES}: pages by region: {table} (a region "
            "takes pages of its own unless it says can_pack: true)"))
    return regions, total


def smem_pages(smem: dict, regions: list[dict]) -> list[tuple[str, int]]:
    """(region, pages) as Runtime-V2 plans them: each region whole pages of its own, the
    packable ones (can_pack) together in shared pages ("packed: a+b" for that group)."""
    page = config.SMEM_PAGE_BYTES
    out, packed, span = [], [], 0
    for declared, r in zip(smem["regions"], regions):
        if declared.get("can_pack"):
            span = -(-span // r["align"]) * r["align"] + r["bytes"]
            packed.append(r["name"])
        else:
            out.append((r["name"], -(-r["bytes"] // page)))
    if packed:
        out.append(("packed: " + "+".join(packed), -(-span // page)))
    return out


def variant_tensors(codegen: dict, variant: str) -> dict:
    """{"inputs": [...], "outputs": [...]} for one variant: the declared tensors with the
    partitions codegen.overrides gives that variant (the loader allows one per tensor)."""
    override = {}
    for rule in codegen.get("overrides", []):
        if fnmatch.fnmatch(variant, rule["variants"]):
            override.update(rule["partition"])
    return {kind: [{**t, "partition": override[t["name"]]} if t["name"] in override else t
                   for t in codegen[kind]] for kind in ("inputs", "outputs")}



"""The tune section, owned by the tune stage: the space searched per variant and GPU profile,
its constraints and its budget."""
from __future__ import annotations

import fnmatch

from mpkbuild.model.schema import C_IDENT
from mpkbuild.model.section import Section, short
from mpkbuild.util.expr import constants
from mpkbuild.util import config, expr

SCHEMA: dict = {
    "type": "object",
    "additionalProperties": False,
    "required": ["space"],
    "description": "the configuration space the tune stage searches per variant and GPU profile",
    "properties": {
        "variants": {"type": "array", "minItems": 1, "maxItems": 64, "default": ["*"],
                     "items": {"type": "string"},
                     "description": "fnmatch globs over variant names: the variants tuned"},
        "space": {"type": "object", "minProperties": 1, "maxProperties": 16,
                  "propertyNames": {"pattern": C_IDENT},
                  "additionalProperties": {
                      "type": "array", "minItems": 1, "maxItems": 64, "uniqueItems": True,
                      "items": {"type": ["integer", "boolean"]}},
                  "description": "symbol (a variant symbol every tuned variant binds, or a "
                                 "lever) -> candidate values"},
        "constraints": {"type": "array", "default": [], "maxItems": 32,
                        "items": {"type": "string"},
                        "description": "conditions over threads, params, the variant's symbols "
                                       "and levers (0/1): comparisons joined by and/or/not"},
        "budget": {
            "type": "object", "additionalProperties": False,
            "default": {"candidates": 32, "seconds": 900},
            "properties": {
                "candidates": {"type": "integer", "minimum": 1, "maximum": 512, "default": 32,
                               "description": "at most this many per variant (the spec's own "
                                              "config first, then the nearest to it)"},
                "seconds": {"type": "number", "exclusiveMinimum": 0,
                            "maximum": config.MAX_TIMEOUT_S, "default": 900,
                            "description": "GPU time per variant: a candidate whose earlier "
                                           "candidates' trials recorded more is not run (its "
                                           "result says so; a larger budget runs it); also "
                                           "split evenly into each candidate's watchdog"},
            },
        },
        "repeats": {"type": "integer", "minimum": 5, "maximum": 1000,
                    "description": "timed replays per candidate (default: perf.repeats)"},
        "figure": {"enum": ["hot", "cold", "runtime"], "default": "hot",
                   "description": "the figure candidates are compared on: the harness's hot or "
                                  "cold time against the perf baseline, or runtime: ours / the "
                                  "incumbent's makespan inside MPK (needs mpk_root=; each variant's "
                                  "spec configuration and its 3 fastest others in the harness, "
                                  "whose figure is kept beside it)"},
    },
}


def harness_figure(data: dict) -> str:
    """The figure a trial times in the harness: the tune's own, or with `runtime` the one
    the runtime gate judges by (its memory state), as corroboration."""
    figure = data["tune"]["figure"]
    if figure != "runtime":
        return figure
    return "cold" if data.get("runtime", {}).get("memory") == "cold" else "hot"


def tuned_variants(data: dict) -> list[str]:
    """The variants tune.variants' globs select, in spec order."""
    globs = data["tune"]["variants"]
    return [v for v in data["codegen"]["variants"] if any(fnmatch.fnmatch(v, g) for g in globs)]


def check(data: dict, root):
    cg, t = data["codegen"], data["tune"]
    consts, levers = constants(cg), cg.get("levers", {})
    for i, glob in enumerate(t["variants"]):
        if not fnmatch.filter(cg["variants"], glob):
            yield ("tune", "variants", i), f"{glob!r} matches no variant"
    chosen = tuned_variants(data)
    for sym, values in t["space"].items():
        where = ("tune", "space", sym)
        if sym in levers:
            if not all(isinstance(v, bool) for v in values):
                yield where, f"lever {sym!r} takes true/false, got {short(values)}"
            continue
        if sym in consts:
            yield where, f"{sym!r} is a codegen param or 'threads', not a variant symbol (tune variant symbols or levers)"
            continue
        unbound = [v for v in chosen if sym not in cg["variants"][v]]
        if unbound:
            yield where, (f"{sym!r} is neither a lever nor a symbol of every tuned variant "
                          f"(not bound by {unbound[0]!r})")
            continue
        for value in values:
            if isinstance(value, bool) or not 0 <= value <= config.INT32_MAX:
                yield where, f"{short(value)} is not a symbol value (an integer 0..{config.INT32_MAX})"
                break
    if t["figure"] == "runtime":
        # the runtime trial builds every candidate into one megakernel: one body render
        on = [sym for sym in t["space"] if sym in levers]
        if on:
            yield ("tune", "figure"), (f"runtime: lever {on[0]!r} is kernel-wide (one body serves every "
                                       "candidate of the runtime trial's megakernel): tune levers with "
                                       "figure hot or cold")
        if "wiring" not in data:
            yield ("tune", "figure"), "runtime: the kernel has no wiring section, so it cannot run inside MPK"
    for i, text in enumerate(t["constraints"]):
        for vname in chosen:
            symbols = {**consts, **cg["variants"][vname],
                       **{k: int(v.get("default", False)) for k, v in levers.items()}}
            try:
                expr.holds(text, symbols)
            except expr.ExprError as exc:
                yield ("tune", "constraints", i), f"variant {vname}: {exc}"
                break


# the tune stage reads the spec's own codegen (never a tuned one) with it
SECTION = Section("tune", SCHEMA, check, carries=("kernel", "op", "family", "codegen"))

"""The profile section, owned by the profile stage: which variants Nsight Compute profiles,
how a variant's bound is decided, and the bound each variant is expected to have."""
from __future__ import annotations

import fnmatch

from mpkbuild.model.schema import VARIANT_GLOB
from mpkbuild.model.section import Section
from mpkbuild.util import config

BOUNDS = ("memory", "compute", "latency", "launch")

EXPECT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["variants", "bound"],
    "properties": {
        "variants": VARIANT_GLOB,
        "bound": {"oneOf": [{"enum": list(BOUNDS)},
                            {"type": "array", "items": {"enum": list(BOUNDS)}, "minItems": 1,
                             "uniqueItems": True}],
                  "description": "what the variants must be bound by (one, or any of a list)"},
    },
}

SCHEMA: dict = {
    "type": "object",
    "additionalProperties": False,
    "description": "Nsight Compute (ncu) on chosen variants after validate: DRAM and SM "
                   "throughput, achieved occupancy, the top stall reasons, and each variant's "
                   "bound against the GPU's measured ceilings (docs/profile.md)",
    "properties": {
        "variants": {"type": "array", "items": VARIANT_GLOB, "minItems": 1, "default": ["*"],
                     "description": "globs over variant names: the variants profiled"},
        "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": config.MAX_TIMEOUT_S,
                      "default": config.DEFAULT_GATE_TIMEOUT_S,
                      "description": "the run's watchdog before ncu's slowdown (the gate waits "
                                     "TIMEOUT_FACTOR times this under ncu)"},
        "thresholds": {
            "type": "object", "additionalProperties": False, "default": {},
            "properties": {
                "bound_at": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 0.6,
                             "description": "a unit busy at this fraction of its ceiling (DRAM: "
                                            "of the measured bandwidth for the variant's read:"
                                            "write mix; SM: of ncu's peak) bounds the variant"},
                "launch_factor": {"type": "number", "minimum": 1, "default": 2.0,
                                  "description": "a variant within this factor of an empty "
                                                 "kernel's duration, measured in the same run, "
                                                 "is launch-bound"},
                "expect": {"type": "array", "items": EXPECT, "default": [],
                           "description": "the bound each variant must have: a variant "
                                          "measured otherwise fails the gate"},
            },
        },
    },
}


def chosen(data: dict) -> list[str]:
    """The variants profiled, in the spec's order."""
    names = list(data["codegen"]["variants"])
    globs = data["profile"]["variants"]
    return [n for n in names if any(fnmatch.fnmatchcase(n, g) for g in globs)]


def check(data: dict, root):
    names = list(data["codegen"]["variants"])
    for i, glob in enumerate(data["profile"]["variants"]):
        if not fnmatch.filter(names, glob):
            yield ("profile", "variants", i), f"{glob!r} matches no variant"
    picked = chosen(data)
    for i, rule in enumerate(data["profile"]["thresholds"]["expect"]):
        if not fnmatch.filter(picked, rule["variants"]):
            yield ("profile", "thresholds", "expect", i, "variants"), (
                f"{rule['variants']!r} matches no profiled variant (profile.variants picks "
                f"{', '.join(picked)})")


SECTION = Section("profile", SCHEMA, check)

"""The spec schema's shared pieces and its composition.

Each section's fragment lives with the stage that owns it (model/section.Section); the
loader composes them with the kernel's identity into one JSON Schema (SpecLoader.schema),
and `python -m mpkbuild schema --json` prints it: data/spec.schema.json is that output, for
editors (a test keeps the two equal). Defaults live in the fragments, beside the fields they
belong to, and :func:`fill_defaults` applies them, so a default is never written twice.
"""
from __future__ import annotations

import copy

C_IDENT = r"^[A-Za-z_][A-Za-z0-9_]*$"
REPO_PATH = r"^[A-Za-z0-9_][A-Za-z0-9_./-]*$"
REF_PATH = r"^[A-Za-z0-9_][A-Za-z0-9_./-]*\.py:[A-Za-z_][A-Za-z0-9_]*$"
INT_OR_EXPR = {"type": ["integer", "string"]}
VARIANT_GLOB = {"type": "string", "description": "fnmatch glob over variant names"}

GENERATOR = {
    "type": "object",
    "additionalProperties": False,
    "required": ["dist"],
    "properties": {
        "dist": {"enum": ["normal", "uniform", "randint"]},
        "mean": {"type": "number"}, "std": {"type": "number", "exclusiveMinimum": 0},
        "low": {"type": "number"}, "high": {"type": "number"},
        # round normal/uniform draws to multiples of step: equal values on purpose (ties)
        # in a dtype finer than the spacing the kernel's rule must be tested on
        "step": {"type": "number", "exclusiveMinimum": 0},
        # rows of very different magnitude: each row (the last dim) times a factor drawn
        # log-uniformly from [low, high], so an eps or a scaling rule is exercised on rows
        # near zero as on large ones
        "row_scales": {"type": "array", "minItems": 2, "maxItems": 2,
                       "items": {"type": "number", "exclusiveMinimum": 0}},
    },
}


def compose(identity: dict, required: list, sections) -> dict:
    """One JSON Schema: the identity's properties and each section's fragment under its key
    (the required ones listed after the identity's, in the sections' order)."""
    props = copy.deepcopy(identity)
    for s in sections:
        props[s.key] = copy.deepcopy(s.schema)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "mpkbuild/spec.schema.json",
        "title": "mpkbuild kernel spec",
        "type": "object",
        "additionalProperties": False,
        "required": [*required, *(s.key for s in sections if s.required)],
        "properties": props,
    }


def fill_defaults(data, schema) -> None:
    """Apply `default` values from the schema in place (objects only, recursively)."""
    if not isinstance(data, dict) or schema.get("type") != "object":
        if isinstance(data, list) and isinstance(schema.get("items"), dict):
            for item in data:
                fill_defaults(item, schema["items"])
        return
    props = schema.get("properties", {})
    for key, sub in props.items():
        if key not in data and "default" in sub:
            data[key] = copy.deepcopy(sub["default"])
        if key in data:
            fill_defaults(data[key], sub)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        for key, value in data.items():
            if key not in props:
                fill_defaults(value, extra)

"""The perf section, owned by the perf stage: the baselines a kernel is timed against, the
bytes it moves (its roofline), how it is sampled, and the thresholds it is judged by."""
from __future__ import annotations

import fnmatch

from mpkbuild.model.schema import C_IDENT, GENERATOR, INT_OR_EXPR, REF_PATH, VARIANT_GLOB
from mpkbuild.model.section import INT64_MAX, Section, function_problem, generator_problems
from mpkbuild.util.expr import constants
from mpkbuild.util import config, expr

THRESHOLD = {
    "type": "object",
    "additionalProperties": False,
    "required": ["variants"],
    "properties": {
        "variants": VARIANT_GLOB,
        "min_bandwidth_fraction": {"type": "number", "exclusiveMinimum": 0, "maximum": 1.5},
        "max_time_vs_baseline": {"type": "number", "exclusiveMinimum": 0},
        "max_us": {"type": "number", "exclusiveMinimum": 0},
        "time_figure": {"enum": ["hot", "cold"],
                        "description": "the figure max_time_vs_baseline and max_us judge (hot when absent)"},
        "baseline": {"type": "string", "pattern": C_IDENT,
                     "description": "the baseline max_time_vs_baseline compares with: `torch` "
                                    "(perf.baseline, when absent) or a perf.baselines name"},
    },
}

BASELINE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "function"],
    "properties": {
        "name": {"type": "string", "pattern": C_IDENT,
                 "description": "how the review and thresholds name it (not `torch`, the primary's)"},
        "function": {"type": "string", "pattern": REF_PATH,
                     "description": "path.py:function called with the kernel's inputs (and the "
                                    "codegen params it names), like perf.baseline"},
        "compile": {"type": "boolean", "default": False,
                    "description": "time torch.compile(function, dynamic=False), compiled once per "
                                   "variant before timing (compile time recorded, not timed)"},
        "mode": {"enum": ["default", "max-autotune-no-cudagraphs"],
                 "description": "torch.compile's mode (with compile: true; default: torch's "
                                "default). max-autotune-no-cudagraphs is what a user tuning "
                                "for speed picks; the perf gate replays every baseline in its "
                                "own CUDA graph, so cudagraphs would add nothing"},
        "description": {"type": "string"},
    },
}

SAMPLING = {
    "type": "object",
    "additionalProperties": False,
    "description": "sampling to a noise criterion (runners/timing.py): at least max(repeats, "
                   "min_samples) samples, then until the relative half-width of the paired "
                   "ratio's median interval is at most `target`, it stops improving, or `max_s`",
    "properties": {
        "min_samples": {"type": "integer", "minimum": 5, "maximum": 10000},
        "target": {"type": "number", "exclusiveMinimum": 0, "maximum": 0.5},
        "max_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 60},
        "max_samples": {"type": "integer", "minimum": 5, "maximum": 100000},
        "capture_floor": {"type": "number", "minimum": 0, "maximum": 0.5,
                          "description": "widen each paired ratio's interval by this fraction "
                                         "each side: the per-capture offset samples cannot see "
                                         "(util.stats.CAPTURE_FLOOR when absent)"},
        "clock_floor": {"type": "number", "minimum": 0, "maximum": 1,
                        "description": "a sample whose SM clock is under this fraction of the "
                                       "median clock seen is rejected (and reported)"},
    },
}

SCHEMA: dict = {
    "type": "object",
    "additionalProperties": False,
    "required": ["baseline", "bytes"],
    "properties": {
        "baseline": {"type": "string", "pattern": REF_PATH,
                     "description": "the torch op the kernel must beat, timed the same way "
                                    "(the primary baseline, named `torch`)"},
        # no default: a spec without them keeps its perf signature
        "baselines": {"type": "array", "maxItems": 8, "items": BASELINE,
                      "description": "more baselines a user might pick instead "
                                     "(torch.compile, another library)"},
        "bytes": {"oneOf": [
            {**INT_OR_EXPR, "description": "total bytes moved per launch, judged "
                                           "against the copy (1:1) ceiling"},
            {"type": "object", "additionalProperties": False, "required": ["read", "write"],
             "properties": {"read": INT_OR_EXPR, "write": INT_OR_EXPR},
             "description": "bytes read and written per launch: judged against the "
                            "ceiling measured for that read:write mix"}],
            "description": "bytes moved per launch (roofline)"},
        "sampling": SAMPLING,
        "max_regression": {"type": "number", "exclusiveMinimum": 0, "maximum": 1,
                           "description": "fail when the intervals of a variant's cold "
                                          "time (hot without cold) and of its ratio to the "
                                          "baseline, each over the last accepted one "
                                          "(perf_history/), are both all above 1 + this "
                                          "(default 0.03)"},
        "launches_per_graph": {"type": "integer", "minimum": 1, "maximum": 8192, "default": 20},
        "repeats": {"type": "integer", "minimum": 5, "maximum": 1000, "default": 7},
        "warmup": {"type": "integer", "minimum": 0, "maximum": 100000, "default": 16},
        "cold": {"type": "boolean", "default": True},
        "placements": {"type": "integer", "minimum": 1, "maximum": 3, "default": 3,
                       "description": "buffer placements the hot figure is timed over "
                                      "(fresh, after a large free, beside a held "
                                      "buffer: runners/placement.py); judged on the "
                                      "worst of them"},
        # no default: a spec without it keeps its perf signature
        "generators": {"type": "object",
                       "description": "input name -> distribution for the timed inputs "
                                      "only, over the top-level generators (validate "
                                      "may need inputs a real workload never sees)",
                       "propertyNames": {"pattern": C_IDENT},
                       "additionalProperties": GENERATOR},
        "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": config.MAX_TIMEOUT_S,
                      "default": config.DEFAULT_GATE_TIMEOUT_S},
        "thresholds": {"type": "array", "default": [], "maxItems": 64, "items": THRESHOLD},
    },
}


def check(data: dict, root):
    p = data["perf"]
    inputs = {t["name"]: t for t in data["codegen"]["inputs"]}
    yield from generator_problems(("perf", "generators"), p.get("generators", {}), inputs)
    why = function_problem(root, p["baseline"])
    if why:
        yield ("perf", "baseline"), f"baseline {p['baseline']!r}: {why}"
    names = ["torch"]
    for i, b in enumerate(p.get("baselines", [])):
        why = function_problem(root, b["function"])
        if why:
            yield ("perf", "baselines", i, "function"), f"baseline {b['function']!r}: {why}"
        if b["name"] in names:
            yield ("perf", "baselines", i, "name"), (
                f"baseline name {b['name']!r} is taken" +
                (" (torch is perf.baseline's)" if b["name"] == "torch" else ""))
        names.append(b["name"])
    yield from _bytes_problems(data["codegen"], p)
    for i, rule in enumerate(p["thresholds"]):
        if "baseline" in rule and rule["baseline"] not in names:
            yield ("perf", "thresholds", i, "baseline"), (
                f"baseline {rule['baseline']!r} is not one of {', '.join(names)}")
        if not fnmatch.filter(data["codegen"]["variants"], rule["variants"]):
            yield ("perf", "thresholds", i, "variants"), f"{rule['variants']!r} matches no variant"
        if not any(k in rule for k in ("min_bandwidth_fraction", "max_time_vs_baseline", "max_us")):
            yield ("perf", "thresholds", i), "a threshold needs at least one limit"


def _bytes_problems(cg: dict, p: dict):
    """perf.bytes (or its read and write) is a byte count for every variant."""
    consts = constants(cg)
    parts = ([(("perf", "bytes", "read"), p["bytes"]["read"]), (("perf", "bytes", "write"), p["bytes"]["write"])]
             if isinstance(p["bytes"], dict) else [(("perf", "bytes"), p["bytes"])])
    for where, text in parts:
        for vname, binding in cg["variants"].items():
            try:
                nbytes = expr.evaluate(text, {**consts, **binding})
            except expr.ExprError as exc:
                yield where, f"variant {vname}: {exc}"
                break
            positive = where[-1] != "write"          # a read-only kernel writes (almost) nothing
            if not isinstance(nbytes, (int, float)) or nbytes < 0 or (positive and nbytes == 0):
                yield where, f"variant {vname}: {where[-1]} = {nbytes!r} is not {'positive' if positive else 'a count'}"
            elif nbytes > INT64_MAX:
                yield where, f"variant {vname}: {where[-1]} = {nbytes:g} is more than 2**63 - 1"


def _functions(data: dict) -> tuple[str, ...]:
    return (data["perf"]["baseline"], *(b["function"] for b in data["perf"].get("baselines", [])))


SECTION = Section("perf", SCHEMA, check, required=True, functions=_functions)

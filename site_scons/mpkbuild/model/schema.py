"""The spec schema: one JSON Schema that loading enforces and editors can use.

`python -m mpkbuild.model.schema` prints it; data/spec.schema.json is that output (a test keeps the
two equal). Defaults live here, beside the fields they belong to, and :func:`fill_defaults`
applies them, so a default is never written twice.
"""
from __future__ import annotations

import copy
import json
import sys

from mpkbuild.util import config

C_IDENT = r"^[A-Za-z_][A-Za-z0-9_]*$"
REPO_PATH = r"^[A-Za-z0-9_][A-Za-z0-9_./-]*$"
REF_PATH = r"^[A-Za-z0-9_][A-Za-z0-9_./-]*\.py:[A-Za-z_][A-Za-z0-9_]*$"
INT_OR_EXPR = {"type": ["integer", "string"]}
_VARIANT_GLOB = {"type": "string", "description": "fnmatch glob over variant names"}

_PARTITION = {"type": "array", "minItems": 1, "maxItems": 4, "items": {"enum": [-1, 0]},
              "description": "MPK notation: 0 = this dim is split across grid x, -1 = whole"}

_OVERRIDE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["variants", "partition"],
    "properties": {
        "variants": _VARIANT_GLOB,
        "partition": {"type": "object", "minProperties": 1,
                      "propertyNames": {"pattern": C_IDENT},
                      "additionalProperties": _PARTITION,
                      "description": "tensor name -> the partition these variants use instead"},
        "description": {"type": "string"},
    },
}

_TENSOR = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "dtype", "shape", "partition"],
    "properties": {
        "name": {"type": "string", "pattern": C_IDENT},
        "dtype": {"enum": list(config.DTYPES)},
        "shape": {"type": "array", "minItems": 1, "maxItems": 4, "items": INT_OR_EXPR,
                  "description": "extents: integers or expressions over variant symbols"},
        "partition": _PARTITION,
        "runtime": {"enum": list(config.RUNTIME_INPUTS), "description":
                    "an input the runtime keeps rather than the layer hands the task "
                    "(util/config.py RUNTIME_INPUTS): in MPK the wired call passes the runtime's "
                    "own; elsewhere it is the input tensor it is, whole (partition all -1)"},
        "shared_by_tasks": {"type": "boolean", "description":
                            "every task is given all of this unsplit tensor by design: the body "
                            "finds its own part from task_index (silu_mul_v2's tiles) or "
                            "accumulates into it; without it an output split over no dim, in a "
                            "grid of more than one task, is an error"},
        "description": {"type": "string"},
    },
}

_GENERATOR = {
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
    },
}

_THRESHOLD = {
    "type": "object",
    "additionalProperties": False,
    "required": ["variants"],
    "properties": {
        "variants": _VARIANT_GLOB,
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

_RUNTIME_THRESHOLD = {
    "type": "object",
    "additionalProperties": False,
    "required": ["variants", "max_vs_incumbent"],
    "properties": {
        "variants": _VARIANT_GLOB,
        "max_vs_incumbent": {"type": "number", "exclusiveMinimum": 0,
                             "description": "the most ours / incumbent may be on the figure, "
                                            "the whole interval of the paired ratios"},
        "figure": {"enum": ["makespan", "slowcta"], "default": "makespan",
                   "description": "makespan: the op's first task start to its last task end; "
                                  "slowcta: its slowest task (both from the runtime's profiler)"},
        "incumbent": {"type": "string", "pattern": C_IDENT,
                      "description": "which of the variant's incumbents (default: each of them)"},
    },
}

_INCUMBENT_RULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["variants", "task"],
    "properties": {
        "variants": _VARIANT_GLOB,
        "task": {"type": "string", "pattern": C_IDENT,
                 "description": "an entry of the incumbent table (mpkbuild/wire/incumbents.py), "
                                "or `none`"},
        "params": {"type": "object", "description": "the incumbent's graph parameters "
                                                   "(its table entry lists them)"},
        "why": {"type": "string", "description": "with task: none, why there is no incumbent"},
    },
}

_BLOCK_LAYER = {
    "type": "object",
    "additionalProperties": False,
    "required": ["kernel", "variant", "incumbent"],
    "properties": {
        "kernel": {"type": "string", "pattern": C_IDENT, "description": "a catalog kernel (specs/<kernel>.yaml)"},
        "variant": {"type": "string", "minLength": 1,
                    "description": "its variant at each batch: `{batch}` is replaced by the batch"},
        "incumbent": {"type": "string", "pattern": C_IDENT,
                      "description": "the MPK task MPK's builder runs for this layer (an entry of "
                                     "the incumbent table)"},
        "params": {"type": "object", "description": "the incumbent's graph parameters"},
    },
}

_BLOCK = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "batches", "layers", "cos_min", "rel_max"],
    "properties": {
        "name": {"type": "string", "pattern": C_IDENT},
        "batches": {"type": "array", "minItems": 1, "maxItems": 16, "uniqueItems": True,
                    "items": {"type": "integer", "minimum": 1},
                    "description": "decode batches: one graph each, named block:<name>:b<batch>"},
        "layers": {"type": "array", "minItems": 2, "maxItems": 8, "items": _BLOCK_LAYER,
                   "description": "in order; each layer's first input is the layer before's "
                                  "first output (the same bytes)"},
        "cos_min": {"type": "number", "minimum": -1, "maximum": 1,
                    "description": "the block's output against the float64 composition of the "
                                   "layers' references"},
        "rel_max": {"type": "number", "exclusiveMinimum": 0},
    },
}

_BASELINE = {
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

_SAMPLING = {
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

_LEVER = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "default": {"type": "boolean", "default": False,
                    "description": "on for every GPU profile (turning one on is a spec edit)"},
        "description": {"type": "string"},
    },
}

_TUNE = {
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
        "figure": {"enum": ["hot", "cold"], "default": "hot",
                   "description": "the perf figure candidates are compared on"},
    },
}

SPEC_SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "mpkbuild/spec.schema.json",
    "title": "mpkbuild kernel spec",
    "type": "object",
    "additionalProperties": False,
    "required": ["kernel", "op", "family", "archs", "codegen", "validate", "perf"],
    "properties": {
        "kernel": {"type": "string", "pattern": C_IDENT,
                   "description": "kernel name; must equal the spec file's stem"},
        "op": {"type": "string", "pattern": C_IDENT},
        "family": {"enum": ["A", "B", "C", "D", "E"],
                   "description": "A pipeline, B consumer+typed SMEM regions, C monolithic SMEM, "
                                  "D no SMEM (elementwise), E helper fused in a host kernel"},
        "description": {"type": "string", "description": "cosmetic: not part of any signature"},
        "archs": {"type": "array", "minItems": 1, "uniqueItems": True,
                  "items": {"enum": list(config.ARCHS)}},
        "codegen": {
            "type": "object",
            "additionalProperties": False,
            "required": ["body", "threads", "variants", "grid", "inputs", "outputs"],
            "properties": {
                "body": {"type": "string", "pattern": REPO_PATH,
                         "description": "task body: a .cuh, or a .cuh.j2 rendered with the codegen section"},
                # no default: a spec without include folders keeps its codegen signature
                "include_dirs": {"type": "array", "maxItems": 16, "uniqueItems": True,
                                 "items": {"type": "string", "minLength": 1, "maxLength": 4096},
                                 "description": "folders the body's #includes are looked for in "
                                                "(repo-relative or absolute: e.g. an MPK checkout's "
                                                "include/mirage/persistent_kernel); every header "
                                                "found there is an input of the compile"},
                "threads": {"type": "integer", "minimum": 32, "maximum": 1024},
                "params": {"type": "object", "default": {}, "maxProperties": 64,
                           "propertyNames": {"pattern": C_IDENT},
                           "additionalProperties": {"type": ["number", "boolean"]}},
                "template_params": {"type": "array", "default": [], "uniqueItems": True, "maxItems": 16,
                                    "items": {"type": "string", "pattern": C_IDENT}},
                "variants": {"type": "object", "minProperties": 1,
                             "maxProperties": config.MAX_VARIANTS,
                             "propertyNames": {"pattern": C_IDENT},
                             "additionalProperties": {
                                 "type": "object", "minProperties": 1, "maxProperties": 32,
                                 "propertyNames": {"pattern": C_IDENT},
                                 # `constexpr int` in K_spec.h, and template arguments
                                 "additionalProperties": {"type": "integer", "minimum": 0,
                                                          "maximum": config.INT32_MAX}}},
                "tiling": {"type": "array", "default": [], "maxItems": 16, "items": {
                    "type": "object", "additionalProperties": False,
                    "required": ["symbol", "multiple_of"],
                    "properties": {"symbol": {"type": "string", "pattern": C_IDENT},
                                   "multiple_of": INT_OR_EXPR}}},
                "min_blocks_per_sm": {**INT_OR_EXPR, "default": 1,
                                      "description": "harness __launch_bounds__ minimum blocks per SM "
                                                     "(caps registers); an expression over variant symbols"},
                "grid": {"type": "array", "minItems": 1, "maxItems": 1, "items": INT_OR_EXPR,
                         "description": "number of tasks (grid x), an expression over variant symbols"},
                "inputs": {"type": "array", "minItems": 1, "maxItems": 7, "items": _TENSOR},
                "task_metadata": {
                    "type": "array", "minItems": 1, "uniqueItems": True,
                    "items": {"enum": list(config.TASK_METADATA)},
                    "description": "task metadata the body takes, as ints after its tensors "
                                   "(in the order request_id, expert_offset, kv_idx): each "
                                   "the task's index on grid x, which the wired builder sets "
                                   "as MPK's sets it for its attention and MoE tasks (bid.x); "
                                   "they share TaskMetadata's union with task_offset, so "
                                   "wiring.tile_indexed must be false"},
                "outputs": {"type": "array", "minItems": 1, "maxItems": 3, "items": _TENSOR},
                # no default: a spec without levers keeps its codegen signature
                "levers": {"type": "object", "maxProperties": 16,
                           "propertyNames": {"pattern": C_IDENT},
                           "additionalProperties": _LEVER,
                           "description": "default-off switches: `levers.NAME` (a bool) in the "
                                          "body template; off, they must not change a byte"},
                # no default: a spec without overrides keeps its codegen signature
                "overrides": {"type": "array", "maxItems": 64, "items": _OVERRIDE,
                              "description": "per-variant tensor partitions (a variant glob each); "
                                             "a tensor takes at most one override per variant"},
                "smem": {
                    "type": "object", "additionalProperties": False,
                    "default": {"budget": config.SMEM_MAX_BYTES, "regions": []},
                    "properties": {
                        "budget": {"type": "integer", "minimum": 0, "maximum": config.SMEM_MAX_BYTES,
                                   "default": config.SMEM_MAX_BYTES,
                                   "description": "at most what MPK's runtime gives a task"},
                        "regions": {"type": "array", "default": [], "maxItems": 16, "items": {
                            "type": "object", "additionalProperties": False,
                            "required": ["name", "bytes"],
                            "properties": {"name": {"type": "string", "pattern": C_IDENT},
                                           "bytes": {**INT_OR_EXPR, "description":
                                                     "an expression over threads, params and the "
                                                     "variant's symbols (the plan may differ per variant)"},
                                           # the harness aligns the SMEM base to 1024 bytes only
                                           "align": {"type": "integer", "minimum": 1, "maximum": 1024,
                                                     "default": 16},
                                           # no default: a spec without it keeps its signature
                                           "can_pack": {"type": "boolean", "description":
                                                        "the region may share 16 KB pages with the "
                                                        "other packable ones (default: pages of its own)"}}}},
                    },
                },
            },
        },
        "generators": {"type": "object", "default": {}, "maxProperties": 16,
                       "description": "input name -> random distribution (validate and perf); "
                                      "float inputs default to normal(0, 1)",
                       "propertyNames": {"pattern": C_IDENT},
                       "additionalProperties": _GENERATOR},
        "validate": {
            "type": "object",
            "additionalProperties": False,
            "required": ["reference"],
            "properties": {
                "reference": {"type": "string", "pattern": REF_PATH,
                              "description": "path/to/file.py:function computing the output in float64"},
                "compare": {"enum": ["tolerance", "exact"], "default": "tolerance",
                            "description": "exact: bitwise equality (indices); tolerances do not apply"},
                "cos_min": {"type": "number", "minimum": 0, "maximum": 1,
                            "default": config.DEFAULT_COS_MIN},
                "rel_max": {"type": "number", "minimum": 0, "maximum": 1, "default": config.DEFAULT_REL_MAX,
                            "description": "max |out-ref| / max |ref| (above 1 it checks nothing)"},
                "trials": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 3},
                "steps": {"type": "integer", "minimum": 3, "maximum": 1000, "default": 3},
                "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": config.MAX_TIMEOUT_S,
                              "default": config.DEFAULT_GATE_TIMEOUT_S},
                "share_gpu": {"type": "boolean", "default": False,
                              "description": "validate may run beside other sharing validates on "
                                             "one GPU (small memory, no timing); perf never shares"},
            },
        },
        "tune": _TUNE,
        "perf": {
            "type": "object",
            "additionalProperties": False,
            "required": ["baseline", "bytes"],
            "properties": {
                "baseline": {"type": "string", "pattern": REF_PATH,
                             "description": "the torch op the kernel must beat, timed the same way "
                                            "(the primary baseline, named `torch`)"},
                # no default: a spec without them keeps its perf signature
                "baselines": {"type": "array", "maxItems": 8, "items": _BASELINE,
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
                "sampling": _SAMPLING,
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
                               "additionalProperties": _GENERATOR},
                "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": config.MAX_TIMEOUT_S,
                              "default": config.DEFAULT_GATE_TIMEOUT_S},
                "thresholds": {"type": "array", "default": [], "maxItems": 64, "items": _THRESHOLD},
            },
        },
        "runtime": {
            "type": "object",
            "additionalProperties": False,
            "default": {},
            "description": "the runtime gate's head to head: the MPK task each variant would "
                           "replace (its incumbent), run beside ours in the persistent kernel",
            "properties": {
                "incumbent": {"type": "array", "default": [], "maxItems": 32, "items": _INCUMBENT_RULE,
                              "description": "every rule whose glob matches a variant names one "
                                             "of its incumbents; a matching `task: none` rule "
                                             "says it has none"},
                "pairs": {"type": "integer", "minimum": 5, "maximum": 1000, "default": 20,
                          "description": "interleaved launches (ours, incumbent, ours, ...) "
                                         "timed per variant"},
                "generators": {"type": "object",
                               "description": "input name -> distribution for the head to head "
                                              "(inputs every incumbent accepts), over the "
                                              "top-level generators",
                               "propertyNames": {"pattern": C_IDENT},
                               "additionalProperties": _GENERATOR},
                "thresholds": {"type": "array", "default": [], "maxItems": 64,
                               "items": _RUNTIME_THRESHOLD,
                               "description": "`variants` globs over the variants and the "
                                              "blocks' graphs (block:<name>:b<batch>)"},
                "blocks": {"type": "array", "default": [], "maxItems": 8, "items": _BLOCK,
                           "description": "graphs of several kernels' layers (a model's block), "
                                          "each run against the chain of its layers' incumbents"},
            },
        },
    },
}


def full_schema() -> dict:
    """The spec schema including sections contributed by other stages (wiring)."""
    schema = copy.deepcopy(SPEC_SCHEMA)
    try:
        from mpkbuild.wire.section import WIRING_SCHEMA  # the wire stage owns its section's schema
    except ImportError:
        return schema
    schema["properties"]["wiring"] = copy.deepcopy(WIRING_SCHEMA)
    return schema


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


def main() -> None:
    json.dump(full_schema(), sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

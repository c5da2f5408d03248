"""The runtime section, owned by the runtime gate: the MPK task each variant would replace (its
incumbent), the head to head's pairs, inputs and thresholds, and the blocks (several
kernels' layers in one graph) run against their incumbents' chain."""
from __future__ import annotations

from mpkbuild.model.schema import C_IDENT, GENERATOR, VARIANT_GLOB
from mpkbuild.model.section import Section, generator_problems
from mpkbuild.stages.runtime import composition
from mpkbuild.wire import incumbents

RUNTIME_THRESHOLD = {
    "type": "object",
    "additionalProperties": False,
    "required": ["variants", "max_vs_incumbent"],
    "properties": {
        "variants": VARIANT_GLOB,
        "max_vs_incumbent": {"type": "number", "exclusiveMinimum": 0,
                             "description": "the most ours / incumbent may be on the figure, "
                                            "the whole interval of the paired ratios"},
        "figure": {"enum": ["makespan", "slowcta"], "default": "makespan",
                   "description": "makespan: the op's first task start to its last task end; "
                                  "slowcta: its slowest task (both from the runtime's profiler)"},
        "incumbent": {"type": "string", "pattern": C_IDENT,
                      "description": "which of the variant's incumbents (default: each of them)"},
        "against": {"enum": ["default", "best"], "default": "default",
                    "description": "the incumbent as the builder configures it (default), or at "
                                   "the fastest of the configurations timed (best: the rule's "
                                   "incumbent needs `best`)"},
    },
}

INCUMBENT_RULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["variants", "task"],
    "properties": {
        "variants": VARIANT_GLOB,
        "task": {"type": "string", "pattern": C_IDENT,
                 "description": "an entry of the incumbent table (mpkbuild/wire/incumbents.py), "
                                "or `none`"},
        "params": {"type": "object", "description": "the incumbent's graph parameters "
                                                   "(its table entry lists them)"},
        "why": {"type": "string", "description": "with task: none, why there is no incumbent"},
        "best": {"type": "boolean", "default": True,
                 "description": "also time the incumbent at the other values of its own "
                                "parameters its table entry tries (a few, near the worker "
                                "count), so the review says both 'vs MPK's default' and 'vs "
                                "MPK's task at its best'"},
    },
}

BLOCK_LAYER = {
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

BLOCK = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "batches", "layers", "cos_min", "rel_max"],
    "properties": {
        "name": {"type": "string", "pattern": C_IDENT},
        "batches": {"type": "array", "minItems": 1, "maxItems": 16, "uniqueItems": True,
                    "items": {"type": "integer", "minimum": 1},
                    "description": "decode batches: one graph each, named block:<name>:b<batch>"},
        "layers": {"type": "array", "minItems": 2, "maxItems": 8, "items": BLOCK_LAYER,
                   "description": "in order; each layer's first input is the layer before's "
                                  "first output (the same bytes)"},
        "cos_min": {"type": "number", "minimum": -1, "maximum": 1,
                    "description": "the block's output against the float64 composition of the "
                                   "layers' references"},
        "rel_max": {"type": "number", "exclusiveMinimum": 0},
    },
}

SCHEMA: dict = {
    "type": "object",
    "additionalProperties": False,
    "default": {},
    "description": "the runtime gate's head to head: the MPK task each variant would "
                   "replace (its incumbent), run beside ours in the persistent kernel",
    "properties": {
        "incumbent": {"type": "array", "default": [], "maxItems": 32, "items": INCUMBENT_RULE,
                      "description": "every rule whose glob matches a variant names one "
                                     "of its incumbents; a matching `task: none` rule "
                                     "says it has none"},
        "composition": {
            "default": "production",
            "description": "the worker the verdict is measured in: production (the checkout's "
                           "qwen3 builder's decode tasks on Hopper compiled in beside ours, never "
                           "run: Qwen3-8B at batch 8), a mapping of that model's sizes to change, "
                           "or minimal (only the graphs' own tasks)",
            "oneOf": [
                {"enum": ["production", "minimal"]},
                {"type": "object", "additionalProperties": False, "minProperties": 1,
                 "properties": {"model": {"enum": ["qwen3"]},
                                **{k: {"type": "integer", "minimum": 1} for k in composition.SIZES}}},
            ]},
        "memory": {"enum": ["hot", "cold"], "default": "hot",
                   "description": "the state the judged launches find memory in: hot (what the "
                                  "launch before left in L2) or cold (the L2 filled with other, "
                                  "clean data before each launch of every side, as a decode step "
                                  "streams its weights from DRAM: for weight-streaming ops; the "
                                  "hot figure is then shown as a diagnostic)"},
        "pairs": {"type": "integer", "minimum": 5, "maximum": 1000, "default": 20,
                  "description": "interleaved launches (ours, incumbent, ours, ...) "
                                 "timed per variant"},
        "generators": {"type": "object",
                       "description": "input name -> distribution for the head to head "
                                      "(inputs every incumbent accepts), over the "
                                      "top-level generators",
                       "propertyNames": {"pattern": C_IDENT},
                       "additionalProperties": GENERATOR},
        "thresholds": {"type": "array", "default": [], "maxItems": 64,
                       "items": RUNTIME_THRESHOLD,
                       "description": "`variants` globs over the variants and the "
                                      "blocks' graphs (block:<name>:b<batch>)"},
        "blocks": {"type": "array", "default": [], "maxItems": 8, "items": BLOCK,
                   "description": "graphs of several kernels' layers (a model's block), "
                                  "each run against the chain of its layers' incumbents"},
    },
}


def check(data: dict, root):
    inputs = {t["name"]: t for t in data["codegen"]["inputs"]}
    yield from generator_problems(("runtime", "generators"), data["runtime"].get("generators", {}), inputs)
    yield from incumbents.check_section(data)
    yield from (((("runtime", "composition"), m)) for m in composition.problems(composition.declared(data)))


SECTION = Section("runtime", SCHEMA, check)

"""The validate section, owned by the validate stage: the float64 reference every variant is
compared with, and how (tolerances or exact, trials, steps, the watchdog)."""
from __future__ import annotations

from mpkbuild.model.schema import REF_PATH
from mpkbuild.model.section import Section, function_problem
from mpkbuild.util import config

SCHEMA: dict = {
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
}


def check(data: dict, root):
    ref = data["validate"]["reference"]
    why = function_problem(root, ref)
    if why:
        yield ("validate", "reference"), f"reference {ref!r}: {why}"


def _functions(data: dict) -> tuple[str, ...]:
    return (data["validate"]["reference"],)


SECTION = Section("validate", SCHEMA, check, required=True, functions=_functions)

"""What a gate job tells a runner about a kernel's variants, resolved by the build: the
runners compute no shape, grid or byte count from the spec's expressions (they import no
expression evaluator). The build writes, beside each codegen section it hands a runner (the
job's own, and each kernel's of a runtime job), `variants`: variant name -> Variant
(util/expr.variant_facts); a runner reads them with `variant()`.

This module is the schema of that part of the job, for both sides. Standard library only.
"""
from __future__ import annotations

from typing import TypedDict

KEY = "variants"      # beside the codegen section: side[KEY][variant] is a Variant
PROFILED = "profiled_variants"   # the profile gate's job: the variants it launches, in the spec's order


class Tensor(TypedDict):
    name: str
    shape: list[int]
    dtype: str                          # a util.config.DTYPES name


class Bytes(TypedDict):
    total: float                        # bytes one launch moves (perf.bytes)
    read: float | None                  # with perf.bytes {read, write}; else None
    write: float | None


class Variant(TypedDict):
    inputs: list[Tensor]                # in the spec's order (the harness's argument order)
    outputs: list[Tensor]
    grid: int                           # tasks (grid x)
    bytes: Bytes | None                 # only in jobs that read the perf section


def variant(side: dict, name: str) -> Variant:
    """A variant's facts from a job's side (the job itself, or one kernel of a runtime job)."""
    try:
        return side[KEY][name]
    except KeyError:
        raise KeyError(f"the job has no resolved facts for variant {name!r} (the build writes "
                       f"them as {KEY!r} beside the codegen section)") from None

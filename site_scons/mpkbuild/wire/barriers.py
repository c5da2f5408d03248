"""Named barrier ids: the ones a task header's code uses, and the ones this tool assigns.

Runtime-V2 runs every task on the compute warps of one block beside the runtime's own
warps, so a task synchronises on a named barrier (never barrier 0: `__syncthreads()` would
wait for warps that never come). A block has 16 hardware barriers; two tasks of one graph
that picked the same id would be fine only while they never overlap, so the tool gives
its own uses ids that no task of the checkout's v2 folder uses, and checks that. CUTLASS's
`NamedBarrier(threads, id)` (and its static `sync`/`arrive_and_wait`/`arrive` with an
integer id) adds its reserved count (8) to the id; a `ReservedNamedBarriers::X` id is X.

Standard library only (the build side).
"""
from __future__ import annotations

import re
from pathlib import Path

CUTLASS_RESERVED = 8          # cutlass/arch/barrier.h ReservedNamedBarrierCount
# the ids this tool assigns on Runtime-V2 (free in the pinned v2 tree, whose tasks use 1,
# 2, 14 and 15; CUTLASS's collectives keep 1-7 for themselves)
V2_TASK_BARRIER = 12          # a body's task_barrier() (the spec header, under USE_RUNTIME_V2)
V2_MARK_BARRIER = 13          # the runtime gate's span marks around each task (megakernel_v2)
# the ids a pipeline's named barrier groups take, in declaration order (codegen.pipeline.
# named_barriers; stages/generate/pipeline.py), per runtime: on v1 a task has its worker
# block to itself and no header of the pinned v1 tree uses 4-7; on v2 8-11 are free in the
# pinned tree (the v2 gate checks them against the checkout's tasks like the ids above)
PIPELINE_BARRIERS = {"v1": (4, 5, 6, 7), "v2": (8, 9, 10, 11)}

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_PTX = re.compile(r"\b(?:bar|barrier)\.(?:sync|arrive|red\.\w+)(?:\.aligned)?\s+(\w+)")
_CUTLASS_CTOR = re.compile(r"\bNamedBarrier\s+\w+\s*\(\s*[^,()]+(?:\([^()]*\))?\s*,\s*([^()]+?)\s*\)")
_CUTLASS_STATIC = re.compile(r"\bNamedBarrier::(?:sync|arrive_and_wait|arrive)\s*\(\s*[^,()]+,\s*([^()]+?)\s*\)")
# a constant or a template parameter's default: `constexpr int ID = 6;`, `int ID = 6,`
_CONST = re.compile(r"\b(?:int|uint32_t|unsigned)\s+(\w+)\s*=\s*(\d+)\s*[;,>]")


def _value(token: str, consts: dict[str, int]) -> int | None:
    token = token.strip()
    if token.isdigit():
        return int(token)
    return consts.get(token)


def barrier_ids(text: str) -> dict[int, str]:
    """{hardware id: the line that uses it} of one header's code; an id it cannot resolve
    to a number is left out (the checks below say so where it matters)."""
    code = _COMMENTS.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    consts = {m.group(1): int(m.group(2)) for m in _CONST.finditer(code)}
    lines = text.splitlines()
    found: dict[int, str] = {}

    def add(pos: int, hw: int | None) -> None:
        if hw is not None:
            found.setdefault(hw, lines[code.count("\n", 0, pos)].strip())

    for m in _PTX.finditer(code):
        add(m.start(), _value(m.group(1), consts))
    for rx in (_CUTLASS_CTOR, _CUTLASS_STATIC):
        for m in rx.finditer(code):
            arg = m.group(1)
            if "ReservedNamedBarriers::" in arg:
                continue              # CUTLASS's own ids (1-7): never ours
            v = _value(arg, consts)
            add(m.start(), None if v is None else v + CUTLASS_RESERVED)
    return found


def clashes(headers: dict[str, str], ours: dict[int, str]) -> list[str]:
    """One message per id of `ours` ({id: what it is}) that a header ({name: text}) uses."""
    out = []
    for name, text in sorted(headers.items()):
        used = barrier_ids(text)
        for hw, what in sorted(ours.items()):
            if hw in used:
                out.append(f"named barrier {hw} is {what} and {name} uses it too ({used[hw]})")
    return out


def v2_task_headers(checkout_root: Path) -> dict[str, str]:
    """{path under include/mirage/persistent_kernel: text} of the checkout's v2 tasks."""
    base = Path(checkout_root) / "include/mirage/persistent_kernel"
    return {str(p.relative_to(base)): p.read_text(errors="replace")
            for p in sorted((base / "tasks/blackwell_v2").glob("*.cuh"))}

"""TMA as the tool uses it: the facts of a 2-d tensor map that the spec's audit
(stages/generate/pipeline.py), the spec header, the harness and the wire stage's tma.cuh
cases all read, so a box is written once (codegen.pipeline.copies) and rendered the same
everywhere."""
from __future__ import annotations

from mpkbuild.util import config, expr

# cuTensorMapEncodeTiled and cp.async.bulk.tensor: a box dim is 1..256 elements, its inner
# extent a multiple of 16 bytes and at most the swizzle span; the SMEM it lands in is aligned
# to 128 bytes, to the swizzle's whole pattern (8 rows of the span) when swizzled
SWIZZLES = [0, 32, 64, 128]      # bytes; the index is fill_tma_desc's B (0 none .. 3 128B)
BOX_MAX = 256
SMEM_ALIGN = 128
DTYPES = ("bf16",)               # fill_tma_desc encodes bf16 on every pinned MPK branch
ELEMENT_BYTES = config.DTYPES["bf16"]["bytes"]
TILE = ("rows", "cols")          # the symbols a box is written in: the task's tile of the tensor
DEFAULT_SWIZZLE = 128            # a copy that says none


def swizzle(copy: dict) -> int:
    """A tensor copy's swizzle in bytes (0: none)."""
    return copy.get("swizzle", DEFAULT_SWIZZLE)


def pattern(copy: dict) -> int:
    """Bytes of a tensor copy's whole swizzle pattern (8 rows of the span; the plain SMEM
    alignment when unswizzled): where each of its boxes must land."""
    return max(SMEM_ALIGN, 8 * swizzle(copy))


def slot_unit(copy: dict) -> int:
    """What a stage's room for one of the copy's boxes is a multiple of: its swizzle pattern
    when swizzled, so the next stage's box lands aligned too (a swizzled box of fewer than 8
    rows, e.g. x's m rows at decode, still takes a whole pattern: the swizzle is a function
    of the address); a byte otherwise."""
    return pattern(copy) if "tensor" in copy and swizzle(copy) else 1


def slot_bytes(nbytes: int, copy: dict) -> int:
    """A stage's room for one box of `nbytes` (rounded up to slot_unit)."""
    unit = slot_unit(copy)
    return -(-nbytes // unit) * unit


def tensors(codegen: dict) -> list[str]:
    """The inputs a body loads with TMA (codegen.pipeline.copies naming a tensor), in
    codegen.inputs order: after its tensors, the body takes each one's tensor map
    (`<name>_tmap`, a `void const*`: the runtime's task_desc->input_tma_desc_ptrs[i][0])."""
    loaded = {c["tensor"] for c in (codegen.get("pipeline") or {}).get("copies", []) if "tensor" in c}
    return [t["name"] for t in codegen.get("inputs") or [] if t.get("name") in loaded]


def copy_of(codegen: dict, tensor: str) -> dict:
    """The first copy of a TMA-loaded tensor (the audit holds every copy of it to one box)."""
    return next(c for c in codegen["pipeline"]["copies"] if c.get("tensor") == tensor)


def box_cpp(copy: dict, params: dict, tile: tuple[str, str]) -> dict:
    """A tensor copy's map as C++: its box over the tile's two dims (the C++ `tile` names
    them), the params as their values (the checkout's tma.cuh sees no spec header), and
    its swizzle (bytes, and fill_tma_desc's code: 0 none, 1 32B, 2 64B, 3 128B)."""
    names = dict(zip(TILE, tile))
    values = {k: v for k, v in params.items() if not isinstance(v, bool)}
    span = swizzle(copy)

    def cpp(text):
        return expr.to_cpp(text, lambda s: names.get(s) or repr(values[s]))
    return {"box": [cpp(d) for d in copy["box"]], "swizzle": span, "swizzle_code": SWIZZLES.index(span)}

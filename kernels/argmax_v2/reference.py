"""Torch definitions for argmax_v2 and argmax_fp32_v2 (the same body over fp32 logits): the
reference (what is correct) and the torch op the kernel must beat (timed by the perf gate
the same way as the kernel).

Semantics (torch.argmax's, which the kernel implements): the index of the maximum of each
row; among equal maxima the lowest index; a NaN counts as larger than any number (the
first NaN wins); -0.0 == +0.0.
"""
import torch


def argmax_reference(logits):
    """Called with a float64 copy of the gate's bf16 (argmax_v2) or fp32 (argmax_fp32_v2)
    logits: the upcast is exact, so ties stay ties. Returns int64 indices (compared
    exactly)."""
    return torch.argmax(logits.to(torch.float64), dim=-1)


def torch_argmax(logits):
    """Called with the gate's own bf16 or fp32 tensor inside a CUDA-graph capture."""
    return torch.argmax(logits, dim=-1)

"""Torch definitions for linear_v2: the float64 reference (what is correct) and the torch op the
kernel must beat (timed by the perf gate the same way as the kernel). One file per op: each
kernel's validate, perf and tune nodes sign its reference file whole, so an edit here re-runs
this kernel's gates only."""
import torch
import torch.nn.functional as F


def linear_reference(x, weight):
    """y = x . W^T, called with float64 copies of the gate's bf16 inputs."""
    return x.to(torch.float64) @ weight.to(torch.float64).T


def torch_linear(x, weight):
    """Called with the gate's own bf16 tensors inside a CUDA-graph capture (cuBLAS)."""
    return F.linear(x, weight)

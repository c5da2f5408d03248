"""Torch definitions for linear_v2: the float64 reference (what is correct) and the torch
op the kernel must beat (timed by the perf gate the same way as the kernel)."""
import torch
import torch.nn.functional as F


def linear_reference(x, weight):
    """y = x . W^T, called with float64 copies of the gate's bf16 inputs."""
    return x.to(torch.float64) @ weight.to(torch.float64).T


def torch_linear(x, weight):
    """Called with the gate's own bf16 tensors inside a CUDA-graph capture (cuBLAS)."""
    return F.linear(x, weight)


def linear_residual_reference(x, weight, residual):
    """y = x . W^T + residual (linear_residual_v2), in float64."""
    return x.to(torch.float64) @ weight.to(torch.float64).T + residual.to(torch.float64)


def torch_linear_residual(x, weight, residual):
    """cuBLAS with the residual added in the GEMM's epilogue (beta = 1), as a user writes it."""
    return torch.addmm(residual, x, weight.T)

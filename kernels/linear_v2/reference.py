"""Torch definitions for the linears (linear_v2, linear_residual_v2 and the fused
rmsnorm_linear_v2, rmsnorm_linear_silu_mul_v2 and silu_mul_linear_residual_v2): the float64
reference (what is correct) and the torch op the kernel must beat (timed by the perf gate the
same way as the kernel)."""
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


def rmsnorm_linear_reference(x, weight, norm_weight, *, eps=1e-6):
    """rmsnorm_linear_v2: y = rmsnorm(x) . W^T (MPK's rmsnorm, eps 1e-6), in float64."""
    x = x.to(torch.float64)
    normed = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * norm_weight.to(torch.float64)
    return normed @ weight.to(torch.float64).T


def torch_rmsnorm_linear(x, weight, norm_weight, *, eps=1e-6):
    """What a user writes: torch's rms_norm, then cuBLAS."""
    return F.linear(F.rms_norm(x, (x.shape[-1],), norm_weight, eps), weight)


def rmsnorm_linear_silu_mul_reference(x, weight, norm_weight, *, eps=1e-6):
    """rmsnorm_linear_silu_mul_v2: y = silu(g) * u, [g | u] = rmsnorm(x) . W^T (W's gate rows,
    then its up rows), in float64."""
    gu = rmsnorm_linear_reference(x, weight, norm_weight, eps=eps)
    half = weight.shape[0] // 2
    return F.silu(gu[:, :half]) * gu[:, half:]


def torch_rmsnorm_linear_silu_mul(x, weight, norm_weight, *, eps=1e-6):
    """What a user writes: torch's rms_norm, cuBLAS over the gate|up weight, silu(g) * u."""
    gu = F.linear(F.rms_norm(x, (x.shape[-1],), norm_weight, eps), weight)
    half = weight.shape[0] // 2
    return F.silu(gu[:, :half]) * gu[:, half:]


def silu_mul_linear_residual_reference(x, weight, residual):
    """silu_mul_linear_residual_v2: y = (silu(gate) * up) . W^T + residual, gate and up
    the halves of x [m, 2k], in float64."""
    x = x.to(torch.float64)
    k = weight.shape[1]
    h = F.silu(x[:, :k]) * x[:, k:]
    return h @ weight.to(torch.float64).T + residual.to(torch.float64)


def torch_silu_mul_linear_residual(x, weight, residual):
    """What a user writes: silu(gate) * up, then cuBLAS with the residual in its epilogue."""
    k = weight.shape[1]
    return torch.addmm(residual, F.silu(x[:, :k]) * x[:, k:], weight.T)

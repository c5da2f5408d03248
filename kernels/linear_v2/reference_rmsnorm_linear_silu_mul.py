"""Torch definitions for rmsnorm_linear_silu_mul_v2: the float64 reference (what is correct) and the torch op the
kernel must beat (timed by the perf gate the same way as the kernel). One file per op: each
kernel's validate, perf and tune nodes sign its reference file whole, so an edit here re-runs
this kernel's gates only."""
import torch
import torch.nn.functional as F


def rmsnorm_linear_silu_mul_reference(x, weight, norm_weight, *, eps=1e-6):
    """y = silu(g) * u, [g | u] = rmsnorm(x) . W^T (W's gate rows, then its up rows; MPK's
    rmsnorm, eps 1e-6), in float64."""
    x = x.to(torch.float64)
    normed = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * norm_weight.to(torch.float64)
    gu = normed @ weight.to(torch.float64).T
    half = weight.shape[0] // 2
    return F.silu(gu[:, :half]) * gu[:, half:]


def torch_rmsnorm_linear_silu_mul(x, weight, norm_weight, *, eps=1e-6):
    """What a user writes: torch's rms_norm, cuBLAS over the gate|up weight, silu(g) * u."""
    gu = F.linear(F.rms_norm(x, (x.shape[-1],), norm_weight, eps), weight)
    half = weight.shape[0] // 2
    return F.silu(gu[:, :half]) * gu[:, half:]

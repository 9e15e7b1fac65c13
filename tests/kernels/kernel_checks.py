"""Shared checks for the kernel tests: relative error against the reference."""
import torch

# float32 kernels land far under 1e-4; half types round at ~1e-3
TOL = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 2e-2}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def assert_close(out, ref, dtype, seed, what=""):
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert not torch.isnan(out).any(), f"{what}: NaN in output (unwritten element?) seed={seed}"
    err = rel_err(out, ref)
    assert err < TOL[dtype], f"{what}: rel err {err:.3g} >= {TOL[dtype]} (seed={seed})"

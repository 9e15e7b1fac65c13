"""SiLU-and-mul: Triton (interpreted) against the reference."""
import pytest
import torch
from tests.kernels.kernel_checks import assert_close

from kernels.activation import silu_and_mul, silu_and_mul_reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 128), (5, 2 * 96), (2, 3, 2 * 1100)])
def test_silu_and_mul_matches_reference(dtype, shape, rng, poisoned):
    x = (torch.randn(shape, generator=rng) * 3).to(dtype)
    ref = silu_and_mul_reference(x)
    with poisoned():
        out = silu_and_mul(x)
    assert_close(out, ref, dtype, rng.initial_seed(), "silu_and_mul")

"""Gated activations (SiLU, GELU-tanh) and mul: Triton (interpreted) against the references."""
import pytest
import torch
from tests.kernels.kernel_checks import assert_close

from llm_kernels.activation import gelu_tanh_and_mul, gelu_tanh_and_mul_reference, silu_and_mul, silu_and_mul_reference

OPS = [(silu_and_mul, silu_and_mul_reference), (gelu_tanh_and_mul, gelu_tanh_and_mul_reference)]


@pytest.mark.parametrize("op", OPS, ids=["silu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 128), (5, 2 * 96), (2, 3, 2 * 1100)])
def test_act_and_mul_matches_reference(op, dtype, shape, rng, poisoned):
    fn, reference = op
    x = (torch.randn(shape, generator=rng) * 3).to(dtype)
    ref = reference(x)
    with poisoned():
        out = fn(x)
    assert_close(out, ref, dtype, rng.initial_seed(), fn.__name__)


def test_gelu_tanh_reference_is_transformers_gelu_pytorch_tanh():
    from transformers.activations import ACT2FN

    x = torch.linspace(-8, 8, 2 * 301).reshape(1, -1)
    gate, up = x.chunk(2, dim=-1)
    torch.testing.assert_close(gelu_tanh_and_mul_reference(x), ACT2FN["gelu_pytorch_tanh"](gate) * up)

"""RMSNorm and fused add + RMSNorm: Triton (interpreted) against the reference."""
import pytest
import torch
from tests.kernels.kernel_checks import assert_close

from llm_kernels.norm import fused_add_rms_norm, rms_norm, rms_norm_reference

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 64), (7, 100), (3, 5, 256)])
def test_rms_norm_matches_reference(dtype, shape, rng, poisoned):
    x = torch.randn(shape, generator=rng).to(dtype)
    w = torch.randn(shape[-1], generator=rng).to(dtype)
    ref = rms_norm_reference(x, w, 1e-6)
    with poisoned():
        out = rms_norm(x, w, 1e-6)
    assert_close(out, ref, dtype, rng.initial_seed(), "rms_norm")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 64), (9, 200), (2, 3, 128)])
def test_fused_add_rms_norm_updates_residual_in_place(dtype, shape, rng, poisoned):
    x = torch.randn(shape, generator=rng).to(dtype)
    res = torch.randn(shape, generator=rng).to(dtype)
    w = torch.randn(shape[-1], generator=rng).to(dtype)
    res_ref = res + x
    ref = rms_norm_reference(res_ref, w, 1e-5)
    ptr = res.data_ptr()
    with poisoned():
        out, res_out = fused_add_rms_norm(x, res, w, 1e-5)
    assert res_out.data_ptr() == ptr and res_out is res
    assert_close(res, res_ref, dtype, rng.initial_seed(), "residual")
    assert_close(out, ref, dtype, rng.initial_seed(), "fused_add_rms_norm")


def test_rms_norm_strided_rows(rng, poisoned):
    base = torch.randn(6, 160, generator=rng)
    x = base[:, 16:144]  # rows with a stride wider than the hidden size
    w = torch.randn(128, generator=rng)
    ref = rms_norm_reference(x, w, 1e-6)
    with poisoned():
        out = rms_norm(x, w, 1e-6)
    assert_close(out, ref, torch.float32, rng.initial_seed(), "strided")

"""The per-token activation quantization in one launch (llm_kernels.fp8.act_quant) under the
interpreter: the same bytes and scales as the torch reference it replaces (per_token_scales,
quantize_fp8) for 16-bit and float32 rows, across the loop's block edges, on strided rows,
all-zero rows, negative zeros, values that land in e4m3's subnormals, and every midpoint
between two e4m3 values (ties go to the even code)."""
import pytest
import torch

from llm_kernels.fp8 import FP8
from llm_kernels.fp8.act_quant import MAX_ROW, quantize_per_token, quantize_per_token_group
from llm_kernels.fp8.reference import per_token_scales, quantize_fp8


def reference(x):
    s = per_token_scales(x.float())
    return quantize_fp8(x.float(), s), s


def assert_same(x):
    q, s = quantize_per_token(x)
    rq, rs = reference(x)
    assert q.dtype == FP8 and s.shape == rs.shape and torch.equal(s, rs)
    diff = (q.view(torch.uint8) != rq.view(torch.uint8)).nonzero()
    assert not len(diff), [(x[i, j].item(), q[i, j].item(), rq[i, j].item()) for i, j in diff[:5].tolist()]


def every_midpoint() -> torch.Tensor:
    """448 (the scale is then 1), then every finite e4m3 value and every midpoint between two
    neighbours, both signs."""
    vals = torch.arange(256, dtype=torch.uint8)
    vals = vals[(vals & 0x7F) != 0x7F].view(FP8).float().unique()
    mids = (vals[1:] + vals[:-1]) / 2
    return torch.cat([torch.tensor([448.0]), vals, mids, -mids])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("K", [7, 3584, MAX_ROW, MAX_ROW + 77])
def test_bytes_and_scales_equal_torchs(rng, dtype, K):
    x = (torch.randn(6, K, generator=rng) * 3).to(dtype)
    x[1] = 0.0  # eps scale
    x[2, : K // 2] = -0.0
    x[3, 1:] *= 1e-3  # one large value: the rest fall among e4m3's subnormals
    assert_same(x)


def test_every_midpoint_rounds_to_the_even_code():
    row = every_midpoint()
    x = torch.zeros(2, row.numel() + 3)
    x[0, : row.numel()] = row
    x[1, : row.numel()] = row.flip(0) * 2.0**-3  # another scale: the same values, times 2^-3
    assert_same(x)


def test_strided_rows_and_no_rows(rng):
    xs = torch.randn(4, 300, generator=rng).to(torch.bfloat16)
    assert_same(xs[:, 20:250])
    q, s = quantize_per_token(xs[:0])
    assert q.shape == (0, 300) and s.shape == (0, 1)


def test_without_the_interpreter_it_is_the_reference(monkeypatch, rng):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert_same(torch.randn(3, 64, generator=rng).to(torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_per_token_and_group_bytes_and_scales_equal_torchs(rng, dtype):
    """Groups of 128 (block-scale checkpoints): each its own scale, an all-zero group eps, a
    group of one large value and subnormals; the bytes and scales of the float32 reference."""
    x = (torch.randn(5, 512, generator=rng) * 3).to(dtype)
    x[1, 128:256] = 0.0
    x[2, 256:384] *= 1e-3
    x[2, 300] = 50.0
    x[3, :128] = every_midpoint()[:128]
    q, s = quantize_per_token_group(x, 128)
    ref_s = per_token_scales(x.float(), 128)
    assert s.shape == (5, 4) and torch.equal(s, ref_s)
    assert torch.equal(q.view(torch.uint8), quantize_fp8(x.float(), ref_s, 128).view(torch.uint8))
    with pytest.raises(ValueError, match="multiple of the group"):
        quantize_per_token_group(x[:, :200], 128)

"""AWQ W4A16 GEMM on the checkpoint format: Triton (interpreted) against the reference."""
import pytest
import torch
from tests.kernels.kernel_checks import assert_close

from kernels.awq import (
    _dequant_triton,
    _gemm_configs,
    _gemm_launch,
    awq_dequantize,
    awq_gemm,
    awq_gemm_reference,
    pack_awq_int4,
    unpack_awq_int4,
)


def _weights(rng, K, N, G, dtype):
    q = torch.randint(0, 16, (K, N), generator=rng)
    z = torch.randint(0, 16, (K // G, N), generator=rng)
    s = (torch.rand(K // G, N, generator=rng) * 0.02 + 0.002).to(dtype)
    return pack_awq_int4(q), pack_awq_int4(z), s


def test_pack_unpack_round_trip(rng):
    v = torch.randint(0, 16, (4, 32), generator=rng)
    assert torch.equal(unpack_awq_int4(pack_awq_int4(v)), v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("M,K,N,G", [(1, 128, 64, 32), (5, 256, 96, 64), (16, 256, 128, 128), (33, 128, 64, 64)])
def test_awq_gemm_matches_reference(dtype, M, K, N, G, rng, poisoned):
    qw, qz, s = _weights(rng, K, N, G, dtype)
    x = torch.randn(M, K, generator=rng).to(dtype)
    ref = awq_gemm_reference(x, qw, qz, s, G)
    with poisoned():
        out = awq_gemm(x, qw, qz, s, G)
        per_config = [(cfg, _gemm_launch(x, qw, qz, s, G, cfg)) for cfg in _gemm_configs(M, x.device)]
    assert_close(out, ref, dtype, rng.initial_seed(), "awq_gemm")
    for cfg, o in per_config:  # both kernels (nibble planes, widened tile) and split-K
        assert_close(o, ref, dtype, rng.initial_seed(), f"awq_gemm {cfg}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_awq_dequantize_kernel_matches_reference(dtype, rng, poisoned):
    qw, qz, s = _weights(rng, 256, 192, 64, dtype)
    ref = awq_dequantize(qw, qz, s, 64)
    with poisoned():
        out = _dequant_triton(qw, qz, s, 64, dtype)
    assert_close(out, ref, dtype, rng.initial_seed(), "dequant")


def test_awq_gemm_rejects_mismatched_k(rng):
    qw, qz, s = _weights(rng, 128, 64, 32, torch.float32)
    with pytest.raises(ValueError):
        awq_gemm(torch.randn(2, 96), qw, qz, s, 32)

"""The checkpoint-layout W4A16 kernels (llm_kernels.w4a16.ckpt): Triton (interpreted) against
the reference.

The interpreter runs the plain-Triton dequant (exact float planes, DEQ 0, and
the 16-bit magic number, DEQ 1); the inline-PTX one (DEQ 2) runs in the GPU
tests. bf16 dots are broken under the interpreter: float32 and float16 here.
"""
import pytest
import torch
from tests.kernels.kernel_checks import assert_close

from llm_kernels.w4a16 import awq_dequantize, awq_gemm, awq_gemm_reference, pack_awq_int4, prepare, unpack_awq_int4
from llm_kernels.w4a16.ckpt import dequantize, launch, plan
from llm_kernels.w4a16.configs import ckpt_config, ckpt_configs
from llm_kernels.w4a16.select import CHECKPOINT
from llm_kernels.w4a16.workspace import workspace


def _weights(rng, K, N, G, dtype):
    q = torch.randint(0, 16, (K, N), generator=rng)
    z = torch.randint(0, 16, (K // G, N), generator=rng)
    s = (torch.rand(K // G, N, generator=rng) * 0.02 + 0.002).to(dtype)
    return pack_awq_int4(q), pack_awq_int4(z), s


def test_pack_unpack_round_trip(rng):
    v = torch.randint(0, 16, (4, 32), generator=rng)
    assert torch.equal(unpack_awq_int4(pack_awq_int4(v)), v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("M,K,N,G", [(1, 128, 64, 32), (5, 256, 136, 64), (16, 256, 256, 128), (33, 128, 64, 16),
                                     (3, 512, 128, 256)])
def test_awq_gemm_matches_reference(dtype, M, K, N, G, rng, poisoned):
    qw, qz, s = _weights(rng, K, N, G, dtype)
    x = torch.randn(M, K, generator=rng).to(dtype)
    ref = awq_gemm_reference(x, qw, qz, s, G)
    cfgs = ckpt_configs(M, dtype, x.device)
    with poisoned():
        out = awq_gemm(x, qw, qz, s, G)
        per_config = [(cfg, launch(x, qw, qz, s, G, cfg)) for cfg in cfgs]
    assert_close(out, ref, dtype, rng.initial_seed(), "awq_gemm")
    # split-K in one launch (workspace + arrival counters), one program per
    # tile, register prefetch, the 16-bit magic-number planes (float16), and
    # the wide-tile kernel (atomics split-K)
    if K // min(G, 64) > 1:
        assert any(plan(M, N, K, G, c, x.device)[3] > 1 for c in cfgs if c["kind"] == "fused")
    for cfg, o in per_config:
        assert_close(o, ref, dtype, rng.initial_seed(), f"awq_gemm {cfg}")


def test_awq_split_k_is_deterministic_and_counters_reset(rng):
    qw, qz, s = _weights(rng, 512, 128, 32, torch.float32)
    x = torch.randn(3, 512, generator=rng)
    cfg = ckpt_config(16, 16, 0, split=5, bk=32)
    assert plan(3, 128, 512, 32, cfg, x.device)[3] > 1
    a = launch(x, qw, qz, s, 32, cfg)
    b = launch(x, qw, qz, s, 32, cfg)
    assert torch.equal(a, b)
    assert not workspace(x.device)[1].any()  # every tile's counter back to zero
    assert_close(a, awq_gemm_reference(x, qw, qz, s, 32), torch.float32, rng.initial_seed(), "split-K")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_awq_dequantize_kernel_matches_reference(dtype, rng, poisoned):
    qw, qz, s = _weights(rng, 256, 192, 64, dtype)
    ref = awq_dequantize(qw, qz, s, 64)
    with poisoned():
        out = dequantize(qw, qz, s, 64, dtype)
    assert_close(out, ref, dtype, rng.initial_seed(), "dequant")


def test_awq_gemm_rejects_mismatched_k(rng):
    qw, qz, s = _weights(rng, 128, 64, 32, torch.float32)
    with pytest.raises(ValueError):
        awq_gemm(torch.randn(2, 96), qw, qz, s, 32)
    with pytest.raises(ValueError):
        prepare(qw, qz[:1], s, 32, CHECKPOINT)

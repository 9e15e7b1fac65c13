"""The CUDA-core AWQ GEMM for a few rows (llm_kernels.awq_gemv) under the interpreter,
against the checkpoint-format reference: every group size, 1-4 rows, split-K
partials summed in a fixed order with the counters reset, stripes narrower than a
tile, strided rows of x; more rows than it serves are refused by name. Its place
among the tuner's candidates (llm_kernels.awq_configs) is checked too."""
import pytest
import torch
from tests.kernels.kernel_checks import assert_close

from llm_kernels import awq_gemv, awq_kpack
from llm_kernels.awq import awq_gemm_reference, pack_awq_int4
from llm_kernels.awq_configs import gemv_configs, kpack_configs
from llm_kernels.workspace import workspace


def _layer(rng, K, N, G, stripe=None):
    q = torch.randint(0, 16, (K, N), generator=rng)
    z = torch.randint(0, 16, (K // G, N), generator=rng)
    s = (torch.rand(K // G, N, generator=rng) * 0.02 + 0.002).to(torch.float16)
    qw, qz = pack_awq_int4(q), pack_awq_int4(z)
    qk, z16 = awq_kpack.kpack_from_awq(qw, qz, G, stripe)
    return qw, qz, s, qk, z16


@pytest.mark.parametrize("M", [1, 2, 3, 4])
@pytest.mark.parametrize("K,N,G", [(256, 48, 16), (384, 64, 32), (256, 80, 64), (512, 96, 128), (768, 40, 256)])
def test_matches_reference(rng, M, K, N, G):
    qw, qz, s, qk, z16 = _layer(rng, K, N, G)
    x = torch.randn(M, K, generator=rng)
    ref = awq_gemm_reference(x, qw, qz, s.float(), G)
    for cfg in (awq_gemv.gemv_config(16), awq_gemv.gemv_config(32, warps=2, split=1), awq_gemv.gemv_config(64)):
        out = torch.full((M, N), float("nan"))
        awq_gemv.launch(x, qk, z16, s, G, cfg, out=out)
        assert_close(out, ref, torch.float32, rng.initial_seed(), f"gemv {cfg} M={M}")


def test_half_precision_rows(rng):
    """fp16 x and output: products and sums in float32, one rounding at the store."""
    K, N, G = 512, 64, 128
    qw, qz, s, qk, z16 = _layer(rng, K, N, G)
    x = torch.randn(3, K, generator=rng).to(torch.float16)
    ref = awq_gemm_reference(x.float(), qw, qz, s.float(), G)
    out = awq_gemv.launch(x, qk, z16, s, G, awq_gemv.gemv_config(32))
    assert out.dtype == torch.float16
    assert_close(out.float(), ref, torch.float16, rng.initial_seed(), "gemv fp16")


@pytest.mark.parametrize("split", [2, 3, 5, 8])
def test_split_k_partials_reduce_in_fixed_order(rng, split):
    """K cut into `split` runs (uneven ones too): equal to the whole K in one program,
    the same on a second call, and the arrival counters are back at zero."""
    K, N, G = 1024, 64, 128  # 8 blocks
    qw, qz, s, qk, z16 = _layer(rng, K, N, G)
    x = torch.randn(2, K, generator=rng)
    one = awq_gemv.launch(x, qk, z16, s, G, awq_gemv.gemv_config(32, split=1))
    assert_close(one, awq_gemm_reference(x, qw, qz, s.float(), G), torch.float32, rng.initial_seed(), "split 1")
    first = awq_gemv.launch(x, qk, z16, s, G, awq_gemv.gemv_config(32, split=split))
    again = awq_gemv.launch(x, qk, z16, s, G, awq_gemv.gemv_config(32, split=split))
    assert torch.allclose(first, one, rtol=1e-5, atol=1e-5)
    assert torch.equal(first, again)  # the partials summed in split order, not arrival order
    assert int(workspace(x.device)[1].abs().sum()) == 0


def test_split_count_follows_waves_and_blocks():
    """Enough splits for `waves` programs per SM (4 SMs under the interpreter), at most one a block."""
    cpu = torch.device("cpu")
    assert awq_gemv.split_count(awq_gemv.gemv_config(32, waves=16), 8, 100, cpu) == 8  # 64 programs / 8 tiles
    assert awq_gemv.split_count(awq_gemv.gemv_config(32, waves=16), 8, 3, cpu) == 3  # 3 blocks of K
    assert awq_gemv.split_count(awq_gemv.gemv_config(32, waves=1), 100, 50, cpu) == 1
    assert awq_gemv.split_count(awq_gemv.gemv_config(32, split=7), 1, 50, cpu) == 7


def test_tiles_across_narrow_stripes_and_strided_rows(rng):
    """A 64-column tile reading four 16-column stripes (the last one padded), x a view of wider rows."""
    K, N, G = 384, 72, 64
    qw, qz, s, qk, z16 = _layer(rng, K, N, G, stripe=16)
    wide = torch.randn(3, K + 40, generator=rng)
    x = wide[:, 8:8 + K]
    assert x.stride(0) == K + 40
    out = torch.full((3, N), float("nan"))
    awq_gemv.launch(x, qk, z16, s, G, awq_gemv.gemv_config(64, split=2), out=out)
    assert_close(out, awq_gemm_reference(x.contiguous(), qw, qz, s.float(), G), torch.float32, rng.initial_seed(),
                 "gemv stripes")


def test_more_rows_than_served_are_refused(rng):
    K, N, G = 128, 16, 128
    _, _, s, qk, z16 = _layer(rng, K, N, G)
    with pytest.raises(ValueError, match="at most 4 rows"):
        awq_gemv.launch(torch.zeros(5, K), qk, z16, s, G, awq_gemv.gemv_config(16))


def test_candidates_only_where_it_serves(monkeypatch):
    """The tuner times gemv configs at M <= 4 only, on CUDA (132 SMs here) and under the
    interpreter, never first (the first candidate is the capture-time and interpreter answer);
    the float32 (exact) path keeps its one config."""
    from llm_kernels import awq_configs

    monkeypatch.setattr(awq_configs, "sm_count", lambda device: 132)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    for M in (1, 2, 3, 4, 8, 16):
        for device in (cuda, cpu):
            kinds = [c["kind"] for c in kpack_configs(M, torch.bfloat16, device)]
            assert ("gemv" in kinds) == (M <= awq_gemv.MAX_M) and kinds[0] != "gemv", (M, device, kinds)
    assert [c for c in kpack_configs(2, torch.bfloat16, cuda) if c["kind"] == "gemv"] == gemv_configs(2)
    assert not gemv_configs(5)
    assert all(c["kind"] != "gemv" for c in kpack_configs(1, torch.float32, cuda))

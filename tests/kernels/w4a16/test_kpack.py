"""The K-packed W4A16 GEMM (llm_kernels.w4a16.kpack) under the interpreter against the
checkpoint-format reference: the repack is exact, every CPU candidate config
and the split-K reduction agree, unwritten outputs show. bf16 dots are broken
under the interpreter (the GPU tests run bf16 at real shapes)."""
import pytest
import torch
from tests.kernels.kernel_checks import assert_close

from llm_kernels.w4a16 import awq_dequantize, awq_gemm_reference, linear, pack_awq_int4, prepare
from llm_kernels.w4a16 import kpack as awq_kpack
from llm_kernels.w4a16 import kpack_grid
from llm_kernels.w4a16.configs import kpack_config, kpack_configs
from llm_kernels.w4a16.select import KPACK
from llm_kernels.w4a16.workspace import workspace


def _weights(rng, K, N, G, dtype):
    q = torch.randint(0, 16, (K, N), generator=rng)
    z = torch.randint(0, 16, (K // G, N), generator=rng)
    s = (torch.rand(K // G, N, generator=rng) * 0.02 + 0.002).to(dtype)
    return pack_awq_int4(q), pack_awq_int4(z), s


@pytest.mark.parametrize("stripe", [awq_kpack.STRIPE, 16])
@pytest.mark.parametrize("K,N,G", [(128, 64, 128), (256, 40, 32), (384, 96, 64), (256, 64, 16)])
def test_repack_is_exact(rng, K, N, G, stripe):
    """Striped (N padded to whole stripes with zero words) or not, the same half-words."""
    qw, qz, s = _weights(rng, K, N, G, torch.float16)
    qk, z8 = awq_kpack.kpack_from_awq(qw, qz, G, stripe)
    S = min(stripe, N)
    assert qk.shape == (-(-N // S), K // 4, S) and qk.dtype == torch.int16
    assert z8.shape == (K // G, N) and z8.dtype == torch.int16
    flat, _ = awq_kpack.kpack_from_awq(qw, qz, G, N)  # one stripe: the plain [K/4, N] matrix
    assert flat.shape == (1, K // 4, N) and torch.equal(awq_kpack.unstripe(qk, N), flat[0])
    assert not awq_kpack.unstripe(qk, qk.shape[0] * S)[:, N:].any()  # the padding is zero words
    ref = awq_dequantize(qw, qz, s, G, torch.float32)
    assert torch.equal(awq_kpack.kpack_dequantize_reference(qk, z8, s, G), ref)
    assert torch.equal(awq_kpack.dequantize(qk, z8, s, G, torch.float32), ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("M,K,N,G", [(1, 128, 64, 128), (5, 256, 72, 32), (17, 384, 64, 64), (40, 256, 128, 16),
                                     (3, 768, 96, 256)])
def test_every_config_matches_reference(rng, dtype, M, K, N, G):
    qw, qz, s = _weights(rng, K, N, G, torch.float16)
    x = torch.randn(M, K, generator=rng).to(dtype)
    ref = awq_gemm_reference(x.float(), qw, qz, s.float(), G)
    qk, z8 = awq_kpack.kpack_from_awq(qw, qz, G)
    for cfg in kpack_configs(M, dtype, x.device):
        out = torch.full((M, N), float("nan"), dtype=dtype)
        awq_kpack.launch(x, qk, z8, s, G, cfg, out=out)
        assert_close(out.float(), ref, dtype, rng.initial_seed(), f"kpack {cfg}")


@pytest.mark.parametrize("M,K,N,G,stripe", [(5, 256, 72, 32, 16), (17, 384, 96, 64, 32)])
def test_stripes_narrower_than_a_tile(rng, M, K, N, G, stripe):
    """Tiles that span several stripes (and a last, padded one) read the right columns."""
    qw, qz, s = _weights(rng, K, N, G, torch.float16)
    x = torch.randn(M, K, generator=rng)
    ref = awq_gemm_reference(x, qw, qz, s.float(), G)
    qk, z8 = awq_kpack.kpack_from_awq(qw, qz, G, stripe)
    for cfg in kpack_configs(M, x.dtype, x.device):
        out = torch.full((M, N), float("nan"))
        awq_kpack.launch(x, qk, z8, s, G, cfg, out=out)
        assert_close(out, ref, torch.float32, rng.initial_seed(), f"kpack stripe {stripe} {cfg}")


@pytest.mark.parametrize("programs", [3, 4, 5, 7, 16])
def test_stream_k_partials_reduce_in_fixed_order(rng, programs):
    """The work units cut into runs that start and end inside tiles (and tiles
    shared by up to 3 programs), partials reduced by the last arriving program:
    equal to one program per tile, and the arrival counters are reset for the
    next call."""
    K, N, G = 1024, 64, 128  # 2 tiles of 32 columns x 8 blocks
    qw, qz, s = _weights(rng, K, N, G, torch.float16)
    qk, z8 = awq_kpack.kpack_from_awq(qw, qz, G)
    x = torch.randn(3, K, generator=rng)
    one = awq_kpack.launch(x, qk, z8, s, G, {"kind": "fused", "BM": 16, "BN": 32, "grid": "tiles"})
    assert_close(one.float(), awq_gemm_reference(x, qw, qz, s.float(), G), torch.float32, rng.initial_seed(), "tiles")
    for _ in range(2):
        many = awq_kpack.launch(x, qk, z8, s, G, {"kind": "fused", "BM": 16, "BN": 32, "grid": programs})
        assert torch.allclose(many, one, rtol=1e-5, atol=1e-5)
    assert int(workspace(x.device)[1].abs().sum()) == 0


@pytest.mark.parametrize("grid", ["tiles", 3, 5])
@pytest.mark.parametrize("swap", [False, True])
def test_bias_is_added_once_at_the_store(rng, grid, swap):
    """The bias joins each output tile once: where one program finishes the tile, and where
    the last of the programs sharing it sums their partials (a run of 3 or 5 programs over
    2 tiles of 8 blocks splits both), in either orientation; out is written everywhere."""
    K, N, G, M = 1024, 64, 128, 3
    qw, qz, s = _weights(rng, K, N, G, torch.float16)
    qk, z8 = awq_kpack.kpack_from_awq(qw, qz, G)
    x = torch.randn(M, K, generator=rng)
    bias = torch.randn(N, generator=rng)
    ref = awq_gemm_reference(x, qw, qz, s.float(), G) + bias
    out = torch.full((M, N), float("nan"))
    cfg = {"kind": "fused", "BM": 16, "BN": 32, "grid": grid, "swap": swap}
    awq_kpack.launch(x, qk, z8, s, G, cfg, out=out, bias=bias)
    assert_close(out, ref, torch.float32, rng.initial_seed(), f"kpack bias {cfg}")
    assert int(workspace(x.device)[1].abs().sum()) == 0


@pytest.mark.parametrize("M", [2, 40])
def test_linear_adds_the_bias_in_the_gemm(rng, M, monkeypatch):
    """linear(x, w, bias) on the tuned paths (the kpack kernel at 2 tokens, the dequantized
    weight with cuBLAS's addmm at 40 under the interpreter) equals the reference plus the
    bias, and what it returns is the GEMM's own output (no add over it afterwards)."""
    from llm_kernels.w4a16 import weight

    K, N, G = 256, 48, 64
    qw, qz, s = _weights(rng, K, N, G, torch.float32)
    p = prepare(qw, qz, s, G)
    x = torch.randn(M, K, generator=rng)
    bias = torch.randn(N, generator=rng)
    ref = awq_gemm_reference(x, qw, qz, s, G) + bias
    made = []
    real_launch, real_addmm = awq_kpack.launch, torch.addmm
    monkeypatch.setattr(awq_kpack, "launch", lambda *a, **kw: made.append(real_launch(*a, **kw)) or made[-1])
    monkeypatch.setattr(torch, "addmm", lambda *a, **kw: made.append(real_addmm(*a, **kw)) or made[-1])
    got = weight.linear(x, p, bias)
    assert len(made) == 1 and got.data_ptr() == made[0].data_ptr()
    assert_close(got, ref, torch.float32, rng.initial_seed(), f"linear with bias M={M}")


@pytest.mark.parametrize("tiles,nblk,programs", [(2, 8, 3), (2, 8, 16), (296, 28, 660), (56, 148, 528), (7, 3, 20)])
def test_stream_k_plan_counts_the_programs_sharing_a_tile(tiles, nblk, programs):
    """C sizes the workspace slots per tile: the most programs whose runs meet one tile."""
    U = tiles * nblk
    runs = [(p * U // programs, (p + 1) * U // programs) for p in range(programs)]
    most = max(sum(1 for a, b in runs if a < (t + 1) * nblk and b > t * nblk and b > a) for t in range(tiles))
    assert kpack_grid.split_plan(tiles, nblk, programs) == most


def test_prepared_linear_uses_kpack(rng):
    """Prepared in the K-packed layout, the layer keeps no checkpoint words and linear keeps the answer."""
    K, N, G = 256, 48, 64
    qw, qz, s = _weights(rng, K, N, G, torch.float16)
    p = prepare(qw, qz, s, G)  # under the interpreter, as on CUDA: K a multiple of 128 packs
    assert p.layout == KPACK and p.qweight is None and p.qk is not None
    x = torch.randn(2, 3, K, generator=rng, dtype=torch.float16)
    ref = awq_gemm_reference(x.reshape(-1, K).float(), qw, qz, s.float(), G).view(2, 3, N)
    assert_close(linear(x, p).float(), ref, torch.float16, rng.initial_seed(), "linear kpack")


def test_bad_shapes_are_named():
    qw = torch.zeros(96, 8, dtype=torch.int32)
    with pytest.raises(ValueError, match="divisible by 128"):
        awq_kpack.kpack_from_awq(qw, torch.zeros(3, 8, dtype=torch.int32), 32)


def test_programs_per_sm_counts_registers_per_scheduler_quarter():
    """The stream-K grid is sized to the programs resident per SM: registers are
    allocated per warp in units of 256 within one quarter of the register file."""
    assert kpack_grid.programs_per_sm(95, 20000, 4) == 5  # 3072 per warp: 5 warps a quarter
    assert kpack_grid.programs_per_sm(200, 30000, 2) == 4  # 6400 per warp: 2 a quarter, not 10 / 2 = 5
    assert kpack_grid.programs_per_sm(64, 20000, 4) == 8
    assert kpack_grid.programs_per_sm(64, 100 * 1024, 4) == 2  # shared memory bound
    assert kpack_grid.programs_per_sm(16, 0, 1) == 32  # the per-SM block limit


def test_residency_is_kept_per_compiled_kernel():
    """M == 1 and M % 16 == 0 compile other kernels (Triton specialises them), and the
    row-tile and block counts are compile-time, and a bias is another kernel (more registers):
    each gets its own residency."""
    cfg = kpack_config(16, 64)

    def key(m, n=64, nblk=28, ops=(False,)):
        return kpack_grid.resident_key(cfg, torch.empty(m, 8), n, nblk, ops)

    assert len({key(1), key(16), key(2), key(17), key(2, nblk=148), key(2, n=72), key(2, ops=(True,))}) == 7
    assert key(2) == key(8)

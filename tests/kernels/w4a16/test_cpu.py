"""W4A16 on the CPU (llm_kernels.w4a16.cpu, through llm_kernels.w4a16.linear outside the
interpreter): torch's int4 kernel on the AWQ weights for steps of up to INT4_MAX_ROWS rows in
bfloat16 (the same weights as the dequantized ones, the zero term rounded once), the dense
weight above; the layers and dtypes it cannot take (or runs slowly: float32, float16) keep
the dense path."""
import pytest
import torch
from tests.kernels.kernel_checks import assert_close

from llm_kernels.dense import dense_linear
from llm_kernels.w4a16 import awq_dequantize, awq_gemm_reference, linear, pack_awq_int4, prepare
from llm_kernels.w4a16 import cpu as awq_cpu
from llm_kernels.w4a16.select import HOST, HOST_INT4

pytestmark = pytest.mark.skipif(not awq_cpu.int4_available(), reason="this torch has no CPU int4 kernel")


@pytest.fixture(autouse=True)
def no_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")


def _layer(rng, K, N, G):
    q = torch.randint(0, 16, (K, N), generator=rng)
    z = torch.randint(0, 16, (K // G, N), generator=rng)
    s = (torch.rand(K // G, N, generator=rng) * 0.02 + 0.002).to(torch.float16)
    return pack_awq_int4(q), pack_awq_int4(z), s


@pytest.fixture
def int4_calls(monkeypatch):
    calls = []
    real = awq_cpu.int4_mm
    monkeypatch.setattr(awq_cpu, "int4_mm", lambda x2, pack: calls.append(x2.shape[0]) or real(x2, pack))
    return calls


@pytest.mark.parametrize("dtype", [torch.bfloat16])
@pytest.mark.parametrize("K,N,G", [(576, 960, 32), (256, 48, 64), (512, 64, 128), (512, 32, 256)])
def test_few_rows_take_the_int4_kernel(rng, dtype, K, N, G, int4_calls):
    qw, qz, s = _layer(rng, K, N, G)
    s = s.to(dtype)
    w = prepare(qw, qz, s, G)
    assert w.layout == HOST_INT4 and w.int4 is not None
    bias = torch.randn(N, generator=rng).to(dtype)
    for rows in (1, 3, awq_cpu.INT4_MAX_ROWS):
        x = torch.randn(rows, K, generator=rng).to(dtype)
        ref = awq_gemm_reference(x.float(), qw, qz, s.float(), G) + bias.float()
        out = linear(x, w, bias)
        assert out.dtype == dtype and out.shape == (rows, N)
        assert_close(out.float(), ref, dtype, rng.initial_seed(), f"int4 {rows} rows")
    assert int4_calls == [1, 3, awq_cpu.INT4_MAX_ROWS]


def test_weights_are_the_dequantized_ones(rng):
    """scale = s and zero = (8 - z) s rebuild (q - z) s: a one-hot x reads weight rows, equal to the
    float32 dequantized ones within the kernel's bfloat16 roundings (the zero, (q - 8) s, the sum,
    the output: at most (3 * 8 + 15) / 512 of s; 0.073 s the worst seen): an eighth of a step.
    A wrong zero or scale would be off by a whole step s."""
    K, N, G = 128, 32, 32
    qw, qz, s = _layer(rng, K, N, G)
    pack = awq_cpu.int4_pack(qw, qz, s.to(torch.bfloat16), G, torch.bfloat16)
    w = awq_dequantize(qw, qz, s.to(torch.bfloat16), G, torch.float32)
    rows = awq_cpu.int4_mm(torch.eye(K)[:16].to(torch.bfloat16), pack).float()
    step = s.float().repeat_interleave(G, 0)[:16]
    assert ((rows - w[:16]).abs() <= step / 8).all()


def test_more_rows_or_other_dtypes_take_the_dense_weight(rng, int4_calls):
    K, N, G = 256, 64, 32
    qw, qz, s = _layer(rng, K, N, G)
    w = prepare(qw, qz, s.to(torch.bfloat16), G)
    dense = awq_dequantize(qw, qz, s.to(torch.bfloat16), G, torch.float32).t().contiguous().to(torch.bfloat16)
    assert torch.equal(w.dense, dense)
    x = torch.randn(2, 9, K, generator=rng).to(torch.bfloat16)  # 18 rows
    assert torch.equal(linear(x, w), dense_linear(x, dense))
    w16 = prepare(qw, qz, s, G)  # a float16 model: no pack (the kernel is slow there)
    assert w16.layout == HOST and w16.int4 is None
    x16 = torch.randn(1, 3, K, generator=rng).to(torch.float16)
    assert torch.equal(linear(x16, w16), dense_linear(x16, w16.dense))
    empty = torch.zeros(0, K, dtype=torch.bfloat16)
    assert linear(empty, w).shape == (0, N)
    assert int4_calls == []
    y = linear(x[:, :2], w)  # leading dims kept
    assert y.shape == (2, 2, N) and int4_calls == [4]


def test_layers_it_cannot_take_get_no_pack(rng):
    qw, qz, s = _layer(rng, 128, 40, 32)  # N = 40: not a multiple of 16
    assert awq_cpu.int4_pack(qw, qz, s, 32, torch.bfloat16) is None
    qw, qz, s = _layer(rng, 128, 32, 16)  # group 16
    assert awq_cpu.int4_pack(qw, qz, s, 16, torch.bfloat16) is None
    qw, qz, s = _layer(rng, 128, 32, 32)
    assert awq_cpu.int4_pack(qw, qz, s, 32, torch.bfloat16) is not None
    for slow in (torch.float32, torch.float16):
        assert awq_cpu.int4_pack(qw, qz, s, 32, slow) is None

"""The W8A16 GEMM (llm_kernels.fp8.w8a16) under the interpreter against the float32 product with
the dequantized weight: per-channel, per-tensor and block scales, token counts 1, 5 and 33, N and
K that are not multiples of the tiles, fp16, bf16 and float32 activations, every interpreter
config (split-K and not, the hardware conversion and the bit moves); the split-K partials
reduce in a fixed order; the bit-moved conversion is exact for every e4m3 byte. The same kernel
as W8A8 (activations quantized per token first) against the float32 product of the quantized
activations and the dequantized weight."""
import pytest
import torch
from tests.kernels.kernel_checks import assert_close

from llm_kernels.fp8 import FP8, dequantize_fp8, fp8_qdq_per_token, w8a16_reference
from llm_kernels.fp8 import dequant, w8a16
from llm_kernels.fp8.configs import w8a8_config, w8a8_configs, w8a16_config, w8a16_configs
from llm_kernels.w4a16.workspace import workspace

DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def layer(rng, N, K, kind, block=(32, 64)):
    """(e4m3 weight [N, K], scale as the kernel takes it, block or None) of one scale layout."""
    w = torch.randn(N, K, generator=rng) * 0.05
    if kind == "channel":
        s = w.abs().amax(1) / 448
        return (w / s[:, None]).to(FP8), s, None
    if kind == "tensor":  # one scale, expanded to channels as prepare holds it
        s = w.abs().amax() / 448
        return (w / s).to(FP8), s.reshape(1).expand(N).contiguous(), None
    bn, bk = block
    s = torch.rand(-(-N // bn), -(-K // bk), generator=rng) * 0.01 + 0.001
    return (torch.randn(N, K, generator=rng) * 100).clamp(-448, 448).to(FP8), s, block


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind,N,K", [("channel", 72, 200), ("tensor", 40, 96), ("block", 72, 224)])
@pytest.mark.parametrize("M", [1, 5, 33])
def test_every_config_matches_the_float32_product(rng, poisoned, dtype, kind, N, K, M):
    q, s, block = layer(rng, N, K, kind)
    x = torch.randn(M, K, generator=rng).to(dtype)
    ref = w8a16_reference(x, q, s, block)
    for cfg in w8a16_configs(M, dtype, x.device, block[1] if block else 0):
        with poisoned():
            out = w8a16.launch(x, q, s, block, cfg)
        assert out.dtype == dtype
        assert_close(out.float(), ref, dtype, rng.initial_seed(), f"{kind} M={M} {cfg}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bias_strided_rows_and_wide_scale_rows(rng, dtype):
    """A bias added to the float32 sum, x a slice with a row stride above K, block scales of one
    row per output row (bn 1: merged shards that do not start on whole blocks)."""
    N, K, M = 48, 128, 3
    q, s, _ = layer(rng, N, K, "block", (1, 64))
    xs = torch.randn(M, K + 32, generator=rng).to(dtype)
    x = xs[:, :K]
    bias = torch.randn(N, generator=rng).to(dtype)
    ref = w8a16_reference(x, q, s, (1, 64)) + bias.float()
    for cfg in (w8a16_config(16, 32, 64, split=1), w8a16_config(16, 16, 32, split=4, cvt="bits")):
        out = w8a16.launch(x, q, s, (1, 64), cfg, bias)
        assert_close(out.float(), ref, dtype, rng.initial_seed(), str(cfg))


def test_bit_moves_are_exact_for_every_byte():
    """The fp16 made from an e4m3 byte's bits is 2^-8 times its value, subnormals included (the
    dequant kernel multiplies the 2^8 back): equal to torch's conversion for all 254 finite bytes."""
    b = torch.arange(256, dtype=torch.uint8)
    b = b[(b & 0x7F) != 0x7F].view(FP8).reshape(2, 127)  # NaN (0x7f, 0xff) is not kept
    ones = torch.ones(2)
    for native in (True, False):
        w8a16_native = w8a16.native_conversion
        try:
            dequant.native_conversion = lambda device, n=native: n
            got = dequant.dequantize(b, ones, None, torch.float32)
        finally:
            dequant.native_conversion = w8a16_native
        assert torch.equal(got, b.float()), native


@pytest.mark.parametrize("split", [2, 3, 5])
def test_split_k_partials_reduce_in_part_order(rng, split):
    """K cut into parts (the last shorter): equal to one part per tile, bit for bit from call to
    call, and the arrival counters are back at zero for the next launch."""
    N, K, M = 40, 320, 4  # 10 blocks of 32 rows
    q, s, _ = layer(rng, N, K, "channel")
    x = torch.randn(M, K, generator=rng)
    one = w8a16.launch(x, q, s, None, w8a16_config(16, 16, 32, split=1))
    assert_close(one, w8a16_reference(x, q, s), torch.float32, rng.initial_seed(), "one part")
    outs = [w8a16.launch(x, q, s, None, w8a16_config(16, 16, 32, split=split)) for _ in range(2)]
    assert_close(outs[0], one, torch.float32, rng.initial_seed(), f"split {split}")
    assert torch.equal(outs[0], outs[1])
    assert not workspace(x.device)[1].any()


def test_split_parts_leave_no_part_empty():
    cpu = torch.device("cpu")  # 4 SMs stand in for the interpreter
    assert w8a16.split_parts(2, 10, {"split": 4}, cpu) == (4, 3)  # 3 + 3 + 3 + 1 blocks
    assert w8a16.split_parts(2, 10, {"split": 6}, cpu) == (5, 2)  # 6 parts of 2 would leave one empty
    assert w8a16.split_parts(1, 3, {"split": 8}, cpu) == (3, 1)
    assert w8a16.split_parts(8, 10, {"waves": 4}, cpu) == (2, 5)  # 16 programs = 4 a "SM"
    assert w8a16.split_parts(100, 10, {"waves": 4}, cpu) == (1, 10)


@pytest.mark.parametrize("kind", ["channel", "block"])
def test_dequantize_kernel_matches_the_reference(rng, kind):
    """Exact in float32; in bf16 one rounding (to nearest on a GPU; the interpreter truncates)."""
    q, s, block = layer(rng, 72, 200, kind, (32, 64))
    ref = dequantize_fp8(q, s, block, torch.float32)
    assert torch.equal(dequant.dequantize(q, s, block, torch.float32), ref)
    got = dequant.dequantize(q, s, block, torch.bfloat16).float()
    assert ((got - ref).abs() <= ref.abs() * 2**-7).all()


def test_a_block_k_that_does_not_divide_the_scale_block_is_refused(rng):
    q, s, block = layer(rng, 32, 128, "block", (32, 32))
    with pytest.raises(ValueError, match="does not divide"):
        w8a16.launch(torch.randn(1, 128), q, s, block, w8a16_config(16, 16, 64, split=1))
    assert all(c["BK"] <= 32 for c in w8a16_configs(1, torch.bfloat16, torch.device("cpu"), 32))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind,N,K", [("channel", 72, 200), ("tensor", 40, 96)])
@pytest.mark.parametrize("M", [1, 5, 33])
def test_w8a8_configs_match_the_quantized_product(rng, poisoned, dtype, kind, N, K, M):
    """Every interpreter config of the W8A8 kernel (split-K and not, tails of M, N and K), with a
    bias: the float32 product of the per-token quantized activations and the dequantized weight."""
    q, s, _ = layer(rng, N, K, kind)
    x = torch.randn(M, K, generator=rng).to(dtype)
    bias = torch.randn(N, generator=rng).to(dtype)
    ref = fp8_qdq_per_token(x.float()) @ dequantize_fp8(q, s).t() + bias.float()
    for cfg in w8a8_configs(M, x.device):
        with poisoned():
            out = w8a16.launch(x, q, s, None, cfg, bias)
        assert out.dtype == dtype
        assert_close(out.float(), ref, dtype, rng.initial_seed(), f"{kind} M={M} {cfg}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 5, 33])
def test_w8a8_with_block_scales_matches_the_group_quantized_product(rng, poisoned, dtype, M):
    """Block scales (32 x 64 here; 128 x 128 in the official releases): every interpreter config
    the block allows, the activations quantized per token and block of K (the scheme's own
    quantization), each block's sum scaled by both scales; N and M off the tiles."""
    q, s, block = layer(rng, 72, 256, "block", (32, 64))
    x = torch.randn(M, 256, generator=rng).to(dtype)
    bias = torch.randn(72, generator=rng).to(dtype)
    ref = fp8_qdq_per_token(x.float(), 64) @ dequantize_fp8(q, s, block).t() + bias.float()
    cands = w8a8_configs(M, x.device, block[1])
    assert cands and all(block[1] % c["BK"] == 0 for c in cands)
    for cfg in cands:
        with poisoned():
            out = w8a16.launch(x, q, s, block, cfg, bias)
        assert_close(out.float(), ref, dtype, rng.initial_seed(), f"block M={M} {cfg}")


def test_w8a8_refuses_a_k_off_the_scale_blocks(rng):
    q, s, block = layer(rng, 32, 96, "block", (32, 64))
    with pytest.raises(ValueError, match="multiple of the scale block"):
        w8a16.launch(torch.randn(1, 96), q, s, block, w8a8_config(16, 16, 32, split=1))

"""An FP8 layer prepared for its device and run on the kernel the selection names: on the CPU
the dequantized weight alone and the products it always computed; under the interpreter (the
GPU's kernels) the e4m3 weight alone, held once, the weight-only kernel at small token counts
and the dequantized weight above; merged shards of block scales; the tuner's choice between the
W8A16 kernel and the path beside it, timed without the agreement check."""
import pytest
import torch
import torch.nn.functional as F
from tests.kernels.kernel_checks import assert_close

from llm_kernels import dispatch
from llm_kernels.dense import dense_linear
from llm_kernels.fp8 import FP8, dequantize_fp8, fp8_qdq_per_token, linear, plan, prepare, w8a16_reference
from llm_kernels.fp8 import weight as fp8_weight
from llm_kernels.fp8.configs import shape_key
from llm_kernels.fp8.select import BLOCK, CHANNEL, HOST, SCALED


def channel_layer(rng, N, K):
    w = torch.randn(N, K, generator=rng) * 0.05
    s = w.abs().amax(1) / 448
    return (w / s[:, None]).to(FP8), s


def block_layer(rng, sizes, K, block):
    bn, bk = block
    q = (torch.randn(sum(sizes), K, generator=rng) * 100).clamp(-448, 448).to(FP8)
    s = torch.rand(sum(-(-n // bn) for n in sizes), -(-K // bk), generator=rng) * 0.01 + 0.001
    return q, s


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cpu_keeps_the_products_it_always_computed(monkeypatch, rng, dtype):
    """Without the interpreter: the dequantized weight alone, per-token activations through
    torch's linear, grouped ones (block scales) and none (weight-only) through dense_linear."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, s = channel_layer(rng, 40, 64)
    x = torch.randn(3, 5, 64, generator=rng).to(dtype)
    bias = torch.randn(40, generator=rng).to(dtype)
    p = prepare(q, s, dtype)
    assert p.layout == HOST and p.weight is None and p.dense.dtype == dtype
    dense = dequantize_fp8(q, s, dtype=dtype)
    assert torch.equal(linear(x, p, bias), F.linear(fp8_qdq_per_token(x.float()).to(dtype), dense, bias))
    assert torch.equal(linear(x, prepare(q, s, dtype, act=None)), dense_linear(x, dense))
    qb, sb = block_layer(rng, [32, 16], 64, (16, 32))
    pb = prepare(qb, sb, dtype, (16, 32), "group", [32, 16])
    xg = fp8_qdq_per_token(x.reshape(-1, 64), 32).reshape(3, 5, 64)
    assert torch.equal(linear(x, pb), dense_linear(xg, dequantize_fp8(qb, sb, (16, 32), dtype)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_interpreter_runs_the_weight_only_kernel_on_the_weight_held_once(rng, dtype):
    q, s = channel_layer(rng, 48, 96)
    p = prepare(q, s, dtype)
    assert p.layout == SCALED and p.dense is None and p.weight.data_ptr() == q.data_ptr()
    assert prepare(q, s, dtype, act=None).layout == CHANNEL
    assert prepare(q[:40, :88], s[:40], dtype).layout == CHANNEL  # not what _scaled_mm takes
    bias = torch.randn(48, generator=rng).to(dtype)
    for M in (1, 5, 33):
        x = torch.randn(M, 96, generator=rng).to(dtype)
        assert plan(x, p)[0] == "w8a16"
        out = linear(x.unsqueeze(0), p, bias)
        assert out.shape == (1, M, 48) and out.dtype == dtype
        assert_close(out[0].float(), w8a16_reference(x, q, s) + bias.float(), dtype, rng.initial_seed(), f"M={M}")
    x = torch.randn(513, 96, generator=rng).to(dtype)  # above the kernel's range: the dequantized weight
    assert plan(x, p)[0] == "dequant_matmul"
    ref = fp8_qdq_per_token(x.float()).to(dtype).float() @ dequantize_fp8(q, s).t()
    assert_close(linear(x, p).float(), ref, dtype, rng.initial_seed(), "M=513")
    assert linear(x[:0], p).shape == (0, 48)
    with pytest.raises(ValueError, match="K=95"):
        linear(x[:, :95], p)


@pytest.mark.parametrize("sizes", [[64, 32], [40, 24]])
def test_block_scales_of_merged_shards(rng, sizes):
    """Shards of whole blocks keep the checkpoint's scales; others get a scale row per output row."""
    K, block = 96, (32, 32)
    q, s = block_layer(rng, sizes, K, block)
    p = prepare(q, s, torch.bfloat16, block, "group", sizes)
    assert p.layout == BLOCK and p.block == (block if sizes[0] % 32 == 0 else (1, 32))
    ref_w = torch.cat([dequantize_fp8(q[o:o + n], s[r:r + -(-n // 32)], block)
                       for o, n, r in ((0, sizes[0], 0), (sizes[0], sizes[1], -(-sizes[0] // 32)))])
    x = torch.randn(4, K, generator=rng)
    assert_close(linear(x, p), x @ ref_w.t(), torch.float32, rng.initial_seed(), str(sizes))
    assert torch.equal(fp8_weight.dequantize(p, torch.float32), ref_w)


@pytest.mark.parametrize("fastest", ["scaled_mm", "w8a8"])
def test_tuner_times_every_path_without_the_agreement_check(fake_gpu, monkeypatch, rng, fastest):
    """17-128 tokens on an FP8 GPU: each Triton kernel's configs are timed and checked among
    themselves, then the best of each against _scaled_mm, whose outputs differ by the
    activation's rounding (5% here); the fastest is taken though it disagrees."""
    gpu = fake_gpu({"w8a16": 20e-6, "w8a8": 8e-6 if fastest == "w8a8" else 12e-6, "scaled_mm": 10e-6})

    def run(x2, w, cfg, bias, xq=None):
        gpu.log.append(cfg["kind"])
        assert xq is None  # an unfed layer: every kind times its own activation pass
        return torch.full((4,), 1.0 if cfg["kind"] == "w8a16" else 1.05)

    monkeypatch.setattr(fp8_weight, "device_class", lambda x: "cuda-fp8")
    monkeypatch.setattr(fp8_weight, "_run", run)
    q, s = channel_layer(rng, 48 + int(rng.initial_seed() % 1000) * 16 + len(fastest), 64)  # a shape of its own
    p = prepare(q, s, torch.bfloat16, layout=SCALED)
    x = torch.randn(32, 64, generator=rng).to(torch.bfloat16)
    assert fp8_weight.plan(x, p) == ("w8a16", None)  # before tuning: the list's first
    fp8_weight._tuned(x, p, ("w8a16", "w8a8", "scaled_mm"), None)
    timed = [c for (name, *_), runs in dispatch.TIMINGS.items() if name == fp8_weight.TUNED_PATH for c, _ in runs]
    assert sorted(c["kind"] for c in timed) == ["scaled_mm", "w8a16", "w8a8"]
    kernel, cfg = fp8_weight.plan(x, p)
    assert kernel == fastest and (cfg is None) == (fastest == "scaled_mm")


def test_a_fed_layer_times_the_fp8_gemms_on_a_handed_over_input_and_tunes_apart(fake_gpu, monkeypatch, rng):
    """A fed layer (its producer quantizes its input): W8A8 and cuBLAS FP8 are timed on x
    quantized once beforehand, as the model hands it over, the weight-only kernel on x; the
    choice is stored under the fed key, the unfed shape left untuned."""
    gpu = fake_gpu({"w8a16": 20e-6, "w8a8": 12e-6, "scaled_mm": 10e-6})
    handed = []

    def run(x2, w, cfg, bias, xq=None):
        gpu.log.append(cfg["kind"])
        handed.append((cfg["kind"], xq is not None))
        return torch.full((4,), 1.0 if cfg["kind"] == "w8a16" else 1.05)

    monkeypatch.setattr(fp8_weight, "device_class", lambda x: "cuda-fp8")
    monkeypatch.setattr(fp8_weight, "_run", run)
    q, s = channel_layer(rng, 64 + int(rng.initial_seed() % 1000) * 16, 64)  # a shape of its own
    p = prepare(q, s, torch.bfloat16, layout=SCALED)
    x = torch.randn(32, 64, generator=rng).to(torch.bfloat16)
    assert fp8_weight.wants_quantized_input(p, x) and p.fed  # untuned: any of its kernels may take it
    fp8_weight._tuned(x, p, ("w8a16", "w8a8", "scaled_mm"), None)
    *timings, last = handed
    assert {kind for kind, _ in timings} == {"w8a16", "w8a8", "scaled_mm"}
    assert all(got for kind, got in timings if kind != "w8a16")  # (the weight-only kernel reads x itself)
    assert last == ("scaled_mm", False)  # the call itself, handed nothing: it quantizes x as before
    assert fp8_weight.plan(x, p)[0] == "scaled_mm" and fp8_weight.wants_quantized_input(p, x)
    key = shape_key(32, p.out_features, 64, SCALED, x.dtype)
    assert dispatch.chosen(fp8_weight.TUNED_PATH, key + ("fed",)) is not None
    assert dispatch.chosen(fp8_weight.TUNED_PATH, key) is None


@pytest.mark.parametrize("act,w8a8", [("group", True), (None, False)])
def test_block_layers_take_w8a8_only_where_their_scheme_quantizes_activations(monkeypatch, rng, act, w8a8):
    """On an FP8 GPU a 128 x 128 block layer of a per-token-and-group scheme has the W8A8 kernel
    among its candidates; a weight-only block scheme never does (its product would change)."""
    monkeypatch.setattr(fp8_weight, "device_class", lambda x: "cuda-fp8")
    q, s = block_layer(rng, [256], 256, (128, 128))
    p = prepare(q, s, torch.bfloat16, (128, 128), act)
    assert p.layout == BLOCK
    for M in (1, 100):
        names = fp8_weight._kernels(torch.zeros(M, 256, dtype=torch.bfloat16), p)
        assert ("w8a8" in names) == w8a8 and "w8a16" in names, (M, names)

"""The FP8 linear on the GPU at Qwen2.5-7B's shapes (qkv, o, gate+up, down) and decode token
counts 1, 16, 64: every tuner candidate of the W8A16 kernel (the hardware e4m3 conversion and the
bit moves Ampere runs) against the float32 weight-only product; the layer (whatever the
selection and the tuner pick) against the float32 product of the kernel it runs, eagerly and
replayed from a CUDA graph; per-channel and 128x128 block scales; no 16-bit copy of the weight;
every candidate of the W8A8 kernel against the float32 product of the per-token quantized
activations; the one-launch activation quantization byte for byte against torch's.
The default run takes a few shapes; `-m slow` all of them."""
import pytest
import torch

from llm_kernels.fp8 import FP8, dequantize_fp8, fp8_qdq_per_token, linear, plan, prepare
from llm_kernels.fp8 import w8a16
from llm_kernels.fp8.act_quant import quantize_per_token, quantize_per_token_group
from llm_kernels.fp8.configs import w8a8_configs, w8a16_configs
from llm_kernels.fp8.reference import per_token_scales, quantize_fp8, scaled_mm_available
from llm_kernels.w4a16.workspace import workspace
from tests.gpu.conftest import cases, check, rel_err

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

QKV, O, GATE_UP, DOWN = (3584, 4608), (3584, 3584), (3584, 37888), (18944, 3584)  # (K, N)
EVERY = [(K, N, M, scales) for (K, N) in (QKV, O, GATE_UP, DOWN) for M in (1, 16, 64)
         for scales in ("channel", "block")]
DEFAULT = [(*QKV, 1, "channel"), (*QKV, 16, "block"), (*GATE_UP, 16, "channel"), (*DOWN, 64, "channel"),
           (*O, 64, "block"), (*O, 256, "channel")]


def fp8_layer(K, N, scales, gen):
    """(e4m3 weight [N, K], its scales as a checkpoint holds them, block or None)."""
    w = torch.randn(N, K, device="cuda", generator=gen) * 0.05
    if scales == "channel":
        s = w.abs().amax(1) / 448
        return (w / s[:, None]).to(FP8), s, None
    s = torch.rand(N // 128, K // 128, device="cuda", generator=gen) * 0.002 + 1e-4
    q = (torch.randn(N, K, device="cuda", generator=gen) * 100).clamp(-448, 448).to(FP8)
    return q, s, (128, 128)


def kernel_reference(kernel, x, w_deq, act, bias):
    """The float32 product of the kernel: weight-only for w8a16, the activations quantized as the scheme says else."""
    if kernel == "w8a8" and act == "group":  # the W8A8 kernel quantizes per token and block from float32
        x = fp8_qdq_per_token(x.float(), 128)
    elif kernel != "w8a16":
        x = fp8_qdq_per_token(x.float()) if act == "token" else fp8_qdq_per_token(x, 128) if act == "group" else x
    return x.float() @ w_deq.t() + bias.float()


@pytest.mark.parametrize("K,N,M,scales", cases(DEFAULT, EVERY))
def test_fp8_layer_at_qwen25_7b_shapes(K, N, M, scales):
    gen = torch.Generator(device="cuda").manual_seed(K + N + M)
    q, s, block = fp8_layer(K, N, scales, gen)
    w_deq = dequantize_fp8(q, s, block)
    act = "token" if block is None else "group"
    workspace(q.device)  # the split-K workspace, allocated once per device, is not the layer's
    before = torch.cuda.memory_allocated()
    p = prepare(q, s, torch.bfloat16, block, act)
    assert p.weight is q and torch.cuda.memory_allocated() - before < N * K // 8, "a copy of the weight"
    x = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
    bias = torch.randn(N, device="cuda", generator=gen).to(torch.bfloat16)
    ref = x.float() @ w_deq.t() + bias.float()
    for cfg in w8a16_configs(M, x.dtype, x.device, block[1] if block else 0):
        check(w8a16.launch(x, p.weight, p.scale, p.block, cfg, bias), ref, torch.bfloat16, f"w8a16 {cfg}")
    if scaled_mm_available(x.device):  # FP8 tensor cores: the W8A8 kernel, per-channel and block scales
        ref_a8 = kernel_reference("w8a8", x, w_deq, act, bias)
        for cfg in w8a8_configs(M, x.device, block[1] if block else 0):
            check(w8a16.launch(x, p.weight, p.scale, p.block, cfg, bias), ref_a8, torch.bfloat16, f"w8a8 {cfg}")
    out = linear(x, p, bias)  # tunes this shape
    kernel, cfg = plan(x, p)
    check(out, kernel_reference(kernel, x, w_deq, act, bias), torch.bfloat16, f"layer ({kernel} {cfg})")
    assert rel_err(out, ref) < 6e-2  # near the weight-only product whichever kernel ran

    static_x = x.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = linear(static_x, p, bias)
    for _ in range(2):
        x2 = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
        static_x.copy_(x2)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_out, linear(x2, p, bias)), "the graph's replay differs from the eager call"
        check(static_out, kernel_reference(kernel, x2, w_deq, act, bias), torch.bfloat16, f"graph ({kernel})")


def test_weight_only_kernel_runs_where_the_gpu_has_no_fp8_conversion():
    """The bit-moved conversion (Ampere's) forced on this GPU: equal to the hardware's."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, s, _ = fp8_layer(*QKV, "channel", gen)
    x = torch.randn(16, QKV[0], device="cuda", generator=gen).to(torch.bfloat16)
    cfg = w8a16_configs(16, x.dtype, x.device)[0]
    native = w8a16.launch(x, q, s, None, cfg)
    bits = w8a16.launch(x, q, s, None, {**cfg, "cvt": "bits"})
    assert rel_err(bits, native) < 1e-3


@pytest.mark.parametrize("K", [3584, 18944])
def test_activation_quantization_is_torchs_byte_for_byte(K):
    """The hardware's rounding (cvt.rn.satfinite) and IEEE division: the bytes and scales of
    torch's five-kernel version, every e4m3 midpoint included, eagerly and from a CUDA graph."""
    gen = torch.Generator(device="cuda").manual_seed(K)
    if not scaled_mm_available(torch.device("cuda")):
        pytest.skip("no FP8 conversion below sm_89")
    x = (torch.randn(64, K, device="cuda", generator=gen) * 4).to(torch.bfloat16)
    vals = torch.arange(256, dtype=torch.uint8)
    vals = vals[(vals & 0x7F) != 0x7F].view(FP8).float().unique()
    row = torch.cat([torch.tensor([448.0]), vals, (vals[1:] + vals[:-1]) / 2]).cuda()
    x32 = x.float()
    x32[0].zero_()
    x32[1, : row.numel()] = row
    x32[1, row.numel():] = 0
    for inp in (x, x32):
        q, s = quantize_per_token(inp)
        rs = per_token_scales(inp.float())
        assert torch.equal(s, rs)
        assert torch.equal(q.view(torch.uint8), quantize_fp8(inp.float(), rs).view(torch.uint8))
        if K % 128 == 0:  # per token and block of 128 (block-scale checkpoints' W8A8)
            q, s = quantize_per_token_group(inp, 128)
            rs = per_token_scales(inp.float(), 128)
            assert torch.equal(s, rs)
            assert torch.equal(q.view(torch.uint8), quantize_fp8(inp.float(), rs, 128).view(torch.uint8))
    static = x.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gq, gs = quantize_per_token(static)
    static.copy_(x.flip(0))
    graph.replay()
    q, s = quantize_per_token(x.flip(0))
    assert torch.equal(gq.view(torch.uint8), q.view(torch.uint8)) and torch.equal(gs, s)

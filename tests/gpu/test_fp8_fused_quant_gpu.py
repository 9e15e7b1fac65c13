"""On the GPU: the norm and the SiLU/GELU-and-mul that quantize their output for an FP8 GEMM
in their own launch (llm_kernels.rms_norm_quant, fused_add_rms_norm_quant, act_and_mul_quant,
the hardware's e4m3 rounding on sm_89+) give the bytes and scales of quantize_per_token of the
16-bit output they store (the plain kernels' output within a bf16 unit), at Qwen2.5-7B's widths
(hidden 3584, intermediate 18944) and 1-256 tokens, eagerly and replayed from a CUDA graph; a
fed FP8 layer handed that quantization computes what it computes quantizing its own input, on
every kernel that takes one."""
import dataclasses

import pytest
import torch

import llm_kernels
from llm_kernels.fp8 import FP8, linear, plan, prepare, wants_quantized_input
from llm_kernels.fp8.act_quant import quantize_per_token
from llm_kernels.fp8.reference import scaled_mm_available

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def same_bytes(out, q, s, want, what):
    """q and s are quantize_per_token of the stored out, byte for byte; out is the plain kernel's
    output up to its last bit: the two compiled variants may round a row's 1/rms apart (on an
    H100, one row in 1 of 30 random inputs of 1-256 tokens: 46 values a bf16 unit apart), and the
    quantization follows the row it stores."""
    rq, rs = quantize_per_token(out)
    assert torch.equal(s, rs), what
    diff = (q.view(torch.uint8) != rq.view(torch.uint8)).sum().item()
    assert diff == 0, f"{what}: {diff} bytes differ"
    torch.testing.assert_close(out, want, rtol=2**-7, atol=0, msg=what)


def graphed(fn):
    """fn's outputs replayed from a CUDA graph (captured after a warm-up call)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = fn()
    g.replay()
    torch.cuda.synchronize()
    return outs


@pytest.mark.parametrize("M", [1, 50, 256])
def test_the_norm_quantizes_what_it_stores(M, gen):
    H = 3584
    x = torch.randn(M, H, device="cuda", generator=gen).to(torch.bfloat16) * 4
    res = torch.randn(M, H, device="cuda", generator=gen).to(torch.bfloat16)
    w = torch.randn(H, device="cuda", generator=gen).to(torch.bfloat16)
    out, q, s = llm_kernels.rms_norm_quant(x, w, 1e-6)
    same_bytes(out, q, s, llm_kernels.rms_norm(x, w, 1e-6), "rms_norm_quant")
    r1, r2 = res.clone(), res.clone()
    out, r1, q, s = graphed(lambda: llm_kernels.fused_add_rms_norm_quant(x, r1.copy_(res), w, 1e-6))
    want, r2 = llm_kernels.fused_add_rms_norm(x, r2, w, 1e-6)
    assert torch.equal(r1, r2)
    same_bytes(out, q, s, want, "fused_add_rms_norm_quant, graphed")


@pytest.mark.parametrize("gelu", [False, True])
@pytest.mark.parametrize("M", [1, 50, 256])
def test_the_activation_quantizes_what_it_stores(M, gelu, gen):
    x = torch.randn(M, 2 * 18944, device="cuda", generator=gen).to(torch.bfloat16) * 3
    want = (llm_kernels.gelu_tanh_and_mul if gelu else llm_kernels.silu_and_mul)(x)
    same_bytes(*llm_kernels.act_and_mul_quant(x, gelu), want, "act_and_mul_quant")
    same_bytes(*graphed(lambda: llm_kernels.act_and_mul_quant(x, gelu)), want, "act_and_mul_quant, graphed")


@pytest.mark.skipif(not torch.cuda.is_available() or not scaled_mm_available(torch.device("cuda")),
                    reason="needs FP8 tensor cores")
@pytest.mark.parametrize("K,N", [(3584, 4608), (18944, 3584)])
@pytest.mark.parametrize("M", [64, 256])
def test_a_fed_layer_handed_the_quantization_computes_the_same(K, N, M, gen):
    w = torch.randn(N, K, device="cuda", generator=gen) * 0.05
    s = w.abs().amax(1) / 448
    p = dataclasses.replace(prepare((w / s[:, None]).to(FP8), s, torch.bfloat16, act="token"), fed=True, wants={})
    x = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
    wants = wants_quantized_input(p, x)
    xq = quantize_per_token(x)
    out = linear(x, p, xq=xq)  # tunes the fed shape
    kernel, _ = plan(x, p)
    assert wants or kernel == "w8a16", (wants, kernel)
    if kernel in ("w8a8", "scaled_mm"):
        assert wants_quantized_input(p, x)
    own = linear(x, p)
    assert torch.equal(out, own), kernel  # the same e4m3 bytes either way
    assert torch.equal(graphed(lambda: linear(x, p, xq=xq)), own)

"""GPTQ and compressed-tensors W4A16 layers on the GPU run through the AWQ kernel
(repacked at load into its K-packed layout) and match the float32 reference built
straight from the checkpoint's integers; the FP8 linear matches the float32 math of the
kernel it runs (llm_kernels.fp8: weight-only at small token counts, W8A8 above)."""
import pytest
import torch

from engine.quant.repacked import apply_parts, int4_parts
from llm_kernels.fp8 import FP8, fp8_qdq_per_token, plan
from llm_kernels.fp8 import linear as fp8_linear
from llm_kernels.fp8 import prepare as fp8_prepare
from llm_kernels.fp8.select import CHANNEL
from llm_kernels.w4a16.ct_format import ct_int_view
from llm_kernels.w4a16.gptq_format import gptq_unpack, pack_cols, pack_rows
from llm_kernels.w4a16.select import KPACK
from tests.gpu.conftest import slow
from tests.quant_models import ct_pack

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SHAPES = [(3584, 4608), slow(18944, 3584), slow(3584, 37888)]
MS = [1, 16, 100, 512]


def rel_err(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def _ints(K, N, G, gen):
    q = torch.randint(0, 16, (K, N), device="cuda", generator=gen)
    z = torch.randint(1, 16, (K // G, N), device="cuda", generator=gen)  # v1 GPTQ cannot store zero 0
    s = (torch.rand(K // G, N, device="cuda", generator=gen) * 0.01 + 0.001).to(torch.bfloat16)
    return q, z, s


def _layer(fmt, K, N, G, gen):
    """(engine parts, reference weight [K, N] float32) of one layer of `fmt`."""
    q, z, s = _ints(K, N, G if G > 0 else K, gen)
    g_idx = torch.arange(K, device="cuda") // (G if G > 0 else K)
    if fmt == "gptq-act-order":
        g_idx = g_idx[torch.randperm(K, device="cuda", generator=gen)]
    if fmt.startswith("gptq"):
        qq, zz = gptq_unpack(pack_rows(q, 4), pack_cols(z - 1, 4), 4, 1)
        ref = (q - z[g_idx]).float() * s.float()[g_idx]
        return int4_parts([(qq, zz, s, g_idx)], G, torch.bfloat16), ref
    ref = (q - 8).float() * s.float()[g_idx]  # compressed-tensors symmetric: zero 8
    return int4_parts([ct_int_view(ct_pack(q.t(), 4), s.t().contiguous(), None, None, 4, K)], G, torch.bfloat16), ref


@pytest.mark.parametrize("K,N", SHAPES)
@pytest.mark.parametrize("fmt,G", [("gptq", 128), ("gptq", -1), ("gptq-act-order", 128), ("gptq-act-order", 32),
                                   ("compressed-tensors", 128), ("compressed-tensors", -1)])
def test_w4a16_formats_run_the_awq_kernel(fmt, G, K, N):
    gen = torch.Generator(device="cuda").manual_seed(K + N + G)
    parts, ref_w = _layer(fmt, K, N, G, gen)
    assert len(parts) == 1 and parts[0].w4a16.layout == KPACK, "not the K-packed layout of the W4A16 kernel"
    assert (parts[0].perm is not None) == (fmt == "gptq-act-order")
    for M in MS:
        x = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
        out = apply_parts(parts, x, None)
        assert out.dtype == torch.bfloat16 and not torch.isnan(out).any()
        err = rel_err(out, x.float() @ ref_w)
        assert err < 1.5e-2, f"{fmt} g{G} {K}x{N} M={M}: rel err {err:.3g}"


@pytest.mark.parametrize("K,N", SHAPES)
@pytest.mark.parametrize("per_tensor", [False, True])
def test_fp8_linear_matches_the_product_of_the_kernel_it_runs(K, N, per_tensor):
    """FP8_DYNAMIC-style layers through llm_kernels.fp8.linear: the weight-only kernel's product
    (16-bit activations) where it runs, the W8A8 one (activations quantized per token) where
    torch._scaled_mm or the dequantized weight does; both near the unquantized product."""
    gen = torch.Generator(device="cuda").manual_seed(K * 3 + N)
    w = torch.randn(N, K, device="cuda", generator=gen) * 0.05
    s = (w.abs().amax() if per_tensor else w.abs().amax(1)) / 448
    wq = (w / (s if per_tensor else s[:, None])).to(FP8)
    p = fp8_prepare(wq, s.reshape(1) if per_tensor else s, torch.bfloat16)
    assert p.weight is not None and p.dense is None, "the e4m3 weight is not what the layer holds"
    w_deq = wq.float() * (s if per_tensor else s[:, None])
    bias = torch.randn(N, device="cuda", generator=gen).to(torch.bfloat16)
    for M in MS:
        x = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
        out = fp8_linear(x, p, bias)
        kernel = plan(x, p)[0]
        xr = x.float() if kernel == "w8a16" else fp8_qdq_per_token(x.float())
        ref = xr @ w_deq.t() + bias.float()
        assert out.dtype == torch.bfloat16
        err = rel_err(out, ref)
        assert err < 1e-2, f"fp8 {K}x{N} M={M} ({kernel}): rel err {err:.3g} against the same math in float32"
        assert rel_err(out, x.float() @ w.t() + bias.float()) < 6e-2  # and near the unquantized product


def test_fp8_channel_layout_matches_the_scaled_one():
    """The layout without torch._scaled_mm (weight-only schemes, odd shapes: W8A16 and the
    dequantized weight) against the one with it, at a decode and a prefill token count."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(256, 512, device="cuda", generator=gen) * 0.05)
    s = w.abs().amax(1) / 448
    p = fp8_prepare((w / s[:, None]).to(FP8), s, torch.bfloat16, layout=CHANNEL)
    fast = fp8_prepare((w / s[:, None]).to(FP8), s, torch.bfloat16)
    for M in (7, 600):
        x = torch.randn(M, 512, device="cuda", generator=gen).to(torch.bfloat16)
        assert rel_err(fp8_linear(x, p), fp8_linear(x, fast)) < 1e-2

"""The kernels that produce an FP8 GEMM's activations and quantize them in the same launch
(llm_kernels.rms_norm_quant, fused_add_rms_norm_quant, act_and_mul_quant) under the
interpreter, and on the CPU's reference path: the 16-bit output of the kernel without the
quantization, and its bytes and scales from quantize_per_token, exactly; all-zero rows,
widths that are not powers of two, and the widest row one program holds. The FP8 linear
takes such a quantization (xq) in place of its own, and says when it wants one."""
import pytest
import torch

import llm_kernels
from llm_kernels.fp8 import FP8, prepare, wants_quantized_input
from llm_kernels.fp8 import weight as fp8_weight
from llm_kernels.fp8 import w8a16
from llm_kernels.fp8.act_quant import MAX_ROW, quantize_per_token
from llm_kernels.fp8.configs import w8a8_configs
from tests.kernels.fresh_process import run_fresh
from tests.kernels.kernel_checks import compile_for, spill_bytes


def assert_quantized(out, q, s, want):
    """out equals want; (q, s) equal quantize_per_token(want), byte for byte."""
    rq, rs = quantize_per_token(want)
    assert torch.equal(out, want)
    assert q.dtype == FP8 and q.shape == want.shape and s.shape == (want.shape[0], 1)
    assert torch.equal(s, rs)
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8))


@pytest.fixture(params=["interpreter", "cpu"])
def path(request, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1" if request.param == "interpreter" else "0")
    return request.param


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("H", [7, 96, 3584])
def test_the_norm_quantizes_what_it_stores(rng, poisoned, path, dtype, H):
    x = (torch.randn(5, H, generator=rng) * 3).to(dtype)
    res = torch.randn(5, H, generator=rng).to(dtype)
    x[1], res[1] = 0.0, 0.0  # an all-zero row: the eps scale
    w = torch.randn(H, generator=rng).to(dtype)
    with poisoned():
        out, q, s = llm_kernels.rms_norm_quant(x, w, 1e-6)
    assert_quantized(out, q, s, llm_kernels.rms_norm(x, w, 1e-6))
    r1, r2 = res.clone(), res.clone()
    with poisoned():
        out, r1, q, s = llm_kernels.fused_add_rms_norm_quant(x, r1, w, 1e-6)
    want, r2 = llm_kernels.fused_add_rms_norm(x, r2, w, 1e-6)
    assert torch.equal(r1, r2)
    assert_quantized(out, q, s, want)


@pytest.mark.parametrize("gelu", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("I", [5, 130, 3584])
def test_the_activation_quantizes_what_it_stores(rng, poisoned, path, gelu, dtype, I):
    x = (torch.randn(4, 2 * I, generator=rng) * 2).to(dtype)
    x[2] = 0.0
    with poisoned():
        out, q, s = llm_kernels.act_and_mul_quant(x, gelu)
    assert_quantized(out, q, s, (llm_kernels.gelu_tanh_and_mul if gelu else llm_kernels.silu_and_mul)(x))


def test_the_widest_row_one_program_holds_and_a_wider_one(rng, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    x = torch.randn(2, 2 * MAX_ROW, generator=rng).to(torch.bfloat16)
    out, q, s = llm_kernels.act_and_mul_quant(x, False)
    assert_quantized(out, q, s, llm_kernels.silu_and_mul(x))
    assert llm_kernels.act_and_mul_quant(torch.zeros(1, 2 * MAX_ROW + 2, dtype=torch.bfloat16), False) is None


def scaled_layer(rng, N=64, K=96):
    """A per-tensor FP8 layer with per-token activations, held as the interpreter holds it (SCALED)."""
    w = torch.randn(N, K, generator=rng) * 0.05
    s = w.abs().amax() / 448
    return prepare((w / s).to(FP8), s.reshape(1), torch.bfloat16, act="token")


def test_the_w8a8_kernel_takes_the_producers_quantization(rng, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    w = scaled_layer(rng)
    x = torch.randn(5, 96, generator=rng).to(torch.bfloat16)
    xq = quantize_per_token(x)
    for cfg in w8a8_configs(5, x.device):
        want = w8a16.launch(x, w.weight, w.scale, None, cfg)
        # the handed-over bytes are the ones used: x itself is not read again
        assert torch.equal(w8a16.launch(torch.full_like(x, float("nan")), w.weight, w.scale, None, cfg, xq=xq), want)


def test_the_linear_wants_a_quantized_input_only_where_its_step_takes_one(rng, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    w = scaled_layer(rng)
    x = torch.randn(5, 96, generator=rng).to(torch.bfloat16)
    # the interpreter's steps run the weight-only kernel (llm_kernels.fp8.select): no quantization wanted
    assert not wants_quantized_input(w, x) and w.fed
    assert w.wants == {5: False}  # settled: asked again, the answer comes without a lookup
    monkeypatch.setattr(fp8_weight, "candidates", lambda *a: ("w8a8",))
    w = scaled_layer(rng)
    assert wants_quantized_input(w, x[:, :7])  # any width: the token count decides
    y = fp8_weight.linear(x, w, xq=quantize_per_token(x))
    assert torch.equal(y, fp8_weight.linear(x, w))
    with pytest.raises(ValueError, match="xq holds"):
        fp8_weight.linear(x, w, xq=quantize_per_token(x[:4]))
    weight_only = prepare(w.weight, w.scale[:1], torch.bfloat16, act=None)  # no activation quantization
    assert not wants_quantized_input(weight_only, x)


@pytest.mark.parametrize("quant", [True, False])
@pytest.mark.parametrize("which", ["norm", "act"])
def test_the_quantizing_kernels_compile_for_hopper_without_spills(which, quant):
    """At Qwen2.5-7B's widths (the norm's 3,584, the activation's 18,944: a block of 32,768 on
    32 warps), with the hardware's e4m3 rounding (cvt.rn.satfinite) and no register spills; and
    without the quantization, as every other model runs them."""
    run_fresh(__name__, "check_compile", which, quant)


def check_compile(which: str, quant: bool) -> None:
    from llm_kernels import activation, norm

    if which == "norm":
        lazy, warps = norm._rms_norm_kernel, 8
        sig = {"x_ptr": "*bf16", "r_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "q_ptr": "*u8",
               "s_ptr": "*fp32", "stride_x": "i32", "stride_r": "i32", "stride_o": "i32", "stride_q": "i32",
               "H": "i32", "eps": "fp32"}
        const = {"HAS_RESIDUAL": True, "BLOCK": 4096}
    else:
        lazy, warps = activation._act_and_mul_kernel, 32
        sig = {"x_ptr": "*bf16", "out_ptr": "*bf16", "q_ptr": "*u8", "s_ptr": "*fp32", "stride_x": "i32",
               "stride_o": "i32", "stride_q": "i32", "I": "i32"}
        const = {"BLOCK": 32768, "GELU": False}
    const.update(QUANT=quant, EPS_=1.1920928955078125e-07 if quant else 0.0, NATIVE=quant)
    if not quant:
        const["BLOCK"], warps = (4096, 8) if which == "norm" else (1024, 4)
    lazy[(1,)]  # builds the JIT function in compiled mode, launches nothing
    k = compile_for(lazy._built[False], sig, const, 90, {"num_warps": warps, "num_stages": 1})
    assert ("cvt.rn.satfinite.e4m3x2.f32" in k.asm["ptx"]) == quant
    assert spill_bytes(k) == 0

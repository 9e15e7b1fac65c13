"""Gated MLP activations: act(x[..., :I]) * x[..., I:] with act SiLU (Llama, Qwen, Phi)
or GELU with the tanh approximation (Gemma's gelu_pytorch_tanh).
One Triton kernel over (row, column block); the references are the CPU path. The `_quant`
variant also quantizes each output row per token to e4m3 in the same launch, one program a
row holding it whole (for an FP8 down projection that takes e4m3 activations; the bytes of
quantize_per_token of the 16-bit output, which it stores too)."""
import torch
import torch.nn.functional as F
import triton.language as tl

from llm_kernels.dispatch import lazy_jit, next_pow2, use_triton, uses_helpers_of
from llm_kernels.fp8.act_quant import EPS, MAX_ROW, native_rounding, quantize_per_token, quantize_row, quantized_outputs
from llm_kernels.pdl import gdc_launch_dependents, gdc_wait

uses_helpers_of(__name__, "llm_kernels.fp8.act_quant")  # quantize_row


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


@lazy_jit(pdl=True)
def _act_and_mul_kernel(x_ptr, out_ptr, q_ptr, s_ptr, stride_x, stride_o, stride_q, I, BLOCK: tl.constexpr,
                        GELU: tl.constexpr, QUANT: tl.constexpr = False, EPS_: tl.constexpr = 0.0,
                        NATIVE: tl.constexpr = False, PDL: tl.constexpr = False):
    """Row r, columns of block program_id(1): act(gate) * up; QUANT (one block a row): the row
    quantized per token too."""
    if PDL:  # programmatic dependent launch (llm_kernels.pdl): wait for the previous kernel here
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < I
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + I + cols, mask=mask, other=0.0).to(tl.float32)
    if GELU:
        # 0.5 g (1 + tanh(y)) = g * sigmoid(2y), y = sqrt(2/pi) (g + 0.044715 g^3)
        y = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)  # sqrt(2 / pi)
        act = gate / (1.0 + tl.exp(-2.0 * y))
    else:
        act = gate / (1.0 + tl.exp(-gate))
    o = (act * up).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_o + cols, o, mask=mask)
    if QUANT:  # the stored row, quantized per token
        quantize_row(o.to(tl.float32), q_ptr, s_ptr, row, stride_q, cols, mask, EPS_, NATIVE)


def _act_and_mul(x: torch.Tensor, gelu: bool, quant: bool = False):
    two_i = x.shape[-1]
    assert two_i % 2 == 0, "last dim must be 2 * intermediate"
    inter = two_i // 2
    x2 = x.reshape(-1, two_i)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape[0], inter, dtype=x.dtype, device=x.device)
    if quant:  # a row a program, at most 32 values a thread
        block = next_pow2(inter)
        warps = min(32, max(4, block // 1024))
        q, s = quantized_outputs(x2.shape[0], inter, x.device)
    else:
        block, warps, q, s = min(1024, next_pow2(inter)), 4, out, out  # (stand-ins, never touched)
    _act_and_mul_kernel[(x2.shape[0], (inter + block - 1) // block)](
        x2, out, q.view(torch.uint8) if quant else q, s, x2.stride(0), out.stride(0), q.stride(0), inter,
        BLOCK=block, GELU=gelu, QUANT=quant, EPS_=EPS if quant else 0.0, NATIVE=quant and native_rounding(x), num_warps=warps,
    )
    out = out.view(*x.shape[:-1], inter)
    return (out, q, s) if quant else out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if not (use_triton(x) and x.numel()):
        return silu_and_mul_reference(x)
    return _act_and_mul(x, False)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """gelu(x[..., :I], approximate="tanh") * x[..., I:]."""
    if not (use_triton(x) and x.numel()):
        return gelu_tanh_and_mul_reference(x)
    return _act_and_mul(x, True)


def act_and_mul_quant(x: torch.Tensor, gelu: bool):
    """(silu_and_mul(x), or gelu_tanh_and_mul(x) with gelu, and its rows quantized per token:
    e4m3 [M, I], float32 scales [M, 1]) for x [M, 2 I]; None where a row is too wide for one
    program (I above llm_kernels.fp8.act_quant.MAX_ROW): the caller quantizes apart."""
    if x.shape[-1] // 2 > MAX_ROW:
        return None
    if use_triton(x) and x.numel():
        return _act_and_mul(x, gelu, quant=True)
    out = (gelu_tanh_and_mul_reference if gelu else silu_and_mul_reference)(x)
    return (out, *quantize_per_token(out))

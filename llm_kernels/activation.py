"""Gated MLP activations: act(x[..., :I]) * x[..., I:] with act SiLU (Llama, Qwen, Phi)
or GELU with the tanh approximation (Gemma's gelu_pytorch_tanh).
One Triton kernel over (row, column block); the references are the CPU path."""
import torch
import torch.nn.functional as F
import triton.language as tl

from llm_kernels.dispatch import lazy_jit, next_pow2, use_triton
from llm_kernels.pdl import gdc_launch_dependents, gdc_wait

def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


@lazy_jit(pdl=True)
def _act_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, I, BLOCK: tl.constexpr, GELU: tl.constexpr, PDL: tl.constexpr = False):
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
    tl.store(out_ptr + row * stride_o + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def _act_and_mul(x: torch.Tensor, gelu: bool) -> torch.Tensor:
    two_i = x.shape[-1]
    assert two_i % 2 == 0, "last dim must be 2 * intermediate"
    inter = two_i // 2
    x2 = x.reshape(-1, two_i)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape[0], inter, dtype=x.dtype, device=x.device)
    block = min(1024, next_pow2(inter))
    _act_and_mul_kernel[(x2.shape[0], (inter + block - 1) // block)](
        x2, out, x2.stride(0), out.stride(0), inter, BLOCK=block, GELU=gelu, num_warps=4,
    )
    return out.view(*x.shape[:-1], inter)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if not (use_triton(x) and x.numel()):
        return silu_and_mul_reference(x)
    return _act_and_mul(x, False)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """gelu(x[..., :I], approximate="tanh") * x[..., I:]."""
    if not (use_triton(x) and x.numel()):
        return gelu_tanh_and_mul_reference(x)
    return _act_and_mul(x, True)

"""RMSNorm and fused residual-add + RMSNorm (Llama style: float32 statistics).
One Triton program per row; the reference is the CPU path and test oracle. The `_quant`
variants also quantize each output row per token to e4m3 in the same launch, for an FP8
GEMM that takes e4m3 activations (llm_kernels.fp8.act_quant.quantize_row: the bytes of
quantize_per_token of the 16-bit output, which they store too)."""
import torch
import triton.language as tl

from llm_kernels.dispatch import lazy_jit, next_pow2, use_triton, uses_helpers_of
from llm_kernels.fp8.act_quant import EPS, native_rounding, quantize_per_token, quantize_row, quantized_outputs
from llm_kernels.pdl import gdc_launch_dependents, gdc_wait

uses_helpers_of(__name__, "llm_kernels.fp8.act_quant")  # quantize_row


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


@lazy_jit(pdl=True)
def _rms_norm_kernel(
    x_ptr, r_ptr, w_ptr, out_ptr, q_ptr, s_ptr,
    stride_x, stride_r, stride_o, stride_q, H, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, QUANT: tl.constexpr = False, EPS_: tl.constexpr = 0.0,
    NATIVE: tl.constexpr = False, PDL: tl.constexpr = False,
):
    if PDL:  # programmatic dependent launch (llm_kernels.pdl): wait for the previous kernel here
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + row * stride_r + cols, mask=mask, other=0.0)
        # residual += x, rounded to the residual's dtype as the in-place add is
        r = (r.to(tl.float32) + x.to(tl.float32)).to(r_ptr.dtype.element_ty)
        tl.store(r_ptr + row * stride_r + cols, r, mask=mask)
        h = r.to(tl.float32)
        in_ty = r_ptr.dtype.element_ty
    else:
        h = x.to(tl.float32)
        in_ty = x_ptr.dtype.element_ty
    var = tl.sum(h * h, axis=0) / H
    h = (h * tl.rsqrt(var + eps)).to(in_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    o = (h * w).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_o + cols, o, mask=mask)
    if QUANT:  # the stored row, quantized per token
        quantize_row(o.to(tl.float32), q_ptr, s_ptr, row, stride_q, cols, mask, EPS_, NATIVE)


def _launch(x, residual, weight, eps, quant=False):
    H = x.shape[-1]
    x2 = x.reshape(-1, H)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    r2 = x2
    if residual is not None:
        r2 = residual.view(-1, H)  # in place: must be a view of residual
        assert r2.stride(-1) == 1, "residual must be contiguous along the hidden dim"
    in_dtype = x.dtype if residual is None else residual.dtype
    out = torch.empty(x2.shape, dtype=torch.promote_types(weight.dtype, in_dtype), device=x.device)
    block = next_pow2(H)
    warps = 4 if block <= 1024 else 8
    q, s = quantized_outputs(x2.shape[0], H, x.device) if quant else (out, out)  # (stand-ins, never touched)
    _rms_norm_kernel[(x2.shape[0],)](
        x2, r2, weight, out, q.view(torch.uint8) if quant else q, s,
        x2.stride(0), r2.stride(0), out.stride(0), q.stride(0), H, float(eps),
        HAS_RESIDUAL=residual is not None, BLOCK=block, QUANT=quant, EPS_=EPS if quant else 0.0,
        NATIVE=quant and native_rounding(x), num_warps=warps,
    )
    out = out.view(*x.shape[:-1], H)
    return (out, q, s) if quant else out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if use_triton(x, weight) and x.numel():
        return _launch(x, None, weight, eps)
    return rms_norm_reference(x, weight, eps)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """residual += x (in place); returns (rms_norm(residual), residual)."""
    if use_triton(x, residual, weight) and x.numel():
        assert x.shape == residual.shape, (x.shape, residual.shape)
        return _launch(x, residual, weight, eps), residual
    residual.add_(x)
    return rms_norm(residual, weight, eps), residual


def rms_norm_quant(x: torch.Tensor, weight: torch.Tensor, eps: float):
    """(rms_norm(x), its rows quantized per token: e4m3 [M, H], float32 scales [M, 1]), x [M, H]."""
    if use_triton(x, weight) and x.numel():
        return _launch(x, None, weight, eps, quant=True)
    out = rms_norm_reference(x, weight, eps)
    return (out, *quantize_per_token(out))


def fused_add_rms_norm_quant(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """residual += x (in place); returns (rms_norm(residual), residual, e4m3 rows, scales) as rms_norm_quant."""
    if use_triton(x, residual, weight) and x.numel():
        assert x.shape == residual.shape, (x.shape, residual.shape)
        out, q, s = _launch(x, residual, weight, eps, quant=True)
        return out, residual, q, s
    residual.add_(x)
    out, q, s = rms_norm_quant(residual, weight, eps)
    return out, residual, q, s

"""FP8 W8A8 GEMM: e4m3 weights with per-output-channel scales, activations quantized
per token to e4m3 with dynamic scales (compressed-tensors' FP8_DYNAMIC, and
quant_method "fp8" checkpoints).

On CUDA GPUs with FP8 (compute capability >= 8.9) `fp8_linear` runs
torch._scaled_mm with row-wise scales; elsewhere the reference: the same math with
the weight dequantized and the activations quantized to e4m3 and back, which is
exactly what transformers + compressed-tensors compute on the CPU.
"""
from dataclasses import dataclass
from typing import Optional

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def per_token_scales(x: torch.Tensor, group: int = 0) -> torch.Tensor:
    """Dynamic symmetric scales of x [M, K]: amax / 448 per row ([M, 1]) or, with
    group > 0, per row and group of `group` features ([M, K/group]); zeros become eps."""
    v = x if group <= 0 else x.unflatten(-1, (x.shape[-1] // group, group))
    amax = torch.amax(v.abs(), dim=-1, keepdim=group <= 0)
    s = amax / FP8_MAX
    return s.masked_fill(s == 0, torch.finfo(s.dtype).eps)  # no host tensor: CUDA graphs capture this


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor, group: int = 0) -> torch.Tensor:
    """x / scale clamped to +-448 and rounded to e4m3 (scale [M, 1] or [M, K/group])."""
    if group > 0:
        scale = scale.repeat_interleave(group, dim=-1)
    return torch.clamp(x / scale, -FP8_MAX, FP8_MAX).to(FP8)


def fp8_qdq_per_token(x: torch.Tensor, group: int = 0) -> torch.Tensor:
    """x quantized per token (or per token and group) to e4m3 and back, in x's dtype."""
    s = per_token_scales(x, group)
    q = quantize_fp8(x, s, group).to(x.dtype)
    return q * (s if group <= 0 else s.repeat_interleave(group, dim=-1))


def dequantize_fp8(weight: torch.Tensor, scale: torch.Tensor, block: Optional[tuple] = None, dtype=torch.float32):
    """e4m3 weight [N, K] times its scale: a scalar / [1], per channel [N] or [N, 1], or
    per block ([N/bn, K/bk] with block (bn, bk), edges cut) -> dense [N, K] in dtype."""
    w = weight.to(dtype)
    s = scale.to(dtype)
    if block is not None:
        bn, bk = block
        s = s.repeat_interleave(bn, 0)[: w.shape[0]].repeat_interleave(bk, 1)[:, : w.shape[1]]
        return w * s
    if s.numel() == 1:
        return w * s.reshape(())
    return w * s.reshape(-1, 1)


def scaled_mm_available(device) -> bool:
    """Whether torch._scaled_mm with row-wise FP8 scales runs on this device."""
    if not hasattr(torch, "_scaled_mm") or torch.device(device).type != "cuda":
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


@dataclass
class FP8Prepared:
    """One FP8 linear ready for fp8_linear: `weight_t` e4m3 [K, N] (column-major view
    of the checkpoint's [N, K]) and `scale` float32 [1, N] for torch._scaled_mm; or,
    without FP8 hardware, `dense` the dequantized [N, K] weight."""

    in_features: int
    out_features: int
    weight_t: Optional[torch.Tensor] = None
    scale: Optional[torch.Tensor] = None
    dense: Optional[torch.Tensor] = None


def fp8_prepare(weight: torch.Tensor, scale: torch.Tensor, dtype, use_scaled_mm: Optional[bool] = None) -> FP8Prepared:
    """Hold a layer's e4m3 weight [N, K] and its per-tensor or per-channel scale."""
    N, K = weight.shape
    p = FP8Prepared(K, N)
    if use_scaled_mm is None:
        use_scaled_mm = scaled_mm_available(weight.device) and K % 16 == 0 and N % 16 == 0
    if use_scaled_mm:
        p.weight_t = weight.contiguous().t()
        p.scale = scale.float().reshape(-1).expand(N).reshape(1, N).contiguous()
    else:
        p.dense = dequantize_fp8(weight, scale, dtype=dtype)
    return p


def fp8_linear(x: torch.Tensor, p: FP8Prepared, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [..., K] @ W^T (+ bias) with x quantized per token to e4m3 -> [..., N] in x's dtype."""
    lead, K = x.shape[:-1], x.shape[-1]
    if K != p.in_features:
        raise ValueError(f"fp8_linear: x has K={K}, the layer {p.in_features}")
    x2 = x.reshape(-1, K)
    if p.weight_t is not None and x2.shape[0]:
        s = per_token_scales(x2.float())
        xq = quantize_fp8(x2.float(), s)
        y = torch._scaled_mm(xq, p.weight_t, scale_a=s, scale_b=p.scale, bias=bias, out_dtype=x.dtype)
    else:
        w = p.dense if p.dense is not None else dequantize_fp8(p.weight_t.t(), p.scale, dtype=x.dtype)
        # activations quantized from float32, as the _scaled_mm path does (a 16-bit x / s
        # rounds some values to the other e4m3 neighbour)
        y = torch.nn.functional.linear(fp8_qdq_per_token(x2.float()).to(x.dtype), w.to(x.dtype), bias)
    return y.reshape(*lead, p.out_features)

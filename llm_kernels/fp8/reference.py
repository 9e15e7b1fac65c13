"""FP8 math in PyTorch: the e4m3 format, dynamic activation scales and quantization, the
dequantized weight, and the float32 products every FP8 kernel is checked against.

Weights are e4m3 [N, K] with a per-tensor, per-output-channel or per-block scale
(compressed-tensors' FP8 schemes, quant_method "fp8" checkpoints). Activations are either
quantized per token (or per token and group) to e4m3 with dynamic scales and back (W8A8,
what transformers + compressed-tensors compute on the CPU) or kept in 16 bits (W8A16).
"""
from __future__ import annotations

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
    """Whether torch._scaled_mm with row-wise FP8 scales runs on this device (FP8 tensor
    cores: compute capability >= 8.9)."""
    if not hasattr(torch, "_scaled_mm") or torch.device(device).type != "cuda":
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def quantize_activations(x: torch.Tensor, act: Optional[str], group: int = 0) -> torch.Tensor:
    """x as a W8A8 product sees it: act "token" quantizes per token from float32 (as the
    _scaled_mm path does: a 16-bit x / s rounds some values to the other e4m3 neighbour),
    "group" per token and group of `group` in x's dtype, None leaves x alone (W8A16)."""
    if act == "token":
        return fp8_qdq_per_token(x.float()).to(x.dtype)
    if act == "group":
        return fp8_qdq_per_token(x, group)
    return x


def w8a16_reference(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                    block: Optional[tuple] = None) -> torch.Tensor:
    """float32 x [M, K] @ dequant(weight)^T: the weight-only product (tests' oracle)."""
    return x.float() @ dequantize_fp8(weight, scale, block, torch.float32).t()

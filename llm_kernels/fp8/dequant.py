"""The dense weight of an FP8 layer, made by a Triton kernel for the dequantize-then-cuBLAS
path at large token counts (compute-bound: one pass over the weight, then cuBLAS's GEMM),
so a layer holds its e4m3 weight alone, not a 16-bit copy beside it."""
from __future__ import annotations

import torch
import triton.language as tl

from llm_kernels.dispatch import lazy_jit
from llm_kernels.fp8.w8a16 import BITS_FACTOR, native_conversion
from llm_kernels.pdl import gdc_launch_dependents, gdc_wait


@lazy_jit(pdl=True)
def _dequant_kernel(w_ptr, s_ptr, out_ptr, N, K, stride_sn,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr,
                    NATIVE: tl.constexpr, FACTOR: tl.constexpr, PDL: tl.constexpr = False):
    """out[N, K] = e4m3 w[N, K] * scale, computed in float32 and rounded once. Scales as
    llm_kernels.fp8.w8a16's kernel takes them (SCALE_BK 0: one per row)."""
    if PDL:  # programmatic dependent launch (llm_kernels.pdl): wait for the previous kernel here
        gdc_wait()
        gdc_launch_dependents()
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (rn < N)[:, None] & (rk < K)[None, :]
    b = tl.load(w_ptr + rn[:, None].to(tl.int64) * K + rk[None, :], mask=mask, other=0)
    if NATIVE:
        w = b.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:  # the bits moved into fp16's fields: 2^-8 times the value (llm_kernels.fp8.w8a16)
        h = b.to(tl.int32)
        h = ((h & 0x7F) << 7) | ((h & 0x80) << 8)
        w = h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32) * FACTOR
    if SCALE_BK == 0:
        s = tl.load(s_ptr + rn, mask=rn < N, other=0.0)[:, None]
    else:
        s = tl.load(s_ptr + (rn // SCALE_BN)[:, None].to(tl.int64) * stride_sn + (rk // SCALE_BK)[None, :],
                    mask=mask, other=0.0)
    tl.store(out_ptr + rn[:, None].to(tl.int64) * K + rk[None, :], (w * s).to(out_ptr.dtype.element_ty), mask=mask)


def dequantize(weight: torch.Tensor, scale: torch.Tensor, block, dtype) -> torch.Tensor:
    """weight [N, K] e4m3 (contiguous) times its scale ([N], or block (bn, bk) scales) -> [N, K] in dtype."""
    N, K = weight.shape
    out = torch.empty(N, K, dtype=dtype, device=weight.device)
    native = native_conversion(weight.device)
    bn, bk = 64, 128
    _dequant_kernel[(-(-N // bn), -(-K // bk))](
        weight.view(torch.uint8), scale, out, N, K, scale.stride(0), BLOCK_N=bn, BLOCK_K=bk,
        SCALE_BN=block[0] if block else 1, SCALE_BK=block[1] if block else 0, NATIVE=native,
        FACTOR=1.0 if native else BITS_FACTOR, num_warps=4)
    return out

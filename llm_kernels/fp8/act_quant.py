"""Per-token FP8 quantization of activations in one Triton launch: x [M, K] -> e4m3 [M, K]
and float32 scales [M] (amax / 448, eps for an all-zero row), the same bytes as
llm_kernels.fp8.reference's per_token_scales and quantize_fp8 (x in float32, divided by its
scale with IEEE rounding, clamped to +-448, rounded to the nearest e4m3, ties to even).
quantize_per_token_group does the same per token and group of columns (scales [M, K/group]),
as block-scale checkpoints (128 x 128, DeepSeek / Qwen3 FP8) quantize their activations.

Torch's version is five kernels (the float32 copy, abs, amax, the division and clamp, the
cast) and took 21-72% of the W8A8 path's time on Qwen2.5-7B's layers. One program per row
reads it once into registers (up to MAX_ROW values; wider rows twice, in blocks: amax, then
quantize) and writes one byte a value. Looping over a row of 18,944 values in steps of 1,024
took about 16 us at one token on an H100 (the latency of one program's dependent loads); read
in one step, the row's loads are all in flight at once.

The rounding to e4m3: the GPU's conversion (cvt.rn.satfinite, sm_89+) where it runs; under
the interpreter integer ops, because the interpreter's own float32 -> fp8e4nv conversion
rounds wrongly (124.3 became 64, ties went to odd in a check against torch).
"""
from __future__ import annotations

import torch
import triton.language as tl

from llm_kernels.dispatch import jit_helper, lazy_jit, next_pow2, use_triton
from llm_kernels.fp8.reference import FP8, per_token_scales, quantize_fp8
from llm_kernels.fp8.select import CUDA_FP8, device_class
from llm_kernels.pdl import gdc_launch_dependents, gdc_wait

MAX_ROW = 32768  # rows up to this wide are read once, held in registers (64 values a thread at most)
EPS = torch.finfo(torch.float32).eps  # the scale of an all-zero row, as per_token_scales has it


@jit_helper
def _e4m3_bits(v, NATIVE: tl.constexpr):
    """float32 v in [-448, 448] -> its e4m3 byte (uint8), rounded to nearest, ties to even.
    NATIVE: the hardware's conversion; else integer ops: normal values keep 3 of float32's 23
    mantissa bits with round-to-nearest-even (a carry may step the exponent), values below
    2^-6 become multiples of 2^-9 rounded by float32's own addition of 2^23."""
    if NATIVE:
        q = v.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        bits = v.to(tl.int32, bitcast=True)
        a = tl.abs(v)
        ab = a.to(tl.int32, bitcast=True)
        normal = ((ab + 0x7FFFF + ((ab >> 20) & 1)) >> 20) - ((127 - 7) << 3)
        sub = ((a * 512.0 + 8388608.0) - 8388608.0).to(tl.int32)
        code = tl.where(a >= 0.015625, normal, sub) | ((bits >> 24) & 0x80)
        q = code.to(tl.uint8)
    return q


@jit_helper
def quantize_row(v, q_ptr, s_ptr, row, stride_q, cols, mask, EPS_: tl.constexpr, NATIVE: tl.constexpr):
    """A whole row v (float32, zeros past the mask) quantized per token: s_ptr[row] = max(|v|) / 448
    (EPS_ if 0), q_ptr[row, cols] = e4m3(clamp(v / s, +-448)). The one-pass tail of the
    quantization kernel, and of the kernels that produce a GEMM's activations (RMSNorm,
    SiLU/GELU-and-mul) when that GEMM takes them in e4m3: the same bytes as
    quantize_per_token of the 16-bit output they store."""
    s = tl.max(tl.abs(v), 0) / 448.0
    s = tl.where(s == 0.0, EPS_, s)
    tl.store(s_ptr + row, s)
    v = tl.minimum(tl.maximum(tl.math.div_rn(v, s), -448.0), 448.0)
    tl.store(q_ptr + row * stride_q + cols, _e4m3_bits(v, NATIVE), mask=mask)


@lazy_jit(pdl=True)
def _quant_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, stride_q, EPS_: tl.constexpr, BLOCK_: tl.constexpr,
                  ONE_PASS: tl.constexpr, NATIVE: tl.constexpr, PDL: tl.constexpr = False):
    """Row r of x: s[r] = max(|x[r]|) / 448 (EPS_ if 0), q[r] = e4m3(clamp(x[r] / s[r], +-448)).
    ONE_PASS: the row fits one block, held in registers between the two steps."""
    if PDL:  # programmatic dependent launch (llm_kernels.pdl): wait for the previous kernel here
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_)
    if ONE_PASS:
        v = tl.load(x_ptr + row * stride_x + cols, mask=cols < K, other=0.0).to(tl.float32)
        quantize_row(v, q_ptr, s_ptr, row, stride_q, cols, cols < K, EPS_, NATIVE)
    else:
        amax = tl.zeros([BLOCK_], tl.float32)
        for k0 in range(0, K, BLOCK_):
            v = tl.load(x_ptr + row * stride_x + k0 + cols, mask=k0 + cols < K, other=0.0)
            amax = tl.maximum(amax, tl.abs(v.to(tl.float32)))
        s = tl.max(amax, 0) / 448.0
        s = tl.where(s == 0.0, EPS_, s)
        tl.store(s_ptr + row, s)
        for k0 in range(0, K, BLOCK_):
            v = tl.load(x_ptr + row * stride_x + k0 + cols, mask=k0 + cols < K, other=0.0).to(tl.float32)
            v = tl.minimum(tl.maximum(tl.math.div_rn(v, s), -448.0), 448.0)
            tl.store(q_ptr + row * stride_q + k0 + cols, _e4m3_bits(v, NATIVE), mask=k0 + cols < K)


@lazy_jit(pdl=True)
def _group_quant_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, stride_q, stride_s, EPS_: tl.constexpr,
                        GROUP: tl.constexpr, NATIVE: tl.constexpr, PDL: tl.constexpr = False):
    """Group g of row r (columns g GROUP ...): its scale s[r, g] and its e4m3 values."""
    if PDL:  # programmatic dependent launch (llm_kernels.pdl): wait for the previous kernel here
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    cols = g * GROUP + tl.arange(0, GROUP)
    v = tl.load(x_ptr + row * stride_x + cols, mask=cols < K, other=0.0).to(tl.float32)
    s = tl.max(tl.abs(v), 0) / 448.0
    s = tl.where(s == 0.0, EPS_, s)
    tl.store(s_ptr + row * stride_s + g, s)
    v = tl.minimum(tl.maximum(tl.math.div_rn(v, s), -448.0), 448.0)
    tl.store(q_ptr + row * stride_q + cols, _e4m3_bits(v, NATIVE), mask=cols < K)


def quantize_per_token_group(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (K a multiple of group, a power of two) -> (e4m3 [M, K], float32 scales
    [M, K / group]): one program per token and group."""
    M, K = x.shape
    if K % group or group & (group - 1):
        raise ValueError(f"quantize_per_token_group: K {K} is not a multiple of the group {group}, a power of two")
    if not use_triton(x) or M == 0:
        s = per_token_scales(x.float(), group)
        return quantize_fp8(x.float(), s, group), s
    if x.stride(-1) != 1:
        x = x.contiguous()
    q = torch.empty(M, K, dtype=FP8, device=x.device)
    s = torch.empty(M, K // group, dtype=torch.float32, device=x.device)
    _group_quant_kernel[(M, K // group)](x, q.view(torch.uint8), s, K, x.stride(0), q.stride(0), s.stride(0),
                                         EPS_=EPS, GROUP=group, NATIVE=device_class(x) == CUDA_FP8, num_warps=1)
    return q, s


def quantized_outputs(M: int, K: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty (e4m3 [M, K], float32 scales [M, 1]) for a kernel that quantizes its rows (quantize_row)."""
    return torch.empty(M, K, dtype=FP8, device=device), torch.empty(M, 1, dtype=torch.float32, device=device)


def native_rounding(x: torch.Tensor) -> bool:
    """Whether quantize_row may use the GPU's own e4m3 conversion for x's device (sm_89+)."""
    return device_class(x) == CUDA_FP8  # cached per device: this runs before every W8A8 GEMM


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (16-bit or float32, unit stride along K) -> (e4m3 [M, K], float32 scales [M, 1])."""
    M, K = x.shape
    if not use_triton(x) or M == 0:
        s = per_token_scales(x.float())
        return quantize_fp8(x.float(), s), s
    if x.stride(-1) != 1:
        x = x.contiguous()
    q, s = quantized_outputs(M, K, x.device)
    native = native_rounding(x)
    block = min(next_pow2(K), MAX_ROW)
    _quant_kernel[(M,)](x, q.view(torch.uint8), s, K, x.stride(0), q.stride(0), EPS_=EPS, BLOCK_=block,
                        ONE_PASS=K <= block, NATIVE=native, num_warps=min(16, max(4, block // 2048)))
    return q, s


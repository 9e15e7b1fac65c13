"""W8A16 GEMM in Triton: e4m3 weights streamed once from the checkpoint's own [N, K]
layout, converted to the activations' 16-bit type in registers, 16-bit tensor-core dots
with float32 accumulation, the scales applied to the float32 sums (llm_kernels.fp8.configs
holds the tuner's candidates). The same kernel is the W8A8 GEMM (A8): activations quantized
per token to e4m3 by one launch beforehand (llm_kernels.fp8.act_quant), both operands fed to
FP8 tensor cores as they are (twice bf16's rate on sm_89+, no conversion in the loop), the
token scales applied with the channel scales to the float32 sums (with block scales:
activations quantized per token and block of K, each block's sum scaled by both).

Decode (M = 1-64 tokens) is bound by the weight's bytes: an e4m3 weight is half of bf16's,
so a kernel that reads it once and hides the conversion approaches 2x bf16 cuBLAS. The
techniques are the 4-bit kpack kernel's (llm_kernels.w4a16.kpack):

- Swapped tiles: the kernel computes out^T = W x^T. A tile of BLOCK_N weight rows by
  BLOCK_K is the dot's first operand (the MMA's M dimension: 64 rows a Hopper warpgroup,
  all of them weight rows), which Hopper's wgmma takes from registers, where the conversion
  leaves it; x^T [BLOCK_K, BLOCK_M] is the second (the MMA's N, as narrow as 16 tokens),
  read from shared memory. Unswapped, a decode step's 1-16 tokens would be padded to M = 64.
  The weight's rows are K-contiguous, so a tile is BLOCK_N runs of BLOCK_K bytes (whole
  128-byte lines at BLOCK_K = 128): the checkpoint's layout needs no repack, and
  torch._scaled_mm reads the same bytes (as a [K, N] view).
- Split-K: a 7B layer has 56-600 tiles of 64 rows; each (tile, part of K) is one program,
  the parts sized so that about `waves` programs per SM stream the weight. Each part
  writes its float32 partial to a workspace; the last part to arrive (an atomic counter
  per tile) sums the partials in part order (deterministic) and stores the tile.

Scales: per output channel (per-tensor ones expanded to channels at load) multiply the
finished float32 sum once; block scales (128 x 128 in the official Qwen3/DeepSeek FP8
releases) multiply each BLOCK_K part's sum, BLOCK_K dividing the block's width.

The conversion (a config's "cvt"): the hardware's on sm_89+ (tl.float8e4nv); or the bytes'
bits moved into a 16-bit float's fields, by Triton integer ops (sign to bit 15, the 4
exponent and 3 mantissa bits to bits 13-7 of an fp16: exactly 2^-8 times the e4m3 value,
its exponent bias being 15 against e4m3's 7, e4m3's subnormals landing on fp16 subnormals;
bf16 activations take it through float32, exact at 4 significant bits) or by packed PTX
(e4m3_asm). Below sm_89 Triton refuses the fp8e4nv type itself (its NVIDIA backend lists it
among the supported FP8 types only from capability 8.9; building the kernel for sm_86
raises "type fp8e4nv not supported in this architecture"), so there "native" configs take
the integer ops: the kernel runs on Ampere (sm_80/86), with mma.sync. The factor 2^8 goes
into the final scaling. NaN (0x7f, 0xff) does not occur in checkpoints and is not kept.

Under Triton's interpreter (and for float32 activations) the dots run in float32 "ieee":
the interpreter's bf16 dots are wrong, and float32 is the exact path.
"""
from __future__ import annotations

import torch
import triton.language as tl

from llm_kernels.dispatch import jit_helper, lazy_jit, sm_count
from llm_kernels.fp8.act_quant import quantize_per_token, quantize_per_token_group
from llm_kernels.pdl import gdc_launch_dependents, gdc_wait
from llm_kernels.w4a16.workspace import WS_FLOATS, WS_TILES, workspace

BITS_FACTOR = 256.0  # the bit-moved fp16 is 2^-8 times the e4m3 value
NATIVE, BITS, ASM = 0, 1, 2  # the conversions: the hardware's, Triton integer ops, packed PTX


def e4m3_asm(dtype, pack: int = 2) -> str:
    """PTX turning `pack` (2 or 4) e4m3 bytes (the last operand: a 16- or 32-bit register) into
    16-bit floats, two per 32-bit register ($0: bytes 0-1, $1: bytes 2-3), with no conversion
    instruction: by the CUDA guide's throughput table an SM issues 16 conversions a clock
    against 64 integer ops, and the hardware path to bf16 takes three conversions per pair
    (e4m3x2 -> f16x2, then f16 -> bf16 twice), which by that count cannot keep pace with a
    decode step's bytes on an H200 (the tuner decides). prmt puts byte 2i into bits 8-15 and
    byte 2i+1 into bits 24-31; exponent and mantissa bits (0x7F00 of each half) shift right
    into place, 4 for bf16 (8 exponent bits), 1 for fp16 (5), and the sign (0x8000) stays.
    fp16 is then exactly 2^-8 times the value (the caller's FACTOR); bf16 2^-120 times it, a
    bf16 subnormal for the smallest values, so one packed FMA by 2^120 (exact, subnormal
    inputs honoured) makes it exact."""
    bf16 = dtype == torch.bfloat16
    src = "q" if pack == 2 else f"${pack // 2}"
    code = "{ .reg .b32 a, t, q, k, z; mov.b32 k, 0x7B807B80; mov.b32 z, 0x80008000; "
    if pack == 2:
        code += "cvt.u32.u16 q, $1; "
    for o, sel in enumerate(("0x1404", "0x3424")[: pack // 2]):
        code += (f"prmt.b32 a, {src}, 0, {sel}; and.b32 t, a, 0x7F007F00; shr.b32 t, t, {4 if bf16 else 1}; "
                 f"lop3.b32 ${o}, t, a, 0x80008000, 0xF8; ")
        if bf16:
            code += f"fma.rn.bf16x2 ${o}, ${o}, k, z; "
    return code + "}"


@jit_helper
def _e4m3(b, like, CVT: tl.constexpr, ASM_CODE: tl.constexpr, ASM_PACK: tl.constexpr):
    """e4m3 bytes b (uint8) in like's dtype: CVT NATIVE the hardware's conversion (sm_89+),
    exact; BITS Triton integer ops moving the bits into fp16's fields, exactly 2^-8 times the
    value; ASM the packed PTX of e4m3_asm (exact for bf16, 2^-8 times for fp16), on ASM_PACK bytes a call."""
    if CVT == 0:
        w = b.to(tl.float8e4nv, bitcast=True).to(like.dtype)
    elif CVT == 2:
        if ASM_PACK == 2:
            w = tl.inline_asm_elementwise(ASM_CODE, "=r,h", [b], dtype=like.dtype, is_pure=True, pack=2)
        else:
            w = tl.inline_asm_elementwise(ASM_CODE, "=r,=r,r", [b], dtype=like.dtype, is_pure=True, pack=4)
    else:
        h = b.to(tl.int32)
        h = ((h & 0x7F) << 7) | ((h & 0x80) << 8)
        w = h.to(tl.int16).to(tl.float16, bitcast=True)
        if like.dtype != tl.float16:
            w = w.to(tl.float32).to(like.dtype)
    return w


@jit_helper
def _dot(w, x, acc, F32: tl.constexpr):
    """acc + w x; F32: in float32 with exact products (the interpreter, float32 models)."""
    if F32:
        acc = tl.dot(w.to(tl.float32), x.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(w, x, acc)
    return acc


@lazy_jit(pdl=True, do_not_specialize=["KPS"])
def w8a16_kernel(
    x_ptr, w_ptr, s_ptr, xs_ptr, bias_ptr, out_ptr, ws_ptr, cnt_ptr,
    M, N, K, stride_xm, stride_wn, stride_om, stride_sn, stride_xs, KPS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MT: tl.constexpr, SPLIT: tl.constexpr,
    SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr, CVT: tl.constexpr, ASM_CODE: tl.constexpr, ASM_PACK: tl.constexpr,
    F32: tl.constexpr, A8: tl.constexpr,
    FACTOR: tl.constexpr, EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr, PDL: tl.constexpr = False,
):
    """out[M, N] = x[M, K] @ (W[N, K] * scale)^T. Program (t, p): tile t (column tile
    t // MT, row tile t % MT: the row tiles of one weight tile are neighbours, the weight
    stays in L2) over K blocks [p KPS, (p + 1) KPS) of BLOCK_K. SCALE_BK 0: one scale per
    output row (s_ptr [N]); else block scales s_ptr [N / SCALE_BN, K / SCALE_BK] (row
    stride stride_sn), SCALE_BK a multiple of BLOCK_K. FACTOR: what the conversion left
    out (1 or 2^8). CVT, ASM_CODE: the conversion (_e4m3). SPLIT: the parts of K; above 1 the partials meet in the workspace.
    HAS_BIAS: bias_ptr [N] is added to the float32 sum before the one rounding. A8 (W8A8): x_ptr
    holds e4m3 activations, multiplied by the weight's on FP8 tensor cores; their scales
    xs_ptr are per token ([M]) with per-channel weight scales, or per token and scale block
    of K ([M, K / SCALE_BK], row stride stride_xs) with block scales, each K block's sum then
    scaled by both."""
    if PDL:  # programmatic dependent launch (llm_kernels.pdl): wait for the previous kernel here
        gdc_wait()
        gdc_launch_dependents()
    t = tl.program_id(0)
    part = tl.program_id(1)
    pid_n = t // MT
    pid_m = t - pid_n * MT
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    nmask = rn < N
    mmask = rm < M
    w_ptrs = w_ptr + rn[:, None].to(tl.int64) * stride_wn + rk[None, :]
    x_ptrs = x_ptr + rm[None, :].to(tl.int64) * stride_xm + rk[:, None]
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    kb0 = part * KPS
    kb1 = tl.minimum(kb0 + KPS, tl.cdiv(K, BLOCK_K))
    for kb in range(kb0, kb1):
        k0 = kb * BLOCK_K
        if EVEN_K:  # (0.0: a zero of every element type, e4m3 included)
            b = tl.load(w_ptrs + k0, mask=nmask[:, None], other=0.0)
            x = tl.load(x_ptrs + k0, mask=mmask[None, :], other=0.0)
        else:
            kmask = rk + k0 < K
            b = tl.load(w_ptrs + k0, mask=nmask[:, None] & kmask[None, :], other=0.0)
            x = tl.load(x_ptrs + k0, mask=mmask[None, :] & kmask[:, None], other=0.0)
        if A8:  # both operands e4m3 as they are: no conversion
            if SCALE_BK == 0:
                acc = _dot(b.to(tl.float8e4nv, bitcast=True), x.to(tl.float8e4nv, bitcast=True), acc, F32)
            else:  # this block's sum times the weight block's scale (per row) and the tokens' (per column)
                sb = tl.load(s_ptr + (rn // SCALE_BN).to(tl.int64) * stride_sn + k0 // SCALE_BK, mask=nmask,
                             other=0.0)
                xsb = tl.load(xs_ptr + rm.to(tl.int64) * stride_xs + k0 // SCALE_BK, mask=mmask, other=0.0)
                bsum = _dot(b.to(tl.float8e4nv, bitcast=True), x.to(tl.float8e4nv, bitcast=True),
                            tl.zeros_like(acc), F32)
                acc += bsum * sb[:, None] * xsb[None, :]
        else:
            w = _e4m3(b, x, CVT, ASM_CODE, ASM_PACK)
            if SCALE_BK == 0:
                acc = _dot(w, x, acc, F32)
            else:  # this block's sum times the block's scale, per row
                sb = tl.load(s_ptr + (rn // SCALE_BN).to(tl.int64) * stride_sn + k0 // SCALE_BK, mask=nmask,
                             other=0.0)
                acc += _dot(w, x, tl.zeros_like(acc), F32) * sb[:, None]
    if A8:
        if SCALE_BK == 0:
            xs = tl.load(xs_ptr + rm, mask=mmask, other=0.0)
            acc *= tl.load(s_ptr + rn, mask=nmask, other=0.0)[:, None] * xs[None, :]
    elif SCALE_BK == 0:
        acc *= tl.load(s_ptr + rn, mask=nmask, other=0.0)[:, None] * FACTOR
    elif FACTOR != 1.0:
        acc *= FACTOR
    if HAS_BIAS:
        bias = tl.load(bias_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[:, None]
    optrs = out_ptr + rm[None, :].to(tl.int64) * stride_om + rn[:, None]
    omask = mmask[None, :] & nmask[:, None]
    if SPLIT == 1:
        if HAS_BIAS:
            acc += bias
        tl.store(optrs, acc.to(out_ptr.dtype.element_ty), mask=omask)
    else:
        loc = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
        # the whole slot, columns past M too (zeros): masking them cuts the stores and loads
        # to single elements when M is not a multiple of 16 (as llm_kernels.w4a16.kpack found)
        tl.store(ws_ptr + (t * SPLIT + part).to(tl.int64) * (BLOCK_M * BLOCK_N) + loc, acc)
        tl.debug_barrier()  # every thread's partial is written before the count
        arrived = tl.atomic_add(cnt_ptr + t, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT - 1:  # the last part to arrive sums all parts, in part order
            total = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
            for p in tl.static_range(SPLIT):
                total += tl.load(ws_ptr + (t * SPLIT + p).to(tl.int64) * (BLOCK_M * BLOCK_N) + loc,
                                 cache_modifier=".cg")
            if HAS_BIAS:
                total += bias
            tl.store(optrs, total.to(out_ptr.dtype.element_ty), mask=omask)
            tl.atomic_xchg(cnt_ptr + t, 0)  # ready for the next launch


def native_conversion(device: torch.device) -> bool:
    """Whether Triton converts e4m3 in hardware here (CUDA sm_89+); the interpreter does too."""
    if device.type != "cuda":
        return True
    return torch.cuda.get_device_capability(device) >= (8, 9)


def capability(device: torch.device) -> tuple[int, int] | None:
    """The CUDA compute capability of device; None for the interpreter (CPU tensors)."""
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


def constexprs(cfg: dict, dtype, cap: tuple[int, int] | None, block, mt: int, split: int, even_k: bool,
               bias: bool) -> dict:
    """The kernel's compile-time arguments for one config, activations of dtype, on a GPU of
    compute capability cap (None: the interpreter). The conversion a config asks for where it
    can run: "native" takes the bit moves below sm_89 (Triton refuses fp8e4nv there), "asm"
    (PTX) them under the interpreter and for float32. The PTX takes 2 bytes a call on Hopper
    and later, 4 below: from the compiled loops (nvdisasm, BLOCK 64 x 128), packing four bytes
    of the wgmma operand layout into a word cost Triton 7 byte permutes a word on sm_90 (0.216
    issued warp instructions a weight byte against 0.164 with two), while on sm_80 the mma.sync
    layout packs four for free (0.144 against 0.207)."""
    a8 = cfg.get("kind") == "w8a8"
    want = "native" if a8 else cfg.get("cvt", "native")
    if want == "asm" and cap is not None and dtype != torch.float32:
        cvt = ASM
    elif want == "native" and (cap is None or cap >= (8, 9)):
        cvt = NATIVE
    else:
        cvt = BITS
    pack = (2 if cap >= (9, 0) else 4) if cvt == ASM else 0
    factor = BITS_FACTOR if cvt == BITS or (cvt == ASM and dtype == torch.float16) else 1.0
    return dict(BLOCK_M=cfg["BM"], BLOCK_N=cfg["BN"], BLOCK_K=cfg["BK"], MT=mt, SPLIT=split,
                SCALE_BN=block[0] if block else 1, SCALE_BK=block[1] if block else 0, CVT=cvt,
                ASM_CODE=e4m3_asm(dtype, pack) if cvt == ASM else "", ASM_PACK=pack,
                F32=dtype == torch.float32 or cap is None, A8=a8, FACTOR=factor, EVEN_K=even_k, HAS_BIAS=bias)


def split_parts(tiles: int, nkb: int, cfg: dict, device) -> tuple[int, int]:
    """(parts of K, K blocks a part): cfg "split" a fixed count, else about cfg "waves"
    programs per SM over the tiles; no part empty."""
    want = cfg.get("split") or -(-cfg.get("waves", 4) * sm_count(device) // tiles)
    want = max(1, min(int(want), nkb, 16))
    kps = -(-nkb // want)
    return -(-nkb // kps), kps


def launch(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block, cfg: dict,
           bias: torch.Tensor | None = None, out: torch.Tensor | None = None, xq=None) -> torch.Tensor:
    """x [M, K] @ (weight [N, K] e4m3 * scale)^T (+ bias [N]) in x's dtype with one config of
    llm_kernels.fp8.configs. scale: float32 [N] per channel, or with block (bn, bk) float32
    [cdiv(N, bn), cdiv(K, bk)] (bn 1: a scale row per output row). A "w8a8" config first
    quantizes x per token (llm_kernels.fp8.act_quant: one launch; per token and scale block of
    K with block scales), then multiplies e4m3 by e4m3; with xq (x's per-token quantization,
    per-channel scales only: e4m3 [M, K], float32 [M, 1]) it takes that instead."""
    M, K = x.shape
    N = weight.shape[0]
    BM, BN, BK = cfg["BM"], cfg["BN"], cfg["BK"]
    if block is not None and block[1] % BK:
        raise ValueError(f"w8a16: BLOCK_K {BK} does not divide the scale block {block}")
    xk, wk, xs = x, weight.view(torch.uint8), scale  # as the kernel reads them; xs a stand-in unless W8A8
    if cfg.get("kind") == "w8a8":
        if block is not None and (K % block[1] or block[1] & (block[1] - 1)):
            raise ValueError(f"w8a8: K {K} is not a multiple of the scale block {block}, a power of two")
        if xq is not None and block is None:
            xk, xs = xq
        else:
            xk, xs = quantize_per_token(x) if block is None else quantize_per_token_group(x, block[1])
        # typed e4m3, not bytes: Triton then feeds both tiles from shared memory to the MMA as
        # loaded (a byte tile bitcast to e4m3 went through registers and back each K step)
        wk = weight
    mt = -(-M // BM)
    tiles = mt * -(-N // BN)
    nkb = -(-K // BK)
    split, kps = split_parts(tiles, nkb, cfg, x.device)
    ws = workspace(x.device) if split > 1 else None
    if split > 1 and (ws is None or tiles > WS_TILES or tiles * split * BM * BN > WS_FLOATS):
        split, kps, ws = 1, nkb, None  # no room for partials (or first met inside a capture): whole tiles
    if ws is None:  # typed stand-ins, never touched with one part
        ws = (x.new_empty(1, dtype=torch.float32), x.new_zeros(1, dtype=torch.int32))
    out = torch.empty(M, N, dtype=x.dtype, device=x.device) if out is None else out
    const = constexprs(cfg, x.dtype, capability(x.device), block, mt, split, K % BK == 0, bias is not None)
    w8a16_kernel[(tiles, split)](
        xk, wk, scale, xs, out if bias is None else bias, out, ws[0], ws[1], M, N, K,
        xk.stride(0), weight.stride(0), out.stride(0), scale.stride(0), xs.stride(0), kps, **const,
        num_warps=cfg.get("warps", 4), num_stages=cfg.get("stages", 3))
    return out

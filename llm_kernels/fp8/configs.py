"""The tuner's candidate configs of the W8A16 kernel (llm_kernels.fp8.w8a16) per token
count, and the stand-ins for the paths beside it. The first candidate of a step is the one
the interpreter runs, the one taken inside a graph capture before the shape was tuned,
and the yardstick the others must agree with.

The lists are short on purpose (each candidate costs a compile and a timing per shape at
start-up) and are a first cut from instruction counts of the compiled loops and the kpack
kernel's experience on an H200, not yet from FP8 timings: K5's `w8a16_config` column (the
tuner's picks on Qwen2.5-7B's layers) should prune them.
"""
import torch

from llm_kernels.dispatch import next_pow2

SCALED_MM = {"kind": "scaled_mm"}  # activations quantized per token, torch._scaled_mm (W8A8)
DENSE = {"kind": "dense"}  # the weight dequantized by a Triton kernel, then cuBLAS


# Above 16 tokens the candidates include about one program an SM (waves 1): each part of K
# writes a float32 partial of BLOCK_M x BLOCK_N tokens and weight rows and the last part reads
# them all back, so at 32-256 tokens a tile the partials of 4 programs an SM rival the weight's
# own bytes (o_proj at 64 tokens on an H100: 56 tiles cut in 10 parts of 3 K blocks, 9 MB of
# partials written and read against a 12.8 MB weight; 20 us against a 4.6 us floor).


def shape_key(M: int, N: int, K: int, layout: str, dtype) -> tuple:
    """What a choice is tuned for: M up to its next power of two, the layer, the scale layout, the dtype."""
    return (next_pow2(M), N, K, layout, dtype)


def w8a16_config(bm, bn, bk=128, warps=4, stages=4, waves=4, split=None, cvt="native"):
    """BLOCK_M tokens x BLOCK_N weight rows (swapped: the weight is the MMA's M) x BLOCK_K;
    K cut into `split` parts, or into enough parts for about `waves` programs per SM; cvt
    "native" (the hardware's e4m3 conversion where the GPU has it, Triton's bit moves below
    sm_89), "asm" (packed PTX bit moves, llm_kernels.fp8.w8a16.e4m3_asm) or "bits"."""
    c = {"kind": "w8a16", "BM": bm, "BN": bn, "BK": bk, "warps": warps, "stages": stages, "cvt": cvt}
    if split is not None:
        c["split"] = split
    else:
        c["waves"] = waves
    return c


def w8a16_configs(M: int, dtype, device, block_k: int = 0) -> list:
    """Candidates for M tokens; block_k: the width of the layer's scale blocks (0: per
    channel), which BLOCK_K must divide.

    Why these (from the compiled loops, nvdisasm, sm_90, per weight byte; an SM issues 4 warp
    instructions a clock and an H200 step must take about 21 bytes a clock an SM): the
    hardware conversion costs 0.094 issued instructions a byte for fp16 but 0.141 for bf16,
    64 of them quarter-rate f16 -> bf16 conversions (at most about 77% of the bandwidth by that
    count); the PTX bit moves cost 0.164 at BLOCK_K 128 and 0.140 at 256, all full-rate. So
    both conversions, 64 weight rows a warpgroup (wgmma M = 64), K blocks of 128 or 256 bytes,
    and 4 or 8 programs an SM. On an H200, K5 (Qwen2.5-7B's four layers at 1-256 tokens) and E1
    in FP8 picked only these three; 128-row tiles on 8 warps and native 256-byte blocks at 8
    programs an SM never won and went."""
    if device.type != "cuda":  # the interpreter: every kernel variant, small tiles
        cands = [w8a16_config(16, 32, 32, split=1), w8a16_config(16, 32, 32, split=3),
                 w8a16_config(16, 16, 64, waves=2, cvt="bits"), w8a16_config(32, 64, 32, split=2, cvt="asm")]
    elif dtype == torch.float32:  # the correctness path: float32 ieee dots
        cands = [w8a16_config(16, 32, 32, stages=3, waves=2)]
    else:
        bm = 16 if M <= 16 else min(64, next_pow2(M))
        cands = [w8a16_config(bm, 64, 128), w8a16_config(bm, 64, 256, stages=3, cvt="asm"),
                 w8a16_config(bm, 64, 128, waves=8, cvt="asm")]
        if M > 16:  # fewer, longer parts of K (above)
            cands += [w8a16_config(bm, 64, 128, waves=1), w8a16_config(bm, 64, 256, stages=3, cvt="asm", waves=1)]
    return _fit_block(cands, block_k)


def w8a8_config(bm, bn, bk=128, warps=4, stages=4, waves=4, split=None):
    """A config of the same kernel as W8A8 (activations quantized per token, e4m3 dots):
    tiles and split-K as w8a16_config, no conversion to choose."""
    c = w8a16_config(bm, bn, bk, warps, stages, waves, split)
    del c["cvt"]
    return {**c, "kind": "w8a8"}


def w8a8_configs(M: int, device, block_k: int = 0) -> list:
    """Candidates for M tokens. The tokens are the MMA's N (up to 128 a tile: FP8 wgmma takes
    N to 256, and the float32 accumulator of 128 x 128 fills half of 8 warps' registers), the
    weight rows its M (64 a warpgroup, 128 on two); K blocks of 128 or 256 bytes (FP8 wgmma
    steps K by 32); split-K as the W8A16 kernel, for the small layers at few tokens. block_k:
    the width of the layer's scale blocks (0: per channel), which BLOCK_K must divide."""
    if device.type != "cuda":  # the interpreter: split and whole, tails of M, N and K
        cands = [w8a8_config(16, 32, 32, split=1), w8a8_config(16, 32, 32, split=3),
                 w8a8_config(32, 64, 64, split=2)]
    else:
        bm = 16 if M <= 16 else min(128, next_pow2(M))
        cands = [w8a8_config(bm, 64, 128), w8a8_config(bm, 128, 128, warps=8),
                 w8a8_config(bm, 64, 256, stages=3), w8a8_config(bm, 128, 256, warps=8, stages=3, waves=2)]
        if M > 16:  # fewer, longer parts of K (above)
            cands += [w8a8_config(bm, 64, 128, waves=1), w8a8_config(bm, 64, 256, stages=3, waves=1),
                      w8a8_config(bm, 128, 128, warps=8, waves=1)]
    return _fit_block(cands, block_k)


def _fit_block(cands: list, block_k: int) -> list:
    """The candidates whose BLOCK_K divides the scale blocks' width (0: per channel, all of
    them); none: the first with the largest power of two that does."""
    if not block_k:
        return cands
    return [c for c in cands if block_k % c["BK"] == 0] or [{**cands[0], "BK": _largest_divisor(block_k)}]


def _largest_divisor(block_k: int) -> int:
    """The largest power of two up to 128 dividing a scale block's width."""
    bk = 128
    while block_k % bk:
        bk //= 2
    return bk

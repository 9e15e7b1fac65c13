"""The tuner's candidate configs of each W4A16 kernel, per token count: the K-packed kernel
(llm_kernels.w4a16.kpack), the checkpoint-layout kernels (llm_kernels.w4a16.ckpt) and the
dequantize-then-matmul path. A candidate stays only while it wins somewhere: the lists were
cut to the configs the tuner picked on Qwen2.5-7B's and SmolLM2-135M's layers on an H200
(benchmarks/tools/tuner_picks.py prints the picks). The first candidate of a step is the one
the interpreter runs, the one taken inside a graph capture before the shape was tuned, and
the yardstick the others must agree with: above 16 tokens the dequantize-then-matmul path
(llm_kernels.w4a16.weight puts it first), at most 16 the first config of the kernel's list
(for the checkpoint layout plain Triton, no inline PTX)."""
import torch

from llm_kernels.dispatch import next_pow2, sm_count

DENSE = {"kind": "dense"}  # dequantize (Triton), then torch.matmul (cuBLAS)


def shape_key(M: int, N: int, K: int, group_size: int, dtype) -> tuple:
    """What a config is tuned for: M up to its next power of two, the layer, the dtype."""
    return (next_pow2(M), N, K, group_size, dtype)


# ----------------------------------------------------------------------------
# the checkpoint layout (llm_kernels.w4a16.ckpt)


def ckpt_config(bm, bw, deq, warps=4, waves=None, split=None, bk=128, stages=1, pf=False, maxnreg=None, pfx=False):
    """A config of the plane kernel: BLOCK_M x 8 BLOCK_W tiles, dequant DEQ, split-K
    into `split` parts or about `waves` programs per SM, K blocks of bk rows; pf
    prefetches the next block's words in registers, pfx its x, zeros and scales too."""
    cfg = {"kind": "fused", "BM": bm, "BW": bw, "deq": deq, "warps": warps, "stages": stages, "BK": bk, "pf": pf}
    if pfx:
        cfg["pfx"] = True
    if maxnreg:
        cfg["maxnreg"] = maxnreg
    if split is not None:
        cfg["split"] = split
    else:
        cfg["waves"] = waves or 0
    return cfg


def wide_config(bm, bn, split, warps=4):
    """A config of the wide-tile kernel: BLOCK_M x BLOCK_N tiles, K split in `split` by atomics."""
    return {"kind": "wide", "BM": bm, "BN": bn, "SPLIT_K": split, "warps": warps, "stages": 3}


def ckpt_configs(M: int, dtype, device) -> list:
    """Candidates of the checkpoint-layout kernels for M tokens (on a GPU at most 16 in bf16
    and fp16, 64 in float32: llm_kernels.w4a16.select)."""
    if device.type != "cuda":  # the interpreter: every kernel variant, small
        deq = 0 if dtype == torch.float32 else 1
        cands = [ckpt_config(16, 16, deq, waves=2, bk=64), ckpt_config(16, 16, deq, split=1),
                 ckpt_config(16, 16, deq, waves=2, pf=True),
                 ckpt_config(16, 16, deq, waves=2, bk=32, pf=True, pfx=True), wide_config(16, 32, 2)]
        if dtype != torch.float32:
            cands.append(ckpt_config(16, 16, 0, waves=2))
        return cands
    if dtype == torch.float32:  # the correctness path: exact float planes, ieee dots
        return [ckpt_config(16, 16, 0, warps=2, waves=4, bk=32)]
    # up to 16 tokens (above, the dequantized weight with cuBLAS won on every layer): plain
    # Triton first (the yardstick), the words prefetched in registers at 2-8 programs an SM,
    # and the wide tiles split 7 ways by atomics
    return [ckpt_config(16, 32, 1, waves=6, stages=2)] + \
        [ckpt_config(16, 32, 2, waves=w, pf=True) for w in (6, 8, 2)] + [wide_config(16, 64, 7)]


# ----------------------------------------------------------------------------
# the K-packed layout (llm_kernels.w4a16.kpack)


def kpack_config(bm, bn, warps=4, stages=3, grid="auto", maxnreg=None, swap=False, znext=False):
    """A config of the kpack kernel: BLOCK_M x BLOCK_N tiles; grid "auto" (the programs
    resident per SM times the SMs), "tiles" (one program per tile) or a program count;
    swap computes out^T = W^T x^T (Hopper's wgmma then takes the weights from registers);
    znext (swapped, groups of 128 rows or more) loads the next block's zero row a block ahead
    into registers, as the scale row is."""
    c = {"kind": "fused", "BM": bm, "BN": bn, "warps": warps, "stages": stages, "grid": grid}
    if maxnreg:
        c["maxnreg"] = maxnreg
    if swap:
        c["swap"] = True
    if znext:
        c["znext"] = True
    return c


def kpack_configs(M: int, dtype, device) -> list:
    """Candidates of the kpack kernel for M tokens."""
    if device.type != "cuda":  # the interpreter: every kernel variant, small
        return [kpack_config(16, 32, grid=3), kpack_config(16, 32, grid="tiles"), kpack_config(32, 64, grid=5),
                kpack_config(16, 32, grid=3, swap=True), kpack_config(32, 64, grid="tiles", swap=True),
                kpack_config(32, 64, grid=5, swap=True, znext=True)]
    if dtype == torch.float32:
        return [kpack_config(16, 64)]
    if M <= 16:
        # BN 128 on 2 warps (64 columns a warp) for the wide layers, BN 64 on 4 or 2 warps for
        # the small ones, a grid of two programs an SM for long K (fewer partials per tile), and
        # the swapped BN 256 (wgmma with the weights in registers) for the widest, its zero rows
        # loaded in the loop or a block ahead (on an H100 within 1.5% of each other where picked)
        sms = sm_count(device)
        return [kpack_config(16, 64), kpack_config(16, 128, warps=2, stages=4), kpack_config(16, 64, warps=2, stages=4),
                kpack_config(16, 64, grid=2 * sms), kpack_config(16, 128, warps=2, stages=4, grid=2 * sms),
                kpack_config(16, 256, swap=True), kpack_config(16, 256, swap=True, znext=True)]
    if M <= 64:
        # swapped: BM rows of x are the wgmma's N, BN weight columns its M (64 per warpgroup);
        # at 168 registers 3 programs fit an SM. 64 x 128 on one warpgroup spills (255
        # registers and 40 bytes of stack at sm_90); on two, or as 64 x 64, it does not. The
        # one-warpgroup tiles of BN 128 load the zero row a block ahead: 5-17% faster at 50
        # tokens on an H100 than loading it in the loop, where the 8-warp and 64 x 64 tiles
        # were 8-55% slower (docs/kernels.md)
        return [kpack_config(32, 128, swap=True, maxnreg=168, znext=True), kpack_config(32, 128, swap=True, znext=True),
                kpack_config(64, 128, swap=True, znext=True), kpack_config(64, 64, swap=True),
                kpack_config(64, 128, warps=8, swap=True)]
    # 8 warps: two warpgroups share the x tile. 128 x 128 spills (255 registers, about 400
    # bytes of stack at sm_90); 64 x 128 does not. (64 x 64 and 128 x 64 won no layer at
    # 128-512 tokens on an H100, in K1 or in E1's tuning, and were dropped)
    return [kpack_config(128, 128, warps=8, swap=True), kpack_config(64, 128, warps=8, swap=True)]

"""Candidate configs of the AWQ GEMM kernels (llm_kernels.awq_ckpt on the
checkpoint layout, llm_kernels.awq_kpack on the K-packed one, llm_kernels.awq_mma
at small M and llm_kernels.awq_tile up to 256 tokens on the mma layout), and their GEMMs with the config tuned once per shape on CUDA
(llm_kernels.dispatch.autotune)."""
import torch

from llm_kernels import awq_ckpt, awq_kpack, awq_mma, awq_tile
from llm_kernels.awq_gemv import MAX_M as GEMV_MAX_M
from llm_kernels.awq_gemv import gemv_config
from llm_kernels.dispatch import autotune, chosen, next_pow2, sm_count

CKPT, KPACK, MMA = "awq_ckpt", "awq_kpack", "awq_mma"  # the tuner's names of the kernels
DENSE = {"kind": "dense"}  # dequantize, then torch.matmul (cuBLAS)


def shape_key(M: int, N: int, K: int, group_size: int, dtype) -> tuple:
    """What a config is tuned for: M up to its next power of two, the layer, the dtype."""
    return (next_pow2(M), N, K, group_size, dtype)


def chosen_config(kernel: str, M: int, N: int, K: int, group_size: int, dtype):
    """The config tuned for a shape (benchmarks print it), or None; kernel is CKPT or KPACK."""
    return chosen(kernel, shape_key(M, N, K, group_size, dtype))


# ----------------------------------------------------------------------------
# the checkpoint layout (llm_kernels.awq_ckpt)


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
    """Candidates timed per shape (the fastest wins). The first is the interpreter's,
    and the one used when a shape is first met inside a graph capture: plain Triton,
    no inline asm. BLOCK_M 16 (mma.sync) tiles serve M <= 32: the per-weight work is
    the dequant, so two M tiles cost less than one taller tile."""
    if device.type != "cuda":
        deq = 0 if dtype == torch.float32 else 1
        cands = [ckpt_config(16, 16, deq, waves=2, bk=64), ckpt_config(16, 16, deq, split=1),
                 ckpt_config(16, 16, deq, waves=2, pf=True),
                 ckpt_config(16, 16, deq, waves=2, bk=32, pf=True, pfx=True), wide_config(16, 32, 2)]
        if dtype != torch.float32:
            cands.append(ckpt_config(16, 16, 0, waves=2))
        return cands
    if dtype == torch.float32:  # the correctness path: exact float planes, ieee dots
        return [ckpt_config(16, 16, 0, warps=2, waves=4, bk=32)] if M <= 64 else [DENSE]
    safe = ckpt_config(16, 32, 1, waves=6, stages=2)  # plain Triton: the yardstick of the others
    pf = [ckpt_config(16, 32, 2, waves=w, pf=True) for w in (6, 4, 8, 2)]
    pfx = [ckpt_config(16, 32, 2, waves=w, pf=True, pfx=True) for w in (6, 4)]
    pfx64 = [ckpt_config(16, 32, 2, waves=w, pf=True, pfx=True, bk=64) for w in (6, 8)]
    cpasync = [ckpt_config(16, 32, 2, waves=6, stages=3, maxnreg=168)]  # the words by the cp.async pipeline
    wide16 = [wide_config(16, 128, 7), wide_config(16, 64, 7), wide_config(16, 64, 7, warps=2)]
    wide64 = [wide_config(32 if M <= 32 else 64, 128, s) for s in ((4, 14) if M <= 32 else (2, 7))]
    # more programs in flight: thinner K blocks (fewer registers) and wider tiles
    thin = [ckpt_config(16, bw, 2, waves=w, pf=True, bk=32) for bw, w in ((32, 8), (32, 12), (64, 6), (64, 8))]
    capped = [ckpt_config(16, 32, 2, waves=8, pf=True, bk=64, maxnreg=128),
              ckpt_config(16, 64, 2, warps=8, waves=4, pf=True, bk=64)]
    if M <= 16:
        return [safe] + pf + pfx + pfx64 + cpasync + thin + capped + wide16
    # taller tiles for batched decode: one dequantized weight tile serves 32 or 64 rows
    tall = [ckpt_config(32, 32, 2, waves=4, pf=True, bk=64), ckpt_config(32, 32, 2, warps=8, waves=4, pf=True, bk=64),
            ckpt_config(64, 32, 2, warps=8, waves=2, pf=True, bk=64),
            ckpt_config(64, 32, 2, warps=8, waves=4, pf=True, bk=32)]
    if M <= 32:
        return [safe, pf[0], pfx[0], pfx64[0], cpasync[0], DENSE] + thin[:2] + tall[:2] + wide64
    if M <= 64:
        return [DENSE, pf[0], pfx[0], thin[0]] + tall + wide64
    if M <= 256:
        return [DENSE] + tall[2:] + [ckpt_config(64, 32, 2, warps=8, waves=1, pf=True, bk=64)]
    return [DENSE]


def ckpt_gemm(x, qweight, qzeros, scales, group_size: int) -> torch.Tensor:
    """x [..., K] @ dequant(qweight) on the checkpoint layout, the config tuned per shape."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    assert qweight.is_contiguous() and qzeros.is_contiguous() and scales.is_contiguous()
    M, K = x2.shape
    N = qweight.shape[1] * 8

    def candidates():  # the ones whose split-K partials fit the workspace
        return [c for c in ckpt_configs(M, x.dtype, x.device) if awq_ckpt.fits(M, N, K, group_size, c, x.device)]

    def launch(cfg):
        return awq_ckpt.launch(x2, qweight, qzeros, scales, group_size, cfg)

    cfg = autotune(CKPT, shape_key(M, N, K, group_size, x.dtype), candidates, launch, checked=(x.dtype, group_size))
    return launch(cfg).view(*lead, N)


# ----------------------------------------------------------------------------
# the K-packed layout (llm_kernels.awq_kpack)


def kpack_config(bm, bn, warps=4, stages=3, grid="auto", maxnreg=None, swap=False, fold=False):
    """A config of the kpack kernel: BLOCK_M x BLOCK_N tiles; grid "auto" (the programs
    resident per SM times the SMs), "tiles" (one program per tile) or a program count;
    swap computes out^T = W^T x^T; fold: the scales multiply the dequantized weights
    instead of each group's sum (fewer registers, one more FMA a weight pair: on the H200
    it won only swapped 32x128 at M = 32, benchmarks/NOTES.md session 14)."""
    c = {"kind": "fused", "BM": bm, "BN": bn, "warps": warps, "stages": stages, "grid": grid}
    if maxnreg:
        c["maxnreg"] = maxnreg
    if swap:
        c["swap"] = True
    if fold:
        c["fold"] = True
    return c


def gemv_configs(M: int) -> list:
    """CUDA-core candidates (llm_kernels.awq_gemv) for M <= 4: tiles and warps whose sm_90 SASS
    holds no spills (benchmarks/kernel_sass.py --m 1 2 4), waves = the programs resident per SM
    there (1 row: BN 32 on 1 warp at 128 registers, 16 an SM; 4 warps at 96, 5 an SM)."""
    if M <= 1:
        return [gemv_config(32, 1, 16), gemv_config(64, 2, 6), gemv_config(128, 4, 5)]
    if M <= 2:
        return [gemv_config(64, 2, 6), gemv_config(128, 4, 2)]
    return [gemv_config(128, 4, 2)] if M <= GEMV_MAX_M else []


def kpack_configs(M: int, dtype, device) -> list:
    """Candidates timed per shape; the first is the interpreter's and the one used
    if a shape is first met inside a graph capture."""
    if device.type != "cuda":
        gemv = [gemv_config(16, split=3), gemv_config(32, warps=2)] if M <= GEMV_MAX_M else []
        return [kpack_config(16, 32, grid=3), kpack_config(16, 32, grid="tiles"), kpack_config(32, 64, grid=5),
                kpack_config(16, 32, grid=3, swap=True), kpack_config(32, 64, grid="tiles", swap=True),
                kpack_config(32, 64, grid=5, fold=True), kpack_config(16, 32, grid=3, swap=True, fold=True)] + gemv
    if dtype == torch.float32:
        return [kpack_config(16, 64)] if M <= 64 else [DENSE]
    sms = sm_count(device)
    if M <= 16:
        # BN 128 on 2 warps (64 columns a warp) for the wide layers, BN 64 on 4 or 2 warps for
        # the small ones, grids under a full wave for long K (fewer partials per tile: BN 128 at
        # 2 SMs' worth of programs took 18944x3584 M = 16 from 29.9 to 23.2 us, NOTES session 16),
        # and the swapped BN 256 (wgmma with the weights in registers)
        return [kpack_config(16, 64), kpack_config(16, 128, warps=2, stages=4), kpack_config(16, 64, warps=2),
                kpack_config(16, 128), kpack_config(16, 64, warps=2, stages=4), kpack_config(16, 64, grid=2 * sms),
                kpack_config(16, 64, grid=4 * sms), kpack_config(16, 128, warps=2, stages=4, grid=2 * sms),
                kpack_config(16, 256, swap=True)] + gemv_configs(M)
    # swapped (wgmma, the weights in registers): BM rows of x are the wgmma's N, BN weight
    # columns its M (64 per warpgroup); 8 warps are two warpgroups sharing the x tile
    swapped = [kpack_config(bm, bn, warps=w, stages=st, swap=True) for bm, bn, w, st in
               ((64, 128, 4, 3), (64, 256, 8, 3), (128, 128, 4, 3), (128, 128, 8, 3), (128, 256, 8, 3),
                (128, 64, 4, 4))]  # not (256, 128, 8, 3): 336 KB of shared memory for sm_90 (benchmarks/kernel_sass.py), over the limit
    if M <= 64:
        # taller tiles, unswapped and swapped
        return [kpack_config(16, 64), kpack_config(32, 64), kpack_config(32, 128), kpack_config(64, 64),
                kpack_config(32, 64, warps=2), kpack_config(16, 128, warps=2, stages=4),
                kpack_config(32, 128, swap=True), kpack_config(32, 128, swap=True, fold=True)] + swapped[:2] + [DENSE] + \
            [kpack_config(32, 128, swap=True, maxnreg=168)]  # 3 programs an SM, no spills: the M = 32 pick on the H200
    if M <= 256:
        # (128, 256) unswapped needs 256 KB of shared memory at 3 stages (the H200 has 227): left out
        return [DENSE] + [kpack_config(bm, bn, warps=8, stages=s, grid="tiles") for bm in (64, 128)
                          for bn in (128, 256) for s in (3, 4) if (bm, bn) != (128, 256)] + \
            [kpack_config(128, 128, warps=8)] + swapped
    if M <= 512:
        # a mixed step of a chunk beside decodes (MAX_CUDAGRAPH_TOKENS = 512): the dense path
        # writes and reads the whole layer in bf16 each step; the largest tiles may beat it
        return [DENSE] + [kpack_config(128, 128, warps=8, stages=s, grid="tiles") for s in (3, 4)] + \
            [kpack_config(128, 128, warps=8), swapped[4]]
    return [DENSE]


def kpack_gemm(x, qk, zeros, scales, group_size: int) -> torch.Tensor:
    """x [M, K] @ W [K, N] with W in the kpack layout; the config tuned per shape with the L2 cold."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    M, K = x.shape
    N = scales.shape[1]

    def launch(cfg):
        return awq_kpack.launch(x, qk, zeros, scales, group_size, cfg)

    cfg = autotune(KPACK, shape_key(M, N, K, group_size, x.dtype), lambda: kpack_configs(M, x.dtype, x.device),
                   launch, checked=(x.dtype, group_size), cold_l2_device=x.device)
    return launch(cfg)


# ----------------------------------------------------------------------------
# small M with the mma layout kept too (llm_kernels.awq_mma, and llm_kernels.awq_tile up to 256 tokens)

OTHER_LAYOUT = {"kind": "layout"}  # the layer's other path (awq_linear's: kpack, or the checkpoint layout's kernel)


def small_m_configs(M: int, N: int, K: int, mma_max: int, sms=None, smem=None) -> list:
    """The layer's other path first (the one taken inside a capture before the shape was
    tuned), then the kernels' configs that launch at every M of M's tuning bucket (its
    choice serves them all: a config whose partial sums fit shared memory at 17 tokens may
    not at 32): awq_mma's up to mma_max tokens, and on a GPU (sms SMs, smem bytes of shared
    memory a block may opt in to) awq_tile's from 17 to 256."""
    bucket = next_pow2(M)
    cands = [OTHER_LAYOUT] + (awq_mma.mma_configs(bucket, N) if bucket <= mma_max else [])
    if sms is not None:
        cands += awq_tile.tile_configs(bucket, N, K, sms, smem)
    return cands


def small_m_gemm(x, words, sz, group_size: int, other, mma_max: int = awq_mma.MAX_M) -> torch.Tensor:
    """x [M, K] bf16 (M <= awq_tile.MAX_M) @ a layer held in the mma layout (words, sz), which
    other(x) multiplies another way (its kpack or checkpoint layout, or the mma layout
    dequantized): the tuner times the kernels' configs against that path, per shape
    (awq_mma's up to mma_max tokens)."""
    x = x.contiguous()
    M, K = x.shape
    N = words.shape[0] * 16

    def launch(cfg):
        if cfg["kind"] == "mma":
            return awq_mma.mma_launch(x, words, sz, cfg)
        if cfg["kind"] == "tile":
            return awq_tile.tile_launch(x, words, sz, cfg)
        return other(x)

    def candidates():
        gpu = (sm_count(x.device), awq_tile.smem_limit(x.device)) if x.is_cuda else (None, None)
        return small_m_configs(M, N, K, mma_max, *gpu)

    cfg = autotune(MMA, shape_key(M, N, K, group_size, x.dtype), candidates, launch,
                   checked=(x.dtype, group_size), cold_l2_device=x.device)
    return launch(cfg)

"""AWQ W4A16 on the kpack layout with K split inside a program as well as across
programs ("splitk"): for decode-sized M, where the tensor-core kernel
(kernels.awq_kpack) is bound by latency, not by its instructions.

The H200 (benchmarks/NOTES.md, session 19) shows the stream-K kernel at M <= 16
issuing on 41% of cycles with one warp a scheduler; doubling its programs hides
more latency but costs more than it gains, because every program's [16, BN] float32
partial is written, then read back by the tile's last program, in rounds of four.
Here a program's KS warps each take their own 128-row block of K at a time, as
one batched dot of KS independent [BM, 16] x [16, BN] products (Triton puts the
batch across the warps), and sum their accumulators once at the end: a partial
a program, not a warp, so a quarter of the partial traffic and of the tile's
fix-up rounds at the same warps in flight. Each program owns a column tile and a
contiguous run of K's steps (KS blocks a step), so its loop has no tile ends in
it; the last split of a tile to arrive (an atomic counter) sums the partials in
split order, so results do not depend on timing. The weights are dequantized by
kernels.kpack_planes' routine (one inline-PTX LOP3 + FMA a pair of weights on
CUDA, exact float planes under the interpreter and for float32).
"""
import torch
import triton.language as tl

from kernels import kpack_planes
from kernels.dispatch import lazy_jit, share_helpers, sm_count
from kernels.kpack_planes import ROWS, dequant_asm
from kernels.workspace import WS_FLOATS, WS_TILES, workspace

share_helpers(__name__, kpack_planes._plane, kpack_planes._mma)
MAX_M = 64  # rows a tile holds at most (BM)


# NSTEP and SPLIT vary with the shape and the config: not specialised
@lazy_jit(do_not_specialize=["NSTEP", "SPLIT"])
def _splitk_kernel(x_ptr, qk_ptr, z_ptr, s_ptr, out_ptr, ws_ptr, cnt_ptr, M, N, stride_xm, stride_om, NSTEP, SPLIT,
                   G: tl.constexpr, NBLK: tl.constexpr, PPG: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, KS: tl.constexpr, NBASE: tl.constexpr, A0: tl.constexpr, A1: tl.constexpr,
                   A2: tl.constexpr, A3: tl.constexpr, EXACT: tl.constexpr, S: tl.constexpr):
    """out[rows of program_id(1), tile program_id(0)] = x @ W over the steps of split program_id(2).
    A step is KS consecutive 128-row blocks, one per warp (the dots' batch dimension); blocks
    past NBLK (the last step of a K whose block count KS does not divide) read zero x.
    PPG: 16-row planes a quantization group spans within a block (G / 16, at most 8).
    NBASE: the 16-bit pattern of -OFF, so NBASE + z is -(OFF + z). S: the stripe width of qk."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    sp = tl.program_id(2)
    s0 = sp * NSTEP // SPLIT
    s1 = (sp + 1) * NSTEP // SPLIT
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    nmask = rn < N
    mmask = rm < M
    r16 = tl.arange(0, 16)
    kb = tl.arange(0, KS)
    # column n of half-word row k4 sits at (n // S) (NBLK 32 S) + k4 S + n % S
    scol = (rn // S).to(tl.int64) * (NBLK * 32 * S) + rn % S
    wcol = qk_ptr + scol[None, None, :] + r16[None, :, None] * S  # [1, 16, BN]
    xrow = x_ptr + rm[None, :, None].to(tl.int64) * stride_xm + r16[None, None, :]  # [1, BM, 16]
    acc = tl.zeros([KS, BLOCK_M, BLOCK_N], tl.float32)
    for st in range(s0, s1):
        blk = st * KS + kb  # [KS]: warp i's block
        bmask = blk < NBLK
        blk = tl.where(bmask, blk, NBLK - 1)  # a block past K reads the last one's words, times zero x
        k0 = blk * 128
        hcol = wcol + (blk * 32 * S)[:, None, None]
        ha = tl.load(hcol, mask=nmask[None, None, :], other=0)
        hb = tl.load(hcol + 16 * S, mask=nmask[None, None, :], other=0)
        xk = xrow + k0[:, None, None]
        xmask = mmask[None, :, None] & bmask[:, None, None]
        gacc = tl.zeros([KS, BLOCK_M, BLOCK_N], tl.float32)  # a group's unscaled sum
        for p in tl.static_range(8):
            if p % PPG == 0:  # a group starts: its zeros and scales, once
                g = (k0 + 16 * p) // G  # [KS]
                zi = tl.load(z_ptr + g[:, None] * N + rn[None, :], mask=nmask[None, :], other=0).to(tl.int32)
                sc = tl.load(s_ptr + g[:, None] * N + rn[None, :], mask=nmask[None, :], other=0.0).to(tl.float32)
                nz = tl.broadcast_to((NBASE + zi).to(tl.int16)[:, None, :], [KS, 16, BLOCK_N])
                zf = zi.to(tl.float32)[:, None, :]
                sb = zf  # unused: no FOLD here
            x = tl.load(xk + 16 * p, mask=xmask, other=0.0)
            h = ha if p < 4 else hb
            if p % 4 == 0:
                b = _plane(h, 0, nz, zf, sb, x, A0, EXACT, False)  # noqa: F821 - installed at launch
            elif p % 4 == 1:
                b = _plane(h, 1, nz, zf, sb, x, A1, EXACT, False)  # noqa: F821
            elif p % 4 == 2:
                b = _plane(h, 2, nz, zf, sb, x, A2, EXACT, False)  # noqa: F821
            else:
                b = _plane(h, 3, nz, zf, sb, x, A3, EXACT, False)  # noqa: F821
            gacc = _mma(x, b, gacc, False, EXACT)  # noqa: F821
            if (p + 1) % PPG == 0:
                acc += gacc * sc[:, None, :]
                gacc = tl.zeros_like(gacc)
    total = tl.sum(acc, axis=0)  # the warps' blocks, once a program
    optr = out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :]
    omask = mmask[:, None] & nmask[None, :]
    if SPLIT == 1:
        tl.store(optr, total.to(out_ptr.dtype.element_ty), mask=omask)
    else:
        tile = pid_m * tl.num_programs(0) + pid_n
        loc = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        slot = ws_ptr + (tile * SPLIT).to(tl.int64) * (BLOCK_M * BLOCK_N) + loc
        rows = mmask[:, None] & (loc >= 0)  # rows past M are neither written nor read
        tl.store(slot + sp * (BLOCK_M * BLOCK_N), total, mask=rows)
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT - 1:  # the last split of this tile: the partials in split order
            total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for i in range(0, SPLIT, 4):  # four partials in flight at a time, summed in order
                for j in tl.static_range(4):
                    total += tl.load(slot + (i + j) * (BLOCK_M * BLOCK_N), mask=rows & (loc * 0 + i + j < SPLIT),
                                     other=0.0, cache_modifier=".cg")
            tl.store(optr, total.to(out_ptr.dtype.element_ty), mask=omask)
            tl.atomic_xchg(cnt_ptr + tile, 0)  # ready for the next launch


def splitk_config(bm: int, bn: int, ks: int = 4, warps: int = 4, stages: int = 3, waves: int = 2, split=None,
                  maxnreg=None) -> dict:
    """BM x BN tiles, KS blocks of K a step (one per warp when warps == KS); K split so that
    about `waves` programs per SM run (or into `split` parts)."""
    c = {"kind": "splitk", "BM": bm, "BN": bn, "KS": ks, "warps": warps, "stages": stages, "waves": waves}
    if split is not None:
        c["split"] = split
    if maxnreg:
        c["maxnreg"] = maxnreg
    return c


def split_count(cfg: dict, tiles: int, nstep: int, device) -> int:
    """Parts K's steps are cut into: the config's, or enough for `waves` programs per SM, at most one a step."""
    split = cfg.get("split") or -(-cfg["waves"] * sm_count(device) // tiles)
    return max(1, min(int(split), nstep))


def launch(x, qk, zeros, scales, group_size: int, cfg: dict, out=None, asm=None) -> torch.Tensor:
    """x [M, K] @ W (kpack layout, M <= MAX_M rows a tile) with one splitk config, into out when given;
    asm: other PTX for the four nibble planes (as kernels.awq_kpack.launch)."""
    M, K = x.shape
    N = scales.shape[1]
    BM, BN, KS = cfg["BM"], cfg["BN"], cfg["KS"]
    nblk = K // ROWS
    nstep = -(-nblk // KS)
    ntile, mtile = -(-N // BN), -(-M // BM)
    split = split_count(cfg, ntile * mtile, nstep, x.device)
    ws = workspace(x.device)
    if ws is None or ntile * mtile > WS_TILES or ntile * mtile * split * BM * BN > WS_FLOATS:
        split = 1  # no workspace (first met inside a graph capture) or no room: whole K a program
    if ws is None:
        ws = (torch.empty(1, dtype=torch.float32, device=x.device), torch.zeros(1, dtype=torch.int32, device=x.device))
    out = torch.empty(M, N, dtype=x.dtype, device=x.device) if out is None else out
    exact = x.dtype == torch.float32 or not x.is_cuda
    if asm is None or exact:
        asm = [""] * 4 if exact else [dequant_asm(j, x.dtype) for j in range(4)]
    _splitk_kernel[(ntile, mtile, split)](
        x, qk, zeros, scales, out, ws[0], ws[1], M, N, x.stride(0), out.stride(0), nstep, split,
        G=group_size, NBLK=nblk, PPG=min(8, group_size // 16), BLOCK_M=BM, BLOCK_N=BN, KS=KS,
        NBASE=0xC300 if x.dtype == torch.bfloat16 else 0xE400, A0=asm[0], A1=asm[1], A2=asm[2], A3=asm[3],
        EXACT=exact, S=qk.shape[2], num_warps=cfg.get("warps", 4), num_stages=cfg.get("stages", 3),
        **({"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") and x.is_cuda else {}))
    return out

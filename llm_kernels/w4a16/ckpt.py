"""Triton kernels for W4A16 on AutoAWQ's own packing (llm_kernels.w4a16.awq_format
describes it), for layers the K-packed layout does not take (K not a multiple of 128), and
their launchers; llm_kernels.w4a16.configs holds their candidate configs.

`_awq_gemm_kernel`, one for every M: a program owns a BLOCK_M x (8 * BLOCK_W)
output tile and walks K in blocks of BK rows (BK divides G). Per block it
loads x [BLOCK_M, BK] once and the words [BK, BLOCK_W] once; nibble plane j of
the words is the weight of columns 8 w + ORDER[j], so each plane is its own
`tl.dot` against the same x tile, into its own accumulator: no widening of
packed words, no shuffles. A plane becomes 16-bit floats by one AND/OR
(0x4300 is 128.0 in bf16, 0x6400 is 1024.0 in fp16; OR-ing a nibble into the
low mantissa bits gives OFF + q exactly), so the dot runs on OFF + q and each
block's epilogue corrects with the row sums of x:
    sum_k x (q - z) s = s * (dot(x, OFF + q) - (OFF + z) * sum_k x).
On CUDA an inline-PTX routine (prmt + lop3, about one integer instruction
per weight) makes two planes of two words per call; the interpreter uses the
same magic number in plain Triton (DEQ 1), float32 exact float planes (DEQ 0).

Small M (decode) splits K over the grid's second axis and reduces the split
partials in the same launch: each program writes its fp32 partial to the
workspace of llm_kernels.w4a16.workspace, counts itself in with an atomic, and the last
program of a tile sums the partials in a fixed order and writes the output
(deterministic, one launch, no zero-fill, no cast kernel). `dequantize` turns the
layer into its dense weight for the dequantize-then-matmul path.
`_wide_tile_kernel` is a second candidate: the packed words widened to a
[BLOCK_K, BLOCK_N] tile, split-K by fp32 atomics into a zeroed buffer.
"""
import torch
import triton.language as tl

from llm_kernels.dispatch import jit_helper, lazy_jit, sm_count
from llm_kernels.pdl import gdc_launch_dependents, gdc_wait
from llm_kernels.w4a16.workspace import WS_FLOATS, WS_TILES, workspace

# ----------------------------------------------------------------------------
# kernels


@jit_helper
def _plane(w, like, J: tl.constexpr, DEQ: tl.constexpr, MAGIC: tl.constexpr):
    """Nibble plane J of int32 words w in like's dtype: the exact float q (DEQ 0) or
    OFF + q from the 16-bit magic number (DEQ 1: planes J and J+4 share one
    AND/OR, one in each 16-bit half)."""
    if DEQ == 0:
        out = ((((w >> (4 * J)) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0).to(like.dtype)
    else:
        t = ((w >> (4 * (J % 4))) & 0x000F000F) | MAGIC
        if J < 4:
            h = t.to(tl.int16)
        else:
            h = (t >> 16).to(tl.int16)
        out = h.to(like.dtype, bitcast=True)
    return out


@jit_helper
def _asm_planes(w, like, B: tl.constexpr, MAGIC: tl.constexpr, ASM: tl.constexpr):
    """Planes 2B and 2B+1 of w as OFF + q in like's dtype (bf16 or fp16)."""
    sel = tl.full(w.shape, B * 0x1111 + 0x4400, tl.int32)  # bytes B of both words -> the two halves
    mag = tl.full(w.shape, MAGIC, tl.int32)
    lo, hi = tl.inline_asm_elementwise(ASM, "=r,=r,r,r,r,r,r,r", [w, sel, mag],
                                       dtype=(like.dtype, like.dtype), is_pure=True, pack=2)
    return lo, hi


@jit_helper
def _step(acc, x, b, xs, s, zw, J: tl.constexpr, OFF: tl.constexpr, FP32: tl.constexpr):
    """acc += s * (x @ plane - (OFF + z) * sum x) for plane J (columns 8 w + ORDER[J])."""
    if FP32:
        d = tl.dot(x, b, input_precision="ieee")
    else:
        d = tl.dot(x, b)
    sf = s.to(tl.float32)
    z = ((zw >> (4 * J)) & 0xF).to(tl.float32)
    return acc + sf[None, :] * d - ((z + OFF) * sf)[None, :] * xs[:, None]


@jit_helper
def planes_step(a0, a1, a2, a3, a4, a5, a6, a7, x, xs, w, zw, s0, s1, s2, s3, s4, s5, s6, s7,
                 DEQ: tl.constexpr, MAGIC: tl.constexpr, ASM: tl.constexpr, OFF: tl.constexpr, FP32: tl.constexpr):
    """One K block: the eight plane accumulators plus x times the planes of words w [BK, W]
    (zeros zw [W], the planes' scales s0..s7 [W]; xs the rows' sums of x)."""
    if DEQ == 2:
        p0, p1 = _asm_planes(w, x, 0, MAGIC, ASM)
        p2, p3 = _asm_planes(w, x, 1, MAGIC, ASM)
        p4, p5 = _asm_planes(w, x, 2, MAGIC, ASM)
        p6, p7 = _asm_planes(w, x, 3, MAGIC, ASM)
    else:
        p0 = _plane(w, x, 0, DEQ, MAGIC)
        p1 = _plane(w, x, 1, DEQ, MAGIC)
        p2 = _plane(w, x, 2, DEQ, MAGIC)
        p3 = _plane(w, x, 3, DEQ, MAGIC)
        p4 = _plane(w, x, 4, DEQ, MAGIC)
        p5 = _plane(w, x, 5, DEQ, MAGIC)
        p6 = _plane(w, x, 6, DEQ, MAGIC)
        p7 = _plane(w, x, 7, DEQ, MAGIC)
    return (_step(a0, x, p0, xs, s0, zw, 0, OFF, FP32), _step(a1, x, p1, xs, s1, zw, 1, OFF, FP32),
            _step(a2, x, p2, xs, s2, zw, 2, OFF, FP32), _step(a3, x, p3, xs, s3, zw, 3, OFF, FP32),
            _step(a4, x, p4, xs, s4, zw, 4, OFF, FP32), _step(a5, x, p5, xs, s5, zw, 5, OFF, FP32),
            _step(a6, x, p6, xs, s6, zw, 6, OFF, FP32), _step(a7, x, p7, xs, s7, zw, 7, OFF, FP32))


@jit_helper
def plane_scales(s_ptr, g, N, rw, lim):
    """The 8 planes' scale vectors of group g (plane j: columns 8 w + ORDER[j])."""
    srow = s_ptr + g * N + rw * 8
    m = rw < lim
    return (tl.load(srow + 0, mask=m, other=0.0), tl.load(srow + 2, mask=m, other=0.0),
            tl.load(srow + 4, mask=m, other=0.0), tl.load(srow + 6, mask=m, other=0.0),
            tl.load(srow + 1, mask=m, other=0.0), tl.load(srow + 3, mask=m, other=0.0),
            tl.load(srow + 5, mask=m, other=0.0), tl.load(srow + 7, mask=m, other=0.0))


@jit_helper
def store8(optr, mask, a0, a1, a2, a3, a4, a5, a6, a7):
    """Plane j's tile goes to columns 8 w + ORDER[j]."""
    dt = optr.dtype.element_ty
    tl.store(optr + 0, a0.to(dt), mask=mask)
    tl.store(optr + 2, a1.to(dt), mask=mask)
    tl.store(optr + 4, a2.to(dt), mask=mask)
    tl.store(optr + 6, a3.to(dt), mask=mask)
    tl.store(optr + 1, a4.to(dt), mask=mask)
    tl.store(optr + 3, a5.to(dt), mask=mask)
    tl.store(optr + 5, a6.to(dt), mask=mask)
    tl.store(optr + 7, a7.to(dt), mask=mask)


@jit_helper
def zeros8(BLOCK_M: tl.constexpr, BLOCK_W: tl.constexpr):
    """Eight float32 [BLOCK_M, BLOCK_W] tiles of zeros: one per nibble plane."""
    return (tl.zeros([BLOCK_M, BLOCK_W], tl.float32), tl.zeros([BLOCK_M, BLOCK_W], tl.float32),
            tl.zeros([BLOCK_M, BLOCK_W], tl.float32), tl.zeros([BLOCK_M, BLOCK_W], tl.float32),
            tl.zeros([BLOCK_M, BLOCK_W], tl.float32), tl.zeros([BLOCK_M, BLOCK_W], tl.float32),
            tl.zeros([BLOCK_M, BLOCK_W], tl.float32), tl.zeros([BLOCK_M, BLOCK_W], tl.float32))


@jit_helper
def _store_partial(mine, P: tl.constexpr, mask, a0, a1, a2, a3, a4, a5, a6, a7):
    """A program's eight plane tiles to its workspace slot, P floats apart."""
    tl.store(mine + 0 * P, a0, mask=mask)
    tl.store(mine + 1 * P, a1, mask=mask)
    tl.store(mine + 2 * P, a2, mask=mask)
    tl.store(mine + 3 * P, a3, mask=mask)
    tl.store(mine + 4 * P, a4, mask=mask)
    tl.store(mine + 5 * P, a5, mask=mask)
    tl.store(mine + 6 * P, a6, mask=mask)
    tl.store(mine + 7 * P, a7, mask=mask)


@jit_helper
def _add_partial(part, P: tl.constexpr, mask, t0, t1, t2, t3, t4, t5, t6, t7):
    """The eight running sums plus one program's partial (read past L1: other SMs wrote it)."""
    t0 += tl.load(part + 0 * P, mask=mask, other=0.0, cache_modifier=".cg")
    t1 += tl.load(part + 1 * P, mask=mask, other=0.0, cache_modifier=".cg")
    t2 += tl.load(part + 2 * P, mask=mask, other=0.0, cache_modifier=".cg")
    t3 += tl.load(part + 3 * P, mask=mask, other=0.0, cache_modifier=".cg")
    t4 += tl.load(part + 4 * P, mask=mask, other=0.0, cache_modifier=".cg")
    t5 += tl.load(part + 5 * P, mask=mask, other=0.0, cache_modifier=".cg")
    t6 += tl.load(part + 6 * P, mask=mask, other=0.0, cache_modifier=".cg")
    t7 += tl.load(part + 7 * P, mask=mask, other=0.0, cache_modifier=".cg")
    return t0, t1, t2, t3, t4, t5, t6, t7


@jit_helper
def _column_shifts(BLOCK_N: tl.constexpr):
    """Bit offset of each column's nibble in its packed word: column c of 8 sits in nibble
    (0,4,1,5,2,6,3,7)[c]."""
    c = tl.arange(0, BLOCK_N) % 8
    return ((c & 1) * 4 + (c >> 1)) * 4


@jit_helper
def _wide_zeros(zp, shifts, BLOCK_N: tl.constexpr):
    """Packed zeros [BLOCK_N / 8] widened to one per column, [BLOCK_N]."""
    return (tl.reshape(tl.broadcast_to(zp[:, None], (BLOCK_N // 8, 8)), (BLOCK_N,)) >> shifts) & 0xF


@jit_helper
def _wide_weights(qp, z, shifts, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """q - z as int32 [BLOCK_K, BLOCK_N], the packed words qp [BLOCK_K, BLOCK_N / 8] widened
    to their 8 columns each."""
    q = tl.reshape(tl.broadcast_to(qp[:, :, None], (BLOCK_K, BLOCK_N // 8, 8)), (BLOCK_K, BLOCK_N))
    return ((q >> shifts[None, :]) & 0xF) - z[None, :]


ASM_PAIR = (
    # $2,$3: two words; $4: prmt selector; $6: magic. prmt gathers byte B of
    # both words into the two 16-bit halves; lop3 (a & b) | c keeps one nibble
    # per half and ORs in the magic exponent: two 16-bit floats OFF + q.
    "{ .reg .b32 t; prmt.b32 t, $2, $3, $4; lop3.b32 $0, t, 0x000F000F, $6, 0xea; "
    "shr.u32 t, t, 4; lop3.b32 $1, t, 0x000F000F, $6, 0xea; }"
)


@lazy_jit(pdl=True, do_not_specialize=["M", "nblk", "bps", "split"])
def _awq_gemm_kernel(
    x_ptr, qw_ptr, qz_ptr, s_ptr, out_ptr, ws_ptr, cnt_ptr,
    M, N, K, stride_xm, stride_om, G, nblk, bps, split,
    BK: tl.constexpr, OFF: tl.constexpr, MAGIC: tl.constexpr, ASM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_W: tl.constexpr, DEQ: tl.constexpr, USE_WS: tl.constexpr,
    PREFETCH: tl.constexpr, FP32: tl.constexpr, PFX: tl.constexpr, PDL: tl.constexpr = False,
):
    """out[M, N] = x[M, K] @ W. Program (tile, pid_k) does K blocks
    [pid_k * bps, (pid_k + 1) * bps) of its BLOCK_M x (8 * BLOCK_W) tile."""
    if PDL:  # programmatic dependent launch (llm_kernels.pdl): wait for the previous kernel here
        gdc_wait()
        gdc_launch_dependents()
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    m_tiles = tl.cdiv(M, BLOCK_M)
    pid_n = pid // m_tiles  # consecutive programs share a weight tile
    pid_m = pid % m_tiles
    N8 = N // 8
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rw = pid_n * BLOCK_W + tl.arange(0, BLOCK_W)
    rk = tl.arange(0, BK)
    mmask = rm < M
    wmask = rw < N8
    xptr = x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :]
    wptr = qw_ptr + rk[:, None].to(tl.int64) * N8 + rw[None, :]
    acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = zeros8(BLOCK_M, BLOCK_W)
    b0 = pid_k * bps
    b1 = tl.minimum(nblk, b0 + bps)
    if PREFETCH:
        w_next = tl.load(wptr + b0 * BK * N8, mask=wmask[None, :], other=0)
    else:
        w_next = tl.zeros([BK, BLOCK_W], tl.int32)
    if PFX:  # x, zeros and scales of the next block come in registers too
        x_next = tl.load(xptr + b0 * BK, mask=mmask[:, None], other=0.0)
        g0 = (b0 * BK) // G
        zw_next = tl.load(qz_ptr + g0 * N8 + rw, mask=wmask, other=0)
        s0n, s1n, s2n, s3n, s4n, s5n, s6n, s7n = plane_scales(s_ptr, g0, N, rw, N8)
    for blk in range(b0, b1):
        nb = blk + 1
        nlim = tl.where(nb < b1, N8, 0)
        if PREFETCH:
            w = w_next  # the next block's words load while this one computes
            w_next = tl.load(wptr + nb * BK * N8, mask=(rw < nlim)[None, :], other=0)
        else:
            w = tl.load(wptr + blk * BK * N8, mask=wmask[None, :], other=0)
        k0 = blk * BK
        if PFX:
            x = x_next
            zw = zw_next
            s0, s1, s2, s3, s4, s5, s6, s7 = s0n, s1n, s2n, s3n, s4n, s5n, s6n, s7n
            x_next = tl.load(xptr + nb * BK, mask=(rm < tl.where(nb < b1, M, 0))[:, None], other=0.0)
            gn = (nb * BK) // G
            zw_next = tl.load(qz_ptr + gn * N8 + rw, mask=rw < nlim, other=0)
            s0n, s1n, s2n, s3n, s4n, s5n, s6n, s7n = plane_scales(s_ptr, gn, N, rw, nlim)
        else:
            x = tl.load(xptr + k0, mask=mmask[:, None], other=0.0)
            g = k0 // G
            zw = tl.load(qz_ptr + g * N8 + rw, mask=wmask, other=0)
            s0, s1, s2, s3, s4, s5, s6, s7 = plane_scales(s_ptr, g, N, rw, N8)
        xs = tl.sum(x.to(tl.float32), axis=1)
        acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = planes_step(
            acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, x, xs, w, zw, s0, s1, s2, s3, s4, s5, s6, s7,
            DEQ, MAGIC, ASM, OFF, FP32)
    omask = mmask[:, None] & wmask[None, :]
    optr = out_ptr + rm[:, None].to(tl.int64) * stride_om + rw[None, :] * 8
    if USE_WS:
        # split-K in one launch: partial to the workspace, count in, the last sums
        ntiles = tl.num_programs(0)
        lm = tl.arange(0, BLOCK_M)
        lw = tl.arange(0, BLOCK_W)
        loc = lm[:, None] * BLOCK_W + lw[None, :]
        pmask = mmask[:, None] & (lw < BLOCK_W)[None, :]
        P = BLOCK_M * BLOCK_W
        mine = ws_ptr + (pid_k * ntiles + pid).to(tl.int64) * (8 * P) + loc
        _store_partial(mine, P, pmask, acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7)
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel", scope="gpu")
        if arrived == split - 1:
            t0, t1, t2, t3, t4, t5, t6, t7 = zeros8(BLOCK_M, BLOCK_W)
            first = ws_ptr + pid.to(tl.int64) * (8 * P) + loc
            step = ntiles.to(tl.int64) * (8 * P)
            for p0 in range(0, split, 2):  # fixed order (deterministic); 16 loads in flight
                for u in tl.static_range(2):
                    p = p0 + u
                    part = first + p * step
                    lim = rm < tl.where(p < split, M, 0)
                    pm = lim[:, None] & (lw < BLOCK_W)[None, :]
                    t0, t1, t2, t3, t4, t5, t6, t7 = _add_partial(part, P, pm, t0, t1, t2, t3, t4, t5, t6, t7)
            store8(optr, omask, t0, t1, t2, t3, t4, t5, t6, t7)
            tl.atomic_xchg(cnt_ptr + pid, 0)  # ready for the next launch
    else:
        store8(optr, omask, acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7)


@lazy_jit(pdl=True)
def _wide_tile_kernel(
    x_ptr, qw_ptr, qz_ptr, s_ptr, out_ptr,
    M, N, K, stride_xm, stride_om, G, k_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ATOMIC: tl.constexpr, FP32: tl.constexpr, PDL: tl.constexpr = False,
):
    """out[M, N] = x[M, K] @ W on widened [BLOCK_K, BLOCK_N] weight tiles; with ATOMIC,
    program (m, n, pid_k) adds its K slice into a zeroed float32 out by atomics."""
    if PDL:  # programmatic dependent launch (llm_kernels.pdl): wait for the previous kernel here
        gdc_wait()
        gdc_launch_dependents()
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    N8 = N // 8
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn8 = pid_n * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
    shifts = _column_shifts(BLOCK_N)
    mmask = rm < M
    nmask = rn < N
    n8mask = rn8 < N8
    k_begin = pid_k * k_per_split
    k_end = tl.minimum(K, k_begin + k_per_split)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        g = k0 // G  # BLOCK_K divides G: one group per step, its zeros and scales loaded once
        zp = tl.load(qz_ptr + g * N8 + rn8, mask=n8mask, other=0)
        z = _wide_zeros(zp, shifts, BLOCK_N)
        sc = tl.load(s_ptr + g * N + rn, mask=nmask, other=0.0).to(tl.float32)
        a = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :], mask=mmask[:, None], other=0.0)
        qp = tl.load(qw_ptr + rk[:, None].to(tl.int64) * N8 + rn8[None, :], mask=n8mask[None, :], other=0)
        w = _wide_weights(qp, z, shifts, BLOCK_K, BLOCK_N).to(a.dtype)  # small ints: exact
        if FP32:
            part = tl.dot(a, w, input_precision="ieee")
        else:
            part = tl.dot(a, w)
        acc += part * sc[None, :]
    omask = mmask[:, None] & nmask[None, :]
    optr = out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :]
    if ATOMIC:
        tl.atomic_add(optr, acc, mask=omask)
    else:
        tl.store(optr, acc.to(out_ptr.dtype.element_ty), mask=omask)


@lazy_jit(pdl=True)
def _awq_dequant_kernel(
    qw_ptr, qz_ptr, s_ptr, out_ptr, N, G,
    BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:  # programmatic dependent launch (llm_kernels.pdl): wait for the previous kernel here
        gdc_wait()
        gdc_launch_dependents()
    rk = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rn8 = tl.program_id(1) * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
    shifts = _column_shifts(BLOCK_N)
    N8 = N // 8
    nmask = rn < N
    g = tl.program_id(0) * BLOCK_K // G
    zp = tl.load(qz_ptr + g * N8 + rn8, mask=rn8 < N8, other=0)
    z = _wide_zeros(zp, shifts, BLOCK_N)
    sc = tl.load(s_ptr + g * N + rn, mask=nmask, other=0.0).to(tl.float32)
    qp = tl.load(qw_ptr + rk[:, None].to(tl.int64) * N8 + rn8[None, :], mask=rn8[None, :] < N8, other=0)
    w = _wide_weights(qp, z, shifts, BLOCK_K, BLOCK_N).to(tl.float32) * sc[None, :]
    tl.store(out_ptr + rk[:, None].to(tl.int64) * N + rn[None, :], w.to(out_ptr.dtype.element_ty),
             mask=nmask[None, :])


# ----------------------------------------------------------------------------
# launchers


def _block_k(cfg, group_size: int) -> int:
    bk = min(group_size, cfg.get("BK", 128))
    assert group_size % bk == 0 and bk >= 16, f"unsupported group size {group_size}"
    return bk


def plan(M, N, K, G, cfg, device):
    """(tiles, nblk, bps, split): split-K sized to about `waves` programs per SM."""
    bk = _block_k(cfg, G)
    nblk = K // bk
    tiles = -(-M // cfg["BM"]) * -(-N // (8 * cfg["BW"]))
    split = cfg.get("split") or round(cfg.get("waves", 0) * sm_count(device) / tiles)
    split = max(1, min(split, nblk))
    bps = -(-nblk // split)
    split = -(-nblk // bps)
    return tiles, nblk, bps, split


def fits(M, N, K, G, cfg, device) -> bool:
    """Whether a fused config's split-K partials fit the workspace (other kinds need none)."""
    if cfg["kind"] != "fused":
        return True
    tiles, _, _, split = plan(M, N, K, G, cfg, device)
    return split == 1 or (tiles <= WS_TILES and split * tiles * cfg["BM"] * 8 * cfg["BW"] <= WS_FLOATS)


def _launch_fused(x, qweight, qzeros, scales, G, cfg):
    M, K = x.shape
    N = qweight.shape[1] * 8
    tiles, nblk, bps, split = plan(M, N, K, G, cfg, x.device)
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    ws = workspace(x.device) if split > 1 else None
    if split > 1 and (ws is None or not fits(M, N, K, G, cfg, x.device)):
        split, bps = 1, nblk  # no room for partials: one program per tile
    ws_t, cnt_t = ws if split > 1 else (out, out)
    half = x.dtype in (torch.float16, torch.bfloat16)
    deq = cfg["deq"] if half else 0
    extra = {"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") and x.is_cuda else {}
    _awq_gemm_kernel[(tiles, split)](
        x, qweight, qzeros, scales, out, ws_t, cnt_t,
        M, N, K, x.stride(0), out.stride(0), G, nblk, bps, split,
        BK=_block_k(cfg, G), OFF=0.0 if deq == 0 else (128.0 if x.dtype == torch.bfloat16 else 1024.0),
        MAGIC=0x43004300 if x.dtype == torch.bfloat16 else 0x64006400, ASM=ASM_PAIR,
        BLOCK_M=cfg["BM"], BLOCK_W=cfg["BW"], DEQ=deq, USE_WS=split > 1, PREFETCH=cfg.get("pf", True),
        FP32=x.dtype == torch.float32, PFX=cfg.get("pfx", False),
        num_warps=cfg.get("warps", 4), num_stages=cfg.get("stages", 1), **extra)
    return out


def dequantize(qweight, qzeros, scales, group_size: int, dtype) -> torch.Tensor:
    """The dense [K, N] weight in dtype, dequantized by a Triton kernel."""
    K, N = qweight.shape[0], qweight.shape[1] * 8
    w = torch.empty(K, N, dtype=dtype, device=qweight.device)
    bk, bn = min(group_size, 128), 128
    _awq_dequant_kernel[(K // bk, -(-N // bn))](qweight, qzeros, scales, w, N, group_size,
                                                 BLOCK_K=bk, BLOCK_N=bn, num_warps=4)
    return w


def _launch_wide(x, qweight, qzeros, scales, G, cfg):
    """Three launches when split: zero-fill, the tile kernel with atomics, cast."""
    M, K = x.shape
    N = qweight.shape[1] * 8
    bm, bn = cfg["BM"], cfg["BN"]
    bk = min(G, 128)
    groups = K // G
    split = max(1, min(cfg["SPLIT_K"], groups))
    k_per_split = -(-groups // split) * G
    split = -(-K // k_per_split)
    if split > 1:
        out = torch.zeros(M, N, dtype=torch.float32, device=x.device)
    else:
        out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    _wide_tile_kernel[(-(-M // bm), -(-N // bn), split)](
        x, qweight, qzeros, scales, out, M, N, K, x.stride(0), out.stride(0), G, k_per_split,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, ATOMIC=split > 1, FP32=x.dtype == torch.float32,
        num_warps=cfg.get("warps", 4), num_stages=cfg.get("stages", 3))
    return out.to(x.dtype) if split > 1 else out


def launch(x, qweight, qzeros, scales, group_size: int, cfg: dict) -> torch.Tensor:
    """x [M, K] @ dequant(qweight) with one config of llm_kernels.w4a16.configs.ckpt_configs."""
    if cfg["kind"] == "wide":
        return _launch_wide(x, qweight, qzeros, scales, group_size, cfg)
    return _launch_fused(x, qweight, qzeros, scales, group_size, cfg)

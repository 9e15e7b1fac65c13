"""W4A16 GEMM on a K-packed layout made once at load time ("kpack"): the repack, its
reference, the Triton kernel and its launcher (llm_kernels.w4a16.configs holds its
candidate configs, the tuner picks one per shape).

AutoAWQ packs 8 columns into a word, so a weight tile's 8 nibble planes are
8 column sets and need 8 accumulators (llm_kernels.w4a16.ckpt). Here 16-bit words
pack 4 rows instead. A block of 128 rows starting at k0 is 32 rows of
half-words: row 16 h + r (h = 0, 1; r = 0..15) holds in nibble j the weight
of row k0 + 16 (4 h + j) + r, column n. Nibble j of the [16, BLOCK_N] tile of
half h is then the weight slice of rows k0 + 16 p .. k0 + 16 p + 15 (p = 4 h
+ j): eight `tl.dot`s of K = 16 per block, all into one accumulator. The
half-word matrix [K/4, N] is stored in stripes of STRIPE columns ([N/S, K/4,
S]), so a block of one stripe is one contiguous run (4 KB) instead of 32 rows
of 128 bytes N apart (1-2% faster at M <= 16 on the H200).

On CUDA one inline-PTX routine turns two neighbouring half-words (rows k and
k + 1 of one column: the pair a thread holds for the tensor core's operand)
into two 16-bit floats q - z: shift, one LOP3 that masks the nibbles and ORs
in 0x4300 (128.0 in bf16; 0x6400 = 1024.0 in fp16) so each half is OFF + q
exactly, and one packed FMA that adds -(OFF + z). The half-words come in by
ldmatrix from shared memory, pipelined over num_stages; no byte shuffles.
The per-group scale is applied to the float32 partial sum of the group.
A "swap" config computes out^T = W^T x^T instead: the dequantized weights are
the dot's first operand, which Hopper's wgmma takes from registers, and x^T
the second, which it reads from shared memory: a warpgroup's wgmma covers 64
weight columns by 16 rows of K, one warp's mma.sync 8 columns, and x needs no
ldmatrix. The tuner decides per shape which orientation is faster.
Float32 inputs (and the interpreter) take exact float planes instead.

The grid is "stream-K": the (tile, 128-row block) work units of the whole
product are cut into P equal runs, one per program, P sized to fill the GPU
once (programs resident per SM, from the compiled kernel's registers and
shared memory, times the SMs). A program walks its run in one flat loop, so
the copy pipeline does not drain at tile boundaries; the scale row of the
next block is loaded a block ahead (Triton pipelines the words and x through
shared memory, but not a load used only in registers). The zeros are
pipelined in unswapped tiles only: in a swapped tile compiled for sm_90 each
thread loads its 2-byte zero itself (under cp.async's 4-byte minimum), and it
reaches the dequantization through a shared-memory exchange and a barrier; a
"znext" config (swapped, groups of 128 rows or more) loads the next block's zero
row a block ahead with the scale row, so the block does not wait on that load.
A tile finished by one program is stored; a tile split between programs has its
float32 partials written to a workspace, and after its loop each program
counts in on its shared tiles (an atomic counter per tile): the last to
arrive sums the partials in program order (deterministic) and stores. Large
M dequantizes to bf16 and calls torch.matmul. The grid's sizing is
llm_kernels.w4a16.kpack_grid.
"""
from functools import lru_cache
from typing import Optional

import torch
import triton.language as tl

from llm_kernels.dispatch import jit_helper, lazy_jit
from llm_kernels.pdl import gdc_launch_dependents, gdc_wait
from llm_kernels.w4a16.awq_format import unpack_awq_int4
from llm_kernels.w4a16.kpack_grid import program_count, remember, split_plan
from llm_kernels.w4a16.workspace import WS_FLOATS, WS_TILES, workspace

ROWS = 128  # rows of K per packed block: 8 planes of 16
STRIPE = 64  # columns a stripe of qk: a block of one stripe is 4 KB contiguous


def kpack_from_awq(qweight: torch.Tensor, qzeros: torch.Tensor, group_size: int, stripe: Optional[int] = None):
    """AutoAWQ GEMM-format qweight [K, N/8] and qzeros [K/G, N/8] -> (qk int16 [N'/S, K/4, S],
    zeros int16 [K/G, N]): the half-words in stripes of S = min(stripe or STRIPE, N) columns (N padded to
    N' with zero words), so one 128-row block of a stripe is 32 S contiguous half-words. The
    zeros are 16-bit (not bytes): an unswapped tile's loads of them then stay pipelined."""
    K = qweight.shape[0]
    if K % ROWS:
        raise ValueError(f"kpack needs K divisible by {ROWS}, got {K}")
    if group_size % 16:
        raise ValueError(f"kpack needs a group size divisible by 16, got {group_size}")
    q = unpack_awq_int4(qweight)  # [K, N] int32 of 0..15
    N = q.shape[1]
    q = q.view(K // ROWS, 2, 4, 16, N)  # block, half h, nibble j, row r, n
    words = torch.zeros(K // ROWS, 2, 16, N, dtype=torch.int32, device=q.device)
    for j in range(4):
        words |= q[:, :, j] << (4 * j)
    words = torch.where(words >= 1 << 15, words - (1 << 16), words).to(torch.int16).view(K // 4, N)
    S = min(stripe or STRIPE, N)
    words = torch.nn.functional.pad(words, (0, -N % S))  # [K/4, N']
    qk = words.view(K // 4, -1, S).transpose(0, 1).contiguous()
    return qk, unpack_awq_int4(qzeros).to(torch.int16).contiguous()


def unstripe(qk: torch.Tensor, N: int) -> torch.Tensor:
    """A kpack qk [N'/S, K/4, S] as the half-word matrix [K/4, N]."""
    return qk.transpose(0, 1).reshape(qk.shape[1], -1)[:, :N]


def kpack_dequantize_reference(qk, zeros, scales, group_size: int, dtype=torch.float32) -> torch.Tensor:
    """The dense [K, N] weight of a kpack layout (tests' oracle)."""
    N = scales.shape[1]
    K = qk.shape[1] * 4
    shifts = torch.arange(0, 16, 4, device=qk.device, dtype=torch.int32)
    w = unstripe(qk, N).to(torch.int32) & 0xFFFF
    q = (w.reshape(K // ROWS, 2, 16, 1, N) >> shifts.view(1, 1, 1, 4, 1)) & 0xF  # block, h, r, j, n
    q = q.permute(0, 1, 3, 2, 4).reshape(K, N)
    z = zeros.to(torch.int32).repeat_interleave(group_size, dim=0)
    s = scales.to(dtype).repeat_interleave(group_size, dim=0)
    return (q - z).to(dtype) * s


@lru_cache(maxsize=None)
def dequant_asm(j: int, dtype) -> str:
    """PTX for nibble j of two packed half-words -> two 16-bit floats q - z ($2: -(OFF + z) twice)."""
    magic, one, fma = (("0x43004300", "0x3F803F80", "fma.rn.bf16x2") if dtype == torch.bfloat16
                       else ("0x64006400", "0x3C003C00", "fma.rn.f16x2"))
    shift = f"shr.b32 t, $1, {4 * j}; lop3.b32 t, t, 0x000F000F, {magic}, 0xEA;" if j else \
        f"lop3.b32 t, $1, 0x000F000F, {magic}, 0xEA;"
    return "{ .reg .b32 t, one; " + shift + f" mov.b32 one, {one}; {fma} $0, t, one, $2; }}"


@jit_helper
def _plane(h, j: tl.constexpr, nz, zf, like, ASM: tl.constexpr, EXACT: tl.constexpr):
    """Nibble j of the half-words h ([16, BN], or [BN, 16] when swapped) as q - z in like's
    dtype (float32 when EXACT); nz and zf are broadcast to h's shape."""
    if EXACT:
        b = ((h.to(tl.int32) >> (4 * j)) & 0xF).to(tl.float32) - zf
        if like.dtype != tl.float32:
            b = b.to(like.dtype)
    else:
        b = tl.inline_asm_elementwise(ASM, "=r,r,r", [h, nz], dtype=like.dtype, is_pure=True, pack=2)
    return b


@jit_helper
def _mma(x, b, acc, SWAP: tl.constexpr, EXACT: tl.constexpr):
    """acc + x b, or acc + b x when SWAP (b is then W^T's tile and x is x^T's)."""
    if SWAP:
        if EXACT and x.dtype == tl.float32:
            acc = tl.dot(b, x, acc, input_precision="ieee")
        else:
            acc = tl.dot(b, x, acc)
    else:
        if EXACT and x.dtype == tl.float32:
            acc = tl.dot(x, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(x, b, acc)
    return acc


@jit_helper
def kpack_zeros(zi, NBASE: tl.constexpr, SWAP: tl.constexpr):
    """A group's zeros zi [BN] (int32) as _plane takes them: nz, the 16-bit patterns
    -(OFF + z) broadcast to a [16, BN] plane ([BN, 16] when SWAP), and zf, z as float32."""
    if SWAP:  # one return: a compiled helper's returns must share a type
        nz = tl.broadcast_to((NBASE + zi).to(tl.int16)[:, None], [zi.shape[0], 16])
        zf = zi.to(tl.float32)[:, None]
    else:
        nz = tl.broadcast_to((NBASE + zi).to(tl.int16)[None, :], [16, zi.shape[0]])
        zf = zi.to(tl.float32)[None, :]
    return nz, zf


@jit_helper
def kpack_add_scaled(acc, gacc, sc, SWAP: tl.constexpr):
    """acc + a group's float32 sum gacc times its scales sc [BN] (per column; per row when SWAP)."""
    if SWAP:
        acc += gacc * sc[:, None]
    else:
        acc += gacc * sc[None, :]
    return acc


@jit_helper
def kpack_plane_dot(gacc, xrow, mmask, ha, hb, p: tl.constexpr, nz, zf, A0: tl.constexpr, A1: tl.constexpr,
                    A2: tl.constexpr, A3: tl.constexpr, EXACT: tl.constexpr, SWAP: tl.constexpr):
    """gacc + plane p of a 128-row block: x's columns 16 p ... 16 p + 15 (xrow: the block's first,
    rows past mmask zero) times nibble p % 4 of the half-words ha (p < 4) or hb, as q - z."""
    if SWAP:
        x = tl.load(xrow + 16 * p, mask=mmask[None, :], other=0.0)
    else:
        x = tl.load(xrow + 16 * p, mask=mmask[:, None], other=0.0)
    h = ha if p < 4 else hb
    if p % 4 == 0:
        b = _plane(h, 0, nz, zf, x, A0, EXACT)
    elif p % 4 == 1:
        b = _plane(h, 1, nz, zf, x, A1, EXACT)
    elif p % 4 == 2:
        b = _plane(h, 2, nz, zf, x, A2, EXACT)
    else:
        b = _plane(h, 3, nz, zf, x, A3, EXACT)
    return _mma(x, b, gacc, SWAP, EXACT)


@jit_helper
def _tile_ptrs(out_ptr, rm, rn, mmask, nmask, stride_om, SWAP: tl.constexpr):
    """Pointers into out and the mask of one output tile, in the tile's orientation."""
    if SWAP:
        ptrs = out_ptr + rm[None, :].to(tl.int64) * stride_om + rn[:, None]
        mask = mmask[None, :] & nmask[:, None]
    else:
        ptrs = out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :]
        mask = mmask[:, None] & nmask[None, :]
    return ptrs, mask


@jit_helper
def _plus_bias(acc, b_ptr, rn, nmask, SWAP: tl.constexpr, HAS_BIAS: tl.constexpr):
    """An output tile (float32) with the layer's bias added along its columns (rows when SWAP)."""
    if HAS_BIAS:
        bias = tl.load(b_ptr + rn, mask=nmask, other=0.0).to(tl.float32)
        if SWAP:
            acc = acc + bias[:, None]
        else:
            acc = acc + bias[None, :]
    return acc


@jit_helper
def _ws_loc(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP: tl.constexpr):
    """Offsets of a tile's partial in its workspace slot, in the tile's orientation. The whole
    slot is written and read, rows past M too (zeros: their x rows load as zeros): a row mask
    there cuts the partials' stores and loads to single elements when M is not a multiple of
    16 (a swapped tile's rows are contiguous), which made the split tiles' reduction the
    kernel's bottleneck: 1.3-3x slower at M = 50 than at 48 or 64 on an H100."""
    if SWAP:
        loc = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
    else:
        loc = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    return loc


@jit_helper
def _group_rows(s_ptr, z_ptr, v, u1, N, NBLK: tl.constexpr, MT: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr,
                ZEROS: tl.constexpr):
    """The scale row of work unit v's block (G >= 128: one group row a block) for its tile's
    columns, and with ZEROS its zero row (a placeholder otherwise); nothing is read for v >= u1."""
    tq = v // NBLK
    rq = (tq // MT) * BLOCK_N + tl.arange(0, BLOCK_N)
    off = ((v - tq * NBLK) * 128 // G) * N + rq
    live = (rq < N) & (rq * 0 + v < u1)
    if ZEROS:
        z = tl.load(z_ptr + off, mask=live, other=0)
    else:
        z = tl.zeros([BLOCK_N], tl.int16)
    return tl.load(s_ptr + off, mask=live, other=0.0), z


# U, P and C vary with the shape: not specialised, so one of them at 1 or a multiple of 16 compiles nothing new
@lazy_jit(pdl=True, do_not_specialize=["U", "P", "C"])
def _kpack_kernel(
    x_ptr, qk_ptr, z_ptr, s_ptr, out_ptr, b_ptr, ws_ptr, cnt_ptr,
    M, N, stride_xm, stride_om, U, P, C,
    G: tl.constexpr, NBLK: tl.constexpr, MT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PPG: tl.constexpr, NBASE: tl.constexpr,
    A0: tl.constexpr, A1: tl.constexpr, A2: tl.constexpr, A3: tl.constexpr, EXACT: tl.constexpr,
    SWAP: tl.constexpr, S: tl.constexpr, HAS_BIAS: tl.constexpr, ZNEXT: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """out[M, N] = x[M, K] @ W, plus bias[N] when HAS_BIAS (added once, at the tile's
    store). Program pid runs work units [pid U / P, (pid + 1) U / P) of the tile-major
    (tile, 128-row block) sequence in one flat loop, so the copy pipeline runs on across
    tile boundaries. NBLK: 128-row blocks in K; MT: row tiles (cdiv(M, BLOCK_M)); both
    compile-time, so the unit -> (tile, block) split is a multiply, not a division. PPG:
    planes (of 16 rows) per quantization group within a block (G / 16, at most 8). NBASE:
    the 16-bit pattern of -OFF, so NBASE + z is -(OFF + z). C: most programs sharing a tile.
    SWAP: the transposed product out^T = W^T x^T, weights as the dot's first operand (held
    in registers, where Hopper's wgmma takes its A) and x^T as the second (read from shared
    memory); tiles and partials are [BLOCK_N, BLOCK_M] then. S: the stripe width of qk.
    ZNEXT (G >= 128): each block's zero row comes with its scale row, loaded a block ahead."""
    if PDL:  # programmatic dependent launch (llm_kernels.pdl): wait for the previous kernel here
        gdc_wait()
        gdc_launch_dependents()
    pid = tl.program_id(0)
    u0 = pid * U // P
    u1 = (pid + 1) * U // P
    r16 = tl.arange(0, 16)
    if SWAP:
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    if G >= 128:  # one scale row per block (ZNEXT: and zero row): fetched a block ahead, in registers
        s_next, z_next = _group_rows(s_ptr, z_ptr, u0, u1, N, NBLK, MT, BLOCK_N, G, ZNEXT)
    for u in range(u0, u1):
        if G >= 128:
            s_blk = s_next.to(tl.float32)
            z_blk = z_next
            s_next, z_next = _group_rows(s_ptr, z_ptr, u + 1, u1, N, NBLK, MT, BLOCK_N, G, ZNEXT)
        t = u // NBLK
        blk = u - t * NBLK
        pid_n = t // MT  # the m-tiles of one column tile are neighbours: the words stay in L2
        pid_m = t - pid_n * MT
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mmask = rm < M
        nmask = rn < N
        k0 = blk * 128
        # column n of half-word row k4 sits at (n // S) (NBLK 32 S) + k4 S + n % S
        scol = (rn // S).to(tl.int64) * (NBLK * 32 * S) + rn % S
        if SWAP:
            hcol = qk_ptr + scol[:, None] + (blk * 32 + r16)[None, :] * S
            ha = tl.load(hcol, mask=nmask[:, None], other=0)
            hb = tl.load(hcol + 16 * S, mask=nmask[:, None], other=0)
            xrow = x_ptr + rm[None, :].to(tl.int64) * stride_xm + (k0 + r16)[:, None]
        else:
            hcol = qk_ptr + scol[None, :] + (blk * 32 + r16)[:, None] * S
            ha = tl.load(hcol, mask=nmask[None, :], other=0)
            hb = tl.load(hcol + 16 * S, mask=nmask[None, :], other=0)
            xrow = x_ptr + rm[:, None].to(tl.int64) * stride_xm + (k0 + r16)[None, :]
        gacc = tl.zeros_like(acc)  # a group's unscaled sum
        for p in tl.static_range(8):
            if p % PPG == 0:  # a group starts: its zeros and scales, once
                g = (k0 + 16 * p) // G
                if ZNEXT:
                    zi = z_blk.to(tl.int32)
                else:
                    zi = tl.load(z_ptr + g * N + rn, mask=nmask, other=0).to(tl.int32)
                if G >= 128:
                    sc = s_blk
                else:
                    sc = tl.load(s_ptr + g * N + rn, mask=nmask, other=0.0).to(tl.float32)
                nz, zf = kpack_zeros(zi, NBASE, SWAP)
            gacc = kpack_plane_dot(gacc, xrow, mmask, ha, hb, p, nz, zf, A0, A1, A2, A3, EXACT, SWAP)
            if (p + 1) % PPG == 0:
                acc = kpack_add_scaled(acc, gacc, sc, SWAP)
                gacc = tl.zeros_like(acc)
        if (blk == NBLK - 1) | (u == u1 - 1):  # this program's part of tile t ends here
            if (u - blk >= u0) & (blk == NBLK - 1):  # the whole tile
                optr, omask = _tile_ptrs(out_ptr, rm, rn, mmask, nmask, stride_om, SWAP)
                acc = _plus_bias(acc, b_ptr, rn, nmask, SWAP, HAS_BIAS)
                tl.store(optr, acc.to(out_ptr.dtype.element_ty), mask=omask)
            else:  # a tile shared by programs pf..pl: the partial to slot (t, pid - pf)
                pf = ((t * NBLK + 1) * P - 1) // U
                loc = _ws_loc(BLOCK_M, BLOCK_N, SWAP)
                tl.store(ws_ptr + (t * C + pid - pf).to(tl.int64) * (BLOCK_M * BLOCK_N) + loc, acc)
            acc = tl.zeros_like(acc)
    # Only a program's first and last tiles can be shared. Counting in after the loop (not
    # inside it) keeps the loop free of atomics, which Triton's copy pipelining needs.
    tf = u0 // NBLK
    tn = (u1 - 1) // NBLK
    for side in tl.static_range(2):
        t = tf if side == 0 else tn
        shared = (t * NBLK < u0) | ((t + 1) * NBLK > u1)
        if shared & ((side == 0) | (tn != tf)):
            pf = ((t * NBLK + 1) * P - 1) // U
            pl = ((t + 1) * NBLK * P - 1) // U
            tl.debug_barrier()
            arrived = tl.atomic_add(cnt_ptr + t, 1, sem="acq_rel", scope="gpu")
            if arrived == pl - pf:  # the last to arrive sums the partials, in program order
                pid_n = t // MT
                pid_m = t - pid_n * MT
                rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
                rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
                mmask = rm < M
                loc = _ws_loc(BLOCK_M, BLOCK_N, SWAP)
                total = tl.zeros(loc.shape, tl.float32)
                for j in range(0, pl - pf + 1, 8):  # eight partials in flight at a time, summed in order
                    for i in tl.static_range(8):
                        total += tl.load(ws_ptr + (t * C + j + i).to(tl.int64) * (BLOCK_M * BLOCK_N) + loc,
                                         mask=loc * 0 + j + i <= pl - pf, other=0.0, cache_modifier=".cg")
                optr, omask = _tile_ptrs(out_ptr, rm, rn, mmask, rn < N, stride_om, SWAP)
                total = _plus_bias(total, b_ptr, rn, rn < N, SWAP, HAS_BIAS)
                tl.store(optr, total.to(out_ptr.dtype.element_ty), mask=omask)
                tl.atomic_xchg(cnt_ptr + t, 0)  # ready for the next launch


@lazy_jit(pdl=True)
def _kpack_dequant_kernel(qk_ptr, z_ptr, s_ptr, out_ptr, N, G, BLOCK_N: tl.constexpr, S: tl.constexpr, PDL: tl.constexpr = False):
    """One 128-row block x BLOCK_N columns (within one stripe of S) of the dense weight."""
    if PDL:  # programmatic dependent launch (llm_kernels.pdl): wait for the previous kernel here
        gdc_wait()
        gdc_launch_dependents()
    blk = tl.program_id(0)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    r16 = tl.arange(0, 16)
    nmask = rn < N
    scol = (rn // S).to(tl.int64) * (tl.num_programs(0) * 32 * S) + rn % S
    for hh in tl.static_range(2):
        h = tl.load(qk_ptr + scol[None, :] + (blk * 32 + 16 * hh + r16)[:, None] * S,
                    mask=nmask[None, :], other=0).to(tl.int32)
        for j in tl.static_range(4):
            rows = blk * 128 + 16 * (4 * hh + j) + r16
            g = (blk * 128 + 16 * (4 * hh + j)) // G
            sc = tl.load(s_ptr + g * N + rn, mask=nmask, other=0.0).to(tl.float32)
            z = tl.load(z_ptr + g * N + rn, mask=nmask, other=0).to(tl.float32)
            v = (((h >> (4 * j)) & 0xF).to(tl.float32) - z[None, :]) * sc[None, :]
            tl.store(out_ptr + rows[:, None].to(tl.int64) * N + rn[None, :], v.to(out_ptr.dtype.element_ty),
                     mask=nmask[None, :])


# ----------------------------------------------------------------------------
# launcher

def launch(x, qk, zeros, scales, group_size: int, cfg: dict, out=None, bias=None) -> torch.Tensor:
    """x [M, K] @ W (+ bias [N], added in the kernel) with one config of
    llm_kernels.w4a16.configs.kpack_configs (into out when given)."""
    M, K = x.shape
    N = scales.shape[1]
    BM, BN = cfg["BM"], cfg["BN"]
    nblk = K // ROWS
    tiles = -(-M // BM) * -(-N // BN)
    operands = (bias is not None,)
    P = program_count(cfg, tiles, nblk, x, N, operands)
    C = split_plan(tiles, nblk, P) if P != tiles else 1
    ws = workspace(x.device)
    if P != tiles and (ws is None or tiles > WS_TILES or tiles * C * BM * BN > WS_FLOATS):
        P, C = tiles, 1  # no room for partials: one program per tile
    if ws is None:  # first met inside a graph capture: typed stand-ins, never touched with P == tiles
        ws = (torch.empty(1, dtype=torch.float32, device=x.device), torch.zeros(1, dtype=torch.int32, device=x.device))
    ws_t, cnt_t = ws
    out = torch.empty(M, N, dtype=x.dtype, device=x.device) if out is None else out
    exact = x.dtype == torch.float32 or not x.is_cuda
    swap = bool(cfg.get("swap"))
    asm = [""] * 4 if exact else [dequant_asm(j, x.dtype) for j in range(4)]
    kernel = _kpack_kernel[(P,)](
        x, qk, zeros, scales, out, out if bias is None else bias, ws_t, cnt_t, M, N, x.stride(0), out.stride(0),
        tiles * nblk, P, C,
        G=group_size, NBLK=nblk, MT=-(-M // BM), BLOCK_M=BM, BLOCK_N=BN, PPG=min(8, group_size // 16),
        NBASE=0xC300 if x.dtype == torch.bfloat16 else 0xE400,
        A0=asm[0], A1=asm[1], A2=asm[2], A3=asm[3], EXACT=exact, SWAP=swap, S=qk.shape[2], HAS_BIAS=bias is not None,
        ZNEXT=bool(cfg.get("znext")) and swap and group_size >= 128,
        num_warps=cfg.get("warps", 4), num_stages=cfg.get("stages", 3),
        **({"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") and x.is_cuda else {}))
    remember(kernel, cfg, x, N, nblk, operands)
    return out


def dequantize(qk, zeros, scales, group_size: int, dtype) -> torch.Tensor:
    """The dense [K, N] weight of a kpack layout in dtype, by a Triton kernel."""
    K, N, S = qk.shape[1] * 4, scales.shape[1], qk.shape[2]
    w = torch.empty(K, N, dtype=dtype, device=qk.device)
    bn = 128
    _kpack_dequant_kernel[(K // ROWS, -(-N // bn))](qk, zeros, scales, w, N, group_size, BLOCK_N=bn, S=S, num_warps=4)
    return w

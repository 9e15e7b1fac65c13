"""The one-dot LoRA kernels: every slot of a token tile in one tensor-core dot, no walk over
the tile's slots (llm_kernels.lora.kernels walks them, one slot's dot after another).

A decode batch of many adapters puts a few rows of each slot in every token tile. The walking
kernels then run a chain per program: a reduction to find the next slot, its weight loads,
its dot, again, one link after the other (about 10 us a launch at batch 50 over 8 slots, H100
trace: 2.3 ms of a 9.2 ms step). Here the slots are columns of one operand instead:

expand: out[t] += Y[t] @ B, with B [C, BLOCK_N] the stacked b[s][n tile]^T of a chunk of
SLOTS_C slots (C = SLOTS_C * BLOCK_R rows: column c of Y is slot c // BLOCK_R, rank c % BLOCK_R)
and Y [BLOCK_M, C] each row's y (its output slice's R columns) in its own slot's columns,
zeros elsewhere (a masked load). All loads of a chunk are in flight at once, and a loop over
chunks (S above SLOTS_C) pipelines.

shrink: Z = x @ A, A [BLOCK_K, C] the stacked a[s]^T of a chunk, then each row keeps its own
slot's BLOCK_R columns of Z (a masked sum over the chunk's slots: adds of exact zeros). The
chunks are a grid axis (each row's slot is in one chunk, so the chunks' programs write
disjoint rows); a chunk without rows in the tile returns at once. The K split and its
deterministic reduction are the walking shrink's (finish_shrink), per (tile, chunk).

The price: every slot of a chunk is read and multiplied for every token tile, whether the tile
has rows of it or not. That is what a decode batch over many adapters needs anyway; a prefill
tile (one sequence, one slot) would read S adapters for one, so the tuner keeps these kernels
to decode token counts. Rows of slot -1 and slots outside [0, S) match no column: y and out
rows of such tokens are neither read nor written; a tile without any adapter returns at once.
"""
import torch
import triton.language as tl

from llm_kernels.dispatch import jit_helper, lazy_jit, next_pow2, uses_helpers_of
from llm_kernels.lora.configs import ONEHOT
from llm_kernels.lora.kernels import (block_r, dot_acc, finish_shrink, shrink_grid, slice_grid, slice_tile, split_p2,
                                     tile_slots, wait_then_release)

uses_helpers_of(__name__, "llm_kernels.lora.kernels")


@lazy_jit(pdl=True, do_not_specialize=["T"])  # as the walking kernels (llm_kernels.lora.kernels)
def _shrink_onehot_kernel(
    x_ptr, a_ptr, slots_ptr, y_ptr, ws_ptr, cnt_ptr,
    T, K, R, S, k_per_split, stride_xt, stride_as, stride_ar,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr, SLOTS_C: tl.constexpr,
    SPLIT_P2: tl.constexpr, FP32: tl.constexpr, PDL: tl.constexpr = False,
):
    """y[t, :] = x[t] @ a[slots[t]]^T in float32 for the rows of one token tile whose slots are
    in this program's chunk (slots pid_c * SLOTS_C ...), over one K range; all but the stores
    before the PDL wait (llm_kernels.lora.kernels)."""
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_c = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    sl = tile_slots(slots_ptr, rm, T, S)
    s0 = pid_c * SLOTS_C
    owned = (sl >= s0) & (sl < s0 + SLOTS_C)
    if tl.max(owned.to(tl.int32), axis=0) == 0:  # no row of the tile has a slot of this chunk
        wait_then_release(PDL)  # (every split of it returns alike)
        return
    rk = tl.arange(0, BLOCK_K)
    cols = tl.arange(0, SLOTS_C * BLOCK_R)
    sc, cr = s0 + cols // BLOCK_R, cols % BLOCK_R
    k_begin = pid_k * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, K)
    x_ptrs = x_ptr + rm.to(tl.int64)[:, None] * stride_xt + rk[None, :]
    a_ptrs = a_ptr + sc.to(tl.int64)[None, :] * stride_as + cr[None, :] * stride_ar + rk[:, None]
    amask = ((sc < S) & (cr < R))[None, :]
    z = tl.zeros([BLOCK_M, SLOTS_C * BLOCK_R], tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        kmask = rk < k_end - k0
        xt = tl.load(x_ptrs + k0, mask=owned[:, None] & kmask[None, :], other=0.0)
        at = tl.load(a_ptrs + k0, mask=kmask[:, None] & amask, other=0.0)  # [BLOCK_K, C]
        z = dot_acc(z, xt, at, FP32)
    z = tl.where(sc[None, :] == sl[:, None], z, 0.0)  # each row its own slot's columns
    y = tl.sum(tl.reshape(z, [BLOCK_M, SLOTS_C, BLOCK_R]), axis=1)
    wait_then_release(PDL)
    finish_shrink(y, y_ptr, rm, owned, ws_ptr, cnt_ptr, pid_m * tl.num_programs(2) + pid_c, pid_k,
                  tl.num_programs(1), BLOCK_M, BLOCK_R, SPLIT_P2)


@jit_helper
def _b_chunk(b_ptrs, sc, cr, rn, n_end, S, R, stride_bs):
    """The stacked b[s][n tile]^T of a chunk's slots sc: [C, BLOCK_N], zeros past S and R."""
    return tl.load(b_ptrs + sc.to(tl.int64)[:, None] * stride_bs,
                   mask=((sc < S) & (cr < R))[:, None] & (rn < n_end)[None, :], other=0.0)


@jit_helper
def _y_chunk(y_ptrs, sc, cr, sl, R):
    """y's columns of a chunk's slots sc for each row's own slot (zeros elsewhere): [BLOCK_M, C]."""
    return tl.load(y_ptrs, mask=(sc[None, :] == sl[:, None]) & (cr < R)[None, :], other=0.0)


@lazy_jit(pdl=True, do_not_specialize=["T"])
def _expand_onehot_kernel(
    y_ptr, b_ptr, slots_ptr, out_ptr,
    T, N, R, S, stride_yt, stride_bs, stride_bn, stride_ot, tiles1, tiles2, col1, col2,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, SLOTS_C: tl.constexpr,
    FP32: tl.constexpr, PDL: tl.constexpr = False,
):
    """out[t, n tile] += y[t, slice's R columns] @ b[slots[t]][n tile]^T for the rows of one
    token tile. Before the PDL wait: the slots, the rows of out and the first chunk's b tile
    (written two launches back or more); y after it (llm_kernels.lora.kernels)."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    sl = tile_slots(slots_ptr, rm, T, S)
    rn, n_end, y_col = slice_tile(pid_n, tiles1, tiles2, col1, col2, N, R, BLOCK_N)
    cols = tl.arange(0, SLOTS_C * BLOCK_R)
    cs, cr = cols // BLOCK_R, cols % BLOCK_R
    b_ptrs = b_ptr + rn.to(tl.int64)[None, :] * stride_bn + cr[:, None]
    bt = _b_chunk(b_ptrs, cs, cr, rn, n_end, S, R, stride_bs)  # chunk 0, in flight with the slots
    if tl.max(sl, axis=0) < 0:
        wait_then_release(PDL)
        return
    omask = (sl >= 0)[:, None] & (rn < n_end)[None, :]
    o_ptrs = out_ptr + rm.to(tl.int64)[:, None] * stride_ot + rn[None, :]
    o = tl.load(o_ptrs, mask=omask, other=0.0)
    wait_then_release(PDL)
    y_ptrs = y_ptr + rm.to(tl.int64)[:, None] * stride_yt + y_col + cr[None, :]
    acc = dot_acc(tl.zeros([BLOCK_M, BLOCK_N], tl.float32), _y_chunk(y_ptrs, cs, cr, sl, R), bt, FP32)
    for s0 in range(SLOTS_C, S, SLOTS_C):
        sc = s0 + cs
        acc = dot_acc(acc, _y_chunk(y_ptrs, sc, cr, sl, R), _b_chunk(b_ptrs, sc, cr, rn, n_end, S, R, stride_bs),
                      FP32)
    tl.store(o_ptrs, (o.to(tl.float32) + acc).to(out_ptr.dtype.element_ty), mask=omask)


def slots_per_chunk(cfg: dict, S: int, br: int) -> int:
    """SLOTS_C: the slots one dot takes, cfg["cols"] columns of the stacked operand at most
    (a power of two, at least one slot, no more than S rounded up)."""
    return max(1, min(next_pow2(S), cfg["cols"] // br))


def launch_shrink_onehot(x, a, slots, cfg: dict, sms: int, counters, fp32: bool) -> torch.Tensor:
    """llm_kernels.lora.kernels.launch_shrink for a config of kind ONEHOT: a program per (token
    tile, K split, chunk of slots), a split unit per (tile, chunk)."""
    T, K = x.shape
    S, R = a.shape[0], a.shape[1]
    br = block_r(R)
    sc = slots_per_chunk(cfg, S, br)
    chunks = -(-S // sc)
    tiles, split, per = shrink_grid(T, K, br, chunks, cfg, sms)
    p2 = split_p2(K, br, cfg)
    y = torch.empty(T, br, dtype=torch.float32, device=x.device)
    ws = torch.empty(tiles * chunks * p2 * cfg["BM"] * br if split > 1 else 1, dtype=torch.float32, device=x.device)
    _shrink_onehot_kernel[(tiles, split, chunks)](
        x, a, slots, y, ws, counters, T, K, R, S, per, x.stride(0), a.stride(0), a.stride(1),
        BLOCK_M=cfg["BM"], BLOCK_K=cfg["BK"], BLOCK_R=br, SLOTS_C=sc, SPLIT_P2=p2, FP32=fp32, num_warps=cfg.get("warps", 4), num_stages=cfg.get("stages", 3),
    )
    return y


def launch_expand_onehot(y, b, slots, out, cfg: dict, fp32: bool, slices) -> torch.Tensor:
    """llm_kernels.lora.kernels.launch_expand for a config of kind ONEHOT."""
    T, N = out.shape
    S, R = b.shape[0], b.shape[2]
    br = block_r(R)
    tiles, bounds = slice_grid(slices, cfg["BN"])
    _expand_onehot_kernel[(tiles, -(-T // cfg["BM"]))](
        y, b, slots, out, T, N, R, S, y.stride(0), b.stride(0), b.stride(1), out.stride(0), *bounds,
        BLOCK_M=cfg["BM"], BLOCK_N=cfg["BN"], BLOCK_R=br, SLOTS_C=slots_per_chunk(cfg, S, br), FP32=fp32,
        num_warps=cfg.get("warps", 4), num_stages=cfg.get("stages", 3),
    )
    return out

"""The Triton kernels of batched LoRA and their launchers: shrink (y = x a[s]^T, float32) then
expand (out += y b[s]^T), each token on its own slot s, in two launches with no host
synchronisation (slots is read on the device only, so a CUDA graph can replay them with new
slots). These kernels walk a tile's slots; llm_kernels.lora.onehot takes them all in one dot
(the tuner times both at decode token counts).

Both kernels tile the tokens (BLOCK_M rows) and give each tile G programs along the grid's last
axis, one per group of the tile's distinct slots: program g takes distinct slots g, g + G,
g + 2G, ... in ascending order (the next distinct slot is a min-reduction over the tile's
slots: arithmetic, no memory). Each row has one slot, so the programs of a tile own disjoint
rows and write without atomics. G is a config: a decode tile whose tokens use many adapters
takes one program per adapter (G = min(S, BLOCK_M, T)), so the adapters' weight loads run in
parallel, not one after another in a loop (whose loads the compiler does not pipeline); a
prefill tile of one sequence needs one (G = 1; the extra programs would only find no slot and
exit). A program reads an adapter's weight tile once for all its rows in the tile; rows of
other slots are masked out of each dot. Slots outside [0, S) count as none: a kernel cannot
raise, and an unchecked slot would read past the adapters.

shrink: program (token tile, K split, group) walks its K range in BLOCK_K steps (pipelined);
K is split over the grid so that a decode step of a few tokens still spreads over the SMs.
With splits, each program writes its float32 partial to a workspace, counts itself in with an
atomic, and the last of its (tile, group) loads all their partials in one go (at most
REDUCE_FLOATS: a loop of one load at a time would wait out the L2's latency per split) and
sums them in a fixed tree (deterministic, no zero-fill of y, no extra launch), then resets its
counter for the next launch.

expand: program (N tile, token tile, group) loads its rows of out first (their loads in flight
while the weights come), then per slot a [BLOCK_R, BLOCK_N] tile of b (B's rows are R
contiguous elements: the tile is one contiguous run), accumulates y b^T in float32 and writes
its rows back once. Rows of slot -1 are neither read nor written. A merged linear's output
slices (q, k, v; gate, up) each take their own R columns of y, and b [S, N, R] holds just
those (the blocks of the block diagonal side by side, not the zeros between them, which would
double gate_up's bytes and triple qkv's): the grid tiles each slice on its own, so a tile lies
in one slice.

Not fused into one launch: the expand needs each row's whole y (a sum over all of K), and
recomputing it per N tile would read x and A again for every one of N / BLOCK_N tiles (296 on
Qwen2.5-7B's gate_up). What is fused: the split-K reduction into the shrink, the add into out
into the expand. Half-precision dots take y rounded to the weights' dtype (tensor cores,
float32 accumulation); FP32 runs float32 dots (ieee), which the interpreter also uses for bf16
(its bf16 dot is broken).

PDL (llm_kernels.pdl): these kernels wait late. A linear's LoRA runs as its base GEMM, then
the shrink, then the expand, and each kernel lets the next start only after its own wait, so
a kernel's programs start once the kernel two launches back has completed. What was written
that far back is read before the wait: the shrink's x (the linear's input), a and slots, so
its whole K loop runs while the GEMM finishes, and the expand's slots, rows of out (the GEMM's
output) and b. y, the shrink's output, is read after the wait, and every store and every
program's end comes after it (a grid must not end before the kernel it depends on). The next
kernel is released only after the wait, which keeps the same promise for it.
"""
import torch
import triton.language as tl

from llm_kernels.dispatch import jit_helper, lazy_jit, next_pow2
from llm_kernels.lora.configs import ONEHOT
from llm_kernels.pdl import gdc_launch_dependents, gdc_wait

NONE = tl.constexpr(2147483647)  # past every slot: the walk's end
REDUCE_FLOATS = 8192  # a (tile, group)'s split partials, loaded at once (64 registers a thread at 4 warps)


@jit_helper
def dot_acc(acc, p, q, FP32: tl.constexpr):
    """acc + p @ q in float32; p takes q's dtype first (y into the weights' dtype)."""
    if FP32:
        return acc + tl.dot(p.to(tl.float32), q.to(tl.float32), input_precision="ieee")
    return tl.dot(p.to(q.dtype), q, acc)


@jit_helper
def tile_slots(slots_ptr, rm, T, S):
    """The tile's slots (int32), -1 for rows past T and for slots outside [0, S)."""
    sl = tl.load(slots_ptr + rm, mask=rm < T, other=-1).to(tl.int32)
    return tl.where((sl >= 0) & (sl < S), sl, -1)


@jit_helper
def _next_slot(sl, last):
    """The smallest slot of the tile above `last`, NONE when there is none."""
    return tl.min(tl.where(sl > last, sl, NONE), axis=0)


@jit_helper
def _skip_slots(sl, s, n):
    """The n-th distinct slot of the tile after s (s itself for n = 0)."""
    for _ in range(0, n):
        s = _next_slot(sl, s)
    return s


@jit_helper
def wait_then_release(PDL: tl.constexpr):
    """The late wait of the LoRA kernels (module docstring, "PDL"): wait for the previous
    kernel, then let the next one start, never the other way round."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


# T (the step's tokens) is not specialised: a prefill of any length runs the kernel compiled at start-up,
# where a new divisibility by 16 would compile (and stall the step) mid-serving
@lazy_jit(pdl=True, do_not_specialize=["T"])
def _shrink_kernel(
    x_ptr, a_ptr, slots_ptr, y_ptr, ws_ptr, cnt_ptr,
    T, K, R, S, k_per_split, stride_xt, stride_as, stride_ar,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr, SPLIT_P2: tl.constexpr,
    FP32: tl.constexpr, PDL: tl.constexpr = False,
):
    """y[t, :] = x[t] @ a[slots[t]]^T in float32 (BLOCK_R columns, zero past R) for the rows of
    one token tile whose slots are this program's group; y is [T, BLOCK_R]. Everything but
    the stores runs before the PDL wait: x, a and slots are written two launches back or more."""
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_g = tl.program_id(2)
    groups = tl.num_programs(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    sl = tile_slots(slots_ptr, rm, T, S)
    s = _skip_slots(sl, _next_slot(sl, -1), pid_g)
    if s == NONE:  # the tile has no slot for this group (every split of it returns alike)
        wait_then_release(PDL)  # a program waits before it ends: the grid ends after its dependency
        return
    rr = tl.arange(0, BLOCK_R)
    rk = tl.arange(0, BLOCK_K)
    k_begin = pid_k * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, K)
    x_ptrs = x_ptr + rm.to(tl.int64)[:, None] * stride_xt + rk[None, :]
    a_ptrs = a_ptr + rr[None, :] * stride_ar + rk[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_R], tl.float32)
    owned = sl == s
    while s < NONE:
        mine = sl == s  # only this slot's rows of x are read: the others' dot rows stay 0
        owned = owned | mine
        a_s = a_ptrs + s.to(tl.int64) * stride_as
        for k0 in range(k_begin, k_end, BLOCK_K):
            kmask = rk < k_end - k0
            xt = tl.load(x_ptrs + k0, mask=mine[:, None] & kmask[None, :], other=0.0)
            at = tl.load(a_s + k0, mask=kmask[:, None] & (rr < R)[None, :], other=0.0)  # [BLOCK_K, BLOCK_R]
            acc = dot_acc(acc, xt, at, FP32)
        s = _skip_slots(sl, s, groups)
    wait_then_release(PDL)  # the stores: after the wait
    finish_shrink(acc, y_ptr, rm, owned, ws_ptr, cnt_ptr, pid_m * groups + pid_g, pid_k, tl.num_programs(1),
                  BLOCK_M, BLOCK_R, SPLIT_P2)


@jit_helper
def finish_shrink(acc, y_ptr, rm, owned, ws_ptr, cnt_ptr, unit, pid_k, split,
                  BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, SPLIT_P2: tl.constexpr):
    """A shrink program's float32 [BLOCK_M, BLOCK_R] rows of y (the `owned` ones) into y; with
    the K split (split > 1 programs on axis 1, at most SPLIT_P2), its partial to the workspace
    ([unit][SPLIT_P2][BLOCK_M, BLOCK_R]), counted in, and the last of the unit loads all their
    partials at once and sums them (a fixed tree: deterministic). SPLIT_P2 is the config's
    bound (split_bound), not this launch's split, so token counts that split K differently
    run one compiled kernel."""
    rr = tl.arange(0, BLOCK_R)
    lm = tl.arange(0, BLOCK_M)
    y_ptrs = y_ptr + rm.to(tl.int64)[:, None] * BLOCK_R + rr[None, :]
    if (SPLIT_P2 > 1) & (split > 1):
        ws_unit = ws_ptr + unit.to(tl.int64) * (SPLIT_P2 * BLOCK_M * BLOCK_R)
        tl.store(ws_unit + pid_k * (BLOCK_M * BLOCK_R) + lm[:, None] * BLOCK_R + rr[None, :], acc)
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + unit, 1, sem="acq_rel", scope="gpu")
        if arrived == split - 1:
            rp = tl.arange(0, SPLIT_P2)
            offs = rp[:, None, None] * (BLOCK_M * BLOCK_R) + lm[None, :, None] * BLOCK_R + rr[None, None, :]
            parts = tl.load(ws_unit + offs, mask=(rp < split)[:, None, None], other=0.0,
                            cache_modifier=".cg")  # past L1: written by other SMs
            tl.store(y_ptrs, tl.sum(parts, axis=0), mask=owned[:, None])
            tl.atomic_xchg(cnt_ptr + unit, 0)  # ready for the next launch
    else:
        tl.store(y_ptrs, acc, mask=owned[:, None])


@jit_helper
def slice_tile(pid_n, tiles1, tiles2, col1, col2, N, R, BLOCK_N: tl.constexpr):
    """An expand program's N tile within its output slice: (its columns, the slice's end
    column, the slice's first column of y). Slice i's tiles follow slice i - 1's on the grid
    (tiles1, tiles2: the first tiles of slices 1 and 2; col1, col2: their first columns; both
    past the end for slices a linear does not have), so no tile straddles two slices."""
    i = (pid_n >= tiles1).to(tl.int32) + (pid_n >= tiles2).to(tl.int32)
    tile0 = tl.where(i == 0, 0, tl.where(i == 1, tiles1, tiles2))
    c0 = tl.where(i == 0, 0, tl.where(i == 1, col1, col2))
    c1 = tl.where(i == 0, col1, tl.where(i == 1, col2, N))
    return c0 + (pid_n - tile0) * BLOCK_N + tl.arange(0, BLOCK_N), c1, i * R


@lazy_jit(pdl=True, do_not_specialize=["T"])
def _expand_kernel(
    y_ptr, b_ptr, slots_ptr, out_ptr,
    T, N, R, S, stride_yt, stride_bs, stride_bn, stride_ot, tiles1, tiles2, col1, col2,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, FP32: tl.constexpr, PDL: tl.constexpr = False,
):
    """out[t, n tile] += y[t, slice's R columns] @ b[slots[t]][n tile]^T for the rows of one
    token tile whose slots are this program's group. The slots and the rows of out (written
    two launches back or more) load before the PDL wait, y (the shrink's, the launch before)
    after it."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_g = tl.program_id(2)
    groups = tl.num_programs(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    sl = tile_slots(slots_ptr, rm, T, S)
    first = _skip_slots(sl, _next_slot(sl, -1), pid_g)
    if first == NONE:  # no row of this tile has a slot of this group
        wait_then_release(PDL)
        return
    owned = sl == first  # the group's rows: a walk over its slots, arithmetic only
    s = _skip_slots(sl, first, groups)
    while s < NONE:
        owned = owned | (sl == s)
        s = _skip_slots(sl, s, groups)
    rr = tl.arange(0, BLOCK_R)
    rn, n_end, y_col = slice_tile(pid_n, tiles1, tiles2, col1, col2, N, R, BLOCK_N)
    omask = owned[:, None] & (rn < n_end)[None, :]
    o_ptrs = out_ptr + rm.to(tl.int64)[:, None] * stride_ot + rn[None, :]
    o = tl.load(o_ptrs, mask=omask, other=0.0)  # first: in flight while the weights load
    wait_then_release(PDL)
    y = tl.load(y_ptr + rm.to(tl.int64)[:, None] * stride_yt + y_col + rr[None, :],
                mask=owned[:, None] & (rr < R)[None, :], other=0.0)
    b_ptrs = b_ptr + rn.to(tl.int64)[None, :] * stride_bn + rr[:, None]
    bmask = (rr < R)[:, None] & (rn < n_end)[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    s = first
    while s < NONE:
        ys = tl.where((sl == s)[:, None], y, 0.0)
        bt = tl.load(b_ptrs + s.to(tl.int64) * stride_bs, mask=bmask, other=0.0)  # [BLOCK_R, BLOCK_N]
        acc = dot_acc(acc, ys, bt, FP32)
        s = _skip_slots(sl, s, groups)
    tl.store(o_ptrs, (o.to(tl.float32) + acc).to(out_ptr.dtype.element_ty), mask=omask)


# ----------------------------------------------------------------------------
# launchers


def block_r(R: int) -> int:
    """The rank padded for the dots: a power of two, at least 16 (the smallest MMA side)."""
    return max(16, 1 << max(0, R - 1).bit_length())


def slot_groups(cfg: dict, S: int, T: int) -> int:
    """G, the programs a token tile gets along the slots: cfg["slots"] ("all": as many as the
    tile can hold distinct slots, min(S, BLOCK_M, T)), never more than that."""
    cap = max(1, min(S, cfg["BM"], T))
    want = cfg.get("slots", "all")
    return cap if want == "all" else max(1, min(int(want), cap))


def split_bound(K: int, br: int, cfg: dict) -> int:
    """The most K splits a shrink config takes at any token count: at most one BLOCK_K step a
    split, at most REDUCE_FLOATS partial floats a (tile, group), at most cfg["split"]."""
    steps = -(-K // cfg["BK"])
    return max(1, min(cfg.get("split") or steps, steps, REDUCE_FLOATS // (cfg["BM"] * br)))


def split_p2(K: int, br: int, cfg: dict) -> int:
    """SPLIT_P2 of a shrink config: its split bound as a power of two (1: it never splits). It
    depends on the layer and the config, not on the token count."""
    bound = split_bound(K, br, cfg)
    return 1 if bound == 1 else next_pow2(bound)


def shrink_grid(T: int, K: int, br: int, groups: int, cfg: dict, sms: int) -> tuple[int, int, int]:
    """(token tiles, K splits, K per split) of one shrink: cfg["split"] splits, or about
    cfg["waves"] programs an SM over the tiles and groups, within split_bound."""
    bm, bk = cfg["BM"], cfg["BK"]
    tiles = -(-T // bm)
    steps = -(-K // bk)
    split = cfg.get("split") or -(-cfg.get("waves", 1) * sms // (tiles * groups))
    split = max(1, min(split, split_bound(K, br, cfg)))
    per = -(-steps // split) * bk
    return tiles, -(-K // per), per


def launch_shrink(x, a, slots, cfg: dict, sms: int, counters, fp32: bool) -> torch.Tensor:
    """y float32 [T, block_r(R)]: zero past R; rows without an adapter left unwritten. counters:
    int32, zero (and left zero), at least shrink_units(...) of them."""
    T, K = x.shape
    S, R = a.shape[0], a.shape[1]
    br = block_r(R)
    groups = slot_groups(cfg, S, T)
    tiles, split, per = shrink_grid(T, K, br, groups, cfg, sms)
    p2 = split_p2(K, br, cfg)
    y = torch.empty(T, br, dtype=torch.float32, device=x.device)
    ws = torch.empty(tiles * groups * p2 * cfg["BM"] * br if split > 1 else 1, dtype=torch.float32,
                     device=x.device)
    _shrink_kernel[(tiles, split, groups)](
        x, a, slots, y, ws, counters, T, K, R, S, per, x.stride(0), a.stride(0), a.stride(1),
        BLOCK_M=cfg["BM"], BLOCK_K=cfg["BK"], BLOCK_R=br, SPLIT_P2=p2, FP32=fp32,
        num_warps=cfg.get("warps", 4), num_stages=cfg.get("stages", 3),
    )
    return y


def shrink_units(cfg: dict, S: int, T: int) -> int:
    """The arrival counters one shrink uses: one per (token tile, group); for the one-dot
    kernel (llm_kernels.lora.onehot) one per (tile, chunk of slots), at most S chunks."""
    return -(-T // cfg["BM"]) * (S if cfg.get("kind") == ONEHOT else slot_groups(cfg, S, T))


def slice_grid(slices, block_n: int) -> tuple[int, tuple[int, int, int, int]]:
    """(the expand's N tiles, (tiles1, tiles2, col1, col2)): each output slice tiled on its
    own (slice_tile), up to three slices; a slice a linear does not have starts past the last
    tile and column."""
    tiles, cols = [0], [0]
    for n in slices:
        tiles.append(tiles[-1] + -(-n // block_n))
        cols.append(cols[-1] + n)
    tiles += [tiles[-1]] * (4 - len(tiles))
    cols += [cols[-1]] * (4 - len(cols))
    return tiles[-1], (tiles[1], tiles[2], cols[1], cols[2])


def launch_expand(y, b, slots, out, cfg: dict, fp32: bool, slices) -> torch.Tensor:
    """out [T, N] += y b[slot]^T on the rows with an adapter, slice i of out's columns on y's
    columns i R ... (i + 1) R; returns out."""
    T, N = out.shape
    S, R = b.shape[0], b.shape[2]
    tiles, bounds = slice_grid(slices, cfg["BN"])
    grid = (tiles, -(-T // cfg["BM"]), slot_groups(cfg, S, T))
    _expand_kernel[grid](
        y, b, slots, out, T, N, R, S, y.stride(0), b.stride(0), b.stride(1), out.stride(0), *bounds,
        BLOCK_M=cfg["BM"], BLOCK_N=cfg["BN"], BLOCK_R=block_r(R), FP32=fp32,
        num_warps=cfg.get("warps", 4), num_stages=cfg.get("stages", 3),
    )
    return out

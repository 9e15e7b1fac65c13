"""AWQ W4A16 for a few rows (M <= 4) on the kpack layout, on the CUDA cores ("gemv").

At M = 1 the tensor-core kernel (llm_kernels.awq_kpack) computes 16 rows to keep 1 and holds
its tiles in MMA fragments and shared memory; this one holds a few registers a weight
column, so many small programs stay resident to keep DRAM busy. Each program owns
BLOCK_N columns and a run of the 128-row blocks of K (split-K). A nibble q becomes a
float by bits: q | 0x4B000000 read as float32 is 2^23 + q, and one subtract of 2^23 + z
gives q - z exactly (one LOP3, one FADD), then float32 FMAs with x. The products of a
quantization group are summed per (row, column) slot and reduced over the rows once a
group, times the group's scale. Split-K partials go to the shared workspace
(llm_kernels.workspace); the last split of a column tile to arrive (an atomic counter) sums
them in split order, so results do not depend on timing.
"""
import torch
import triton.language as tl

from llm_kernels.dispatch import lazy_jit, sm_count
from llm_kernels.workspace import WS_FLOATS, WS_TILES, workspace

ROWS = 128  # rows of K per packed block (llm_kernels.awq_kpack.ROWS)
MAX_M = 4  # rows served: each row adds an FMA a weight, past 4 the tensor cores win


# NBLK and SPLIT vary with the shape and the config: not specialised
@lazy_jit(do_not_specialize=["NBLK", "SPLIT"])
def _gemv_kernel(x_ptr, qk_ptr, z_ptr, s_ptr, out_ptr, ws_ptr, cnt_ptr, M, N, stride_xm, stride_om, NBLK, SPLIT,
                 G: tl.constexpr, PPG: tl.constexpr, MB: tl.constexpr, BLOCK_N: tl.constexpr, S: tl.constexpr):
    """out[:M, tile] = x[:M] @ W[:, tile] over blocks [b0, b1) of split program_id(1) of SPLIT.
    PPG: 16-row planes a quantization group spans within a block (G / 16, at most 8).
    MB: M to the next power of two. S: the stripe width of qk."""
    pid_n = tl.program_id(0)
    sp = tl.program_id(1)
    b0 = sp * NBLK // SPLIT
    b1 = (sp + 1) * NBLK // SPLIT
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    rm = tl.arange(0, MB)
    mmask = rm < M
    r16 = tl.arange(0, 16)
    # column n of half-word row k4 sits at (n // S) (NBLK 32 S) + k4 S + n % S
    scol = (rn // S).to(tl.int64) * (NBLK * 32 * S) + rn % S
    wcol = qk_ptr + scol[None, None, :] + r16[None, :, None] * S  # [1, 16, BLOCK_N]: x's rows broadcast
    xrow = x_ptr + rm[:, None, None].to(tl.int64) * stride_xm + r16[None, :, None]  # [MB, 16, 1]
    xmask = mmask[:, None, None] & (r16[None, :, None] >= 0)
    acc = tl.zeros([MB, BLOCK_N], tl.float32)
    gacc = tl.zeros([MB, 16, BLOCK_N], tl.float32)  # a group's products, per row slot
    for blk in range(b0, b1):
        k0 = blk * 128
        wa = tl.load(wcol + blk * 32 * S, mask=nmask[None, None, :], other=0).to(tl.int32)  # half-word rows 0..15
        wb = tl.load(wcol + (blk * 32 + 16) * S, mask=nmask[None, None, :], other=0).to(tl.int32)  # rows 16..31
        for p in tl.static_range(8):  # plane p: nibble p % 4 of half p // 4, rows k0 + 16 p + r
            if p % PPG == 0:  # a group starts: its zeros (with the magic) and scales
                g = (k0 + 16 * p) // G
                zm = tl.load(z_ptr + g * N + rn, mask=nmask, other=0).to(tl.float32) + 8388608.0  # 2^23
                sc = tl.load(s_ptr + g * N + rn, mask=nmask, other=0.0).to(tl.float32)
            w = wa if p < 4 else wb
            q = ((w >> (4 * (p % 4))) & 0xF) | 0x4B000000
            d = q.to(tl.float32, bitcast=True) - zm[None, None, :]  # q - z, exact
            xv = tl.load(xrow + k0 + 16 * p, mask=xmask, other=0.0).to(tl.float32)
            gacc += xv * d
            if (p + 1) % PPG == 0:  # the group ends: its sum over the rows, scaled
                acc += tl.sum(gacc, axis=1) * sc[None, :]
                gacc = tl.zeros_like(gacc)
    optr = out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :]
    omask = mmask[:, None] & nmask[None, :]
    if SPLIT == 1:
        tl.store(optr, acc.to(out_ptr.dtype.element_ty), mask=omask)
    else:
        loc = rm[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        slot = ws_ptr + (pid_n * SPLIT).to(tl.int64) * (MB * BLOCK_N) + loc
        tl.store(slot + sp * (MB * BLOCK_N), acc, mask=omask)
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT - 1:  # the last split of this tile: the partials in split order
            total = tl.zeros([MB, BLOCK_N], tl.float32)
            for i in range(0, SPLIT):
                total += tl.load(slot + i * (MB * BLOCK_N), mask=omask, other=0.0, cache_modifier=".cg")
            tl.store(optr, total.to(out_ptr.dtype.element_ty), mask=omask)
            tl.atomic_xchg(cnt_ptr + pid_n, 0)  # ready for the next launch


def gemv_config(bn: int, warps: int = 1, waves: int = 16, split=None) -> dict:
    """BLOCK_N columns a program on `warps` warps; K split so that about `waves` programs per
    SM run (or into `split` parts)."""
    c = {"kind": "gemv", "BN": bn, "warps": warps, "waves": waves}
    if split is not None:
        c["split"] = split
    return c


def split_count(cfg: dict, tiles: int, nblk: int, device) -> int:
    """Parts K is cut into: the config's, or enough for `waves` programs per SM, at most one a block."""
    split = cfg.get("split") or -(-cfg["waves"] * sm_count(device) // tiles)
    return max(1, min(int(split), nblk))


def launch(x, qk, zeros, scales, group_size: int, cfg: dict, out=None) -> torch.Tensor:
    """x [M, K] @ W (kpack layout, M <= MAX_M) with one gemv config, into out when given."""
    M, K = x.shape
    N = scales.shape[1]
    if M > MAX_M:
        raise ValueError(f"the gemv kernel serves at most {MAX_M} rows, got {M}")
    BN = cfg["BN"]
    MB = max(1, 1 << (M - 1).bit_length())
    nblk = K // ROWS
    tiles = -(-N // BN)
    split = split_count(cfg, tiles, nblk, x.device)
    ws = workspace(x.device)
    if ws is None or tiles > WS_TILES or tiles * split * MB * BN > WS_FLOATS:
        split = 1  # no workspace (first met inside a graph capture) or no room: whole K a program
    if ws is None:
        ws = (torch.empty(1, dtype=torch.float32, device=x.device), torch.zeros(1, dtype=torch.int32, device=x.device))
    out = torch.empty(M, N, dtype=x.dtype, device=x.device) if out is None else out
    _gemv_kernel[(tiles, split)](
        x, qk, zeros, scales, out, ws[0], ws[1], M, N, x.stride(0), out.stride(0), nblk, split,
        G=group_size, PPG=min(8, group_size // 16), MB=MB, BLOCK_N=BN, S=qk.shape[2],
        num_warps=cfg.get("warps", 1), num_stages=cfg.get("stages", 3))
    return out

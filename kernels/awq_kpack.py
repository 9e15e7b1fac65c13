"""AWQ W4A16 GEMM on a K-packed layout made once at load time ("kpack").

AutoAWQ packs 8 columns into a word, so a weight tile's 8 nibble planes are
8 column sets and need 8 accumulators (kernels.awq). Here a word packs 8 rows
instead: for the block of 128 rows starting at k0, word (k0 / 8 + r, n) holds
in nibble p the weight of row k0 + 16 p + r, column n. Nibble plane p of a
[16, BLOCK_N] tile of words is then the [16, BLOCK_N] weight slice of rows
k0 + 16 p .. k0 + 16 p + 15: eight `tl.dot`s of K = 16 per block, all into one
accumulator, columns in their natural order.

A plane becomes 16-bit floats by one AND/OR per two planes (0x4300 is 128.0
in bf16, 0x6400 is 1024.0 in fp16; a nibble OR-ed into the low mantissa bits
gives OFF + q exactly): planes p and p + 4 come from one masked word. The dot
runs on OFF + q; a group's epilogue subtracts (OFF + z) times the row sums of
x and multiplies by the group's scales. The dequantization is elementwise
from the loaded words, so the compiler moves the words (not the 16-bit
planes) through shared memory, pipelined over num_stages.

Zeros are kept unpacked (uint8 [K/G, N]); scales as in the checkpoint.
Small M splits K over the grid's second axis and sums the partials in the
same launch (workspace + arrival counter; the last program of a tile adds
them in a fixed order). Large M dequantizes to bf16 and calls torch.matmul.
"""
from __future__ import annotations

import torch
import triton.language as tl

from kernels._dispatch import LazyKernel, _interpreted_launcher, graph_time, interpret_mode, next_pow2
from kernels.awq import unpack_awq_int4
from kernels.awq_ckpt import _WS_FLOATS, _WS_TILES, _sm_count, _workspace

ROWS = 128  # rows of K per packed block: 8 planes of 16


def kpack_from_awq(qweight: torch.Tensor, qzeros: torch.Tensor, group_size: int):
    """AutoAWQ GEMM-format qweight [K, N/8] and qzeros [K/G, N/8] -> (qk int32 [K/8, N], zeros uint8 [K/G, N])."""
    K = qweight.shape[0]
    if K % ROWS:
        raise ValueError(f"kpack needs K divisible by {ROWS}, got {K}")
    if group_size % 16:
        raise ValueError(f"kpack needs a group size divisible by 16, got {group_size}")
    q = unpack_awq_int4(qweight)  # [K, N] int32 of 0..15
    N = q.shape[1]
    q = q.view(K // ROWS, 8, 16, N)  # block, plane p, row r, n
    qk = torch.zeros(K // ROWS, 16, N, dtype=torch.int32, device=q.device)
    for p in range(8):
        qk |= q[:, p] << (4 * p)
    zeros = unpack_awq_int4(qzeros).to(torch.uint8)
    return qk.view(K // 8, N).contiguous(), zeros.contiguous()


def kpack_dequantize_reference(qk, zeros, scales, group_size: int, dtype=torch.float32) -> torch.Tensor:
    """The dense [K, N] weight of a kpack layout (tests' oracle)."""
    K8, N = qk.shape
    K = K8 * 8
    shifts = torch.arange(0, 32, 4, device=qk.device, dtype=torch.int32)
    q = (qk.view(K // ROWS, 16, 1, N) >> shifts.view(1, 1, 8, 1)) & 0xF  # block, r, p, n
    q = q.permute(0, 2, 1, 3).reshape(K, N)
    z = zeros.to(torch.int32).repeat_interleave(group_size, dim=0)
    s = scales.to(dtype).repeat_interleave(group_size, dim=0)
    return (q - z).to(dtype) * s


def _plane_pair(w, j: tl.constexpr, MAGIC: tl.constexpr, like):
    """Nibbles j and j + 4 of the words w as two tiles of 16-bit floats OFF + q."""
    t = ((w >> (4 * j)) & 0x000F000F) | MAGIC
    lo = t.to(tl.int16).to(like.dtype, bitcast=True)
    hi = (t >> 16).to(tl.int16).to(like.dtype, bitcast=True)
    return lo, hi


def _load_x8(xrow, k0, mask):
    """The 8 [BLOCK_M, 16] slices of x for the 128-row block at k0."""
    m = mask[:, None]
    return (tl.load(xrow + k0, mask=m, other=0.0), tl.load(xrow + k0 + 16, mask=m, other=0.0),
            tl.load(xrow + k0 + 32, mask=m, other=0.0), tl.load(xrow + k0 + 48, mask=m, other=0.0),
            tl.load(xrow + k0 + 64, mask=m, other=0.0), tl.load(xrow + k0 + 80, mask=m, other=0.0),
            tl.load(xrow + k0 + 96, mask=m, other=0.0), tl.load(xrow + k0 + 112, mask=m, other=0.0))


def _load_sz(s_ptr, z_ptr, g, N, rn, mask, OFF: tl.constexpr):
    """Group g's scales and OFF + zeros over the tile's columns, in float32."""
    sc = tl.load(s_ptr + g * N + rn, mask=mask, other=0.0).to(tl.float32)
    zf = tl.load(z_ptr + g * N + rn, mask=mask, other=0).to(tl.float32) + OFF
    return sc, zf


def _plane_exact(w, p: tl.constexpr):
    """Nibble p of w as exact float32 q (the float32 correctness path)."""
    return ((w >> (4 * p)) & 0xF).to(tl.float32)


def _kpack_kernel(
    x_ptr, qk_ptr, z_ptr, s_ptr, out_ptr, ws_ptr, cnt_ptr,
    M, N, stride_xm, stride_om, G, nblk, bps, split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PPG: tl.constexpr,
    MAGIC: tl.constexpr, OFF: tl.constexpr, FP32: tl.constexpr, USE_WS: tl.constexpr,
):
    """out[M, N] = x[M, K] @ W. Program (tile, pid_k) runs 128-row blocks
    [pid_k * bps, (pid_k + 1) * bps) of its BLOCK_M x BLOCK_N tile. PPG: planes
    (of 16 rows) per quantization group within a block (G / 16, at most 8)."""
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    m_tiles = tl.cdiv(M, BLOCK_M)
    pid_n = pid // m_tiles  # consecutive programs share a weight tile
    pid_m = pid % m_tiles
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    r16 = tl.arange(0, 16)
    mmask = rm < M
    nmask = rn < N
    xrow = x_ptr + rm[:, None].to(tl.int64) * stride_xm + r16[None, :]
    wcol = qk_ptr + r16[:, None].to(tl.int64) * N + rn[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    b0 = pid_k * bps
    b1 = tl.minimum(nblk, b0 + bps)
    # x, scales and zeros of the next block load while this one computes (the
    # words are pipelined by the compiler through shared memory)
    n0, n1, n2, n3, n4, n5, n6, n7 = _load_x8(xrow, b0 * 128, mmask)
    if PPG == 8:
        sn, zn = _load_sz(s_ptr, z_ptr, (b0 * 128) // G, N, rn, nmask, OFF)
    for blk in range(b0, b1):
        k0 = blk * 128
        last = blk + 1 >= b1  # nothing to prefetch: masked off
        xt = (n0, n1, n2, n3, n4, n5, n6, n7)
        n0, n1, n2, n3, n4, n5, n6, n7 = _load_x8(xrow, k0 + 128, rm < tl.where(last, 0, M))
        if PPG == 8:
            sc, zf = sn, zn
            sn, zn = _load_sz(s_ptr, z_ptr, (k0 + 128) // G, N, rn, rn < tl.where(last, 0, N), OFF)
        w = tl.load(wcol + blk * 16 * N, mask=nmask[None, :], other=0)
        gacc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        xs = tl.zeros([BLOCK_M], tl.float32)
        for p in tl.static_range(8):
            x = xt[p]
            if FP32:
                b = _plane_exact(w, p)
                gacc += tl.dot(x, b, input_precision="ieee")
            else:
                if p < 4:
                    b = _plane_pair(w, p, MAGIC, x)[0]
                else:
                    b = _plane_pair(w, p - 4, MAGIC, x)[1]
                gacc += tl.dot(x, b)
            xs += tl.sum(x.to(tl.float32), axis=1)
            if (p + 1) % PPG == 0:  # a group ends: its zeros and scales, once
                if PPG != 8:
                    sc, zf = _load_sz(s_ptr, z_ptr, (k0 + 16 * (p + 1 - PPG)) // G, N, rn, nmask, OFF)
                acc += sc[None, :] * gacc - (zf * sc)[None, :] * xs[:, None]
                gacc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
                xs = tl.zeros([BLOCK_M], tl.float32)
    omask = mmask[:, None] & nmask[None, :]
    optr = out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :]
    if USE_WS:
        # split-K in one launch: partial to the workspace, count in, the last sums
        ntiles = tl.num_programs(0)
        loc = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        P = BLOCK_M * BLOCK_N
        tl.store(ws_ptr + (pid_k * ntiles + pid).to(tl.int64) * P + loc, acc)
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel", scope="gpu")
        if arrived == split - 1:
            total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for s in range(0, split):  # a fixed order: deterministic
                total += tl.load(ws_ptr + (s * ntiles + pid).to(tl.int64) * P + loc, cache_modifier=".cg")
            tl.store(optr, total.to(out_ptr.dtype.element_ty), mask=omask)
            tl.atomic_xchg(cnt_ptr + pid, 0)  # ready for the next launch
    else:
        tl.store(optr, acc.to(out_ptr.dtype.element_ty), mask=omask)


def _kpack_dequant_kernel(qk_ptr, z_ptr, s_ptr, out_ptr, N, G, BLOCK_N: tl.constexpr):
    """One 128-row block x BLOCK_N columns of the dense weight."""
    blk = tl.program_id(0)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    r16 = tl.arange(0, 16)
    nmask = rn < N
    w = tl.load(qk_ptr + (blk * 16 + r16)[:, None].to(tl.int64) * N + rn[None, :], mask=nmask[None, :], other=0)
    for p in tl.static_range(8):
        rows = blk * 128 + 16 * p + r16
        g = (blk * 128 + 16 * p) // G
        sc = tl.load(s_ptr + g * N + rn, mask=nmask, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + g * N + rn, mask=nmask, other=0).to(tl.float32)
        v = (((w >> (4 * p)) & 0xF).to(tl.float32) - z[None, :]) * sc[None, :]
        tl.store(out_ptr + rows[:, None].to(tl.int64) * N + rn[None, :], v.to(out_ptr.dtype.element_ty),
                 mask=nmask[None, :])


class _Kernel(LazyKernel):
    """LazyKernel whose @jit helpers are built in the launch's mode too (the
    kernel finds them in this module's globals when it is traced)."""

    def __init__(self, fn, helpers=(), **jit_kwargs):
        super().__init__(fn)
        self.helpers, self.jit_kwargs = helpers, jit_kwargs

    def __getitem__(self, grid):
        import triton

        mode = interpret_mode()
        built = _HELPERS_BUILT.setdefault(mode, {})
        for name in self.helpers:
            if name not in built:
                built[name] = triton.jit(_HELPER_FNS[name])
            globals()[name] = built[name]
        kernel = self._built.get(mode)
        if kernel is None:
            kernel = self._built[mode] = triton.jit(self.fn, **self.jit_kwargs)
        if mode:
            return _interpreted_launcher(kernel[grid])
        return kernel[grid]


_HELPERS_BUILT: dict = {}
_HELPER_FNS = {"_plane_pair": _plane_pair, "_plane_exact": _plane_exact, "_load_x8": _load_x8, "_load_sz": _load_sz}
_gemm = _Kernel(_kpack_kernel, helpers=tuple(_HELPER_FNS),
                do_not_specialize=["M", "nblk", "bps", "split"])
_dequant = _Kernel(_kpack_dequant_kernel)


# ----------------------------------------------------------------------------
# launching and tuning

def _plan(M, N, K, cfg, device):
    nblk = K // ROWS
    tiles = -(-M // cfg["BM"]) * -(-N // cfg["BN"])
    split = cfg.get("split") or round(cfg.get("waves", 0) * _sm_count(device) / tiles)
    split = max(1, min(split, nblk))
    bps = -(-nblk // split)
    return tiles, nblk, bps, -(-nblk // bps)


def launch(x, qk, zeros, scales, group_size: int, cfg: dict, out=None) -> torch.Tensor:
    M, K = x.shape
    N = qk.shape[1]
    if cfg["kind"] == "dense":
        return x @ dequantize(qk, zeros, scales, group_size, x.dtype)
    tiles, nblk, bps, split = _plan(M, N, K, cfg, x.device)
    ws = _workspace(x.device) if split > 1 else None
    if split > 1 and (ws is None or tiles > _WS_TILES or split * tiles * cfg["BM"] * cfg["BN"] > _WS_FLOATS):
        split, bps = 1, nblk  # no room for partials: one program per tile
    ws_t, cnt_t = ws if split > 1 else (x, x)
    out = torch.empty(M, N, dtype=x.dtype, device=x.device) if out is None else out
    _gemm[(tiles, split)](
        x, qk, zeros, scales, out, ws_t, cnt_t, M, N, x.stride(0), out.stride(0), group_size, nblk, bps, split,
        BLOCK_M=cfg["BM"], BLOCK_N=cfg["BN"], PPG=min(8, group_size // 16),
        MAGIC=0x43004300 if x.dtype == torch.bfloat16 else 0x64006400,
        OFF=0.0 if x.dtype == torch.float32 else (128.0 if x.dtype == torch.bfloat16 else 1024.0),
        FP32=x.dtype == torch.float32, USE_WS=split > 1,
        num_warps=cfg.get("warps", 4), num_stages=cfg.get("stages", 2),
        **({"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") and x.is_cuda else {}))
    return out


def dequantize(qk, zeros, scales, group_size: int, dtype) -> torch.Tensor:
    K, N = qk.shape[0] * 8, qk.shape[1]
    w = torch.empty(K, N, dtype=dtype, device=qk.device)
    bn = 128
    _dequant[(K // ROWS, -(-N // bn))](qk, zeros, scales, w, N, group_size, BLOCK_N=bn, num_warps=4)
    return w


def _cfg(bm, bn, warps=4, stages=2, waves=None, split=None, maxnreg=None):
    c = {"kind": "fused", "BM": bm, "BN": bn, "warps": warps, "stages": stages}
    if maxnreg:
        c["maxnreg"] = maxnreg
    if split is not None:
        c["split"] = split
    else:
        c["waves"] = waves or 0
    return c


DENSE = {"kind": "dense"}


def configs(M: int, dtype, device) -> list:
    """Candidates timed per shape; the first is the interpreter's and the one used
    if a shape is first met inside a graph capture."""
    if device.type != "cuda":
        return [_cfg(16, 32, waves=2), _cfg(16, 32, split=1), _cfg(32, 64, waves=1)]
    if dtype == torch.float32:
        return [_cfg(16, 64, waves=2)] if M <= 64 else [DENSE]
    if M <= 16:
        # measured on the H200 (triton 3.6): BN 128, 3 stages, 2-4 waves per SM led; 232 registers
        # leave 2 programs per SM, so the 8-warp and register-capped ones try for more in flight
        return ([_cfg(16, bn, warps=4, stages=s, waves=v) for bn in (64, 128) for s in (2, 3, 4) for v in (2, 4)]
                + [_cfg(16, bn, warps=8, stages=3, waves=v) for bn in (128, 256) for v in (2, 4)]
                + [_cfg(16, bn, warps=4, stages=3, waves=4, maxnreg=r) for bn, r in ((64, 128), (128, 168))])
    if M <= 64:
        return ([_cfg(bm, bn, warps=w, stages=3, waves=v) for bm in (16, 32, 64) for bn in (64, 128)
                 for w in (4,) for v in (1, 2)] + [_cfg(64, 128, warps=8, stages=3, waves=2), DENSE])
    if M <= 256:
        return [DENSE] + [_cfg(bm, bn, warps=8, stages=s, split=1) for bm in (64, 128) for bn in (128, 256)
                          for s in (3, 4)] + [_cfg(128, 128, warps=8, stages=3, waves=1)]
    return [DENSE]


_CHOSEN: dict = {}
TIMINGS: dict = {}
FAILED: dict = {}


def _tune(key, x, qk, zeros, scales, G, cands):
    if interpret_mode() or not x.is_cuda or len(cands) == 1:
        return cands[0], True
    if torch.cuda.is_current_stream_capturing():
        return cands[0], False
    ref, timed = None, []
    for cfg in cands:
        fkey = (tuple(sorted(cfg.items())), x.dtype, G)
        if fkey in FAILED:
            continue
        try:
            out = launch(x, qk, zeros, scales, G, cfg).float()
            if ref is None:
                ref = out
            else:
                err = ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()
                if not err < 2e-2:
                    FAILED[fkey] = f"disagrees with the first config: rel err {err:.3g}"
                    continue
            t = graph_time(lambda c=cfg: launch(x, qk, zeros, scales, G, c))
        except Exception as exc:  # noqa: BLE001 - a config this compiler or chip rejects
            FAILED[fkey] = f"{type(exc).__name__}: {exc}"[:500]
            continue
        timed.append((cfg, t))
    TIMINGS[key] = timed
    if not timed:
        return cands[0], True
    return min(timed, key=lambda ct: ct[1])[0], True


def kpack_gemm(x, qk, zeros, scales, group_size: int) -> torch.Tensor:
    """x [M, K] @ W [K, N] with W in the kpack layout; the config is tuned per shape on CUDA."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    M, K = x.shape
    N = qk.shape[1]
    key = (next_pow2(M), N, K, group_size, x.dtype)
    cfg = _CHOSEN.get(key)
    if cfg is None:
        cfg, keep = _tune(key, x, qk, zeros, scales, group_size, configs(M, x.dtype, x.device))
        if keep:
            _CHOSEN[key] = cfg
    return launch(x, qk, zeros, scales, group_size, cfg)


def chosen_config(M: int, N: int, K: int, group_size: int, dtype):
    return _CHOSEN.get((next_pow2(M), N, K, group_size, dtype))

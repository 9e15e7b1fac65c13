"""llm_kernels.awq_tile's kernel emulated on the CPU, statement by statement where the layout
and the split are concerned: every thread's cp.async pieces into the ring of stages (the
same index arithmetic), each lane's shared-memory loads, the dequantization on bit
patterns (bf16 rounding as the bf16x2 instructions round), the MMAs by the PTX ISA's
fragment layouts of m16n8k16, and the stream-K flush (whole tiles out, partials to their
slots, the last block of a tile adding them in the blocks' order). The blocks may run in
any order, as on a GPU. The CUDA kernel itself runs on a GPU only
(tests/gpu/test_awq_mma_gpu.py); tests/kernels/test_awq_tile.py checks it here.
"""
import torch

from llm_kernels.awq_tile import block_of, grid_for, slot, unit_range, units

LANE = torch.arange(32)
G_, T_ = LANE // 4, LANE % 4  # a lane's group and thread in the group


def _f32(bits16: torch.Tensor) -> torch.Tensor:
    """bf16 bit patterns (int64, 0..65535) -> their float32 values."""
    return (bits16.to(torch.int32) << 16).view(torch.float32)


def _bits(f: torch.Tensor) -> torch.Tensor:
    """float32 -> bf16 bit patterns, rounded to nearest even (cvt.rn / the bf16x2 ops)."""
    return f.to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF


def _halves(r: torch.Tensor) -> tuple:
    return r & 0xFFFF, (r >> 16) & 0xFFFF


def _pack(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    return lo | (hi << 16)


def _byte_perm(x: torch.Tensor, sel: int) -> torch.Tensor:
    """__byte_perm(x, 0, sel) for selectors of bytes 0-3 of x."""
    out = torch.zeros_like(x)
    for i in range(4):
        out |= ((x >> (8 * ((sel >> (4 * i)) & 0xF))) & 0xFF) << (8 * i)
    return out


def _dq(w: torch.Tensor, sh: int, s2: torch.Tensor, nz2: torch.Tensor) -> torch.Tensor:
    """The helper dq: LOP3 to 0x4300 | q (= 128 + q), + (-(128 + z)) (exact), * s (rounded)."""
    v = ((w >> sh) & 0x000F000F) | 0x43004300
    out = []
    for part in (0, 1):
        vh, zh, sh_ = (_halves(a)[part] for a in (v, nz2, s2))
        d = _bits(_f32(vh) + _f32(zh))
        out.append(_bits(_f32(d) * _f32(sh_)))
    return _pack(*out)


def mma_m16n8k16(c: torch.Tensor, a: list, b: list) -> torch.Tensor:
    """mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32 over a warp: c [32, 4] float32, a four and b
    two registers [32] (two bf16 each) -> d [32, 4], by the PTX ISA's fragment layouts."""
    A = torch.zeros(16, 16, dtype=torch.float64)
    B = torch.zeros(16, 8, dtype=torch.float64)
    for r in range(4):
        for e in range(2):
            A[G_ + 8 * (r & 1), 2 * T_ + e + 8 * (r >> 1)] = _f32(_halves(a[r])[e]).double()
    for r in range(2):
        for e in range(2):
            B[2 * T_ + e + 8 * r, G_] = _f32(_halves(b[r])[e]).double()
    D = A @ B
    d = c.clone()
    for i in range(4):
        d[:, i] += D[G_ + 8 * (i >> 1), 2 * T_ + (i & 1)].float()
    return d


class _Launch:
    """One launch's dimensions and global memory (x, the layout, y, the workspace, counters)."""

    def __init__(self, x, words, sz, cfg: dict, sms: int):
        M, K = x.shape
        self.M, self.K, self.N, self.KG = M, K, words.shape[0] * 16, sz.shape[1]
        self.MT, self.NWT, self.WN, self.U, self.ST = cfg["mt"], cfg["nwt"], cfg["wn"], cfg["u"], cfg["st"]
        self.TPB, self.NTH = self.WN * self.NWT, self.WN * 32
        self.BM, self.BN, self.XS = 8 * self.MT, 16 * self.TPB, self.U * 64 + 8
        self.KC = K // 64
        self.gshift = (self.KC // self.KG).bit_length() - 1
        self.tiles, self.KI, self.TL = units(M, self.N, K, cfg)
        self.NB = self.N // self.BN
        self.G = grid_for(M, self.N, K, cfg, sms)
        self.XP = -(-(self.BM * self.U * 8) // self.NTH)
        self.X = x.contiguous().view(torch.int16).flatten().to(torch.int64) & 0xFFFF
        self.W = words.flatten().to(torch.int64) & 0xFFFFFFFF
        self.SZ = sz.contiguous().view(torch.int32).flatten().to(torch.int64) & 0xFFFFFFFF
        self.Y = torch.full((M * self.N,), 0x7FC0, dtype=torch.int64)  # NaN: what no block writes stays NaN
        self.P = torch.full((2 * self.G * self.BM * self.BN,), float("nan"), dtype=torch.float32)
        self.CNT = [0] * self.tiles

    def load(self, ld: list) -> tuple:
        """Every thread's cp.async pieces of the unit at ld (tok0, column block, first chunk):
        a stage (activations, words, scales), -1 where nothing was written."""
        tok0, nb, c = ld
        U, KC, K = self.U, self.KC, self.K
        xs = torch.full((self.BM * self.XS,), -1, dtype=torch.int64)
        ws = torch.full((self.TPB * U * 32 * 4,), -1, dtype=torch.int64)
        ss = torch.full((self.TPB * U * 16,), -1, dtype=torch.int64)
        NTH, WN = self.NTH, self.WN
        for tid in range(NTH):  # each thread's pieces, decomposed as the kernel decomposes them
            xr, xp = tid // (U * 8), tid % (U * 8) * 8
            wt, wu = tid // (U * 32), tid // 32 % U
            woff = (wt * KC + wu) * 128 + (tid & 31) * 4
            for k in range(self.XP):
                row = xr + k * (NTH // (U * 8))
                if row < self.BM:
                    ok = c + (xp >> 6) < KC and tok0 + row < self.M
                    src = tok0 * K + c * 64 + xp + row * K
                    xs[row * self.XS + xp: row * self.XS + xp + 8] = self.X[src: src + 8] if ok else 0
            if c + wu < KC:
                for k in range(self.NWT * U):
                    src = (nb * self.TPB * KC + c) * 128 + woff + k * (WN // U) * KC * 128
                    ws[(tid + k * NTH) * 4: (tid + k * NTH) * 4 + 4] = self.W[src: src + 4]
            su = tid // 4 % U
            if tid < self.TPB * U * 4 and c + su < KC:
                src = nb * self.TPB * self.KG * 16 + (tid // (U * 4) * self.KG * 16 + (tid & 3) * 4) + \
                    ((c + su) >> self.gshift) * 16
                ss[tid * 4: tid * 4 + 4] = self.SZ[src: src + 4]
        return xs, ws, ss

    def advance(self, ld: list) -> None:
        ld[2] += self.U
        if ld[2] >= self.KC:
            ld[2] = 0
            ld[1] += 1
            if ld[1] == self.NB:
                ld[1], ld[0] = 0, ld[0] + self.BM

    def compute(self, stage: tuple, c: int, acc: torch.Tensor) -> None:
        """Every warp's MMAs over a unit's chunks, each lane's registers loaded as the kernel loads them."""
        xs, ws, ss = stage
        U, XS = self.U, self.XS
        for uu in range(U):
            if c + uu >= self.KC:
                continue
            for warp in range(self.WN):
                tw = warp * self.NWT
                sa, wa, xa = tw * U * 16 + G_ * 2, (tw * U * 32 + LANE) * 4, G_ * XS + 16 * T_  # the lane's bases
                sv = [[ss[sa + (b * U + uu) * 16 + e] for e in range(2)] for b in range(self.NWT)]
                assert min(int(r.min()) for rr in sv for r in rr) >= 0, "scales read before they were loaded"
                for jp in range(2):
                    wv = [[ws[wa + (b * U + uu) * 128 + 2 * jp + e] for e in range(2)] for b in range(self.NWT)]
                    assert min(int(r.min()) for rr in wv for r in rr) >= 0, "words read before they were loaded"
                    xw = []
                    for m in range(self.MT):
                        h = [xs[xa + 8 * m * XS + uu * 64 + 8 * jp + e] for e in range(8)]
                        xw.append([_pack(h[2 * e], h[2 * e + 1]) for e in range(4)])
                    for jj in range(2):
                        for b in range(self.NWT):
                            w = wv[b][jj]
                            sg, sg8 = _byte_perm(sv[b][0], 0x1010), _byte_perm(sv[b][0], 0x3232)
                            zg, zg8 = _byte_perm(sv[b][1], 0x1010), _byte_perm(sv[b][1], 0x3232)
                            a = [_dq(w, 0, sg, zg), _dq(w, 4, sg8, zg8), _dq(w, 8, sg, zg), _dq(w, 12, sg8, zg8)]
                            for m in range(self.MT):
                                acc[warp, b, m] = mma_m16n8k16(acc[warp, b, m], a, [xw[m][2 * jj], xw[m][2 * jj + 1]])

    def flush(self, blk: int, u0: int, v: int, acc: torch.Tensor) -> None:
        """The tile of unit v ends (or block blk's range does): bf16 out, or a partial, counted in."""
        BM, BN, KI, TL, G = self.BM, self.BN, self.KI, self.TL, self.G
        tile = v // KI
        t0 = tile * KI
        tok0, col0 = tile // self.NB * BM, tile % self.NB * BN
        whole = u0 <= t0 and v == t0 + KI - 1
        quad = torch.arange(4)
        rows = 8 * torch.arange(self.MT)[:, None, None] + 2 * T_[None, :, None] + (quad & 1)[None, None, :]
        for warp in range(self.WN):
            for b in range(self.NWT):
                col = 16 * (warp * self.NWT + b) + G_[None, :, None] + 8 * (quad >> 1)[None, None, :]
                col = col.expand(self.MT, 32, 4)
                if whole:
                    tok = tok0 + rows
                    keep = tok < self.M
                    self.Y[(tok * self.N + col0 + col)[keep]] = _bits(acc[warp, b])[keep]
                else:
                    base = slot(blk, t0, TL, G) * BM * BN
                    self.P[(base + rows * BN + col).flatten()] = acc[warp, b].flatten()
        if not whole:
            first, lastb = block_of(t0, TL, G), block_of(t0 + KI - 1, TL, G)
            self.CNT[tile] += 1
            if self.CNT[tile] - 1 == lastb - first:  # the last of the tile's blocks: add them in order
                idx = torch.arange(BM * BN)
                s = torch.zeros(BM * BN, dtype=torch.float32)
                for bq in range(first, lastb + 1):
                    s = s + self.P[slot(bq, t0, TL, G) * BM * BN + idx]
                tok = tok0 + idx // BN
                keep = tok < self.M
                self.Y[(tok * self.N + col0 + idx % BN)[keep]] = _bits(s)[keep]
                self.CNT[tile] = 0
        acc.zero_()

    def run_block(self, blk: int) -> None:
        """Block blk's loop: the ring of ST stages, ST - 1 units loaded ahead."""
        u0, u1 = unit_range(blk, self.TL, self.G)
        stages = [None] * self.ST
        tile = u0 // self.KI
        ld = [tile // self.NB * self.BM, tile % self.NB, u0 % self.KI * self.U]
        acc = torch.zeros(self.WN, self.NWT, self.MT, 32, 4)
        for i in range(self.ST - 1):
            if u0 + i < u1:
                stages[i] = self.load(ld)
                self.advance(ld)
        sl, ki = 0, u0 % self.KI
        for v in range(u0, u1):
            if v + self.ST - 1 < u1:
                stages[self.ST - 1 if sl == 0 else sl - 1] = self.load(ld)
                self.advance(ld)
            self.compute(stages[sl], ki * self.U, acc)
            sl = 0 if sl == self.ST - 1 else sl + 1
            if ki == self.KI - 1 or v == u1 - 1:
                self.flush(blk, u0, v, acc)
            ki = 0 if ki == self.KI - 1 else ki + 1


def tile_emulate(x: torch.Tensor, words: torch.Tensor, sz: torch.Tensor, cfg: dict, sms: int, order=None):
    """y [M, N] bf16 as the kernel of cfg computes x [M, K] bf16 @ the mma-layout weight on a
    GPU of sms SMs, its blocks run in `order` (default: 0, 1, ...)."""
    launch = _Launch(x, words, sz, cfg, sms)
    for blk in (range(launch.G) if order is None else order):
        launch.run_block(blk)
    assert all(c == 0 for c in launch.CNT), "a counter was left non-zero"
    return launch.Y.to(torch.int16).view(torch.bfloat16).view(launch.M, launch.N)

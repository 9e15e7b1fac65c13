"""AWQ W4A16 for small M on CUDA in CUDA C++ (issue 20): the "mma" layout, made once at
load time beside the kpack one, and its kernel, compiled at run time by NVRTC
(`torch.cuda._compile_kernel`, no nvcc in the image) for any sm_80+ GPU (Ampere, Ada,
Hopper: mma.sync only). Opt-in (LLM_KERNELS_AWQ_MMA, llm_kernels.awq.awq_prepare): with "1"
the layer holds its 4-bit weights twice, and for M <= MAX_M the tuner picks per shape
between this kernel's configs and the kpack kernel (benchmarks/NOTES.md, session 18); with
"small" the small bf16 layers hold this layout alone, the kernel taking M <= KERNEL_MAX_M and
llm_kernels.awq_mma_dequant + cuBLAS the rest (or llm_kernels.awq_tile up to 256 tokens, by the
tuner); with "all" every bf16 layer does (to be measured: a default without a second copy).

Why (benchmarks/w4a16_cuda_proto.py on the H200): at M <= 16 the Triton kpack kernel
issues on under half the cycles and round-trips the weights through shared memory; here
one 128-bit load of a lane is its A fragments for four MMAs, straight into registers.

The layer is transposed for the MMA (m16n8k16): 16 output columns are its rows, 8 tokens
its columns, up to MAX_M / 8 token tiles share one dequantized fragment. The repack:
  word[nt, kc, lane, j] = the 8 nibbles lane (g = lane / 4, t = lane % 4) feeds step j of
  64-row chunk kc of 16-column tile nt; fragment element e (the PTX ISA's layout: rows g,
  g + 8 for e / 2 odd, columns 2t, 2t + 1, + 8 for e >= 4) sits at nibble e / 2 + 4 (e % 2),
  so one shift and one mask give a bf16 pair (0x4300 | q = 128 + q), and two bf16x2 FMAs
  give (q - z) * s.
Inside a chunk the K order is permuted (the same for weights and activations, so the
product is unchanged): lane t's activations for the chunk's four steps are the 16
contiguous values at 16t, two 128-bit loads. Scales and zeros: one 64-bit load a lane a
group, (s_g, s_g+8, -(128 + z_g), -(128 + z_g+8)). Each 16-column tile is one block; its
warps split K and add their fragments in shared memory at the end. A block may take 2 or 4
neighbouring tiles (NTB), each chunk's activations then loaded once for all of them.
The SC configs (up to SC_MAX_MT token tiles) skip the scale in the fragments: one LOP3 and
one bf16x2 op make q - z (exact), the MMAs sum a group's products in float32 registers, and
the group's scales multiply those sums once (the product of the float32 weights, closer to
the reference than bf16-rounded ones).
"""
import math
import os
from functools import lru_cache

import torch

from llm_kernels.awq_format import unpack_awq_int4

MAX_M = 32  # awq_linear's cut-over: beyond, the kernel loses to kpack / cuBLAS on the H200 (session 18)
KERNEL_MAX_M = 64  # the kernel's own limit: 8 token tiles of 8 a block
NIBBLE = [0, 4, 1, 5, 2, 6, 3, 7]  # fragment element e -> its nibble: e / 2 + 4 (e % 2)
# (warps a block, chunks loaded ahead, 16-column tiles a block, SC, MB): 2 or 4 tiles share each
# activation load (on the H200: 3584x37888 at M = 16-32 from 0.80-0.82x kpack to 0.91-1.03x)
CONFIGS = [(nw, u, 1, 0, 1) for nw in (4, 8, 16) for u in (2, 4, 8)] + \
    [(nw, u, ntb, 0, 1) for ntb in (2, 4) for nw in (4, 8) for u in (2, 4)] + \
    [(nw, u, ntb, 1, 1) for nw, u, ntb in ((4, 2, 1), (8, 2, 1), (8, 4, 1), (16, 2, 1), (16, 4, 1), (4, 2, 2), (8, 2, 2),
                                           (8, 4, 2), (4, 2, 4), (8, 2, 4))] + \
    [(16, 2, 1, 0, 2), (8, 2, 1, 0, 4)]
# (..., SC = 1): the scales applied to each group's float32 sums instead of each weight pair
# (one bf16x2 op a pair instead of two, and one LOP3 instead of two: on sm_90 the main loop
# issued 7.4 instructions a weight pair at M = 8, 3.8 of them integer, benchmarks/mma_sass.py);
# the group sums cost MT x NTB x 4 registers, so up to SC_MAX_MT token tiles
SC_MAX_MT = 4
# (..., MB > 1): at least MB blocks an SM (__launch_bounds__' second argument), registers capped
# at 64, so 32 warps an SM: 16 warps a block took 66 registers at M = 32 (one block an SM), 8
# warps 80 (three). At M = 32-64 the H200 showed 13-21% occupancy and warps waiting on loads
# (benchmarks/NOTES.md, session 20), and one 16-column tile a block keeps the grid large enough
# to fill them (288 blocks for 4608 columns). For MB_MT token tiles only: sm_90 SASS there has
# the same instructions a weight pair or fewer, spilling 4 bytes at 3 tiles and none at 4;
# fewer tiles use 64 registers or fewer anyway, more spill under the cap
MB_MT = (3, 4)
ENV = "LLM_KERNELS_AWQ_MMA"
MODES = ("0", "1", "small", "all")
# "small": layers of at most this many weights keep the mma layout alone (no kpack copy). On the
# H200 the kernel is 1.4-1.8x kpack on Qwen2.5-7B's qkv and o (16.5M and 12.8M weights) and
# 1.03-1.11x on its two large layers, at M <= 8 only (benchmarks/NOTES.md, session 19)
SMALL_WEIGHTS = 1 << 25


def mode() -> str:
    """LLM_KERNELS_AWQ_MMA: "0" (the default) no mma layout; "1" every layer it fits keeps it
    beside kpack (one more copy of the 4-bit weights); "small" bf16 layers of at most
    SMALL_WEIGHTS weights keep it instead of kpack (no extra memory), the others kpack only;
    "all" every bf16 layer keeps it instead of kpack (awq_mma, awq_tile or the dequantized
    layout and cuBLAS, by the tuner, up to 256 tokens; the dequantized layout above)."""
    value = os.environ.get(ENV, "0").strip() or "0"
    if value not in MODES:
        raise ValueError(f"{ENV}={value!r}: expected one of {', '.join(MODES)}")
    return value


def enabled() -> bool:
    """The opt-in of mode "1": keep the mma layout beside kpack."""
    return mode() == "1"


def layout_choice(K: int, N: int, dtype, how: str) -> tuple:
    """(keep the mma layout, keep it alone) for a K x N layer of dtype under mode `how`."""
    if how == "1":
        return True, False
    alone = dtype == torch.bfloat16 and (how == "all" or how == "small" and K * N <= SMALL_WEIGHTS)
    return alone, alone


def layout_fits(K: int, N: int, group_size: int) -> bool:
    """K by 64, N by 16, the group a power-of-two multiple of 64 dividing K."""
    r = group_size // 64
    return K % 64 == 0 and N % 16 == 0 and group_size % 64 == 0 and K % group_size == 0 and r & (r - 1) == 0


def runs_on(device) -> bool:
    """The kernel runs there: a CUDA GPU of sm_80+ and a torch with NVRTC kernels."""
    return device.type == "cuda" and hasattr(torch.cuda, "_compile_kernel") and \
        torch.cuda.get_device_capability(device) >= (8, 0)


def mma_pack(q: torch.Tensor, z: torch.Tensor, s: torch.Tensor):
    """q [K, N], z [K / G, N] integers 0..15, s [K / G, N] -> (words int32 [N/16, K/64, 32, 4],
    sz bf16 [N/16, K/G, 8, 4]: s_g, s_g+8, -(128 + z_g), -(128 + z_g+8))."""
    K, N = q.shape
    KG = z.shape[0]
    # k = kc 64 + t 16 + j 4 + (e >> 2) 2 + (e & 1); n = nt 16 + ((e >> 1) & 1) 8 + g
    v = q.to(torch.int64).view(K // 64, 4, 4, 2, 2, N // 16, 2, 8)  # kc t j hi lo nt mid g
    v = v.permute(5, 0, 7, 1, 2, 3, 6, 4)  # nt kc g t j hi mid lo (e = 4 hi + 2 mid + lo)
    v = v.reshape(N // 16, K // 64, 32, 4, 8)
    shifts = torch.tensor([4 * NIBBLE[e] for e in range(8)], dtype=torch.int64, device=q.device)
    words = (v << shifts).sum(-1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    zb = (-(128 + z.to(torch.float32))).to(torch.bfloat16)

    def pair(a):  # [KG, N] -> [N/16, KG, 8 (g), 2 (rows g, g + 8)]
        return a.reshape(KG, N // 16, 2, 8).permute(1, 0, 3, 2)

    sz = torch.cat([pair(s.to(torch.bfloat16)), pair(zb)], dim=-1).contiguous()
    return words.contiguous(), sz


def mma_from_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int):
    """AutoAWQ GEMM-format qweight [K, N/8], qzeros [K/G, N/8], scales [K/G, N] -> mma_pack's."""
    return mma_pack(unpack_awq_int4(qweight), unpack_awq_int4(qzeros), scales)


def mma_dequantize_reference(words: torch.Tensor, sz: torch.Tensor) -> torch.Tensor:
    """The weight [K, N] in float32, (q - z) * s, undoing mma_pack (the CPU path, and the oracle)."""
    NT, KC = words.shape[:2]
    K, N, KG = KC * 64, NT * 16, sz.shape[1]
    w = words.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.tensor([4 * NIBBLE[e] for e in range(8)], dtype=torch.int64, device=words.device)
    v = (w[..., None] >> shifts) & 0xF  # [NT, KC, 32, 4, 8]: nt kc (g t) j (hi mid lo)
    v = v.view(NT, KC, 8, 4, 4, 2, 2, 2).permute(1, 3, 4, 5, 7, 0, 6, 2)  # kc t j hi lo nt mid g
    q = v.reshape(K, N).float()

    def unpair(a):  # pair's inverse: [N/16, KG, 8, 2] -> [KG, N]
        return a.permute(1, 0, 3, 2).reshape(KG, N)

    s, z = unpair(sz[..., :2].float()), -unpair(sz[..., 2:].float()) - 128
    G = K // KG
    return (q - z.repeat_interleave(G, 0)) * s.repeat_interleave(G, 0)


def mma_emulate_lanes(x: torch.Tensor, words: torch.Tensor, sz: torch.Tensor, sc: bool = False) -> torch.Tensor:
    """What the kernel computes, read the way its lanes read (the fragments' registers, the
    permuted activations, bf16 dequant; float32 on the CPU): y [M, N]. sc: the SC configs'
    arithmetic (the fragments hold q - z, each group's float32 sums times its scales). Tests
    check the layout with it; the CUDA kernel itself runs on a GPU only."""
    NT, KC = words.shape[:2]
    M, N, KG = x.shape[0], NT * 16, sz.shape[1]
    grp = torch.arange(KC) // (KC // KG)  # each chunk's group
    lane = torch.arange(32)
    g, t = lane // 4, lane % 4
    y = torch.zeros(M, N, dtype=torch.float32)
    a = torch.zeros(NT, KC, 4, 16, 16)  # the A tiles: [row n, col k] of each chunk's four steps
    w = words.to(torch.int64) & 0xFFFFFFFF
    s, nz = sz[..., :2].float(), sz[..., 2:].float()  # [NT, KG, 8, 2]
    for reg in range(4):  # the PTX fragment's registers: rows g (0, 2) or g + 8 (1, 3), cols + 8 for 2, 3
        for half in range(2):
            nib = (w >> (4 * (reg + 4 * half))) & 0xF  # [NT, KC, 32, 4]
            row, col = g + 8 * (reg & 1), 2 * t + half + 8 * (reg >> 1)
            scale = s[:, grp][:, :, g, reg & 1]  # [NT, KC, 32]
            zz = nz[:, grp][:, :, g, reg & 1]
            val = (nib.float() + 128 + zz[..., None]).to(torch.bfloat16).float()
            if not sc:
                val = (val * scale[..., None]).to(torch.bfloat16).float()
            a[:, :, :, row, col] = val.permute(0, 1, 3, 2)
    for m in range(M):
        xs = x[m].float().view(KC, 4, 16)  # chunk, t, the lane's 16 values
        b = torch.zeros(KC, 4, 16)  # [chunk, step j, col k]
        for tt in range(4):
            for j in range(4):
                for r in range(2):
                    for half in range(2):
                        b[:, j, 2 * tt + half + 8 * r] = xs[:, tt, 4 * j + 2 * r + half]
        if sc:  # each chunk's sums (a group holds whole chunks) times its group's scales, rows g and g + 8
            rows = s[:, grp].permute(0, 1, 3, 2).reshape(NT, KC, 16)
            y[m] = (torch.einsum("nkjrc,kjc->nkr", a, b) * rows).sum(1).reshape(N)
        else:
            y[m] = torch.einsum("nkjrc,kjc->nr", a, b).reshape(N)
    return y


HELPERS = r"""  // shared with benchmarks/w4a16_wide.py
typedef unsigned int u32;

__device__ __forceinline__ void ldg4(u32 (&r)[4], const void* p) {
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "l"(p));
}
__device__ __forceinline__ void ldx4(u32* r, const void* p) {
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "l"(p));
}
__device__ __forceinline__ void ldsz(u32 (&r)[2], const void* p) {
  asm volatile("ld.global.nc.v2.u32 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "l"(p));
}
// bf16 pair (q_lo - z, q_hi - z) * s of the two nibbles at bits sh and sh + 16; the mask and
// the OR in one LOP3 (0xEA: (a & b) | c), which the compiler does not always find
__device__ __forceinline__ u32 dq(u32 w, int sh, u32 s2, u32 nz2) {
  u32 v, d, r;
  asm("lop3.b32 %0, %1, 0x000F000F, 0x43004300, 0xEA;" : "=r"(v) : "r"(w >> sh));
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(v), "r"(0x3F803F80u), "r"(nz2));
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(d), "r"(s2), "r"(0x80008000u));
  return r;
}
// SC: bf16 pair q_lo - z, q_hi - z (exact: integers -15..15) of the nibbles at bits sh and sh + 16
__device__ __forceinline__ u32 dqz(u32 w, int sh, u32 nz2) {
  u32 v, r;
  asm("lop3.b32 %0, %1, 0x000F000F, 0x43004300, 0xEA;" : "=r"(v) : "r"(w >> sh));
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(v), "r"(0x3F803F80u), "r"(nz2));
  return r;
}
__device__ __forceinline__ void mma(float (&c)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
"""

SOURCE = HELPERS + r"""
extern "C" __global__ void BOUNDS
KNAME(const u32* __restrict__ W, const u32* __restrict__ SZ, const unsigned short* __restrict__ X,
      unsigned short* __restrict__ Y, int M, int N, int K, int gshift) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int nt = blockIdx.x * NTB, KC = K >> 6, KG = KC >> gshift;  // the block's first 16-column tile
  const int c0 = warp * KC / NW, c1 = (warp + 1) * KC / NW;
  float acc[NTB][MT][4];
#if SC
  // SC: the MMAs sum (q - z) x over a group in accg; each group's scales multiply the sums once,
  // in float32, when its last chunk (or the warp's last) is done: one bf16x2 op a weight pair, not two
  float accg[NTB][MT][4];
  const int gmask = (1 << gshift) - 1;
#endif
#pragma unroll
  for (int b = 0; b < NTB; b++)
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        acc[b][m][i] = 0.f;
#if SC
        accg[b][m][i] = 0.f;
#endif
      }
  // running pointers at the warp's first chunk, moved U chunks a trip (the compiler kept
  // recomputing 64-bit addresses from the chunk index: a fifth of the loop's instructions)
  const u32* wp = W + ((size_t)nt * KC * 32 + lane) * 4 + (size_t)c0 * 128;  // tile b's words: + b KC 128
  const u32* sp = SZ + ((size_t)nt * KG * 8 + g) * 2;  // tile b's scales and zeros: + b KG 16
  const unsigned short* xp[MT];
  bool xv[MT];
#pragma unroll
  for (int m = 0; m < MT; m++) {
    const int tok = m * 8 + g;
    xv[m] = tok < M;
    xp[m] = X + (size_t)(xv[m] ? tok : 0) * K + 16 * t + c0 * 64;
  }
  for (int c = c0; c < c1; c += U, wp += U * 128) {
    u32 wv[U][NTB][4];
#pragma unroll
    for (int u = 0; u < U; u++)
      if (c + u < c1)
#pragma unroll
        for (int b = 0; b < NTB; b++) ldg4(wv[u][b], wp + ((size_t)b * KC + u) * 128);
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (c + u < c1) {
        const int cc = c + u;
        u32 sz[NTB][2];  // before the activations, as in the kernel session 18 timed (NTB = 1)
#pragma unroll
        for (int b = 0; b < NTB; b++) ldsz(sz[b], sp + ((size_t)b * KG + (cc >> gshift)) * 16);
        u32 xw[MT][8];  // the lane's 16 activations of the chunk, as bf16 pairs
#pragma unroll
        for (int m = 0; m < MT; m++) {
          if (xv[m]) {
            ldx4(&xw[m][0], xp[m] + u * 64);
            ldx4(&xw[m][4], xp[m] + u * 64 + 8);
          } else {
#pragma unroll
            for (int i = 0; i < 8; i++) xw[m][i] = 0u;
          }
        }
#pragma unroll
        for (int b = 0; b < NTB; b++) {  // every tile of the block reuses the chunk's activations
          const u32 sg = __byte_perm(sz[b][0], 0, 0x1010), sg8 = __byte_perm(sz[b][0], 0, 0x3232);
          const u32 zg = __byte_perm(sz[b][1], 0, 0x1010), zg8 = __byte_perm(sz[b][1], 0, 0x3232);
#pragma unroll
          for (int j = 0; j < 4; j++) {
            const u32 w = wv[u][b][j];
#if SC
            const u32 a0 = dqz(w, 0, zg), a1 = dqz(w, 4, zg8), a2 = dqz(w, 8, zg), a3 = dqz(w, 12, zg8);
#pragma unroll
            for (int m = 0; m < MT; m++) mma(accg[b][m], a0, a1, a2, a3, xw[m][2 * j], xw[m][2 * j + 1]);
#else
            const u32 a0 = dq(w, 0, sg, zg), a1 = dq(w, 4, sg8, zg8), a2 = dq(w, 8, sg, zg), a3 = dq(w, 12, sg8, zg8);
#pragma unroll
            for (int m = 0; m < MT; m++) mma(acc[b][m], a0, a1, a2, a3, xw[m][2 * j], xw[m][2 * j + 1]);
#endif
          }
        }
#if SC
        if (cc + 1 == c1 || ((cc + 1) & gmask) == 0) {  // the group's last chunk: scale its sums
#pragma unroll
          for (int b = 0; b < NTB; b++) {
            const float s0 = __uint_as_float(sz[b][0] << 16), s8 = __uint_as_float(sz[b][0] & 0xFFFF0000u);
#pragma unroll
            for (int m = 0; m < MT; m++) {
#pragma unroll
              for (int i = 0; i < 4; i++) {
                acc[b][m][i] = fmaf(i < 2 ? s0 : s8, accg[b][m][i], acc[b][m][i]);  // c0, c1: row g; c2, c3: g + 8
                accg[b][m][i] = 0.f;
              }
            }
          }
        }
#endif
      }
    }
#pragma unroll
    for (int m = 0; m < MT; m++) xp[m] += U * 64;
  }
  __shared__ float red[NW][NTB * MT * 4][32];
#pragma unroll
  for (int b = 0; b < NTB; b++)
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
      for (int i = 0; i < 4; i++) red[warp][(b * MT + m) * 4 + i][lane] = acc[b][m][i];
  __syncthreads();
  for (int idx = threadIdx.x; idx < NTB * MT * 128; idx += NW * 32) {
    const int mi = idx >> 5, l = idx & 31;
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < NW; w++) s += red[w][mi][l];
    const int b = mi / (MT * 4), m = (mi >> 2) % MT, i = mi & 3;
    const int row = (l >> 2) + ((i >> 1) << 3), tok = m * 8 + 2 * (l & 3) + (i & 1);
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(s));
    if (tok < M) Y[(size_t)tok * N + (nt + b) * 16 + row] = h;
  }
}
"""


def fits(nw: int, mt: int, ntb: int = 1) -> bool:
    """The block's partial sums (red[NW][NTB * MT * 4][32] floats) fit 48 KB of static shared memory."""
    return nw * ntb * mt * 4 * 32 * 4 <= 48 * 1024


def launches(nw: int, ntb: int, sc: int, mb: int, mt: int, N: int) -> bool:
    """A config (warps, tiles a block, SC, MB) launches at mt token tiles on N columns."""
    return N % (16 * ntb) == 0 and fits(nw, mt, ntb) and (not sc or mt <= SC_MAX_MT) and (mb == 1 or mt in MB_MT)


def mma_configs(M: int, N: int) -> list:
    """The kernel's candidates at M <= KERNEL_MAX_M tokens for N columns: warps a block, chunks
    loaded ahead, 16-column tiles a block (NTB > 1 reuses each activation load across tiles:
    fewer blocks, so only where N leaves enough of them)."""
    mt = -(-M // 8)
    return [{"kind": "mma", "nw": nw, "u": u, **({"ntb": ntb} if ntb > 1 else {}), **({"sc": 1} if sc else {}),
             **({"mb": mb} if mb > 1 else {})}
            for nw, u, ntb, sc, mb in CONFIGS if launches(nw, ntb, sc, mb, mt, N)]


def kernel_source(nw: int, mt: int, u: int, ntb: int, sc: int = 0, mb: int = 1) -> tuple:
    """(name, CUDA source) of one config's kernel (benchmarks/mma_sass.py compiles it on the CPU)."""
    name = f"w4a16_mma_nw{nw}_mt{mt}_u{u}_ntb{ntb}" + ("_sc" if sc else "") + (f"_mb{mb}" if mb > 1 else "")
    bounds = f"__launch_bounds__(NW * 32, {mb})" if mb > 1 else "__launch_bounds__(NW * 32)"
    defines = f"#define NW {nw}\n#define MT {mt}\n#define U {u}\n#define NTB {ntb}\n#define SC {int(bool(sc))}\n"
    return name, defines + f"#define BOUNDS {bounds}\n#define KNAME {name}\n" + SOURCE


@lru_cache(maxsize=None)
def _kernel(nw: int, mt: int, u: int, ntb: int, sc: int, mb: int):
    name, src = kernel_source(nw, mt, u, ntb, sc, mb)
    return torch.cuda._compile_kernel(src, name)


def mma_launch(x: torch.Tensor, words: torch.Tensor, sz: torch.Tensor, cfg: dict, out=None) -> torch.Tensor:
    """x [M, K] bf16 (M <= KERNEL_MAX_M, contiguous) @ the mma-layout weight -> out [M, N] bf16, on
    the current stream (graph-capturable). The config's kernel is compiled on first use."""
    M, K = x.shape
    N, KG = words.shape[0] * 16, sz.shape[1]
    ntb = cfg.get("ntb", 1)
    mt, sc, mb = -(-M // 8), cfg.get("sc", 0), cfg.get("mb", 1)
    shape_ok = 1 <= M <= KERNEL_MAX_M and launches(cfg["nw"], ntb, sc, mb, mt, N)
    if not (shape_ok and x.dtype == torch.bfloat16 and x.is_contiguous() and K == words.shape[1] * 64):
        raise ValueError(f"mma_launch: x {tuple(x.shape)} {x.dtype} against a [{words.shape[1] * 64}, {N}] layer")
    if out is None:
        out = torch.empty(M, N, device=x.device, dtype=torch.bfloat16)
    gshift = int(math.log2(K // 64 // KG))
    kernel = _kernel(cfg["nw"], mt, cfg["u"], ntb, sc, mb)
    kernel(grid=(N // (16 * ntb), 1, 1), block=(32 * cfg["nw"], 1, 1), args=[words, sz, x, out, M, N, K, gshift])
    return out

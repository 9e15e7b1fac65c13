"""AWQ W4A16 for 17-256 tokens on CUDA in CUDA C++ (issue 20): a tensor-core GEMM on
llm_kernels.awq_mma's layout (no other copy of the weights), for the batched decode and
mixed steps where awq_mma and the Triton kpack kernel lose to cuBLAS on bf16 weights.

Why a second kernel (benchmarks/NOTES.md, sessions 19-20): awq_mma's warps split K and keep
every token tile in registers, so at 32-64 tokens it runs on 123 registers with one block
an SM and its warps wait on global loads (occupancy 13-21%, DRAM 9-20%). Here:
- the tokens are the MMA's M (m16n8k16, activations as the A operand, the weights as B):
  a warp owns 64 (or 32) columns for up to 64 tokens, so each dequantized weight fragment
  feeds up to 4 MMAs and each activation fragment up to 8;
- one block is 4 or 8 warps side by side in N, each chunk of activations staged once in
  shared memory for all of them;
- weights, their scales and the activations stream into shared memory by cp.async, ST
  stages deep (the weights of ST - 1 chunks in flight an SM: 48-80 KB, enough for the
  H200's DRAM latency at its bandwidth share);
- the grid is persistent and split stream-K: G blocks (the SMs times the blocks each holds)
  take equal ranges of the (tile, chunk) work, so a layer of any width fills every SM
  without a tail wave; a tile shared by several blocks is summed by the last to finish
  (float32 partials in the split-K workspace, an arrival counter that block resets), in
  the blocks' order, so the result does not depend on which finishes first.

The layout (awq_mma): words[nt, kc, lane, j] hold the fragment of k-step j of 64-row chunk
kc for 16-column tile nt; in the transposed kernel they are A's four registers (rows g and
g + 8, k 2t.. and 2t + 8..), here the same registers are B's for the tile's two 8-column
halves: (a0, a2) for columns g, (a1, a3) for columns g + 8. Inside a chunk K is permuted
(k-step j, lane t reads the 4 activations at 16t + 4j), the same for both operands.
"""
import math
from functools import lru_cache

import torch

from llm_kernels import awq_mma
from llm_kernels.dispatch import sm_count
from llm_kernels.workspace import WS_FLOATS, WS_TILES, workspace

MIN_M, MAX_M = 17, 256  # the tuner offers the kernel for tuning buckets 32 to 256
MAX_MT = 8  # 8-token tiles a block: a warp's accumulators are NWT x MT x 4 floats
# (16-column tiles a warp, warps a block, chunks a stage, stages, blocks an SM); a block is
# 8 MT tokens x 16 NWT WN columns. 8 warps x 64 columns at 1 block an SM, or 4 warps at 2;
# 128-column blocks for narrow layers (Qwen2.5-0.5B's 896 and 1152). sm_90 SASS
# (benchmarks/mma_sass.py --kernel tile): no spills at 64 tokens but with 2 chunks a stage
# (that one up to 32 tokens only, U2_MAX_MT)
CONFIGS = [(4, 8, 1, 4, 1), (4, 8, 1, 6, 1), (4, 4, 1, 4, 2), (2, 8, 1, 6, 1), (4, 8, 2, 4, 1), (2, 4, 1, 4, 2)]
U2_MAX_MT = 4

SOURCE = awq_mma.HELPERS + r"""
// shared memory by 32-bit shared-window addresses (computed once a stage, constant offsets after:
// generic pointers cost a conversion and their own arithmetic at every load)
// 16 bytes global -> shared, bypassing L1; bytes 0 fills zeros (tokens past M)
__device__ __forceinline__ void cpa16(u32 s, const void* g, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(s), "l"(g), "r"(bytes));
}
__device__ __forceinline__ void lds4(u32 (&r)[4], u32 a) {
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void lds2(u32 (&r)[2], u32 a) {
  asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}

#define TPB (WN * NWT)          // 16-column tiles a block
#define BM (8 * MT)             // tokens a block
#define BN (16 * TPB)           // columns a block
#define NTH (WN * 32)           // threads a block
#define XS (U * 64 + 8)         // a staged activation row in halves: U chunks, 16 bytes of padding
#define X_STAGE (BM * XS * 2)   // bytes of a stage: activations, then words, then scales and zeros
#define W_STAGE (TPB * U * 512)
#define S_STAGE (TPB * U * 64)
#define STAGE (X_STAGE + W_STAGE + S_STAGE)

#define XP ((BM * U * 8 + NTH - 1) / NTH)  // a thread's 16-byte pieces of a stage: activations,
#define WP (NWT * U)                        // words (TPB U 32 pieces: exactly NWT U a thread),
#define SPC (TPB * U * 4)                   // scales and zeros (SPC pieces, one a thread at most)
static_assert(SPC <= NTH && NTH % (U * 32) == 0 && WN % U == 0, "a stage's pieces as the loads count them");

extern "C" __global__ void __launch_bounds__(NTH, MB)
KNAME(const u32* __restrict__ W, const u32* __restrict__ SZ, const unsigned short* __restrict__ X,
      unsigned short* __restrict__ Y, float* __restrict__ P, int* __restrict__ CNT,
      int M, int N, int K, int gshift) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int last;
  const u32 sbase = (u32)__cvta_generic_to_shared(smem);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int KC = K >> 6, KG = KC >> gshift, KI = (KC + U - 1) / U, NB = N / BN;
  // units: (tile, U chunks), tile-major; a tile is BM tokens x BN columns, column blocks first
  const long long TL = (long long)((M + BM - 1) / BM) * NB * KI, G = gridDim.x;
  const int u0 = (int)(TL * blockIdx.x / G), u1 = (int)(TL * (blockIdx.x + 1) / G);  // this block's range
  const int tw = warp * NWT;  // the warp's first tile in the block

  // this thread's pieces of a stage, the same in every stage (NTH is a multiple of U 32): the
  // k-th piece of activations is row xr + k NTH / (U 8), 8 halves at xp; of words, tile
  // wt + k WN / U, chunk wu; of scales, tile st_, chunk su (threads below SPC)
  const int xr = threadIdx.x / (U * 8), xp = threadIdx.x % (U * 8) * 8;
  const int wt = threadIdx.x / (U * 32), wu = threadIdx.x / 32 % U;
  const int woff = (wt * KC + wu) * 128 + lane * 4;
  const int su = threadIdx.x / 4 % U;
  const int soff = threadIdx.x / (U * 4) * KG * 16 + (threadIdx.x & 3) * 4;

  // the unit loaded next: its tile's token slice and column block, its first chunk
  int ld_tok0, ld_nb, ld_c;
  {
    const int tile = u0 / KI;
    ld_tok0 = tile / NB * BM, ld_nb = tile % NB, ld_c = u0 % KI * U;
  }
  auto load = [&](int sl) {  // the next unit into stage sl, by every thread; then advance
    const u32 stg = sbase + sl * STAGE;
    const unsigned short* xb = X + (size_t)ld_tok0 * K + (size_t)ld_c * 64 + xp;
    const bool xin = ld_c + (xp >> 6) < KC;
#pragma unroll
    for (int k = 0; k < XP; k++) {
      const int row = xr + k * (NTH / (U * 8));
      if (row < BM) {
        const bool ok = xin && ld_tok0 + row < M;
        cpa16(stg + (row * XS + xp) * 2, ok ? (const void*)(xb + row * K) : (const void*)X, ok ? 16 : 0);
      }
    }
    const u32* wb = W + ((size_t)ld_nb * TPB * KC + ld_c) * 128 + woff;
    if (ld_c + wu < KC)
#pragma unroll
      for (int k = 0; k < WP; k++) cpa16(stg + X_STAGE + (threadIdx.x + k * NTH) * 16, wb + k * (WN / U) * KC * 128, 16);
    if (threadIdx.x < SPC && ld_c + su < KC)
      cpa16(stg + X_STAGE + W_STAGE + threadIdx.x * 16, SZ + (size_t)ld_nb * TPB * KG * 16 + soff + ((ld_c + su) >> gshift) * 16, 16);
    ld_c += U;
    if (ld_c >= KC) {
      ld_c = 0;
      if (++ld_nb == NB) ld_nb = 0, ld_tok0 += BM;
    }
  };

  // acc[b][m][i]: column 16 (tw + b) + g + 8 (i / 2), token 8m + 2t + i % 2
  float acc[NWT][MT][4];
#pragma unroll
  for (int b = 0; b < NWT; b++)
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
      for (int i = 0; i < 4; i++) acc[b][m][i] = 0.f;

  // the block containing unit v: the largest b with TL b / G <= v
  auto block_of = [&](long long v) { return ((v + 1) * G - 1) / TL; };

  auto flush = [&](int v) {  // the tile of unit v ends here (or the block's range does)
    const int tile = v / KI, t0 = tile * KI;
    const int tok0 = tile / NB * BM, col0 = tile % NB * BN;
    if (u0 <= t0 && v == t0 + KI - 1) {  // the whole tile is this block's: bf16 out
#pragma unroll
      for (int b = 0; b < NWT; b++)
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
          for (int i = 0; i < 4; i++) {
            const int tok = tok0 + 8 * m + 2 * t + (i & 1);
            unsigned short hv;
            asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(hv) : "f"(acc[b][m][i]));
            if (tok < M) Y[(size_t)tok * N + col0 + 16 * (tw + b) + g + 8 * (i >> 1)] = hv;
          }
    } else {  // a partial: to this block's slot (0: its first tile, 1: its last), then count in
      float* pp = P + (size_t)(2 * blockIdx.x + (u0 >= t0 ? 0 : 1)) * (BM * BN);
#pragma unroll
      for (int b = 0; b < NWT; b++)
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
          for (int i = 0; i < 4; i++)
            pp[(8 * m + 2 * t + (i & 1)) * BN + 16 * (tw + b) + g + 8 * (i >> 1)] = acc[b][m][i];
      __threadfence();  // the partial is visible before the counter says so
      __syncthreads();
      const long long first = block_of(t0), lastb = block_of(t0 + KI - 1);  // the tile's blocks
      if (threadIdx.x == 0) last = atomicAdd(&CNT[tile], 1) == (int)(lastb - first);
      __syncthreads();
      if (last) {  // every other share is in: add them in the blocks' order
        __threadfence();
        for (int i = threadIdx.x; i < BM * BN; i += NTH) {
          const int tok = tok0 + i / BN;
          if (tok >= M) continue;
          float s = 0.f;
          for (long long bq = first; bq <= lastb; bq++)
            s += __ldcg(P + (size_t)(2 * bq + (TL * bq / G >= t0 ? 0 : 1)) * (BM * BN) + i);
          unsigned short hv;
          asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(hv) : "f"(s));
          Y[(size_t)tok * N + col0 + i % BN] = hv;
        }
        if (threadIdx.x == 0) CNT[tile] = 0;  // zero again for the next launch
      }
      __syncthreads();  // `last` is read by all before a later flush rewrites it
    }
#pragma unroll
    for (int b = 0; b < NWT; b++)
#pragma unroll
      for (int m = 0; m < MT; m++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[b][m][i] = 0.f;
  };

#pragma unroll
  for (int i = 0; i < ST - 1; i++) {
    if (u0 + i < u1) load(i);
    asm volatile("cp.async.commit_group;");
  }
  int sl = 0, ki = u0 % KI;
  for (int v = u0; v < u1; v++) {
    asm volatile("cp.async.wait_group %0;" :: "n"(ST - 2));
    __syncthreads();  // unit v is in for every warp; the stage of unit v - 1 is free
    if (v + ST - 1 < u1) load(sl == 0 ? ST - 1 : sl - 1);
    asm volatile("cp.async.commit_group;");
    // this lane's addresses in stage sl: its activations (row g, column 16t), its warp's words, scales
    const u32 stg = sbase + sl * STAGE;
    const u32 xa = stg + (g * XS + 16 * t) * 2;
    const u32 wa = stg + X_STAGE + (tw * U * 32 + lane) * 16;
    const u32 sa = stg + X_STAGE + W_STAGE + (tw * U * 16 + g * 2) * 4;
    const int c = ki * U;
#pragma unroll
    for (int uu = 0; uu < U; uu++) {
      if (c + uu < KC) {
        u32 sv[NWT][2];
#pragma unroll
        for (int b = 0; b < NWT; b++) lds2(sv[b], sa + (b * U + uu) * 64);
#pragma unroll
        for (int jp = 0; jp < 2; jp++) {  // k-steps 2jp, 2jp + 1: each token tile's B fragments, one load
          u32 wv[NWT][2];
#pragma unroll
          for (int b = 0; b < NWT; b++) lds2(wv[b], wa + (b * U + uu) * 512 + 8 * jp);
          u32 xw[MT][4];
#pragma unroll
          for (int m = 0; m < MT; m++) lds4(xw[m], xa + (8 * m * XS + uu * 64 + 8 * jp) * 2);
#pragma unroll
          for (int jj = 0; jj < 2; jj++) {
#pragma unroll
            for (int b = 0; b < NWT; b++) {
              const u32 w = wv[b][jj];
              const u32 sg = __byte_perm(sv[b][0], 0, 0x1010), sg8 = __byte_perm(sv[b][0], 0, 0x3232);
              const u32 zg = __byte_perm(sv[b][1], 0, 0x1010), zg8 = __byte_perm(sv[b][1], 0, 0x3232);
              const u32 a0 = dq(w, 0, sg, zg), a1 = dq(w, 4, sg8, zg8), a2 = dq(w, 8, sg, zg), a3 = dq(w, 12, sg8, zg8);
#pragma unroll
              for (int m = 0; m < MT; m++) mma(acc[b][m], a0, a1, a2, a3, xw[m][2 * jj], xw[m][2 * jj + 1]);
            }
          }
        }
      }
    }
    sl = sl == ST - 1 ? 0 : sl + 1;
    if (ki == KI - 1 || v == u1 - 1) flush(v);
    ki = ki == KI - 1 ? 0 : ki + 1;
  }
  asm volatile("cp.async.wait_group 0;");
}
"""


def smem_bytes(mt: int, nwt: int, wn: int, u: int, st: int) -> int:
    """A block's dynamic shared memory: ST stages of activations (8 MT rows of U chunks, 16
    bytes of padding a row), words (512 bytes a tile and chunk) and scales (64)."""
    return st * (8 * mt * (u * 64 + 8) * 2 + wn * nwt * u * (512 + 64))


def mt_for(M: int) -> int:
    """8-token tiles a block for M tokens (more than 64: several token slices)."""
    return min(MAX_MT, -(-M // 8))


# ----------------------------------------------------------------------------
# the stream-K split, the same integer arithmetic as the kernel's (the emulation and the
# tests use these)


def units(M: int, N: int, K: int, cfg: dict) -> tuple:
    """(tiles, chunk units a tile, all units) of a launch: a tile is 8 MT tokens x the block's
    columns, a unit U chunks of 64 rows of one tile."""
    bm, bn = 8 * cfg["mt"], 16 * cfg["nwt"] * cfg["wn"]
    ki = -(-(K // 64) // cfg["u"])
    tiles = -(-M // bm) * (N // bn)
    return tiles, ki, tiles * ki


def unit_range(b: int, T: int, G: int) -> tuple:
    """The units [start, end) of block b of G."""
    return T * b // G, T * (b + 1) // G


def block_of(v: int, T: int, G: int) -> int:
    """The block whose range holds unit v."""
    return ((v + 1) * G - 1) // T


def slot(b: int, t0: int, T: int, G: int) -> int:
    """Block b's workspace slot for its partial of the tile starting at unit t0: 2b for the
    tile its range starts in, 2b + 1 for a later one (a range holds at most two partials)."""
    return 2 * b + (0 if T * b // G >= t0 else 1)


def grid_for(M: int, N: int, K: int, cfg: dict, sms: int) -> int:
    """Blocks of a launch: the SMs times the blocks each holds, at most one a unit, and no more
    than the workspace holds two partials of (64 x 512 tiles: 128 blocks, 4 SMs of the H200 idle)."""
    bm, bn = 8 * cfg["mt"], 16 * cfg["nwt"] * cfg["wn"]
    return min(sms * cfg["mb"], units(M, N, K, cfg)[2], WS_FLOATS // (2 * bm * bn))


def fits(M: int, N: int, K: int, cfg: dict, sms: int, smem_max: int) -> bool:
    """The config launches on this layer: whole column blocks, shared memory, the workspace's
    counters (one a tile), units counted in 32 bits; and the kernel's static_assert (a stage's
    pieces spread evenly over the threads)."""
    mt, nwt, wn, u, st = cfg["mt"], cfg["nwt"], cfg["wn"], cfg["u"], cfg["st"]
    bn = 16 * nwt * wn
    if N % bn or K % 64 or not 1 <= M <= MAX_M or smem_bytes(mt, nwt, wn, u, st) > smem_max or wn % u or nwt * u > 8:
        return False
    tiles, _, total = units(M, N, K, cfg)
    return tiles <= WS_TILES and total < 2**31


def smem_limit(device) -> int:
    """The shared memory a block may opt in to (227 KB on Hopper, 163 on the A100, 99 on Ada)."""
    return _smem_limit(device.index if device.index is not None else torch.cuda.current_device())


@lru_cache(maxsize=None)
def _smem_limit(index: int) -> int:  # read once a device: tile_launch asks at every eager launch
    props = torch.cuda.get_device_properties(index)
    return int(getattr(props, "shared_memory_per_block_optin", 48 * 1024))


def tile_configs(M: int, N: int, K: int, sms: int, smem_max: int) -> list:
    """The kernel's candidates for M tokens (the tuning bucket's largest M) on a K x N layer."""
    if not MIN_M <= M <= MAX_M:
        return []
    mt = mt_for(M)
    cands = [{"kind": "tile", "mt": mt, "nwt": nwt, "wn": wn, "u": u, "st": st, "mb": mb}
             for nwt, wn, u, st, mb in CONFIGS if u == 1 or mt <= U2_MAX_MT]
    return [c for c in cands if fits(M, N, K, c, sms, smem_max)]


def kernel_source(mt: int, nwt: int, wn: int, u: int, st: int, mb: int) -> tuple:
    """(name, CUDA source) of one config's kernel (benchmarks/mma_sass.py compiles it on the CPU)."""
    name = f"w4a16_tile_mt{mt}_nwt{nwt}_wn{wn}_u{u}_st{st}_mb{mb}"
    defines = f"#define MT {mt}\n#define NWT {nwt}\n#define WN {wn}\n#define U {u}\n#define ST {st}\n#define MB {mb}\n"
    return name, defines + f"#define KNAME {name}\n" + SOURCE


@lru_cache(maxsize=None)
def _kernel(mt: int, nwt: int, wn: int, u: int, st: int, mb: int):
    name, src = kernel_source(mt, nwt, wn, u, st, mb)
    kernel = torch.cuda._compile_kernel(src, name)
    smem = smem_bytes(mt, nwt, wn, u, st)
    if smem >= 48 * 1024:
        kernel.set_shared_memory_config(smem)
    return kernel


def tile_launch(x: torch.Tensor, words: torch.Tensor, sz: torch.Tensor, cfg: dict, out=None) -> torch.Tensor:
    """x [M, K] bf16 (1 <= M <= MAX_M, contiguous) @ the mma-layout weight -> out [M, N]
    bf16 on the current stream (graph-capturable: the workspace is made at load time, and
    its counters are zero again after each launch)."""
    M, K = x.shape
    N, KG = words.shape[0] * 16, sz.shape[1]
    ok = x.is_cuda and x.dtype == torch.bfloat16 and x.is_contiguous() and K == words.shape[1] * 64 \
        and cfg.get("kind") == "tile" and 1 <= cfg["mt"] <= MAX_MT
    sms = sm_count(x.device) if ok else 0
    ws = workspace(x.device) if ok else None
    if not (ws is not None and fits(M, N, K, cfg, sms, smem_limit(x.device))):
        raise ValueError(f"tile_launch: x {tuple(x.shape)} {x.dtype} on {x.device} against a "
                         f"[{words.shape[1] * 64}, {N}] layer, config {cfg}")
    if out is None:
        out = torch.empty(M, N, device=x.device, dtype=torch.bfloat16)
    gshift = int(math.log2(K // 64 // KG))
    kernel = _kernel(cfg["mt"], cfg["nwt"], cfg["wn"], cfg["u"], cfg["st"], cfg["mb"])
    kernel(grid=(grid_for(M, N, K, cfg, sms), 1, 1), block=(32 * cfg["wn"], 1, 1),
           shared_mem=smem_bytes(cfg["mt"], cfg["nwt"], cfg["wn"], cfg["u"], cfg["st"]),
           args=[words, sz, x, out, ws[0], ws[1], M, N, K, gshift])
    return out

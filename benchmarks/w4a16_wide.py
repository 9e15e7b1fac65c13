"""An experiment of session 19 (issue 20), not used by the engine: llm_kernels.awq_mma's
fragments and dequantization with the work split the other way, for 8-64 tokens. Timed by
`python3 benchmarks/w4a16_cuda_proto.py --kinds mma_wide`. On the H200 it is slower than
the engine's pick (awq_mma or the Triton kpack kernel) at every M = 8-64 on Qwen2.5-7B's four
layers (benchmarks/NOTES.md, session 19; results/awq_mma_wide.json); kept so the
measurement can be repeated.

The idea it tested: awq_mma's block is one to four 16-column tiles whose warps split K, so
every block loads the step's activations for its own few columns; at M = 64 that is 16x
the weight bytes a warp. Here the WN warps of a block own neighbouring tiles (WN * NTB * 16
columns) and read each chunk of activations from shared memory, staged once for all of
them; activations, weights and scales come in by cp.async, 3-4 stages ahead. K is split
across blocks instead (grid.y = KS): each split stores its fp32 partial sums, and the last
split of a column block to finish (a counter, reset by that block, so it stays zero
between launches and graph replays) adds them and writes bf16. KS = 1 writes bf16 directly.
"""
from functools import lru_cache

import torch

from llm_kernels import awq_mma

KERNEL_MAX_M = 64  # 8 token tiles
SMEM = 48 * 1024  # static shared memory a block
COUNTERS = 1 << 16  # one per column block: more than any layer has
# (warps a block, 16-column tiles a warp, chunks a stage)
CONFIGS = [(wn, ntb, u) for wn in (4, 8) for ntb in (1, 2) for u in (1, 2)]

SOURCE = awq_mma.HELPERS + r"""
__device__ __forceinline__ void cp16(void* s, const void* g) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"((u32)__cvta_generic_to_shared(s)), "l"(g));
}
__device__ __forceinline__ void cp8(void* s, const void* g) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" :: "r"((u32)__cvta_generic_to_shared(s)), "l"(g));
}
__device__ __forceinline__ void lds4(u32* r, const void* p) {
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"((u32)__cvta_generic_to_shared(p)));
}
__device__ __forceinline__ void lds2(u32* r, const void* p) {
  asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"((u32)__cvta_generic_to_shared(p)));
}

#define XS (U * 64 + 8)  // a staged row: U chunks of 64 activations, 16 bytes of padding (no bank conflicts)
#define TPB (WN * NTB)  // 16-column tiles a block

extern "C" __global__ void __launch_bounds__(WN * 32)
KNAME(const u32* __restrict__ W, const u32* __restrict__ SZ, const unsigned short* __restrict__ X,
      unsigned short* __restrict__ Y, float* __restrict__ P, unsigned* __restrict__ CNT,
      int M, int N, int K, int gshift) {
  // S stages, each U chunks: the block's activations (shared by its warps) and each lane's
  // own weight words and scales (written and read by that lane only)
  __shared__ __align__(16) unsigned short xs[S][MT * 8][XS];
  __shared__ __align__(16) u32 ws[S][TPB][U][32][4];
  __shared__ __align__(16) u32 ss[S][TPB][U][32][2];
  __shared__ int last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int KC = K >> 6, KG = KC >> gshift, KS = gridDim.y;
  const int tw = warp * NTB, nt = blockIdx.x * TPB + tw;  // the warp's first tile: in the block, in the layer
  const int c0 = blockIdx.y * KC / KS, c1 = (blockIdx.y + 1) * KC / KS;
  float acc[NTB][MT][4];
#pragma unroll
  for (int b = 0; b < NTB; b++)
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
      for (int i = 0; i < 4; i++) acc[b][m][i] = 0.f;

  auto stage = [&](int c, int s) {  // chunks c .. c + U - 1 (those below c1) into stage s
    for (int i = threadIdx.x; i < MT * 8 * U * 8; i += WN * 32) {
      const int row = i / (U * 8), p = i % (U * 8);  // tokens >= M: never written out, not loaded
      if (row < M && c + (p >> 3) < c1) cp16(&xs[s][row][p * 8], X + (size_t)row * K + (size_t)c * 64 + p * 8);
    }
#pragma unroll
    for (int u = 0; u < U; u++)
      if (c + u < c1)
#pragma unroll
        for (int b = 0; b < NTB; b++) {
          cp16(ws[s][tw + b][u][lane], W + (((size_t)(nt + b) * KC + c + u) * 32 + lane) * 4);
          cp8(ss[s][tw + b][u][lane], SZ + (((size_t)(nt + b) * KG + ((c + u) >> gshift)) * 8 + g) * 2);
        }
    asm volatile("cp.async.commit_group;");
  };
#pragma unroll
  for (int i = 0; i < S - 1; i++) stage(c0 + i * U, i);
  int s = 0;
  for (int c = c0; c < c1; c += U) {
    asm volatile("cp.async.wait_group %0;" :: "n"(S - 2));
    __syncthreads();  // stage s is in for every warp; stage s - 1, read last step, is free
    stage(c + (S - 1) * U, s == 0 ? S - 1 : s - 1);
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (c + u < c1) {
        u32 xw[MT][8];
#pragma unroll
        for (int m = 0; m < MT; m++) {
          lds4(&xw[m][0], &xs[s][m * 8 + g][u * 64 + 16 * t]);
          lds4(&xw[m][4], &xs[s][m * 8 + g][u * 64 + 16 * t + 8]);
        }
#pragma unroll
        for (int b = 0; b < NTB; b++) {
          u32 wv[4], sz[2];
          lds4(wv, ws[s][tw + b][u][lane]);
          lds2(sz, ss[s][tw + b][u][lane]);
          const u32 sg = __byte_perm(sz[0], 0, 0x1010), sg8 = __byte_perm(sz[0], 0, 0x3232);
          const u32 zg = __byte_perm(sz[1], 0, 0x1010), zg8 = __byte_perm(sz[1], 0, 0x3232);
#pragma unroll
          for (int j = 0; j < 4; j++) {
            const u32 w = wv[j];
            const u32 a0 = dq(w, 0, sg, zg), a1 = dq(w, 4, sg8, zg8), a2 = dq(w, 8, sg, zg), a3 = dq(w, 12, sg8, zg8);
#pragma unroll
            for (int m = 0; m < MT; m++) mma(acc[b][m], a0, a1, a2, a3, xw[m][2 * j], xw[m][2 * j + 1]);
          }
        }
      }
    }
    s = s == S - 1 ? 0 : s + 1;
  }
  asm volatile("cp.async.wait_group 0;");
  // acc[b][m][i]: column (nt + b) * 16 + g + 8 (i / 2), token m * 8 + 2t + i % 2
  if (KS == 1) {
#pragma unroll
    for (int b = 0; b < NTB; b++)
#pragma unroll
      for (int m = 0; m < MT; m++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
          const int tok = m * 8 + 2 * t + (i & 1);
          unsigned short h;
          asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(acc[b][m][i]));
          if (tok < M) Y[(size_t)tok * N + (nt + b) * 16 + g + 8 * (i >> 1)] = h;
        }
    return;
  }
  float* pp = P + (size_t)blockIdx.y * M * N;
#pragma unroll
  for (int b = 0; b < NTB; b++)
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int tok = m * 8 + 2 * t + (i & 1);
        if (tok < M) pp[(size_t)tok * N + (nt + b) * 16 + g + 8 * (i >> 1)] = acc[b][m][i];
      }
  __threadfence();  // the partials are visible before the counter says so
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&CNT[blockIdx.x], 1u) == (unsigned)(KS - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int cols = TPB * 16, col0 = blockIdx.x * cols;
  for (int i = threadIdx.x; i < M * cols; i += WN * 32) {
    const size_t o = (size_t)(i / cols) * N + col0 + i % cols;
    float v = 0.f;
    for (int k = 0; k < KS; k++) v += __ldcg(P + (size_t)k * M * N + o);
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    Y[o] = h;
  }
  if (threadIdx.x == 0) CNT[blockIdx.x] = 0u;  // zero again for the next launch
}
"""


def smem_bytes(wn: int, ntb: int, mt: int, u: int, stages: int) -> int:
    """A block's static shared memory: per stage, MT * 8 rows of U chunks of activations, and
    each tile's words (512 bytes a chunk) and its lanes' scales and zeros (256)."""
    return stages * (mt * 8 * (u * 64 + 8) * 2 + wn * ntb * u * (512 + 256)) + 16


def stages_for(wn: int, ntb: int, mt: int, u: int):
    """The deepest pipeline (4 or 3 stages) that fits, or None."""
    return next((s for s in (4, 3) if smem_bytes(wn, ntb, mt, u, s) <= SMEM), None)


def splits(N: int, K: int, cols: int, u: int, sms: int) -> list:
    """KS candidates: the fewest splits giving at least one block an SM, and twice that, each
    split keeping at least 4 stages of chunks."""
    blocks, kc = N // cols, K // 64
    ks = 1
    while blocks * ks < sms and kc // (ks * 2) >= 4 * u:
        ks *= 2
    return [k for k in (ks, 2 * ks) if kc // k >= 4 * u]


def wide_configs(M: int, N: int, K: int, sms: int) -> list:
    """The kernel's candidates at M <= KERNEL_MAX_M tokens for a K x N layer on sms SMs."""
    mt = -(-M // 8)
    if not 1 <= M <= KERNEL_MAX_M:
        return []
    return [{"kind": "mma_wide", "wn": wn, "ntb": ntb, "u": u, "s": stages_for(wn, ntb, mt, u), "ks": ks}
            for wn, ntb, u in CONFIGS if N % (16 * wn * ntb) == 0 and stages_for(wn, ntb, mt, u)
            for ks in splits(N, K, 16 * wn * ntb, u, sms)]


@lru_cache(maxsize=None)
def _kernel(wn: int, mt: int, u: int, ntb: int, stages: int):
    name = f"w4a16_mma_wide_wn{wn}_mt{mt}_u{u}_ntb{ntb}_s{stages}"
    src = f"#define WN {wn}\n#define MT {mt}\n#define U {u}\n#define NTB {ntb}\n#define S {stages}\n" \
          f"#define KNAME {name}\n" + SOURCE
    return torch.cuda._compile_kernel(src, name)


_counters = {}  # device -> int32 [COUNTERS], zero between launches


def _counter(device) -> torch.Tensor:
    key = (device.type, device.index)
    if key not in _counters:
        _counters[key] = torch.zeros(COUNTERS, device=device, dtype=torch.int32)
    return _counters[key]


def wide_launch(x: torch.Tensor, words: torch.Tensor, sz: torch.Tensor, cfg: dict, out=None) -> torch.Tensor:
    """x [M, K] bf16 (M <= KERNEL_MAX_M, contiguous) @ the mma-layout weight -> out [M, N] bf16,
    on the current stream (graph-capturable; the partial sums' workspace comes from torch's
    allocator, the counters are made on the first launch and stay zero after each)."""
    M, K = x.shape
    N, KG = words.shape[0] * 16, sz.shape[1]
    wn, ntb, u, ks, stages = cfg["wn"], cfg["ntb"], cfg["u"], cfg["ks"], cfg["s"]
    cols, mt = 16 * wn * ntb, -(-M // 8)
    shape_ok = 1 <= M <= KERNEL_MAX_M and stages >= 2 and smem_bytes(wn, ntb, mt, u, stages) <= SMEM \
        and N % cols == 0 and N // cols <= COUNTERS
    if not (shape_ok and x.dtype == torch.bfloat16 and x.is_contiguous() and K == words.shape[1] * 64
            and 1 <= ks <= K // 64):
        raise ValueError(f"wide_launch: x {tuple(x.shape)} {x.dtype} against a [{words.shape[1] * 64}, {N}] layer, "
                         f"config {cfg}")
    if out is None:
        out = torch.empty(M, N, device=x.device, dtype=torch.bfloat16)
    partial = torch.empty(ks if ks > 1 else 0, M, N, device=x.device, dtype=torch.float32)
    gshift = (K // 64 // KG).bit_length() - 1
    kernel = _kernel(wn, mt, u, ntb, stages)
    kernel(grid=(N // cols, ks, 1), block=(32 * wn, 1, 1),
           args=[words, sz, x, out, partial, _counter(x.device), M, N, K, gshift])
    return out

"""Experiment for issue 20's proposal (benchmarks/NOTES.md, sessions 16-17): a CUDA C++ W4A16
kernel for M <= 32, compiled at run time by NVRTC (torch.cuda._compile_kernel), timed against
the Triton kpack pick of the same shape in the same run. Not wired into the engine: it is the
evidence for or against moving the decode GEMM out of Triton.

The technique (Marlin's, written here from the PTX ISA's fragment layouts): the weight is
repacked once so that one 128-bit load of a lane holds its A fragments of four
mma.sync.m16n8k16 (the layer transposed: 16 output columns are the MMA's M, tokens its N):
  word[nt, kc, lane, j] = the 8 nibbles lane (g = lane / 4, t = lane % 4) feeds step j of
  64-row chunk kc of 16-column tile nt; fragment element e (PTX: rows g, g + 8 for e / 2 odd,
  columns 2t, 2t + 1, + 8 for e >= 4) sits at nibble e / 2 + 4 (e % 2), so one shift and one
  mask give a bf16 pair (0x4300 | q = 128 + q), and two bf16x2 FMAs give (q - z) * s.
Inside a chunk the K order is permuted (the same for weights and activations, so the product
is unchanged): lane t's activations for the chunk's four steps are the 16 contiguous values at
16t, two 128-bit loads. Scales and zeros: one 64-bit load a lane a group, (s_g, s_g+8,
-(128 + z_g), -(128 + z_g+8)). Each 16-column tile is one block; its warps split K and add
their fragments in shared memory at the end.

    python3 benchmarks/w4a16_cuda_proto.py [--ms 1,8,16,32] [--shapes 18944x3584] [--out $OUT/cuda_proto.json]
    python3 benchmarks/w4a16_cuda_proto.py --selfcheck   # the layout, emulated on the CPU
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

G = 128  # the group size this experiment handles
SHAPES = [(3584, 4608), (3584, 3584), (3584, 37888), (18944, 3584)]  # (K, N) of Qwen2.5-7B's layers
# e -> its nibble: e / 2 + 4 (e % 2)
NIBBLE = [0, 4, 1, 5, 2, 6, 3, 7]


def repack(q: torch.Tensor, z: torch.Tensor, s: torch.Tensor):
    """q [K, N], z [K / G, N] integers 0..15, s [K / G, N] bf16 -> (words int32 [N/16, K/64, 32, 4],
    sz bf16 [N/16, K/G, 8, 4]: s_g, s_g+8, -(128 + z_g), -(128 + z_g+8))."""
    K, N = q.shape
    # k = kc 64 + t 16 + j 4 + (e >> 2) 2 + (e & 1); n = nt 16 + ((e >> 1) & 1) 8 + g
    v = q.to(torch.int64).view(K // 64, 4, 4, 2, 2, N // 16, 2, 8)  # kc t j hi lo nt mid g
    v = v.permute(5, 0, 7, 1, 2, 3, 6, 4)  # nt kc g t j hi mid lo (e = 4 hi + 2 mid + lo)
    v = v.reshape(N // 16, K // 64, 32, 4, 8)
    shifts = torch.tensor([4 * NIBBLE[e] for e in range(8)], dtype=torch.int64, device=q.device)
    words = (v << shifts).sum(-1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    zb = (-(128 + z.to(torch.float32))).to(torch.bfloat16)
    pair = lambda a: a.view(K // G, N // 16, 2, 8).permute(1, 0, 3, 2)  # noqa: E731 - nt kg g (row g, g+8)
    sz = torch.cat([pair(s.to(torch.bfloat16)), pair(zb)], dim=-1).contiguous()
    return words.contiguous(), sz


def emulate(x: torch.Tensor, words: torch.Tensor, sz: torch.Tensor) -> torch.Tensor:
    """What the kernel computes, read the way its lanes read (float32, on any device): y [M, N]."""
    NT, KC = words.shape[:2]
    M, K, N = x.shape[0], KC * 64, NT * 16
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
            sc = s[:, torch.arange(KC) // 2][:, :, g, reg & 1]  # [NT, KC, 32]
            zz = nz[:, torch.arange(KC) // 2][:, :, g, reg & 1]
            val = (nib.float() + 128 + zz[..., None]).to(torch.bfloat16).float() * sc[..., None]
            a[:, :, :, row, col] = val.to(torch.bfloat16).float().permute(0, 1, 3, 2)
    for m in range(M):
        xs = x[m].float().view(KC, 4, 16)  # chunk, t, the lane's 16 values
        b = torch.zeros(KC, 4, 16)  # [chunk, step j, col k]
        for tt in range(4):
            for j in range(4):
                for r in range(2):
                    for half in range(2):
                        b[:, j, 2 * tt + half + 8 * r] = xs[:, tt, 4 * j + 2 * r + half]
        y[m] = torch.einsum("nkjrc,kjc->nr", a, b).reshape(N)
    return y


SOURCE = r"""
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
// bf16 pair (q_lo - z, q_hi - z) * s of the two nibbles at bits sh and sh + 16
__device__ __forceinline__ u32 dq(u32 w, int sh, u32 s2, u32 nz2) {
  u32 v = ((w >> sh) & 0x000F000Fu) | 0x43004300u, d, r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(v), "r"(0x3F803F80u), "r"(nz2));
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(d), "r"(s2), "r"(0x80008000u));
  return r;
}
__device__ __forceinline__ void mma(float (&c)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

extern "C" __global__ void __launch_bounds__(NW * 32)
KNAME(const u32* __restrict__ W, const u32* __restrict__ SZ, const unsigned short* __restrict__ X,
      unsigned short* __restrict__ Y, int M, int N, int K) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int nt = blockIdx.x, KC = K >> 6, KG = K >> 7;
  const int c0 = warp * KC / NW, c1 = (warp + 1) * KC / NW;
  float acc[MT][4];
#pragma unroll
  for (int m = 0; m < MT; m++)
#pragma unroll
    for (int i = 0; i < 4; i++) acc[m][i] = 0.f;
  const u32* wp = W + ((size_t)nt * KC * 32 + lane) * 4;
  const u32* sp = SZ + ((size_t)nt * KG * 8 + g) * 2;
  const unsigned short* xp[MT];
  bool xv[MT];
#pragma unroll
  for (int m = 0; m < MT; m++) {
    const int tok = m * 8 + g;
    xv[m] = tok < M;
    xp[m] = X + (size_t)(xv[m] ? tok : 0) * K + 16 * t;
  }
  for (int c = c0; c < c1; c += U) {
    u32 wv[U][4];
#pragma unroll
    for (int u = 0; u < U; u++)
      if (c + u < c1) ldg4(wv[u], wp + (size_t)(c + u) * 128);
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (c + u < c1) {
        const int cc = c + u;
        u32 sz[2];
        ldsz(sz, sp + (size_t)(cc >> 1) * 16);
        const u32 sg = __byte_perm(sz[0], 0, 0x1010), sg8 = __byte_perm(sz[0], 0, 0x3232);
        const u32 zg = __byte_perm(sz[1], 0, 0x1010), zg8 = __byte_perm(sz[1], 0, 0x3232);
        u32 xw[MT][8];  // the lane's 16 activations of the chunk, as bf16 pairs
#pragma unroll
        for (int m = 0; m < MT; m++) {
          if (xv[m]) {
            ldx4(&xw[m][0], xp[m] + cc * 64);
            ldx4(&xw[m][4], xp[m] + cc * 64 + 8);
          } else {
#pragma unroll
            for (int i = 0; i < 8; i++) xw[m][i] = 0u;
          }
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
          const u32 w = wv[u][j];
          const u32 a0 = dq(w, 0, sg, zg), a1 = dq(w, 4, sg8, zg8), a2 = dq(w, 8, sg, zg), a3 = dq(w, 12, sg8, zg8);
#pragma unroll
          for (int m = 0; m < MT; m++) {
            mma(acc[m], a0, a1, a2, a3, xw[m][2 * j], xw[m][2 * j + 1]);
          }
        }
      }
    }
  }
  __shared__ float red[NW][MT * 4][32];
#pragma unroll
  for (int m = 0; m < MT; m++)
#pragma unroll
    for (int i = 0; i < 4; i++) red[warp][m * 4 + i][lane] = acc[m][i];
  __syncthreads();
  for (int idx = threadIdx.x; idx < MT * 128; idx += NW * 32) {
    const int mi = idx >> 5, l = idx & 31;
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < NW; w++) s += red[w][mi][l];
    const int m = mi >> 2, i = mi & 3;
    const int row = (l >> 2) + ((i >> 1) << 3), tok = m * 8 + 2 * (l & 3) + (i & 1);
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(s));
    if (tok < M) Y[(size_t)tok * N + nt * 16 + row] = h;
  }
}
"""


def source(nw: int, mt: int, u: int) -> tuple[str, str]:
    name = f"w4a16_m16_nw{nw}_mt{mt}_u{u}"
    return f"#define NW {nw}\n#define MT {mt}\n#define U {u}\n#define KNAME {name}\n" + SOURCE, name


CONFIGS = [(nw, u) for nw in (4, 8, 16) for u in (2, 4, 8)]
MAX_MT = 4  # up to M = 32


class Proto:
    """The compiled variants (NVRTC), launched on the current stream."""

    def __init__(self):
        self.kernels = {}

    def launch(self, x, words, sz, out, nw: int, u: int):
        M, K = x.shape
        N = out.shape[1]
        mt = -(-M // 8)  # 8-token MMA tiles, each fed by the same dequantized fragment
        assert 1 <= mt <= MAX_MT, M
        key = (nw, mt, u)
        if key not in self.kernels:
            src, name = source(nw, mt, u)
            self.kernels[key] = torch.cuda._compile_kernel(src, name)
        self.kernels[key](grid=(N // 16, 1, 1), block=(32 * nw, 1, 1), args=[words, sz, x, out, M, N, K])
        return out


def selfcheck() -> None:
    """The repack and the lanes' reading of it against x @ dequant(w), on the CPU."""
    gen = torch.Generator().manual_seed(0)
    for M, K, N in [(1, 256, 32), (5, 384, 48), (16, 128, 16), (27, 128, 32)]:
        q = torch.randint(0, 16, (K, N), generator=gen)
        z = torch.randint(0, 16, (K // G, N), generator=gen)
        s = (torch.rand(K // G, N, generator=gen) * 0.02 + 0.001).to(torch.bfloat16)
        x = torch.randn(M, K, generator=gen).to(torch.bfloat16)
        w = ((q - z.repeat_interleave(G, 0)).to(torch.bfloat16) * s.repeat_interleave(G, 0)).float()
        ref = x.float() @ w
        got = emulate(x, *repack(q, z, s))
        err = ((got - ref).norm() / ref.norm()).item()
        print(f"selfcheck M={M} K={K} N={N}: rel err {err:.2e}")
        assert err < 1e-5, err


def time_shape(proto: Proto, K: int, N: int, ms: list, gen) -> list:
    """Rows for one layer: every CUDA config checked against x @ dequant(w) and timed on
    CUDA-graph replays rotating through weight sets (cold L2, as K1), beside the Triton pick."""
    from benchmarks.kernel_bench import bench_rot, nsets
    from llm_kernels import awq
    from llm_kernels.awq import pack_awq_int4

    wbytes = K * N // 2 + (K // G) * N * 2 + (K // G) * N // 2  # K1's: int4 words, bf16 scales, int4 zeros
    sets = []
    for _ in range(nsets(wbytes)):
        q = torch.randint(0, 16, (K, N), device="cuda", generator=gen, dtype=torch.int32)
        z = torch.randint(0, 16, (K // G, N), device="cuda", generator=gen, dtype=torch.int32)
        s = (torch.rand(K // G, N, device="cuda", generator=gen) * 0.01 + 0.001).to(torch.bfloat16)
        sets.append((awq.awq_prepare(pack_awq_int4(q), pack_awq_int4(z), s, G), *repack(q, z, s)))
        if len(sets) == 1:
            ref_w = ((q - z.repeat_interleave(G, 0)).float() * s.float().repeat_interleave(G, 0))
    rows = []
    bw = 4.27e12  # GPU.md's measured copy rate; ratios below are to this floor
    for M in ms:
        x = (torch.randn(M, K, device="cuda", generator=gen)).to(torch.bfloat16)
        ref = x.float() @ ref_w
        awq.awq_linear(x, sets[0][0])  # the tuner picks the Triton config first
        triton_s = bench_rot([lambda p=st[0]: awq.awq_linear(x, p) for st in sets])
        floor = (wbytes + 2 * M * (K + N)) / bw
        out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        for nw, u in CONFIGS:
            out.fill_(float("nan"))
            proto.launch(x, sets[0][1], sets[0][2], out, nw, u)
            err = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
            t = bench_rot([lambda st=st: proto.launch(x, st[1], st[2], out, nw, u) for st in sets])
            rows.append({"case": f"{K}x{N} M={M}", "config": f"nw={nw} u={u}", "rel_err": err,
                         "time_us": t * 1e6, "triton_us": triton_s * 1e6, "ratio_to_triton": triton_s / t,
                         "ratio_to_floor": floor / t, "triton_ratio_to_floor": floor / triton_s})
    del sets
    torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default="1,8,16,32")
    ap.add_argument("--shapes", default=None, help="KxN,KxN (default: Qwen2.5-7B's four layers)")
    ap.add_argument("--selfcheck", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.selfcheck:
        selfcheck()
        return
    gen = torch.Generator(device="cuda").manual_seed(1234)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    proto, rows = Proto(), []
    for K, N in shapes:
        rows += time_shape(proto, K, N, [int(m) for m in args.ms.split(",")], gen)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(rows, f, indent=1)
    print(f"{'case':20} {'config':12} {'rel err':>8} {'us':>7} {'floor':>6} {'triton us':>9} {'floor':>6} {'x triton':>8}")
    for r in rows:
        print(f"{r['case']:20} {r['config']:12} {r['rel_err']:8.1e} {r['time_us']:7.1f} {r['ratio_to_floor']:6.2f} "
              f"{r['triton_us']:9.1f} {r['triton_ratio_to_floor']:6.2f} {r['ratio_to_triton']:8.2f}")
    best = {}
    for r in rows:
        if r["rel_err"] < 1e-2 and (r["case"] not in best or r["time_us"] < best[r["case"]]["time_us"]):
            best[r["case"]] = r
    print("best correct config a case:")
    for case, r in best.items():
        print(f"  {case:20} {r['config']:12} {r['ratio_to_floor']:.2f} of the floor (Triton "
              f"{r['triton_ratio_to_floor']:.2f}), {r['ratio_to_triton']:.2f}x the Triton pick")


if __name__ == "__main__":
    main()

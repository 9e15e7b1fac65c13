"""The fused MoE's grouped GEMM on 4-bit experts in the dense path's K-packed layout
(llm_kernels.w4a16.kpack): the rows, blocks and outputs of llm_kernels.moe_gemm (the same
`moe_align` blocks, gather, gating and routing weights), the weights as the kpack kernel
takes them: a 128-row block of one expert's column tile is 32 rows of half-words, eight
nibble planes of 16 rows, each dequantized by one PTX routine into a tensor-core operand,
all eight dots into one accumulator (the gate's, and one more for the up projection of a
gated GEMM). AutoAWQ's own layout packs 8 columns a word instead: a kernel on it keeps eight
accumulators a projection, one per nibble plane, or widens the words through shared memory
(llm_kernels.moe_gemm). The engine repacks AWQ experts once at load (kpack_experts).

A program owns one M block (one expert) and one BLOCK_N tile of outputs and walks all of K
(an expert's K is 2,048 or 768 on Qwen3-30B-A3B: short loops, many programs). SWAP computes
out^T = W^T x^T, the dequantized weights as the dot's first operand (registers, where
Hopper's wgmma takes it), as the dense kernel's swap does.
"""
from typing import NamedTuple

import torch
import triton.language as tl

from llm_kernels.dispatch import jit_helper, lazy_jit, uses_helpers_of
from llm_kernels.moe_gemm import block_of, block_rows
from llm_kernels.pdl import gdc_launch_dependents, gdc_wait
from llm_kernels.w4a16.kpack import (ROWS, STRIPE, dequant_asm, kpack_add_scaled, kpack_dequantize_reference,
                                     kpack_from_awq, kpack_plane_dot, kpack_zeros)

uses_helpers_of(__name__, "llm_kernels.w4a16.kpack", "llm_kernels.moe_gemm")


class KPackExperts(NamedTuple):
    """E experts' 4-bit weights of one projection (K inputs, N outputs) in the kpack layout,
    stacked: qk int16 [E, N'/S, K/4, S], zeros int16 [E, K/G, N], scales [E, K/G, N]
    (llm_kernels.w4a16.kpack.kpack_from_awq of each expert). For w13, N = 2I: the gate's
    columns, then the up's."""

    qk: torch.Tensor
    zeros: torch.Tensor
    scales: torch.Tensor
    group_size: int

    @property
    def shape(self) -> tuple[int, int, int]:
        """(E, N, K), as a dense [E, N, K] weight's."""
        return self.qk.shape[0], self.scales.shape[2], self.qk.shape[2] * 4


def kpack_fits(K: int, group_size: int) -> bool:
    """Whether experts of K inputs and this group size take the kpack layout."""
    return K % ROWS == 0 and group_size % 16 == 0


def kpack_experts(w, chunk: int = 16) -> KPackExperts:
    """AWQ experts (llm_kernels.moe.AWQExperts) repacked, `chunk` experts at a time: side by
    side along the outputs they are one AWQ matrix whose kpack stripes never straddle two
    experts when N is whole stripes (a few dozen calls a model, not one per expert; the
    transient memory is a chunk's unpacked int32 weights). Other N: one expert at a time."""
    E, K, N8 = w.qweight.shape
    N, G = N8 * 8, w.group_size
    if N % STRIPE:
        packed = [kpack_from_awq(w.qweight[e], w.qzeros[e], G) for e in range(E)]
        return KPackExperts(torch.stack([q for q, _ in packed]), torch.stack([z for _, z in packed]),
                            w.scales.contiguous(), G)
    qks, zeros = [], []
    for e0 in range(0, E, chunk):
        q, z = w.qweight[e0 : e0 + chunk], w.qzeros[e0 : e0 + chunk]
        c = q.shape[0]
        qk, zc = kpack_from_awq(q.permute(1, 0, 2).reshape(K, c * N8), z.permute(1, 0, 2).reshape(K // G, c * N8), G)
        qks.append(qk.view(c, N // STRIPE, K // 4, STRIPE))
        zeros.append(zc.view(K // G, c, N).permute(1, 0, 2))
    return KPackExperts(torch.cat(qks), torch.cat(zeros).contiguous(), w.scales.contiguous(), G)


def kpack_experts_dequantize(w: KPackExperts, e: int, dtype=torch.float32) -> torch.Tensor:
    """Expert e's dense [N, K] weight (the reference's)."""
    return kpack_dequantize_reference(w.qk[e], w.zeros[e], w.scales[e], w.group_size, dtype).t()


@jit_helper
def _block_planes(acc, xrow, mmask, h_ptrs, S, z_ptrs, s_ptrs, nmask, k0, N_ALL, G: tl.constexpr,
                  PPG: tl.constexpr, NBASE: tl.constexpr, A0: tl.constexpr, A1: tl.constexpr, A2: tl.constexpr,
                  A3: tl.constexpr, EXACT: tl.constexpr, SWAP: tl.constexpr):
    """acc + one 128-row block: its half-words (two [16, BN] loads, [BN, 16] when SWAP), the
    eight planes' dots, each group's float32 sum times its scales."""
    ha = tl.load(h_ptrs, mask=nmask[None, :] if not SWAP else nmask[:, None], other=0)
    hb = tl.load(h_ptrs + 16 * S, mask=nmask[None, :] if not SWAP else nmask[:, None], other=0)
    gacc = tl.zeros_like(acc)
    for p in tl.static_range(8):
        if p % PPG == 0:  # a group starts: its zeros and scales
            g = (k0 + 16 * p) // G
            zi = tl.load(z_ptrs + g * N_ALL, mask=nmask, other=0).to(tl.int32)
            sc = tl.load(s_ptrs + g * N_ALL, mask=nmask, other=0.0).to(tl.float32)
            nz, zf = kpack_zeros(zi, NBASE, SWAP)
        gacc = kpack_plane_dot(gacc, xrow, mmask, ha, hb, p, nz, zf, A0, A1, A2, A3, EXACT, SWAP)
        if (p + 1) % PPG == 0:
            acc = kpack_add_scaled(acc, gacc, sc, SWAP)
            gacc = tl.zeros_like(acc)
    return acc


@lazy_jit(pdl=True, do_not_specialize=["num_valid"])
def _moe_kpack_kernel(
    a_ptr, qk_ptr, z_ptr, s_ptr, out_ptr, ids_ptr, blk_e_ptr, total_ptr, topw_ptr,
    N, num_valid, num_m, stride_am, stride_om, stride_qe, stride_ze, stride_se,
    NBLK: tl.constexpr, S: tl.constexpr, G: tl.constexpr, PPG: tl.constexpr, NBASE: tl.constexpr,
    A_DIV: tl.constexpr, GATED: tl.constexpr, MUL_W: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    A0: tl.constexpr, A1: tl.constexpr, A2: tl.constexpr, A3: tl.constexpr, EXACT: tl.constexpr,
    SWAP: tl.constexpr, GROUP_M: tl.constexpr, PDL: tl.constexpr = False,
):
    """out[id] = act(A[id // A_DIV] @ W[e]) (* w[id]) for the ids of one M block of expert e and
    BLOCK_N of the N output columns (GATED: the gate's, and the up's N further on)."""
    if PDL:  # programmatic dependent launch (llm_kernels.pdl): wait for the previous kernel here
        gdc_wait()
        gdc_launch_dependents()
    pid = tl.program_id(0)
    pid_m, pid_n = block_of(pid, num_m, tl.cdiv(N, BLOCK_N), GROUP_M)
    if pid_m * BLOCK_M >= tl.load(total_ptr):
        return  # padding past the last expert's rows
    ids, valid, e, rows = block_rows(ids_ptr, blk_e_ptr, pid_m, num_valid, A_DIV, BLOCK_M)
    N_ALL = 2 * N if GATED else N  # columns of the stored weight (gate then up)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    r16 = tl.arange(0, 16)
    qk_e = qk_ptr + e * stride_qe
    # column n of half-word row k4 sits at (n // S) (NBLK 32 S) + k4 S + n % S
    col_g = (rn // S).to(tl.int64) * (NBLK * 32 * S) + rn % S
    col_u = ((rn + N) // S).to(tl.int64) * (NBLK * 32 * S) + (rn + N) % S
    if SWAP:
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        hg = qk_e + col_g[:, None] + r16[None, :] * S
        hu = qk_e + col_u[:, None] + r16[None, :] * S
        xrow = a_ptr + rows[None, :] * stride_am + r16[:, None]
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        hg = qk_e + col_g[None, :] + r16[:, None] * S
        hu = qk_e + col_u[None, :] + r16[:, None] * S
        xrow = a_ptr + rows[:, None] * stride_am + r16[None, :]
    up = tl.zeros_like(acc)
    z_e = z_ptr + e * stride_ze + rn
    s_e = s_ptr + e * stride_se + rn
    for blk in range(NBLK):
        k0 = blk * 128  # a packed block: ROWS rows of K
        acc = _block_planes(acc, xrow + k0, valid, hg + blk * 32 * S, S, z_e, s_e, nmask, k0, N_ALL, G, PPG, NBASE,
                            A0, A1, A2, A3, EXACT, SWAP)
        if GATED:
            up = _block_planes(up, xrow + k0, valid, hu + blk * 32 * S, S, z_e + N, s_e + N, nmask, k0, N_ALL, G,
                               PPG, NBASE, A0, A1, A2, A3, EXACT, SWAP)
    if GATED:
        acc = acc / (1.0 + tl.exp(-acc)) * up
    if SWAP:
        if MUL_W:
            acc = acc * tl.load(topw_ptr + ids, mask=valid, other=0.0).to(tl.float32)[None, :]
        optr = out_ptr + ids.to(tl.int64)[None, :] * stride_om + rn[:, None]
        tl.store(optr, acc.to(out_ptr.dtype.element_ty), mask=valid[None, :] & nmask[:, None])
    else:
        if MUL_W:
            acc = acc * tl.load(topw_ptr + ids, mask=valid, other=0.0).to(tl.float32)[:, None]
        optr = out_ptr + ids.to(tl.int64)[:, None] * stride_om + rn[None, :]
        tl.store(optr, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & nmask[None, :])


def launch(a, weights, out, align, topk_weights, cfg: dict, *, a_div: int, gated: bool, mul_w: bool):
    """One grouped GEMM into out [T * top_k, N] on KPackExperts (N_all = 2 N columns when
    gated), with a config of llm_kernels.moe.moe_configs of kind "kpack"."""
    sorted_ids, block_expert, total = align
    N = out.shape[1]
    qk, zeros, scales, G = weights.qk, weights.zeros, weights.scales, weights.group_size
    K = qk.shape[2] * 4
    bm, bn = cfg["BM"], cfg["BN"]
    num_m = sorted_ids.numel() // bm
    exact = a.dtype == torch.float32 or not a.is_cuda
    asm = [""] * 4 if exact else [dequant_asm(j, a.dtype) for j in range(4)]
    _moe_kpack_kernel[(num_m * -(-N // bn),)](
        a, qk, zeros, scales, out, sorted_ids, block_expert, total, topk_weights,
        N, topk_weights.numel(), num_m, a.stride(0), out.stride(0), qk.stride(0), zeros.stride(0), scales.stride(0),
        NBLK=K // ROWS, S=qk.shape[3], G=G, PPG=min(8, G // 16), NBASE=0xC300 if a.dtype == torch.bfloat16 else 0xE400,
        A_DIV=a_div, GATED=gated, MUL_W=mul_w, BLOCK_M=bm, BLOCK_N=bn,
        A0=asm[0], A1=asm[1], A2=asm[2], A3=asm[3], EXACT=exact, SWAP=bool(cfg.get("swap")), GROUP_M=cfg.get("GM", 8),
        num_warps=cfg.get("warps", 4), num_stages=cfg.get("stages", 3),
    )
    return out

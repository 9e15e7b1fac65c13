"""The fused MoE's grouped GEMM on AWQ experts (llm_kernels.moe.AWQExperts: AutoAWQ's GEMM
layout stacked per expert) by nibble planes: the rows, blocks and outputs of
llm_kernels.moe_gemm (the same `moe_align` blocks, gather, gating and routing weights), the
weights multiplied as llm_kernels.w4a16.ckpt's kernel does.

A word of AutoAWQ's qweight holds 8 columns of one row; nibble plane j of a tile of words
[BK, BLOCK_W] is the weight of columns 8 w + ORDER[j]. Each plane is its own `tl.dot`
against the same activation tile, into its own accumulator (eight, and eight more for the
up projection of a gated GEMM), and a plane becomes 16-bit floats OFF + q with one AND/OR
(inline PTX on CUDA), corrected per block with the rows' sums. Widening the words to a
[BK, 8 BLOCK_W] tile instead (the dense grouped GEMM's way) needs a broadcast and reshape
that Triton lowers through shared memory: the compiled loop (sm_90) wrote every widened
tile to shared memory and read it back before each dot.
"""
import torch
import triton.language as tl

from llm_kernels.dispatch import jit_helper, lazy_jit, uses_helpers_of
from llm_kernels.moe_gemm import block_of, block_rows
from llm_kernels.w4a16.ckpt import ASM_PAIR, planes_step, plane_scales, store8, zeros8

uses_helpers_of(__name__, "llm_kernels.w4a16.ckpt", "llm_kernels.moe_gemm")


@lazy_jit(do_not_specialize=["num_valid"])
def _moe_awq_kernel(
    a_ptr, qw_ptr, qz_ptr, s_ptr, out_ptr, ids_ptr, blk_e_ptr, total_ptr, topw_ptr,
    N, K, num_valid, num_m, G, stride_am, stride_om, stride_qe, stride_ze, stride_se,
    A_DIV: tl.constexpr, GATED: tl.constexpr, MUL_W: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_W: tl.constexpr,
    BK: tl.constexpr, OFF: tl.constexpr, MAGIC: tl.constexpr, ASM: tl.constexpr, DEQ: tl.constexpr,
    FP32: tl.constexpr, GROUP_M: tl.constexpr,
):
    """out[id] = act(A[id // A_DIV] @ W[e]) (* w[id]) for the ids of one M block of expert e and
    8 BLOCK_W of the N output columns (GATED: the gate's, and the up's N further on)."""
    pid = tl.program_id(0)
    N8 = N // 8
    NW = 2 * N8 if GATED else N8  # words in a row of qweight and qzeros
    pid_m, pid_n = block_of(pid, num_m, tl.cdiv(N8, BLOCK_W), GROUP_M)
    if pid_m * BLOCK_M >= tl.load(total_ptr):
        return  # padding past the last expert's rows
    ids, valid, e, rows = block_rows(ids_ptr, blk_e_ptr, pid_m, num_valid, A_DIV, BLOCK_M)
    rk = tl.arange(0, BK)
    rw = pid_n * BLOCK_W + tl.arange(0, BLOCK_W)
    wmask = rw < N8
    a_ptrs = a_ptr + rows[:, None] * stride_am + rk[None, :]
    q_ptrs = qw_ptr + e * stride_qe + rk[:, None].to(tl.int64) * NW + rw[None, :]
    z_ptrs = qz_ptr + e * stride_ze + rw
    s_base = s_ptr + e * stride_se
    g0, g1, g2, g3, g4, g5, g6, g7 = zeros8(BLOCK_M, BLOCK_W)
    u0, u1, u2, u3, u4, u5, u6, u7 = zeros8(BLOCK_M, BLOCK_W)
    for k0 in range(0, K, BK):  # K is whole groups, BK divides the group
        x = tl.load(a_ptrs + k0, mask=valid[:, None], other=0.0)
        xs = tl.sum(x.to(tl.float32), axis=1)
        grp = k0 // G
        w = tl.load(q_ptrs + k0 * NW, mask=wmask[None, :], other=0)
        zw = tl.load(z_ptrs + grp * NW, mask=wmask, other=0)
        s0, s1, s2, s3, s4, s5, s6, s7 = plane_scales(s_base, grp, NW * 8, rw, N8)
        g0, g1, g2, g3, g4, g5, g6, g7 = planes_step(g0, g1, g2, g3, g4, g5, g6, g7, x, xs, w, zw,
                                                      s0, s1, s2, s3, s4, s5, s6, s7, DEQ, MAGIC, ASM, OFF, FP32)
        if GATED:  # the up projection: the words N8 on, the scales N on
            w = tl.load(q_ptrs + k0 * NW + N8, mask=wmask[None, :], other=0)
            zw = tl.load(z_ptrs + grp * NW + N8, mask=wmask, other=0)
            s0, s1, s2, s3, s4, s5, s6, s7 = plane_scales(s_base + N, grp, NW * 8, rw, N8)
            u0, u1, u2, u3, u4, u5, u6, u7 = planes_step(u0, u1, u2, u3, u4, u5, u6, u7, x, xs, w, zw,
                                                          s0, s1, s2, s3, s4, s5, s6, s7, DEQ, MAGIC, ASM, OFF,
                                                          FP32)
    if GATED:
        g0, g1, g2, g3 = _silu_mul(g0, u0), _silu_mul(g1, u1), _silu_mul(g2, u2), _silu_mul(g3, u3)
        g4, g5, g6, g7 = _silu_mul(g4, u4), _silu_mul(g5, u5), _silu_mul(g6, u6), _silu_mul(g7, u7)
    if MUL_W:
        rw_w = tl.load(topw_ptr + ids, mask=valid, other=0.0).to(tl.float32)[:, None]
        g0, g1, g2, g3, g4, g5, g6, g7 = g0 * rw_w, g1 * rw_w, g2 * rw_w, g3 * rw_w, g4 * rw_w, g5 * rw_w, \
            g6 * rw_w, g7 * rw_w
    optr = out_ptr + ids.to(tl.int64)[:, None] * stride_om + rw[None, :] * 8
    store8(optr, valid[:, None] & wmask[None, :], g0, g1, g2, g3, g4, g5, g6, g7)


@jit_helper
def _silu_mul(g, u):
    """silu(g) * u, in float32."""
    return g / (1.0 + tl.exp(-g)) * u


def launch(a, weights, out, align, topk_weights, cfg: dict, *, a_div: int, gated: bool, mul_w: bool):
    """One grouped GEMM into out [T * top_k, N] on AWQ experts (qweight [E, K, N_all/8], N_all =
    2 N when gated), with a config of llm_kernels.moe.moe_configs ("BW" words a program)."""
    sorted_ids, block_expert, total = align
    N = out.shape[1]
    qw, qz, sc, G = weights.qweight, weights.qzeros, weights.scales, weights.group_size
    K = qw.shape[1]
    bm, bw = cfg["BM"], cfg["BW"]
    num_m = sorted_ids.numel() // bm
    half = a.dtype in (torch.float16, torch.bfloat16)
    deq = (2 if a.is_cuda else 1) if half else 0  # PTX planes on CUDA, the same magic in Triton interpreted
    _moe_awq_kernel[(num_m * -(-(N // 8) // bw),)](
        a, qw, qz, sc, out, sorted_ids, block_expert, total, topk_weights,
        N, K, topk_weights.numel(), num_m, G, a.stride(0), out.stride(0), qw.stride(0), qz.stride(0), sc.stride(0),
        A_DIV=a_div, GATED=gated, MUL_W=mul_w, BLOCK_M=bm, BLOCK_W=bw, BK=min(cfg["BK"], G),
        OFF=0.0 if deq == 0 else (128.0 if a.dtype == torch.bfloat16 else 1024.0),
        MAGIC=0x43004300 if a.dtype == torch.bfloat16 else 0x64006400, ASM=ASM_PAIR, DEQ=deq,
        FP32=a.dtype == torch.float32, GROUP_M=cfg.get("GM", 8),
        num_warps=cfg.get("warps", 4), num_stages=cfg.get("stages", 3),
    )
    return out

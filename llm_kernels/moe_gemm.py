"""The grouped GEMM of the fused MoE (llm_kernels.moe): one launch multiplies every
expert's rows by that expert's weight, dense or AWQ int4.

The rows come from llm_kernels.moe.moe_align: `sorted_ids` lists the flat
(token * top_k + slot) indices grouped by expert, each expert's run padded
to a multiple of BLOCK_M with the sentinel T * top_k; `block_expert[b]` is
the expert of rows [b BLOCK_M, (b + 1) BLOCK_M); `total` (on the device) is
the padded length, so programs past it return at once and the grid can be
sized statically (no host synchronisation, CUDA-graph safe).

A program owns one M block (one expert) and one BLOCK_N block of outputs:
  - it gathers its rows of A (row sorted_id // A_DIV: the token for the first
    projection, the flat index for the second) and walks K in BLOCK_K steps;
  - GATED: it multiplies the gate columns n and the up columns n + N of the
    same A tile, and writes silu(gate) * up (the activation fused in);
  - MUL_W: the rows' routing weights scale the result (the second projection);
  - the output row is the flat index: out [T * top_k, N], summed over the
    slots by the caller.
QUANT: B is AWQ (llm_kernels.moe.AWQExperts: the AutoAWQ GEMM layout stacked per
expert, qweight [E, K, N/8] packed 8 along N), widened in the K loop to
q - z (exact small integers in A's dtype); BLOCK_K divides the group size,
so a K step is one group and its scale multiplies the dot afterwards.
"""
import torch
import triton.language as tl

from llm_kernels.dispatch import jit_helper, lazy_jit
from llm_kernels.pdl import gdc_launch_dependents, gdc_wait


@jit_helper
def block_of(pid, num_m, num_n, GROUP_M: tl.constexpr):
    """(M block, N block) of program pid: GROUP_M M blocks side by side walk the N blocks
    together, so their weight tiles stay in L2."""
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_m = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_m, (pid % per_group) // group_m


@jit_helper
def block_rows(ids_ptr, blk_e_ptr, pid_m, num_valid, A_DIV: tl.constexpr, BLOCK_M: tl.constexpr):
    """M block pid_m's flat (token, slot) ids, which of them are real (not padding), its
    expert, and the rows of A they read (id // A_DIV)."""
    ids = tl.load(ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    return ids, ids < num_valid, tl.load(blk_e_ptr + pid_m).to(tl.int64), (ids // A_DIV).to(tl.int64)


@jit_helper
def _nibble_shifts(BLOCK_N: tl.constexpr):
    """Bit offset of each column's nibble in its word: column c of 8 sits in nibble
    (0, 4, 1, 5, 2, 6, 3, 7)[c] (AutoAWQ's order)."""
    c = tl.arange(0, BLOCK_N) % 8
    return ((c & 1) * 4 + (c >> 1)) * 4


@jit_helper
def _awq_tile(q_ptrs, z_ptrs, n8mask, shifts, like, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """q - z as [BLOCK_K, BLOCK_N] in like's dtype from packed words q [BLOCK_K, BLOCK_N/8]
    and zeros [BLOCK_N/8]: each word broadcast to its 8 columns, then shifted."""
    zw = tl.load(z_ptrs, mask=n8mask, other=0)
    z = (tl.reshape(tl.broadcast_to(zw[:, None], (BLOCK_N // 8, 8)), (BLOCK_N,)) >> shifts) & 0xF
    qw = tl.load(q_ptrs, mask=n8mask[None, :], other=0)
    q = tl.reshape(tl.broadcast_to(qw[:, :, None], (BLOCK_K, BLOCK_N // 8, 8)), (BLOCK_K, BLOCK_N))
    return (((q >> shifts[None, :]) & 0xF) - z[None, :]).to(like.dtype)


@jit_helper
def _block_dot(acc, a, b_ptrs, z_ptrs, s_ptrs, kmask, nmask, n8mask, shifts,
               QUANT: tl.constexpr, FP32: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """acc + a @ B for one K step (AWQ: a @ (q - z), times the group's scales)."""
    if QUANT:
        b = _awq_tile(b_ptrs, z_ptrs, n8mask, shifts, a, BLOCK_K, BLOCK_N)
    else:
        b = tl.load(b_ptrs, mask=kmask[:, None] & nmask[None, :], other=0.0)
    if FP32:
        d = tl.dot(a, b, input_precision="ieee")
    else:
        d = tl.dot(a, b)
    if QUANT:
        s = tl.load(s_ptrs, mask=nmask, other=0.0).to(tl.float32)
        d = d * s[None, :]
    return acc + d


@lazy_jit(pdl=True, do_not_specialize=["num_valid"])
def _moe_gemm_kernel(
    a_ptr, b_ptr, z_ptr, s_ptr, out_ptr, ids_ptr, blk_e_ptr, total_ptr, topw_ptr,
    N, K, num_valid, num_m, G, stride_am, stride_om,
    stride_be, stride_bk, stride_bn, stride_ze, stride_zg, stride_se, stride_sg, up_b, up_z, up_s,
    A_DIV: tl.constexpr, GATED: tl.constexpr, MUL_W: tl.constexpr, QUANT: tl.constexpr, FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, PDL: tl.constexpr = False,
):
    """out[id] = act(A[id // A_DIV] @ B[e]) (* w[id]) for the ids of one M block of expert e."""
    if PDL:  # programmatic dependent launch (llm_kernels.pdl): wait for the previous kernel here
        gdc_wait()
        gdc_launch_dependents()
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = block_of(pid, num_m, num_n, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(total_ptr):
        return  # padding past the last expert's rows
    ids, valid, e, rows = block_rows(ids_ptr, blk_e_ptr, pid_m, num_valid, A_DIV, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    a_ptrs = a_ptr + rows[:, None] * stride_am + rk[None, :]
    shifts = _nibble_shifts(BLOCK_N)
    if QUANT:
        rn8 = pid_n * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
        n8mask = rn8 < N // 8
        b_ptrs = b_ptr + e * stride_be + rk[:, None] * stride_bk + rn8[None, :]
        z_ptrs = z_ptr + e * stride_ze + rn8
        s_ptrs = s_ptr + e * stride_se + rn
    else:
        n8mask = nmask
        b_ptrs = b_ptr + e * stride_be + rk[:, None] * stride_bk + rn[None, :] * stride_bn
        z_ptrs = z_ptr
        s_ptrs = s_ptr
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kmask = rk < K - k0
        a = tl.load(a_ptrs + k0, mask=valid[:, None] & kmask[None, :], other=0.0)
        zo = (k0 // G) * stride_zg
        so = (k0 // G) * stride_sg
        bo = k0 * stride_bk
        acc = _block_dot(acc, a, b_ptrs + bo, z_ptrs + zo, s_ptrs + so, kmask, nmask, n8mask, shifts,
                         QUANT, FP32, BLOCK_K, BLOCK_N)
        if GATED:
            acc_up = _block_dot(acc_up, a, b_ptrs + bo + up_b, z_ptrs + zo + up_z, s_ptrs + so + up_s, kmask,
                                nmask, n8mask, shifts, QUANT, FP32, BLOCK_K, BLOCK_N)
    if GATED:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up
    if MUL_W:
        acc = acc * tl.load(topw_ptr + ids, mask=valid, other=0.0).to(tl.float32)[:, None]
    optr = out_ptr + ids.to(tl.int64)[:, None] * stride_om + rn[None, :]
    tl.store(optr, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & nmask[None, :])


def launch(a, weights, out, align, topk_weights, cfg: dict, *, a_div: int, gated: bool, mul_w: bool):
    """One grouped GEMM into out [T * top_k, N]: weights a dense [E, N_all, K] tensor or a
    llm_kernels.moe.AWQExperts (qweight [E, K, N_all/8]); N_all = 2 N when gated.
    align = (sorted_ids, block_expert, total) of llm_kernels.moe.moe_align for cfg["BM"]; row id of
    out reads row id // a_div of a (a_div top_k: a holds the tokens)."""
    sorted_ids, block_expert, total = align
    N = out.shape[1]
    quant = not isinstance(weights, torch.Tensor)
    if quant:
        qw, qz, sc, G = weights.qweight, weights.qzeros, weights.scales, weights.group_size
        K = qw.shape[1]
        b, z, s = qw, qz, sc
        strides = (qw.stride(0), qw.stride(1), 1, qz.stride(0), qz.stride(1), sc.stride(0), sc.stride(1))
        ups = (N // 8, N // 8, N) if gated else (0, 0, 0)
        bk = min(cfg["BK"], G)
    else:
        K, G = weights.shape[2], 1
        b = z = s = weights
        strides = (weights.stride(0), weights.stride(2), weights.stride(1), 0, 0, 0, 0)
        ups = (N * weights.stride(1), 0, 0) if gated else (0, 0, 0)
        bk = cfg["BK"]
    bm, bn = cfg["BM"], cfg["BN"]
    num_m = sorted_ids.numel() // bm
    grid = (num_m * -(-N // bn),)
    _moe_gemm_kernel[grid](
        a, b, z, s, out, sorted_ids, block_expert, total, topk_weights,
        N, K, topk_weights.numel(), num_m, G, a.stride(0), out.stride(0), *strides, *ups,
        A_DIV=a_div,
        GATED=gated, MUL_W=mul_w, QUANT=quant, FP32=a.dtype == torch.float32,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.get("GM", 8),
        num_warps=cfg.get("warps", 4), num_stages=cfg.get("stages", 3),
    )
    return out

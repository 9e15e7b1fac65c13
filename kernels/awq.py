"""AWQ W4A16 GEMM on AutoAWQ's "GEMM" checkpoint format.

qweight int32 [K, N/8] and qzeros int32 [K/G, N/8] pack 8 nibbles along N in
the order 0,2,4,6,1,3,5,7 (nibble i holds column ORDER[i] of its group of 8);
scales [K/G, N]; w[k, n] = (q[k, n] - z[k // G, n]) * s[k // G, n].
Triton: a tiled int4 GEMM (split-K with float32 atomics for decode-sized M)
and a dequantize kernel feeding torch.matmul for large M; configs and the
path are timed once per shape on CUDA. The reference is the CPU path.
"""
import torch
import triton.language as tl

from kernels._dispatch import autotune, lazy_jit, next_pow2, use_triton

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
# column c of a group of 8 lives in nibble AWQ_REVERSE_ORDER[c]
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)


def unpack_awq_int4(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C/8] -> int32 [R, C] of values 0..15 in column order."""
    shifts = torch.arange(0, 32, 4, device=packed.device, dtype=torch.int32)
    nibbles = (packed.unsqueeze(-1) >> shifts) & 0xF
    order = torch.tensor(AWQ_REVERSE_ORDER, device=packed.device)
    return nibbles.index_select(-1, order).reshape(packed.shape[0], -1)


def pack_awq_int4(values: torch.Tensor) -> torch.Tensor:
    """int [R, C] of 0..15 -> int32 [R, C/8] in AutoAWQ's nibble order."""
    rows, cols = values.shape
    assert cols % 8 == 0, "packed dimension must be a multiple of 8"
    v = values.to(torch.int32).reshape(rows, cols // 8, 8)
    packed = torch.zeros(rows, cols // 8, dtype=torch.int32, device=values.device)
    for i, col in enumerate(AWQ_ORDER):
        packed |= v[..., col] << (4 * i)
    return packed


def awq_dequantize(qweight, qzeros, scales, group_size: int, dtype=None) -> torch.Tensor:
    """The checkpoint's int4 weight as a dense [K, N] tensor."""
    dtype = dtype or scales.dtype
    q = unpack_awq_int4(qweight)
    z = unpack_awq_int4(qzeros).repeat_interleave(group_size, dim=0)
    s = scales.to(dtype).repeat_interleave(group_size, dim=0)
    assert q.shape == z.shape == s.shape, (q.shape, z.shape, s.shape)
    return (q - z).to(dtype) * s


def awq_gemm_reference(x, qweight, qzeros, scales, group_size: int) -> torch.Tensor:
    w = awq_dequantize(qweight, qzeros, scales, group_size, dtype=torch.float32)
    return (x.float() @ w).to(x.dtype)


def awq_gemm(x, qweight, qzeros, scales, group_size: int) -> torch.Tensor:
    """x [M, K] @ dequant(qweight) [K, N] -> [M, N] in x's dtype."""
    K = x.shape[-1]
    if qweight.shape[0] != K or K % group_size:
        raise ValueError(f"awq_gemm: x has K={K}, qweight {tuple(qweight.shape)}, group {group_size}")
    if use_triton(x, qweight, qzeros, scales) and x.shape[0]:
        return _awq_gemm_triton(x, qweight, qzeros, scales, group_size)
    return awq_gemm_reference(x, qweight, qzeros, scales, group_size)


def _awq_gemm_kernel(
    x_ptr, qw_ptr, qz_ptr, s_ptr, out_ptr,
    M, N, K, stride_xm, stride_om, G, k_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ATOMIC: tl.constexpr, FP32: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    N8 = N // 8
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn8 = pid_n * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
    c = tl.arange(0, BLOCK_N) % 8
    shifts = ((c & 1) * 4 + (c >> 1)) * 4  # column c of 8 sits in nibble (0,4,1,5,2,6,3,7)[c]
    mmask = rm < M
    nmask = rn < N
    n8mask = rn8 < N8
    k_begin = pid_k * k_per_split
    k_end = tl.minimum(K, k_begin + k_per_split)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        g = k0 // G  # BLOCK_K divides G: one group per step, its zeros and scales loaded once
        zp = tl.load(qz_ptr + g * N8 + rn8, mask=n8mask, other=0)
        # widen [., BLOCK_N/8] packed words to [., BLOCK_N] then pick each column's nibble
        z = (tl.reshape(tl.broadcast_to(zp[:, None], (BLOCK_N // 8, 8)), (BLOCK_N,)) >> shifts) & 0xF
        sc = tl.load(s_ptr + g * N + rn, mask=nmask, other=0.0).to(tl.float32)
        a = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :], mask=mmask[:, None], other=0.0)
        qp = tl.load(qw_ptr + rk[:, None].to(tl.int64) * N8 + rn8[None, :], mask=n8mask[None, :], other=0)
        q = tl.reshape(tl.broadcast_to(qp[:, :, None], (BLOCK_K, BLOCK_N // 8, 8)), (BLOCK_K, BLOCK_N))
        w = (((q >> shifts[None, :]) & 0xF) - z[None, :]).to(a.dtype)  # small ints: exact
        if FP32:
            part = tl.dot(a, w, input_precision="ieee")
        else:
            part = tl.dot(a, w)
        acc += part * sc[None, :]
    omask = mmask[:, None] & nmask[None, :]
    optr = out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :]
    if ATOMIC:
        tl.atomic_add(optr, acc, mask=omask)
    else:
        tl.store(optr, acc.to(out_ptr.dtype.element_ty), mask=omask)


def _awq_gemm_planes_kernel(
    x_ptr, qw_ptr, qz_ptr, s_ptr, out_ptr,
    M, N, K, stride_xm, stride_om, G, k_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N8: tl.constexpr, BLOCK_K: tl.constexpr,
    ATOMIC: tl.constexpr, FP32: tl.constexpr,
):
    """Like _awq_gemm_kernel, without widening the packed words: nibble plane j
    of a [BLOCK_K, BLOCK_N8] tile is the weight of columns 8 * i + AWQ_ORDER[j],
    multiplied in its own accumulator (no shuffles between lanes)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    N8 = N // 8
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn8 = pid_n * BLOCK_N8 + tl.arange(0, BLOCK_N8)
    mmask = rm < M
    n8mask = rn8 < N8
    k_begin = pid_k * k_per_split
    k_end = tl.minimum(K, k_begin + k_per_split)
    acc0 = tl.zeros([BLOCK_M, BLOCK_N8], tl.float32)
    acc1 = tl.zeros([BLOCK_M, BLOCK_N8], tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N8], tl.float32)
    acc3 = tl.zeros([BLOCK_M, BLOCK_N8], tl.float32)
    acc4 = tl.zeros([BLOCK_M, BLOCK_N8], tl.float32)
    acc5 = tl.zeros([BLOCK_M, BLOCK_N8], tl.float32)
    acc6 = tl.zeros([BLOCK_M, BLOCK_N8], tl.float32)
    acc7 = tl.zeros([BLOCK_M, BLOCK_N8], tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        g = k0 // G  # BLOCK_K divides G: one group per step, its zeros and scales loaded once
        zp = tl.load(qz_ptr + g * N8 + rn8, mask=n8mask, other=0)
        srow = s_ptr + g * N + rn8 * 8
        a = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :], mask=mmask[:, None], other=0.0)
        qp = tl.load(qw_ptr + rk[:, None].to(tl.int64) * N8 + rn8[None, :], mask=n8mask[None, :], other=0)
        w = (((qp >> 0) & 0xF) - ((zp >> 0) & 0xF)[None, :]).to(a.dtype)
        sc = tl.load(srow + 0, mask=n8mask, other=0.0).to(tl.float32)
        if FP32:
            acc0 += tl.dot(a, w, input_precision="ieee") * sc[None, :]
        else:
            acc0 += tl.dot(a, w) * sc[None, :]
        w = (((qp >> 4) & 0xF) - ((zp >> 4) & 0xF)[None, :]).to(a.dtype)
        sc = tl.load(srow + 2, mask=n8mask, other=0.0).to(tl.float32)
        if FP32:
            acc1 += tl.dot(a, w, input_precision="ieee") * sc[None, :]
        else:
            acc1 += tl.dot(a, w) * sc[None, :]
        w = (((qp >> 8) & 0xF) - ((zp >> 8) & 0xF)[None, :]).to(a.dtype)
        sc = tl.load(srow + 4, mask=n8mask, other=0.0).to(tl.float32)
        if FP32:
            acc2 += tl.dot(a, w, input_precision="ieee") * sc[None, :]
        else:
            acc2 += tl.dot(a, w) * sc[None, :]
        w = (((qp >> 12) & 0xF) - ((zp >> 12) & 0xF)[None, :]).to(a.dtype)
        sc = tl.load(srow + 6, mask=n8mask, other=0.0).to(tl.float32)
        if FP32:
            acc3 += tl.dot(a, w, input_precision="ieee") * sc[None, :]
        else:
            acc3 += tl.dot(a, w) * sc[None, :]
        w = (((qp >> 16) & 0xF) - ((zp >> 16) & 0xF)[None, :]).to(a.dtype)
        sc = tl.load(srow + 1, mask=n8mask, other=0.0).to(tl.float32)
        if FP32:
            acc4 += tl.dot(a, w, input_precision="ieee") * sc[None, :]
        else:
            acc4 += tl.dot(a, w) * sc[None, :]
        w = (((qp >> 20) & 0xF) - ((zp >> 20) & 0xF)[None, :]).to(a.dtype)
        sc = tl.load(srow + 3, mask=n8mask, other=0.0).to(tl.float32)
        if FP32:
            acc5 += tl.dot(a, w, input_precision="ieee") * sc[None, :]
        else:
            acc5 += tl.dot(a, w) * sc[None, :]
        w = (((qp >> 24) & 0xF) - ((zp >> 24) & 0xF)[None, :]).to(a.dtype)
        sc = tl.load(srow + 5, mask=n8mask, other=0.0).to(tl.float32)
        if FP32:
            acc6 += tl.dot(a, w, input_precision="ieee") * sc[None, :]
        else:
            acc6 += tl.dot(a, w) * sc[None, :]
        w = (((qp >> 28) & 0xF) - ((zp >> 28) & 0xF)[None, :]).to(a.dtype)
        sc = tl.load(srow + 7, mask=n8mask, other=0.0).to(tl.float32)
        if FP32:
            acc7 += tl.dot(a, w, input_precision="ieee") * sc[None, :]
        else:
            acc7 += tl.dot(a, w) * sc[None, :]
    omask = mmask[:, None] & n8mask[None, :]
    optr = out_ptr + rm[:, None].to(tl.int64) * stride_om + rn8[None, :] * 8
    if ATOMIC:
        tl.atomic_add(optr + 0, acc0, mask=omask)
    else:
        tl.store(optr + 0, acc0.to(out_ptr.dtype.element_ty), mask=omask)
    if ATOMIC:
        tl.atomic_add(optr + 2, acc1, mask=omask)
    else:
        tl.store(optr + 2, acc1.to(out_ptr.dtype.element_ty), mask=omask)
    if ATOMIC:
        tl.atomic_add(optr + 4, acc2, mask=omask)
    else:
        tl.store(optr + 4, acc2.to(out_ptr.dtype.element_ty), mask=omask)
    if ATOMIC:
        tl.atomic_add(optr + 6, acc3, mask=omask)
    else:
        tl.store(optr + 6, acc3.to(out_ptr.dtype.element_ty), mask=omask)
    if ATOMIC:
        tl.atomic_add(optr + 1, acc4, mask=omask)
    else:
        tl.store(optr + 1, acc4.to(out_ptr.dtype.element_ty), mask=omask)
    if ATOMIC:
        tl.atomic_add(optr + 3, acc5, mask=omask)
    else:
        tl.store(optr + 3, acc5.to(out_ptr.dtype.element_ty), mask=omask)
    if ATOMIC:
        tl.atomic_add(optr + 5, acc6, mask=omask)
    else:
        tl.store(optr + 5, acc6.to(out_ptr.dtype.element_ty), mask=omask)
    if ATOMIC:
        tl.atomic_add(optr + 7, acc7, mask=omask)
    else:
        tl.store(optr + 7, acc7.to(out_ptr.dtype.element_ty), mask=omask)


def _awq_dequant_kernel(
    qw_ptr, qz_ptr, s_ptr, out_ptr, N, G,
    BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rk = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rn8 = tl.program_id(1) * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
    c = tl.arange(0, BLOCK_N) % 8
    shifts = ((c & 1) * 4 + (c >> 1)) * 4
    N8 = N // 8
    nmask = rn < N
    g = tl.program_id(0) * BLOCK_K // G
    zp = tl.load(qz_ptr + g * N8 + rn8, mask=rn8 < N8, other=0)
    z = (tl.reshape(tl.broadcast_to(zp[:, None], (BLOCK_N // 8, 8)), (BLOCK_N,)) >> shifts) & 0xF
    sc = tl.load(s_ptr + g * N + rn, mask=nmask, other=0.0).to(tl.float32)
    qp = tl.load(qw_ptr + rk[:, None].to(tl.int64) * N8 + rn8[None, :], mask=rn8[None, :] < N8, other=0)
    q = tl.reshape(tl.broadcast_to(qp[:, :, None], (BLOCK_K, BLOCK_N // 8, 8)), (BLOCK_K, BLOCK_N))
    w = (((q >> shifts[None, :]) & 0xF) - z[None, :]).to(tl.float32) * sc[None, :]
    tl.store(out_ptr + rk[:, None].to(tl.int64) * N + rn[None, :], w.to(out_ptr.dtype.element_ty),
             mask=nmask[None, :])


_awq_gemm = lazy_jit(_awq_gemm_kernel)
_awq_dequant = lazy_jit(_awq_dequant_kernel)
_awq_gemm_planes = lazy_jit(_awq_gemm_planes_kernel)


def _block_k(group_size: int) -> int:
    bk = min(group_size, 128)
    assert group_size % bk == 0 and bk >= 16 and bk & (bk - 1) == 0, f"unsupported group size {group_size}"
    return bk


def _dequant_triton(qweight, qzeros, scales, group_size, dtype):
    K, N = qweight.shape[0], qweight.shape[1] * 8
    w = torch.empty(K, N, dtype=dtype, device=qweight.device)
    bk, bn = _block_k(group_size), 128
    _awq_dequant[(K // bk, -(-N // bn))](qweight, qzeros, scales, w, N, group_size,
                                          BLOCK_K=bk, BLOCK_N=bn, num_warps=4)
    return w


def _gemm_launch(x, qweight, qzeros, scales, group_size, cfg):
    M, K = x.shape
    N = qweight.shape[1] * 8
    if cfg.get("dense"):
        return x @ _dequant_triton(qweight, qzeros, scales, group_size, x.dtype)
    bm, bn, split = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["SPLIT_K"]
    bk = _block_k(group_size)
    groups = K // group_size
    split = max(1, min(split, groups))
    k_per_split = -(-groups // split) * group_size
    split = -(-K // k_per_split)
    if split > 1:
        out = torch.zeros(M, N, dtype=torch.float32, device=x.device)
    else:
        out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    grid = (-(-M // bm), -(-N // bn), split)
    args = (x, qweight, qzeros, scales, out, M, N, K, x.stride(0), out.stride(0), group_size, k_per_split)
    common = dict(BLOCK_M=bm, BLOCK_K=bk, ATOMIC=split > 1, FP32=x.dtype == torch.float32,
                  num_warps=cfg.get("warps", 4), num_stages=cfg.get("stages", 3))
    if cfg.get("planes"):
        _awq_gemm_planes[grid](*args, BLOCK_N8=bn // 8, **common)
    else:
        _awq_gemm[grid](*args, BLOCK_N=bn, **common)
    return out.to(x.dtype) if split > 1 else out


def _cfg(bm, bn, split, warps=4, stages=3, planes=True):
    return {"BLOCK_M": bm, "BLOCK_N": bn, "SPLIT_K": split, "warps": warps, "stages": stages, "planes": planes}


def _gemm_configs(M: int, device) -> list:
    """Candidates timed per shape; the first is the interpreter's (split-K on small M)."""
    if device.type != "cuda":
        return [_cfg(16, 128, 2 if M <= 16 else 1), _cfg(16, 32, 2 if M <= 16 else 1, planes=False)]
    if M <= 16:
        return [_cfg(16, bn, s, planes=False) for bn in (64, 128) for s in (4, 7, 14, 28)] \
            + [_cfg(16, 64, 14, 4, 4, planes=False), _cfg(16, 128, 7, 8, 4, planes=False),
               _cfg(16, 64, 7, 2, 3, planes=False)] + [_cfg(16, 128, s) for s in (7, 14)]
    if M <= 64:
        bm = 32 if M <= 32 else 64
        return [_cfg(bm, 128, s, planes=False) for s in (2, 4, 7, 14)] + [_cfg(bm, 128, 7), {"dense": True}]
    if M <= 256:
        return [_cfg(64, 128, s, planes=False) for s in (2, 4, 7)] + [_cfg(128, 128, s, 8, planes=False) for s in (1, 4)] \
            + [{"dense": True}]
    return [{"dense": True}, _cfg(128, 256, 1, 8)]


def _awq_gemm_triton(x, qweight, qzeros, scales, group_size):
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M, K = x2.shape
    N = qweight.shape[1] * 8
    assert scales.shape == (K // group_size, N) and qzeros.shape == (K // group_size, N // 8)
    assert qweight.is_contiguous() and qzeros.is_contiguous() and scales.is_contiguous()
    configs = _gemm_configs(M, x.device)
    key = (next_pow2(M), N, K, group_size, x.dtype)
    cfg = autotune("awq_gemm", key, configs, lambda c: _gemm_launch(x2, qweight, qzeros, scales, group_size, c))
    return _gemm_launch(x2, qweight, qzeros, scales, group_size, cfg).view(*lead, N)

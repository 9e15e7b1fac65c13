"""AWQ W4A16 on AutoAWQ's "GEMM" checkpoint format: the format, the reference,
and the public API.

qweight int32 [K, N/8] and qzeros int32 [K/G, N/8] pack 8 nibbles along N in
the order 0,2,4,6,1,3,5,7 (nibble i holds column ORDER[i] of its group of 8);
scales [K/G, N]; w[k, n] = (q[k, n] - z[k // G, n]) * s[k // G, n].

`awq_gemm` multiplies on the checkpoint layout as it is (Triton kernels in
kernels.awq_ckpt on CUDA and under the interpreter; the reference otherwise).
`awq_prepare` / `awq_linear` are the engine-facing API: on CUDA the weight is
repacked once into the K-packed layout of kernels.awq_kpack, the engine's
decode path; the prepared object may also hold a dense copy for large M.
"""
from dataclasses import dataclass
from typing import Optional

import torch

from kernels._dispatch import use_triton
from kernels.awq_ckpt import _awq_gemm_triton, _dequant_triton, _workspace

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


def _check(K: int, N8: int, qzeros, scales, group_size: int, what: str):
    if group_size < 16 or group_size & (group_size - 1) or K % group_size:
        raise ValueError(f"{what}: group size {group_size} with K={K} (need a power of 2 >= 16 dividing K)")
    if tuple(qzeros.shape) != (K // group_size, N8) or tuple(scales.shape) != (K // group_size, 8 * N8):
        raise ValueError(f"{what}: qweight [{K}, {N8}], qzeros {tuple(qzeros.shape)}, "
                         f"scales {tuple(scales.shape)}, group {group_size}")


def awq_gemm(x, qweight, qzeros, scales, group_size: int) -> torch.Tensor:
    """x [M, K] @ dequant(qweight) [K, N] -> [M, N] in x's dtype."""
    K = x.shape[-1]
    if qweight.shape[0] != K or K % group_size:
        raise ValueError(f"awq_gemm: x has K={K}, qweight {tuple(qweight.shape)}, group {group_size}")
    if use_triton(x, qweight, qzeros, scales) and x.shape[0]:
        _check(K, qweight.shape[1], qzeros, scales, group_size, "awq_gemm")
        return _awq_gemm_triton(x, qweight, qzeros, scales, group_size)
    return awq_gemm_reference(x, qweight, qzeros, scales, group_size)


# ----------------------------------------------------------------------------
# engine-facing API


@dataclass
class AWQPrepared:
    """One AWQ linear ready for awq_linear. On CUDA the weight is repacked once
    into the K-packed layout of kernels.awq_kpack (`qk` int16 [K/4, N] and
    `zeros_k` int16 [K/G, N]; the checkpoint's qweight/qzeros are then
    dropped); otherwise the checkpoint tensors (contiguous) for the kernels of
    this module. `dense`, when asked
    for, is the dequantized [K, N] weight used for large M instead of
    dequantizing on every call (costs K * N * 2 bytes)."""

    qweight: Optional[torch.Tensor]
    qzeros: Optional[torch.Tensor]
    scales: torch.Tensor
    group_size: int
    in_features: int
    out_features: int
    dense: Optional[torch.Tensor] = None
    qk: Optional[torch.Tensor] = None
    zeros_k: Optional[torch.Tensor] = None


DENSE_MIN_M = 512  # with a dense copy, M above this runs x @ dense


def awq_prepare(qweight, qzeros, scales, group_size: int, keep_dense: bool = False,
                kpack: Optional[bool] = None) -> AWQPrepared:
    """Check and hold a layer's checkpoint tensors for awq_linear (call once at
    load time, outside graph capture: it also reserves the split-K workspace).
    kpack (default: on CUDA when K divides by 128) repacks the weight."""
    from kernels import awq_kpack

    K, N8 = qweight.shape
    _check(K, N8, qzeros, scales, group_size, "awq_prepare")
    p = AWQPrepared(qweight.contiguous(), qzeros.contiguous(), scales.contiguous(), group_size, K, N8 * 8)
    if keep_dense:
        p.dense = awq_dequantize(p.qweight, p.qzeros, p.scales, group_size) if not use_triton(p.qweight) \
            else _dequant_triton(p.qweight, p.qzeros, p.scales, group_size, p.scales.dtype)
    if kpack is None:
        kpack = qweight.is_cuda and K % awq_kpack.ROWS == 0
    if kpack:
        p.qk, p.zeros_k = awq_kpack.kpack_from_awq(p.qweight, p.qzeros, group_size)
        p.qweight = p.qzeros = None
    if scales.is_cuda:
        _workspace(scales.device)
    return p


def awq_linear(x, prepared: AWQPrepared) -> torch.Tensor:
    """x [..., K] @ dequant(prepared) [K, N] -> [..., N] in x's dtype."""
    from kernels import awq_kpack

    p = prepared
    K = x.shape[-1]
    if K != p.in_features:
        raise ValueError(f"awq_linear: x has K={K}, the layer {p.in_features}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K)
    if p.dense is not None and x2.shape[0] > DENSE_MIN_M:
        return (x2 @ p.dense.to(x2.dtype)).view(*lead, p.out_features)
    if p.qk is not None:
        if use_triton(x2, p.qk) and x2.shape[0]:
            y = awq_kpack.kpack_gemm(x2, p.qk, p.zeros_k, p.scales, p.group_size)
        else:
            w = awq_kpack.kpack_dequantize_reference(p.qk, p.zeros_k, p.scales, p.group_size)
            y = (x2.float() @ w).to(x2.dtype)
    elif use_triton(x2, p.qweight, p.qzeros, p.scales) and x2.shape[0]:
        y = _awq_gemm_triton(x2, p.qweight, p.qzeros, p.scales, p.group_size)
    elif p.dense is not None:
        y = x2 @ p.dense.to(x2.dtype)
    else:
        y = awq_gemm_reference(x2, p.qweight, p.qzeros, p.scales, p.group_size)
    return y.view(*lead, p.out_features)

"""AWQ W4A16: the public calls on AutoAWQ's "GEMM" checkpoint format
(llm_kernels.awq_format describes it).

`awq_gemm` multiplies on the checkpoint layout as it is (the Triton kernels of
llm_kernels.awq_ckpt on CUDA and under the interpreter; the reference otherwise).
`awq_prepare` / `awq_linear` are the engine-facing API: on CUDA the weight is
repacked once into the K-packed layout of llm_kernels.awq_kpack, the engine's
decode path; with LLM_KERNELS_AWQ_MMA=1 also into llm_kernels.awq_mma's layout,
whose CUDA C++ kernels the tuner may pick for bf16 (awq_mma at M <= 32, awq_tile at 17 <= M
<= 256); with LLM_KERNELS_AWQ_MMA=small the small bf16 layers into that layout only, with
LLM_KERNELS_AWQ_MMA=all every bf16 layer.
"""
from dataclasses import dataclass
from typing import Optional

import torch

from llm_kernels import awq_mma, awq_tile
from llm_kernels.awq_configs import ckpt_gemm, kpack_gemm, small_m_gemm
from llm_kernels.awq_format import awq_dequantize, awq_gemm_reference, check_awq_shapes, pack_awq_int4, unpack_awq_int4
from llm_kernels.awq_kpack import ROWS, kpack_dequantize_reference, kpack_from_awq
from llm_kernels.awq_mma_dequant import mma_dequantize
from llm_kernels.dispatch import use_triton
from llm_kernels.workspace import workspace

# the format's helpers are found here too, beside the calls that use them
__all__ = ["AWQPrepared", "awq_dequantize", "awq_gemm", "awq_gemm_reference", "awq_linear", "awq_prepare",
           "pack_awq_int4", "unpack_awq_int4"]


def awq_gemm(x, qweight, qzeros, scales, group_size: int) -> torch.Tensor:
    """x [M, K] @ dequant(qweight) [K, N] -> [M, N] in x's dtype."""
    K = x.shape[-1]
    if qweight.shape[0] != K or K % group_size:
        raise ValueError(f"awq_gemm: x has K={K}, qweight {tuple(qweight.shape)}, group {group_size}")
    if use_triton(x, qweight, qzeros, scales) and x.shape[0]:
        check_awq_shapes(K, qweight.shape[1], qzeros, scales, group_size, "awq_gemm")
        return ckpt_gemm(x, qweight, qzeros, scales, group_size)
    return awq_gemm_reference(x, qweight, qzeros, scales, group_size)


@dataclass
class AWQPrepared:
    """One AWQ linear ready for awq_linear. On CUDA the weight is repacked once
    into the K-packed layout of llm_kernels.awq_kpack (`qk` int16 [N/S, K/4, S] in
    stripes of S columns and `zeros_k` int16 [K/G, N]; the checkpoint's qweight/qzeros are then
    dropped); otherwise the checkpoint tensors (contiguous) for the kernels of
    llm_kernels.awq_ckpt. With the mma layout (llm_kernels.awq_mma) also `words`
    int32 [N/16, K/64, 32, 4] and `sz` bf16 [N/16, K/G, 8, 4]; held in that layout alone,
    qk, qweight and qzeros are None."""

    qweight: Optional[torch.Tensor]
    qzeros: Optional[torch.Tensor]
    scales: torch.Tensor
    group_size: int
    in_features: int
    out_features: int
    qk: Optional[torch.Tensor] = None
    zeros_k: Optional[torch.Tensor] = None
    words: Optional[torch.Tensor] = None
    sz: Optional[torch.Tensor] = None

    @property
    def mma_only(self) -> bool:
        """Held in the mma layout alone (LLM_KERNELS_AWQ_MMA=small's layers)."""
        return self.qk is None and self.qweight is None


def awq_prepare(qweight, qzeros, scales, group_size: int, kpack: Optional[bool] = None,
                mma: Optional[bool] = None, mma_only: Optional[bool] = None) -> AWQPrepared:
    """Check and hold a layer's checkpoint tensors for awq_linear (call once at
    load time, outside graph capture: it also reserves the split-K workspace).
    kpack (default: on CUDA when K divides by 128) repacks the weight. mma also keeps
    llm_kernels.awq_mma's layout, and mma_only keeps that layout alone (no kpack, no
    checkpoint copy). Their default (llm_kernels.awq_mma.mode, LLM_KERNELS_AWQ_MMA) applies on
    a GPU that runs that kernel, to the layers its layout fits: "1" both layouts, "small"
    the mma layout alone for small bf16 layers."""
    K, N8 = qweight.shape
    check_awq_shapes(K, N8, qzeros, scales, group_size, "awq_prepare")
    p = AWQPrepared(qweight.contiguous(), qzeros.contiguous(), scales.contiguous(), group_size, K, N8 * 8)
    fits = awq_mma.layout_fits(K, N8 * 8, group_size)
    if mma is None and mma_only is None:
        how = awq_mma.mode()
        if how != "0" and fits and awq_mma.runs_on(qweight.device):
            mma, mma_only = awq_mma.layout_choice(K, N8 * 8, scales.dtype, how)
    if mma is False and mma_only:
        raise ValueError("awq_prepare: mma_only keeps the mma layout; mma=False contradicts it")
    mma_only = bool(mma_only)
    mma = bool(mma) or mma_only
    if mma and not fits:
        raise ValueError(f"awq_prepare: the mma layout needs K by 64, N by 16 and a group of 64 x 2^i "
                         f"dividing K; got K={K}, N={N8 * 8}, group {group_size}")
    if kpack is None:
        kpack = qweight.is_cuda and K % ROWS == 0 and not mma_only
    elif kpack and mma_only:
        raise ValueError("awq_prepare: mma_only keeps the mma layout alone; kpack=True contradicts it")
    if mma:
        p.words, p.sz = awq_mma.mma_from_awq(p.qweight, p.qzeros, p.scales, group_size)
    if mma_only:
        p.qweight = p.qzeros = None
    if kpack:
        p.qk, p.zeros_k = kpack_from_awq(p.qweight, p.qzeros, group_size)
        p.qweight = p.qzeros = None
    if scales.is_cuda:
        workspace(scales.device)
    return p


def awq_linear(x, prepared: AWQPrepared) -> torch.Tensor:
    """x [..., K] @ dequant(prepared) [K, N] -> [..., N] in x's dtype."""
    p = prepared
    K = x.shape[-1]
    if K != p.in_features:
        raise ValueError(f"awq_linear: x has K={K}, the layer {p.in_features}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K)
    # the tuner's choice up to awq_tile.MAX_M tokens: awq_mma up to MAX_M tokens beside another
    # layout (alone, up to its own limit), awq_tile from 17, or the layer's other path
    if p.words is not None and x2.is_cuda and x2.dtype == torch.bfloat16 and 1 <= x2.shape[0] <= awq_tile.MAX_M:
        mma_max = awq_mma.KERNEL_MAX_M if p.mma_only else awq_mma.MAX_M
        y = small_m_gemm(x2, p.words, p.sz, p.group_size, lambda xc: _without_mma(xc, p), mma_max)
    else:
        y = _without_mma(x2, p)
    return y.view(*lead, p.out_features)


def _without_mma(x2, p: AWQPrepared) -> torch.Tensor:
    """x2 [M, K] @ the layer on its kpack or checkpoint layout, or, held in the mma layout
    alone, on that layout dequantized (then cuBLAS on CUDA)."""
    if p.mma_only:
        if use_triton(x2, p.words):
            return x2 @ mma_dequantize(p.words, p.sz, x2.dtype)
        return (x2.float() @ awq_mma.mma_dequantize_reference(p.words, p.sz)).to(x2.dtype)
    if p.qk is not None:
        if use_triton(x2, p.qk) and x2.shape[0]:
            return kpack_gemm(x2, p.qk, p.zeros_k, p.scales, p.group_size)
        w = kpack_dequantize_reference(p.qk, p.zeros_k, p.scales, p.group_size)
        return (x2.float() @ w).to(x2.dtype)
    if use_triton(x2, p.qweight, p.qzeros, p.scales) and x2.shape[0]:
        return ckpt_gemm(x2, p.qweight, p.qzeros, p.scales, p.group_size)
    return awq_gemm_reference(x2, p.qweight, p.qzeros, p.scales, p.group_size)

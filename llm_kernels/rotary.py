"""Rotary position embedding, neox style (rotate halves), from a cos/sin cache.

cos_sin_cache is float32 [max_positions, rotary_dim]: cos in the first half,
sin in the second. Any rope scaling (linear, llama3) is baked into the cache.
The Triton kernel rotates q and k in place (strided views included), one
program per token; dims past rotary_dim are left as they are.

Given per-head norm weights (Qwen3's and Gemma 3's q_norm / k_norm), each head is
RMS-normalised over head_dim first, in the same kernel: the normalised values are rounded as
llm_kernels.rms_norm rounds them, then turned, so the result is that of rms_norm then rotary
with two launches and a round trip of q and k fewer a layer. That takes a rotary over the
whole head (the norm's sum needs every dim); a partial rotary normalises first, on its own.
"""
import torch
import triton.language as tl

from llm_kernels.dispatch import jit_helper, lazy_jit, next_pow2, use_triton
from llm_kernels.norm import rms_norm, rms_norm_reference
from llm_kernels.pdl import gdc_launch_dependents, gdc_wait


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The first 2 * half dims rotated (pairs (i, i + half)); dims past them unchanged."""
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest), dim=-1)


def rotary_embedding_reference(positions, q, k, cos_sin_cache, q_weight=None, k_weight=None, eps: float = 1e-6):
    """q [T, Hq, D], k [T, Hk, D] rotated in place (each head RMS-normalised first with the
    weights given); returns (q, k)."""
    if q_weight is not None:
        q.copy_(rms_norm_reference(q, q_weight, eps))
        k.copy_(rms_norm_reference(k, k_weight, eps))
    cos, sin = cos_sin_cache[positions.long()].chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q.copy_(_rotate(q, cos, sin))
    k.copy_(_rotate(k, cos, sin))
    return q, k


@jit_helper
def _normed(x, r, w_ptr, d, dmask, ty):
    """x (float32) times its head's 1 / rms r, rounded to the input dtype, times the weight,
    rounded to it again: llm_kernels.rms_norm's roundings."""
    w = tl.load(w_ptr + d, mask=dmask, other=0.0).to(tl.float32)[None, :]
    return ((x * r).to(ty).to(tl.float32) * w).to(ty).to(tl.float32)


@jit_helper
def _rotate_heads(ptr, w_ptr, t, stride_t, stride_h, H, HALF, d, dmask, cos, sin, eps,
                  BLOCK_H: tl.constexpr, NORM: tl.constexpr):
    """The H heads of token t rotated in place: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin);
    with NORM each head (its 2 HALF dims: the whole head) RMS-normalised first."""
    h = tl.arange(0, BLOCK_H)[:, None]
    mask = (h < H) & dmask[None, :]
    p = ptr + t * stride_t + h * stride_h + d[None, :]
    x1 = tl.load(p, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(p + HALF, mask=mask, other=0.0).to(tl.float32)
    if NORM:
        r = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)[:, None]
        x1 = _normed(x1, r, w_ptr, d, dmask, ptr.dtype.element_ty)
        x2 = _normed(x2, r, w_ptr + HALF, d, dmask, ptr.dtype.element_ty)
    tl.store(p, (x1 * cos - x2 * sin).to(ptr.dtype.element_ty), mask=mask)
    tl.store(p + HALF, (x2 * cos + x1 * sin).to(ptr.dtype.element_ty), mask=mask)


@lazy_jit(pdl=True)
def _rotary_kernel(
    pos_ptr, q_ptr, k_ptr, cache_ptr, qw_ptr, kw_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cache,
    HQ, HK, HALF, eps,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr, NORM: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:  # programmatic dependent launch (llm_kernels.pdl): wait for the previous kernel here
        gdc_wait()
        gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    d = tl.arange(0, BLOCK_HALF)
    dmask = d < HALF
    cos = tl.load(cache_ptr + pos * stride_cache + d, mask=dmask, other=0.0)[None, :]
    sin = tl.load(cache_ptr + pos * stride_cache + HALF + d, mask=dmask, other=0.0)[None, :]
    _rotate_heads(q_ptr, qw_ptr, t, stride_qt, stride_qh, HQ, HALF, d, dmask, cos, sin, eps, BLOCK_HQ, NORM)
    _rotate_heads(k_ptr, kw_ptr, t, stride_kt, stride_kh, HK, HALF, d, dmask, cos, sin, eps, BLOCK_HK, NORM)


def rotary_embedding(positions, q, k, cos_sin_cache, q_weight=None, k_weight=None, eps: float = 1e-6):
    """q [T, Hq, D], k [T, Hk, D] rotated in place (views allowed); returns (q, k). With
    q_weight and k_weight [D] (per-head norms' weights, in q's dtype), each head is
    RMS-normalised over D first, as llm_kernels.rms_norm(q, q_weight, eps) would."""
    if (q_weight is None) != (k_weight is None):
        raise ValueError("rotary_embedding: q_weight and k_weight come together")
    if not (use_triton(positions, q, k, cos_sin_cache) and q.shape[0]):
        return rotary_embedding_reference(positions, q, k, cos_sin_cache, q_weight, k_weight, eps)
    T, HQ, D = q.shape
    HK = k.shape[1]
    rot = cos_sin_cache.shape[-1]
    assert rot <= D and rot % 2 == 0 and k.shape[0] == T and k.shape[2] == D
    norm = q_weight is not None
    if norm and (rot != D or q_weight.dtype != q.dtype or k_weight.dtype != k.dtype):
        # the fused norm needs the whole head turned and the output in q's dtype: norm first
        q.copy_(rms_norm(q, q_weight, eps))
        k.copy_(rms_norm(k, k_weight, eps))
        return rotary_embedding(positions, q, k, cos_sin_cache)
    # the kernel needs unit stride along D; otherwise rotate a copy and write it back
    qk = q if q.stride(-1) == 1 else q.contiguous()
    kk = k if k.stride(-1) == 1 else k.contiguous()
    cache = cos_sin_cache if cos_sin_cache.stride(-1) == 1 else cos_sin_cache.contiguous()
    half = rot // 2
    _rotary_kernel[(T,)](
        positions, qk, kk, cache, q_weight if norm else cache, k_weight if norm else cache,
        qk.stride(0), qk.stride(1), kk.stride(0), kk.stride(1), cache.stride(0),
        HQ, HK, half, float(eps),
        BLOCK_HQ=next_pow2(HQ), BLOCK_HK=next_pow2(HK), BLOCK_HALF=next_pow2(half), NORM=norm, num_warps=4,
    )
    if qk is not q:
        q.copy_(qk)
    if kk is not k:
        k.copy_(kk)
    return q, k

"""Rotary position embedding, neox style (rotate halves), from a cos/sin cache.

cos_sin_cache is float32 [max_positions, rotary_dim]: cos in the first half,
sin in the second. Any rope scaling (linear, llama3) is baked into the cache.
The Triton kernel rotates q and k in place (strided views included), one
program per token; dims past rotary_dim are left as they are.
"""
import torch
import triton.language as tl

from llm_kernels.dispatch import jit_helper, lazy_jit, next_pow2, use_triton


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The first 2 * half dims rotated (pairs (i, i + half)); dims past them unchanged."""
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest), dim=-1)


def rotary_embedding_reference(positions, q, k, cos_sin_cache):
    """q [T, Hq, D], k [T, Hk, D] rotated in place; returns (q, k)."""
    cos, sin = cos_sin_cache[positions.long()].chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q.copy_(_rotate(q, cos, sin))
    k.copy_(_rotate(k, cos, sin))
    return q, k


@jit_helper
def _rotate_heads(ptr, t, stride_t, stride_h, H, HALF, d, dmask, cos, sin, BLOCK_H: tl.constexpr):
    """The H heads of token t rotated in place: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)."""
    h = tl.arange(0, BLOCK_H)[:, None]
    mask = (h < H) & dmask[None, :]
    p = ptr + t * stride_t + h * stride_h + d[None, :]
    x1 = tl.load(p, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(p + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(p, (x1 * cos - x2 * sin).to(ptr.dtype.element_ty), mask=mask)
    tl.store(p + HALF, (x2 * cos + x1 * sin).to(ptr.dtype.element_ty), mask=mask)


@lazy_jit
def _rotary_kernel(
    pos_ptr, q_ptr, k_ptr, cache_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cache,
    HQ, HK, HALF,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    d = tl.arange(0, BLOCK_HALF)
    dmask = d < HALF
    cos = tl.load(cache_ptr + pos * stride_cache + d, mask=dmask, other=0.0)[None, :]
    sin = tl.load(cache_ptr + pos * stride_cache + HALF + d, mask=dmask, other=0.0)[None, :]
    _rotate_heads(q_ptr, t, stride_qt, stride_qh, HQ, HALF, d, dmask, cos, sin, BLOCK_HQ)
    _rotate_heads(k_ptr, t, stride_kt, stride_kh, HK, HALF, d, dmask, cos, sin, BLOCK_HK)


def rotary_embedding(positions, q, k, cos_sin_cache):
    """q [T, Hq, D], k [T, Hk, D] rotated in place (views allowed); returns (q, k)."""
    if not (use_triton(positions, q, k, cos_sin_cache) and q.shape[0]):
        return rotary_embedding_reference(positions, q, k, cos_sin_cache)
    T, HQ, D = q.shape
    HK = k.shape[1]
    rot = cos_sin_cache.shape[-1]
    assert rot <= D and rot % 2 == 0 and k.shape[0] == T and k.shape[2] == D
    # the kernel needs unit stride along D; otherwise rotate a copy and write it back
    qk = q if q.stride(-1) == 1 else q.contiguous()
    kk = k if k.stride(-1) == 1 else k.contiguous()
    cache = cos_sin_cache if cos_sin_cache.stride(-1) == 1 else cos_sin_cache.contiguous()
    half = rot // 2
    _rotary_kernel[(T,)](
        positions, qk, kk, cache,
        qk.stride(0), qk.stride(1), kk.stride(0), kk.stride(1), cache.stride(0),
        HQ, HK, half,
        BLOCK_HQ=next_pow2(HQ), BLOCK_HK=next_pow2(HK), BLOCK_HALF=next_pow2(half), num_warps=4,
    )
    if qk is not q:
        q.copy_(qk)
    if kk is not k:
        k.copy_(kk)
    return q, k

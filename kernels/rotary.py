"""Rotary position embedding, neox style (rotate halves), from a cos/sin cache.

cos_sin_cache is float32 [max_positions, rotary_dim]: cos in the first half,
sin in the second. Any rope scaling (linear, llama3) is baked into the cache.
The Triton kernel rotates q and k in place (strided views included), one
program per token; dims past rotary_dim are left as they are.
"""
import torch
import triton.language as tl

from kernels._dispatch import lazy_jit, next_pow2, use_triton


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = cos.shape[-1]
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rotary_embedding_reference(positions, q, k, cos_sin_cache):
    """q [T, Hq, D], k [T, Hk, D] rotated in place; returns (q, k)."""
    cos, sin = cos_sin_cache[positions.long()].chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q.copy_(_rotate(q, cos, sin))
    k.copy_(_rotate(k, cos, sin))
    return q, k


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

    hq = tl.arange(0, BLOCK_HQ)[:, None]
    mq = (hq < HQ) & dmask[None, :]
    pq = q_ptr + t * stride_qt + hq * stride_qh + d[None, :]
    q1 = tl.load(pq, mask=mq, other=0.0).to(tl.float32)
    q2 = tl.load(pq + HALF, mask=mq, other=0.0).to(tl.float32)
    tl.store(pq, (q1 * cos - q2 * sin).to(q_ptr.dtype.element_ty), mask=mq)
    tl.store(pq + HALF, (q2 * cos + q1 * sin).to(q_ptr.dtype.element_ty), mask=mq)

    hk = tl.arange(0, BLOCK_HK)[:, None]
    mk = (hk < HK) & dmask[None, :]
    pk = k_ptr + t * stride_kt + hk * stride_kh + d[None, :]
    k1 = tl.load(pk, mask=mk, other=0.0).to(tl.float32)
    k2 = tl.load(pk + HALF, mask=mk, other=0.0).to(tl.float32)
    tl.store(pk, (k1 * cos - k2 * sin).to(k_ptr.dtype.element_ty), mask=mk)
    tl.store(pk + HALF, (k2 * cos + k1 * sin).to(k_ptr.dtype.element_ty), mask=mk)


_rotary = lazy_jit(_rotary_kernel)


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
    _rotary[(T,)](
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

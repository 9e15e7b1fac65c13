"""The CPU path of paged attention: the results of llm_kernels/attention_reference.py (the
oracle) in a few large operations instead of many small ones.

Keys and values are gathered a whole block at a time (one index_select per cache), laid out
head-major in one copy (in float32, or in bfloat16 for a bfloat16 model: see _native), and
torch's scaled_dot_product_attention does the scores, the softmax and the weighted sum (grouped
query heads without repeating the KV heads). Positions a query must not
see (past its context, before its window, the unused tail of a block) are masked in the scores
and zeroed in K and V: a stale NaN or inf left in a reused block cannot leak through 0 * NaN or
NaN - inf. Gemma 2's soft-capping has no place in SDPA: those layers take the reference.
Decode, batch 8 of SmolLM2-135M's heads at 60-110 keys on this 2-core machine: ~0.6 ms a call
against the reference's 1.0-1.3 ms. One sequence at 4,472 keys in bfloat16: 0.75 ms a decode call
and 1.1 ms for 5 queries, against 1.4 and 1.6 ms in float32.
"""
import torch
import torch.nn.functional as F

from llm_kernels.attention_reference import paged_decode_attention_reference, paged_prefill_attention_reference

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # an integer dtype per element size


def _native(cache: torch.Tensor, q: torch.Tensor, k_scale: float, v_scale: float) -> bool:
    """bfloat16 caches of bfloat16 models are attended in bfloat16 (torch's CPU kernel accumulates
    in float32, as the GPU kernels do): no float32 copy of the context, and half the time a call
    at 4,500 keys on this 2-core machine. FP8 caches and scaled ones take float32."""
    return cache.dtype == q.dtype == torch.bfloat16 and k_scale == v_scale == 1.0


def _gathered(cache: torch.Tensor, blocks: torch.Tensor, shape: tuple, hidden: torch.Tensor, scale: float,
              native: bool):
    """cache's blocks (flat ids) as [*shape[:-1], Hkv, L, D] (shape's last entry the keys L),
    head-major and contiguous, times scale, zero where hidden ([*shape] bool); float32 unless
    native (the cache's own dtype). The zeros go in by row index (index_fill_), before the
    conversion: a masked_fill_ broadcast over the heads cost 5x as much here. They are written
    as zero bits through an integer view (+0.0 in every float format; FP8 has no index_fill_ of
    its own). Head-major: SDPA over a contiguous head took half the time of a strided one."""
    t = cache.index_select(0, blocks)
    rows = t.view(-1, *cache.shape[2:])
    rows.view(_BITS[t.element_size()]).index_fill_(0, hidden.reshape(-1).nonzero().view(-1), 0)
    t = rows.view(*shape, *cache.shape[2:]).transpose(-3, -2)
    t = t.contiguous() if native else t.float().contiguous()  # one pass: the layout and the dtype together
    return t.mul_(scale) if scale != 1.0 else t


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
    """q [..., Hq, n, D], k/v [..., Hkv, L, D] float32, keep [..., n, L] -> [..., Hq, n, D]."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep.unsqueeze(-3), scale=scale,
                                          enable_gqa=q.shape[-3] != k.shape[-3])


def paged_decode_attention_cpu(q, k_cache, v_cache, block_tables, context_lens, scale, *, sliding_window=None,
                               softcap=None, k_scale=1.0, v_scale=1.0):
    """llm_kernels.attention.paged_decode_attention on CPU tensors (arguments as there)."""
    batch, hq, d = q.shape
    if softcap is not None or batch == 0:
        return paged_decode_attention_reference(q, k_cache, v_cache, block_tables, context_lens, scale,
                                                sliding_window=sliding_window, softcap=softcap, k_scale=k_scale,
                                                v_scale=v_scale)
    num_blocks, block_size = k_cache.shape[:2]
    ctx = context_lens.long()
    lo = torch.zeros_like(ctx) if sliding_window is None else (ctx - sliding_window).clamp_min(0)
    first = lo // block_size
    nblk = int((-(-ctx // block_size) - first).max())
    idx = (first[:, None] + torch.arange(nblk)).clamp_max(block_tables.shape[1] - 1)
    blocks = block_tables.gather(1, idx).long().clamp_(0, num_blocks - 1).view(-1)  # past a context: masked
    kpos = first[:, None] * block_size + torch.arange(nblk * block_size)
    hidden = (kpos >= ctx[:, None]) | (kpos < lo[:, None])  # [B, L]
    shape = (batch, nblk * block_size)
    native = _native(k_cache, q, k_scale, v_scale)
    k = _gathered(k_cache, blocks, shape, hidden, k_scale, native)  # [B, Hkv, L, D]
    v = _gathered(v_cache, blocks, shape, hidden, v_scale, native)
    out = _sdpa(q.view(batch, hq, 1, d).to(k.dtype), k, v, ~hidden[:, None, :], scale)
    return out.view(batch, hq, d).to(q.dtype)


def paged_prefill_attention_cpu(q, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale, *,
                                sliding_window=None, softcap=None, k_scale=1.0, v_scale=1.0):
    """llm_kernels.attention.paged_prefill_attention on CPU tensors: one sequence at a time, from the
    block of the first key its first query sees to the end of its context."""
    if softcap is not None:
        return paged_prefill_attention_reference(q, k_cache, v_cache, block_tables, query_start_loc, context_lens,
                                                 scale, sliding_window=sliding_window, softcap=softcap,
                                                 k_scale=k_scale, v_scale=v_scale)
    out = torch.empty_like(q)
    native = _native(k_cache, q, k_scale, v_scale)
    starts = query_start_loc.tolist()
    lengths = context_lens.tolist()
    block_size = k_cache.shape[1]
    for b in range(len(starts) - 1):
        s, e = starts[b], starts[b + 1]
        n, length = e - s, lengths[b]
        if n == 0:
            continue
        lo = 0 if sliding_window is None else max(0, length - n - sliding_window + 1)
        b0, b1 = lo // block_size, -(-length // block_size)
        # a released block (-1, behind a window) reads garbage, as in the reference
        blocks = block_tables[b, b0:b1].long().clamp_(0, k_cache.shape[0] - 1)
        kpos = torch.arange(b0 * block_size, b1 * block_size)
        qpos = torch.arange(length - n, length)
        keep = kpos[None, :] <= qpos[:, None]  # causal; also hides the tail past the context
        if sliding_window is not None:
            keep &= kpos[None, :] > qpos[:, None] - sliding_window
        hidden = ~keep.any(0)  # keys no query sees: zeroed
        shape = ((b1 - b0) * block_size,)
        k = _gathered(k_cache, blocks, shape, hidden, k_scale, native)[None]  # [1, Hkv, L, D]
        v = _gathered(v_cache, blocks, shape, hidden, v_scale, native)[None]
        # batched (4-D) as decode's: 3-D inputs miss torch's fused CPU kernel for its math path
        # (GQA heads repeated, scores materialized): 4-9x slower at 5-1,000 queries over 4,000 keys
        out[s:e] = _sdpa(q[s:e].to(k.dtype).transpose(0, 1)[None], k, v, keep[None], scale)[0].transpose(0, 1).to(q.dtype)
    return out

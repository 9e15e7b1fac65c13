"""PyTorch references of the paged attention ops (llm_kernels/attention.py): the
CPU path and the tests' oracle. Softmax in float32, GQA by grouping query heads.

Sliding window W (Hugging Face's): a query at position i sees keys j with
i - W < j <= i; only the blocks holding such keys are gathered. softcap
(Gemma 2): scores = cap * tanh(scores / cap) on the scaled scores, before the
mask and the softmax. k_scale / v_scale: the cache holds K / k_scale and V / v_scale
(FP8; 1.0 for any other dtype), multiplied back as they are read.
"""
import torch


def _softcapped(scores: torch.Tensor, softcap) -> torch.Tensor:
    """Gemma 2's soft-capping of scaled scores (None: unchanged)."""
    return scores if softcap is None else torch.tanh(scores / softcap) * softcap


def _gather_kv(cache: torch.Tensor, block_table: torch.Tensor, start: int, end: int, scale: float) -> torch.Tensor:
    """Keys (or values) [start, end) of one sequence, [end - start, Hkv, D] in float32 times
    the cache's scale, read through its block table; start is a multiple of the block size."""
    block_size = cache.shape[1]
    blocks = block_table[start // block_size: -(-end // block_size)].long()
    return cache[blocks].reshape(-1, *cache.shape[2:])[: end - start].float() * scale


def _attend(q, k, v, scale, mask=None, softcap=None):
    """q [n, Hq, D], k/v [L, Hkv, D] -> [n, Hq, D]; mask [n, L] True = keep."""
    n, hq, d = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    qf = q.float().reshape(n, hkv, group, d)
    scores = _softcapped(torch.einsum("nhgd,lhd->hgnl", qf, k.float()) * scale, softcap)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("hgnl,lhd->nhgd", probs, v.float())
    return out.reshape(n, hq, d).to(q.dtype)


def paged_decode_attention_reference(q, k_cache, v_cache, block_tables, context_lens, scale, *,
                                     sliding_window=None, softcap=None, k_scale=1.0, v_scale=1.0):
    """Batched over sequences: from each sequence's first block holding a key it
    sees (block 0 without a window), as many blocks as the widest span needs; masks
    the rest (their values too, so garbage there cannot leak through a 0 * NaN)."""
    batch, hq, d = q.shape
    if batch == 0:
        return torch.empty_like(q)
    num_blocks, block_size, hkv, _ = k_cache.shape
    ctx = context_lens.long()
    lo = torch.zeros_like(ctx) if sliding_window is None else (ctx - sliding_window).clamp_min(0)
    first = lo // block_size
    nblk = int((-(-ctx // block_size) - first).max())
    idx = (first[:, None] + torch.arange(nblk, device=q.device)).clamp_max(block_tables.shape[1] - 1)
    blocks = block_tables.gather(1, idx).long().clamp(0, num_blocks - 1)  # entries past a context are masked
    kpos = first[:, None] * block_size + torch.arange(nblk * block_size, device=q.device)
    keep = (kpos < ctx[:, None]) & (kpos >= lo[:, None])
    k = k_cache[blocks].reshape(batch, nblk * block_size, hkv, d).float() * k_scale
    v = (v_cache[blocks].reshape(batch, nblk * block_size, hkv, d).float() * v_scale).masked_fill(
        ~keep[:, :, None, None], 0.0)
    qf = q.float().reshape(batch, hkv, hq // hkv, d)
    scores = _softcapped(torch.einsum("bhgd,blhd->bhgl", qf, k) * scale, softcap)
    scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
    out = torch.einsum("bhgl,blhd->bhgd", torch.softmax(scores, dim=-1), v)
    return out.reshape(batch, hq, d).to(q.dtype)


def paged_prefill_attention_reference(q, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale, *,
                                      sliding_window=None, softcap=None, k_scale=1.0, v_scale=1.0):
    """One sequence at a time, reading its keys from the block of the first one
    its first query sees (block 0 without a window) to the end of its context."""
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    block_size = k_cache.shape[1]
    for b in range(len(starts) - 1):
        s, e = starts[b], starts[b + 1]
        n, length = e - s, int(context_lens[b])
        if n == 0:
            continue
        lo = 0 if sliding_window is None else max(0, length - n - sliding_window + 1)
        base = lo // block_size * block_size
        k = _gather_kv(k_cache, block_tables[b], base, length, k_scale)
        v = _gather_kv(v_cache, block_tables[b], base, length, v_scale)
        qpos = torch.arange(length - n, length, device=q.device)
        kpos = torch.arange(base, length, device=q.device)
        mask = kpos[None, :] <= qpos[:, None]
        if sliding_window is not None:
            mask &= kpos[None, :] > qpos[:, None] - sliding_window
        out[s:e] = _attend(q[s:e], k, v, scale, mask, softcap)
    return out

"""Attention over a paged KV cache [num_blocks, block_size, Hkv, D].

Decode: one query token per sequence. Prefill: variable-length query tokens
packed without padding (query_start_loc), each sequence attending causally
to its whole context, including a prefix already in the cache.
Softmax in float32; GQA/MQA by grouping query heads over KV heads.
Optional, per layer: a sliding window W (Hugging Face's: a query at position
i sees keys j with i - W < j <= i; keys before a window are never read) and
Gemma 2's logit soft-capping (scores = cap * tanh(scores / cap), on the
scaled scores before the mask and the softmax).
Triton kernels: split-KV decode (one program per sequence, KV head and split,
all query heads of the group together, then a reduction over splits) and a
flash-style causal prefill over flattened q-blocks (T // BLOCK_M + B programs
per query head, a grid of shapes only: no host sync, capturable in a CUDA
graph; see _prefill_kernel); the PyTorch references (the oracle) live in
llm_kernels/attention_reference.py, the CPU path in llm_kernels/attention_cpu.py.
Window and soft-capping are constexpr flags of the kernels: without them the
kernels compile to the code they had before.
An FP8 cache (llm_kernels/kv_cache.py) is read as K * k_scale, V * v_scale: keys and
values are converted to the query's dtype as they load, k_scale folds into the
scores' scale and v_scale into the output.
"""
import torch
import triton.language as tl

from llm_kernels.attention_cpu import paged_decode_attention_cpu, paged_prefill_attention_cpu
from llm_kernels.attention_reference import paged_decode_attention_reference, paged_prefill_attention_reference
from llm_kernels.dispatch import autotune, jit_helper, lazy_jit, next_pow2, sm_count, use_triton
from llm_kernels.pdl import gdc_launch_dependents, gdc_wait

__all__ = [
    "DECODE_CONFIGS",
    "decode_partition",
    "decode_triton",
    "paged_decode_attention",
    "paged_decode_attention_reference",
    "paged_prefill_attention",
    "paged_prefill_attention_reference",
    "prefill_triton",
]

LOG2E = 1.4426950408889634


def _check_options(sliding_window, softcap) -> None:
    """A window is a positive number of keys, a cap a positive float; None means off."""
    if sliding_window is not None and (int(sliding_window) != sliding_window or sliding_window < 1):
        raise ValueError(f"sliding_window must be a positive int or None, got {sliding_window!r}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be positive or None, got {softcap!r}")


def paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale: float, *,
                           sliding_window: int | None = None, softcap: float | None = None,
                           k_scale: float = 1.0, v_scale: float = 1.0):
    """q [B, Hq, D]; block_tables int32 [B, max_blocks]; context_lens int32 [B] -> [B, Hq, D].
    The query sits at position context_lens[b] - 1; sliding_window / softcap / the cache's
    per-tensor k_scale and v_scale (an FP8 cache holds K / k_scale): see the module."""
    _check_options(sliding_window, softcap)
    opts = dict(sliding_window=sliding_window, softcap=softcap, k_scale=k_scale, v_scale=v_scale)
    if use_triton(q, k_cache, v_cache, block_tables, context_lens) and q.shape[0]:
        return decode_triton(q, k_cache, v_cache, block_tables, context_lens, scale, **opts)
    return paged_decode_attention_cpu(q, k_cache, v_cache, block_tables, context_lens, scale, **opts)


def paged_prefill_attention(q, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale: float,
                            *, sliding_window: int | None = None,
                            softcap: float | None = None, k_scale: float = 1.0, v_scale: float = 1.0):
    """q [T, Hq, D] packed; query_start_loc int32 [B+1]; context_lens int32 [B]
    (cached prefix + new tokens, whose KV is already written) -> [T, Hq, D].
    Query token i of sequence b sits at position context_lens[b] - n_b + i.
    The Triton grid follows shapes only, so the launch needs no host synchronisation.
    sliding_window / softcap / k_scale, v_scale: see paged_decode_attention."""
    _check_options(sliding_window, softcap)
    opts = dict(sliding_window=sliding_window, softcap=softcap, k_scale=k_scale, v_scale=v_scale)
    if use_triton(q, k_cache, v_cache, block_tables, query_start_loc, context_lens) and q.shape[0]:
        return prefill_triton(q, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale, **opts)
    return paged_prefill_attention_cpu(q, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale, **opts)


# ---------------------------------------------------------------- shared by both kernels

@jit_helper
def _kv_rows(bt_row, n, nmask, hkv, stride_cb, stride_cs, stride_ch, BLOCK_SIZE: tl.constexpr):
    """Offsets of KV head hkv of tokens n in the paged cache, through the block table row."""
    page = tl.load(bt_row + n // BLOCK_SIZE, mask=nmask, other=0).to(tl.int64)
    return page * stride_cb + (n % BLOCK_SIZE) * stride_cs + hkv * stride_ch


@jit_helper
def _dot(a, b, FP32: tl.constexpr):
    """a @ b; float32 inputs in full precision (not tf32)."""
    if FP32:
        out = tl.dot(a, b, input_precision="ieee")
    else:
        out = tl.dot(a, b)
    return out


@jit_helper
def _scores(qk, qk_scale, cap_log2, SOFTCAP: tl.constexpr):
    """Scores in the log2 domain: qk * qk_scale (scale * log2 e), or with SOFTCAP
    cap * log2e * tanh(qk * qk_scale) (qk_scale is then scale / cap). tanh from
    exp2 of -2|x|, odd by symmetry: saturates to +-1 for large |x|, never inf / inf."""
    if SOFTCAP:
        x = qk * qk_scale
        t = tl.exp2(-2.8853900817779268 * tl.abs(x))  # e^(-2|x|)
        th = (1.0 - t) / (1.0 + t)
        s = cap_log2 * tl.where(x < 0, -th, th)
    else:
        s = qk * qk_scale
    return s


@jit_helper
def _softmax_step(s, m, l, SAFE: tl.constexpr):
    """One block of the online softmax (log2 domain): the block's probabilities, the
    rescale of what came before, the new running sum and max. SAFE: a row whose keys
    are all masked so far (max -inf) stays at zero instead of NaN."""
    m_new = tl.maximum(m, tl.max(s, axis=1))
    if SAFE:
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_ref = m_new
    p = tl.exp2(s - m_ref[:, None])
    alpha = tl.exp2(m - m_ref)
    l = l * alpha + tl.sum(p, axis=1)
    return p, alpha, l, m_new


# ---------------------------------------------------------------- decode

@lazy_jit(pdl=True)
def _decode_kernel(
    q_ptr, kc_ptr, vc_ptr, bt_ptr, cl_ptr, out_ptr, po_ptr, pm_ptr, pl_ptr,
    stride_qb, stride_qh, stride_ob, stride_oh,
    stride_cb, stride_cs, stride_ch, stride_bt,
    qk_scale, cap_log2, v_scale, window, GROUP, D, PART, NUM_SPLITS,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr, SPLIT: tl.constexpr, FP32: tl.constexpr,
    WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:  # programmatic dependent launch (llm_kernels.pdl): wait for the previous kernel here
        gdc_wait()
        gdc_launch_dependents()
    b = tl.program_id(0)
    hkv = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(cl_ptr + b)
    # this sequence's tokens per split: the grid is fixed by shapes (CUDA graphs),
    # the work follows the real range [lo, ctx), split from a BLOCK_N boundary at
    # or below lo; PART (from the table width and the window) bounds it
    if WINDOW:
        lo = tl.maximum(ctx - window, 0)
        base = lo // BLOCK_N * BLOCK_N
        part = tl.minimum(PART, tl.cdiv(tl.cdiv(ctx - base, NUM_SPLITS), BLOCK_N) * BLOCK_N)
        start = base + split * part
    else:
        part = tl.minimum(PART, tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), BLOCK_N) * BLOCK_N)
        start = split * part
    end = tl.minimum(start + part, ctx)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    gmask = g < GROUP
    dmask = d < D
    heads = hkv * GROUP + g
    q = tl.load(q_ptr + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + d[None, :],
                mask=gmask[:, None] & dmask[None, :], other=0.0)

    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nmask = n < end
        if WINDOW:  # keys below the window are neither read nor counted
            nmask = nmask & (n >= lo)
        row = _kv_rows(bt_row, n, nmask, hkv, stride_cb, stride_cs, stride_ch, BLOCK_SIZE)
        kvmask = nmask[:, None] & dmask[None, :]
        k = tl.load(kc_ptr + row[:, None] + d[None, :], mask=kvmask, other=0.0).to(q.dtype)
        v = tl.load(vc_ptr + row[:, None] + d[None, :], mask=kvmask, other=0.0).to(q.dtype)  # in flight with k
        qk = _dot(q, tl.trans(k), FP32)
        s = tl.where(nmask[None, :], _scores(qk, qk_scale, cap_log2, SOFTCAP), float("-inf"))
        p, alpha, l, m = _softmax_step(s, m, l, False)
        pv = _dot(p.to(v.dtype), v, FP32)
        acc = acc * alpha[:, None] + pv

    o = acc * (v_scale / tl.where(l > 0, l, 1.0))[:, None]
    omask = gmask[:, None] & dmask[None, :]
    if SPLIT:
        # partial result of this split: normalised output, running max (log2), sum
        prow = (b * (GROUP * tl.num_programs(1)) + heads).to(tl.int64) * NUM_SPLITS + split
        tl.store(po_ptr + prow[:, None] * D + d[None, :], o, mask=omask)
        tl.store(pm_ptr + prow, m, mask=gmask)
        tl.store(pl_ptr + prow, l, mask=gmask)
    else:
        tl.store(out_ptr + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=omask)


@lazy_jit(pdl=True)
def _decode_reduce_kernel(
    po_ptr, pm_ptr, pl_ptr, out_ptr, stride_ob, stride_oh, HQ, D, NUM_SPLITS,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:  # programmatic dependent launch (llm_kernels.pdl): wait for the previous kernel here
        gdc_wait()
        gdc_launch_dependents()
    b = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    smask = sp < NUM_SPLITS
    prow = (b * HQ + h).to(tl.int64) * NUM_SPLITS + sp
    m = tl.load(pm_ptr + prow, mask=smask, other=float("-inf"))
    l = tl.load(pl_ptr + prow, mask=smask, other=0.0)
    m_max = tl.max(m, axis=0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.exp2(m - m_max) * l
    o = tl.load(po_ptr + prow[:, None] * D + d[None, :], mask=smask[:, None] & (d[None, :] < D), other=0.0)
    total = tl.sum(w, axis=0)
    res = tl.sum(o * w[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + b.to(tl.int64) * stride_ob + h * stride_oh + d, res.to(out_ptr.dtype.element_ty), mask=d < D)


def _decode_block_n(device) -> int:
    return 64 if device.type == "cuda" else 16


def decode_partition(batch: int, num_kv_heads: int, max_blocks: int, block_size: int, device,
                     block_n: int | None = None, per_sm: int = 4, sliding_window: int | None = None) -> tuple:
    """(tokens per split, number of splits) for a launch: a function of shapes
    (and of the layer's window) only, never of context_lens values, so the grid
    is fixed for a CUDA graph. The batch counts as its next power of two, as the
    tuner's key does: a graph padded to a rung of its batch ladder then splits
    as the unpadded batch does."""
    block_n = block_n or _decode_block_n(device)
    max_ctx = max_blocks * block_size
    if sliding_window is not None:  # the span [lo, ctx) from lo's BLOCK_N boundary
        max_ctx = min(max_ctx, sliding_window + block_n - 1)
    min_part = 64 if device.type == "cuda" else 32
    want = -(-per_sm * sm_count(device) // (next_pow2(batch) * num_kv_heads))  # about per_sm programs per SM
    splits = max(1, min(want, -(-max_ctx // min_part)))
    part = -(-max_ctx // splits)
    part = -(-part // block_n) * block_n
    return part, -(-max_ctx // part)


# (BLOCK_N, warps, stages, programs per SM): the first is the interpreter's and
# the one used inside a graph capture before a shape was tuned
DECODE_CONFIGS = [(64, 4, 3, 4)] + [(n, w, st, ps) for n in (32, 64, 128) for w in (4, 8) for st in (2, 3)
                                    for ps in (2, 4, 8) if (n, w, st, ps) != (64, 4, 3, 4)]


def _paged_layout(q, k_cache, v_cache):
    """(q with unit stride along D, block size, KV heads), once the cache layout is checked."""
    _, block_size, HKV, _ = k_cache.shape
    assert q.shape[1] % HKV == 0 and k_cache.shape == v_cache.shape
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    assert block_size & (block_size - 1) == 0, "block size must be a power of two"
    return (q if q.stride(-1) == 1 else q.contiguous()), block_size, HKV


def _score_args(scale, softcap, k_scale, v_scale) -> tuple:
    """(qk_scale, cap_log2, v_scale) of the kernels: the cap and the cache's k_scale fold
    into the scores' scale, v_scale multiplies the normalised output."""
    scale = float(scale) * float(k_scale)
    if softcap is None:
        return scale * LOG2E, 0.0, float(v_scale)
    return scale / float(softcap), float(softcap) * LOG2E, float(v_scale)


def decode_triton(q, k_cache, v_cache, block_tables, context_lens, scale, config=None, *,
                  sliding_window=None, softcap=None, k_scale=1.0, v_scale=1.0):
    """The Triton decode; config: one of DECODE_CONFIGS to run (tests), None tunes per shape."""
    B, HQ, D = q.shape
    q, block_size, HKV = _paged_layout(q, k_cache, v_cache)
    group = HQ // HKV
    out = torch.empty(B, HQ, D, dtype=q.dtype, device=q.device)
    fp32 = q.dtype == torch.float32
    block_d = next_pow2(D)

    def launch(cfg):
        block_n, warps, stages, per_sm = cfg
        if not q.is_cuda:
            block_n = _decode_block_n(q.device)
        part, splits = decode_partition(B, HKV, block_tables.shape[1], block_size, q.device, block_n, per_sm,
                                        sliding_window)
        if splits > 1:
            po = torch.empty(B * HQ * splits, D, dtype=torch.float32, device=q.device)
            pm = torch.empty(B * HQ * splits, dtype=torch.float32, device=q.device)
            pl = torch.empty_like(pm)
        else:
            po = pm = pl = out
        _decode_kernel[(B, HKV, splits)](
            q, k_cache, v_cache, block_tables, context_lens, out, po, pm, pl,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
            *_score_args(scale, softcap, k_scale, v_scale), sliding_window or 0, group, D, part, splits,
            BLOCK_SIZE=block_size, BLOCK_N=block_n, BLOCK_G=max(16, next_pow2(group)),
            BLOCK_D=block_d, SPLIT=splits > 1, FP32=fp32, WINDOW=sliding_window is not None,
            SOFTCAP=softcap is not None, num_warps=warps, num_stages=stages,
        )
        if splits > 1:
            _decode_reduce_kernel[(B, HQ)](
                po, pm, pl, out, out.stride(0), out.stride(1), HQ, D, splits,
                BLOCK_S=next_pow2(splits), BLOCK_D=block_d, num_warps=4,
            )

    configs = DECODE_CONFIGS if q.is_cuda else DECODE_CONFIGS[:1]
    # the window changes the split (and how much each split reads); the cap adds math per score
    key = (next_pow2(B), HQ, HKV, D, block_tables.shape[1], block_size, q.dtype, k_cache.dtype,
           sliding_window, softcap is not None)
    launch(config or autotune("paged_decode", key, configs, launch))
    return out


# ---------------------------------------------------------------- prefill

@lazy_jit(pdl=True)
def _prefill_kernel(
    q_ptr, kc_ptr, vc_ptr, bt_ptr, qsl_ptr, cl_ptr, out_ptr,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cb, stride_cs, stride_ch, stride_bt,
    qk_scale, cap_log2, v_scale, window, GROUP, D, B,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, FP32: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    BLOCK_B: tl.constexpr, PDL: tl.constexpr = False,
):
    # flattened q-blocks: sequence b owns blocks Q_b = qsl[b] // BLOCK_M + b onwards,
    # cdiv(n_b, BLOCK_M) of them, all below Q_{b+1}; program p serves the largest b
    # (< B) with Q_b <= p, block p - Q_b of it (nothing when that is past n_b)
    if PDL:  # programmatic dependent launch (llm_kernels.pdl): wait for the previous kernel here
        gdc_wait()
        gdc_launch_dependents()
    p_id = tl.program_id(0)
    h = tl.program_id(1)
    hkv = h // GROUP
    idx = tl.arange(0, BLOCK_B)
    qs = tl.load(qsl_ptr + idx, mask=idx <= B, other=0)
    b = tl.sum(((qs // BLOCK_M + idx <= p_id) & (idx < B)).to(tl.int32), axis=0) - 1
    q_start = tl.load(qsl_ptr + b)
    tile = p_id - (q_start // BLOCK_M + b)
    n_new = tl.load(qsl_ptr + b + 1) - q_start
    ctx = tl.load(cl_ptr + b)
    prefix = ctx - n_new

    i = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    imask = i < n_new
    dmask = d < D
    qpos = prefix + i
    tok = (q_start + i).to(tl.int64)
    q = tl.load(q_ptr + tok[:, None] * stride_qt + h * stride_qh + d[None, :],
                mask=imask[:, None] & dmask[None, :], other=0.0)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # keys up to the tile's last query position (0 when the tile is past n_new)
    hi = tl.where(tile * BLOCK_M < n_new, tl.minimum(ctx, prefix + (tile + 1) * BLOCK_M), 0)
    # and from the first key the tile's first query sees (its BLOCK_N boundary)
    if WINDOW:
        lo = tl.maximum(prefix + tile * BLOCK_M - window + 1, 0)
        n_start = lo // BLOCK_N * BLOCK_N
    else:
        n_start = 0
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    for n0 in range(n_start, hi, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nmask = n < hi
        if WINDOW:  # keys below the tile's window are not read
            nmask = nmask & (n >= lo)
        row = _kv_rows(bt_row, n, nmask, hkv, stride_cb, stride_cs, stride_ch, BLOCK_SIZE)
        kvmask = nmask[:, None] & dmask[None, :]
        k = tl.load(kc_ptr + row[:, None] + d[None, :], mask=kvmask, other=0.0).to(q.dtype)
        qk = _dot(q, tl.trans(k), FP32)
        keep = nmask[None, :] & (n[None, :] <= qpos[:, None])
        if WINDOW:
            keep = keep & (n[None, :] > qpos[:, None] - window)
        s = tl.where(keep, _scores(qk, qk_scale, cap_log2, SOFTCAP), float("-inf"))
        p, alpha, l, m = _softmax_step(s, m, l, True)
        v = tl.load(vc_ptr + row[:, None] + d[None, :], mask=kvmask, other=0.0).to(q.dtype)
        pv = _dot(p.to(v.dtype), v, FP32)
        acc = acc * alpha[:, None] + pv

    o = acc * (v_scale / tl.where(l > 0, l, 1.0))[:, None]
    tl.store(out_ptr + tok[:, None] * stride_ot + h * stride_oh + d[None, :],
             o.to(out_ptr.dtype.element_ty), mask=imask[:, None] & dmask[None, :])


def prefill_triton(q, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale, *,
                   sliding_window=None, softcap=None, k_scale=1.0, v_scale=1.0):
    """The Triton prefill: a grid of (T // BLOCK_M + B, Hq) programs, shapes only (no host
    sync, fixed inside a CUDA graph). Sequences
    may be empty (padding) and q may hold rows past query_start_loc[B]: those stay unwritten."""
    T, HQ, D = q.shape
    q, block_size, HKV = _paged_layout(q, k_cache, v_cache)
    B = query_start_loc.shape[0] - 1
    out = torch.empty(T, HQ, D, dtype=q.dtype, device=q.device)
    if B == 0:
        return out
    fp32 = q.dtype == torch.float32
    if q.device.type == "cuda":
        block_m, block_n, warps, stages = (64, 32, 4, 2) if fp32 else (128, 64, 8, 3)
    else:
        block_m, block_n, warps, stages = 16, 16, 4, 1
    grid = (T // block_m + B, HQ)
    _prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, query_start_loc, context_lens, out,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        *_score_args(scale, softcap, k_scale, v_scale), sliding_window or 0, HQ // HKV, D, B,
        BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=next_pow2(D),
        FP32=fp32, WINDOW=sliding_window is not None, SOFTCAP=softcap is not None, BLOCK_B=next_pow2(B + 1),
        num_warps=warps, num_stages=stages,
    )
    return out

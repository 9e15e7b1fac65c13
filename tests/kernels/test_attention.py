"""Paged decode and prefill attention: Triton (interpreted) against the reference.

bfloat16 is left to the GPU tests: the interpreter's bf16 dot is not usable.
"""
import pytest
import torch
from tests.kernels.kernel_checks import assert_close

from llm_kernels.attention import (
    decode_partition,
    paged_decode_attention,
    paged_decode_attention_reference,
    paged_prefill_attention,
    paged_prefill_attention_reference,
)

DTYPES = [torch.float32, torch.float16]
# (query heads, kv heads): MHA, GQA groups 4, 7 (padded to 8), 8, and MQA
HEADS = [(4, 4), (8, 2), (7, 1), (16, 2), (6, 1)]


def _paged_cache(rng, batch, max_blocks, block_size, hkv, d, dtype):
    num_blocks = batch * max_blocks + 3
    k = torch.randn(num_blocks, block_size, hkv, d, generator=rng).to(dtype)
    v = torch.randn(num_blocks, block_size, hkv, d, generator=rng).to(dtype)
    tables = torch.randperm(num_blocks, generator=rng)[: batch * max_blocks].view(batch, max_blocks)
    return k, v, tables.to(torch.int32).contiguous()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", HEADS)
def test_decode_matches_reference(dtype, block_size, head_dim, heads, rng, poisoned):
    hq, hkv = heads
    batch = 3
    max_blocks = int(torch.randint(1, 96 // block_size + 2, (1,), generator=rng))
    k, v, tables = _paged_cache(rng, batch, max_blocks, block_size, hkv, head_dim, dtype)
    # ragged: most lengths do not fill their last block; one fills the table
    lens = torch.randint(1, max_blocks * block_size + 1, (batch,), generator=rng)
    lens[0] = max_blocks * block_size
    lens = lens.to(torch.int32)
    q = torch.randn(batch, hq, head_dim, generator=rng).to(dtype)
    scale = head_dim**-0.5
    ref = paged_decode_attention_reference(q, k, v, tables, lens, scale)
    with poisoned():
        out = paged_decode_attention(q, k, v, tables, lens, scale)
    assert_close(out, ref, dtype, rng.initial_seed(), f"decode lens={lens.tolist()}")


@pytest.mark.parametrize("max_blocks", [1, 4, 13])
def test_decode_split_kv_and_unused_splits(max_blocks, rng, poisoned):
    """Long tables split the context; short sequences leave splits empty."""
    block_size, hkv, hq, d = 8, 2, 8, 64
    batch = 4
    k, v, tables = _paged_cache(rng, batch, max_blocks, block_size, hkv, d, torch.float32)
    lens = torch.tensor([1, max_blocks * block_size, 5, max(1, max_blocks * block_size - 3)], dtype=torch.int32)
    q = torch.randn(batch, hq, d, generator=rng)
    part, splits = decode_partition(batch, hkv, max_blocks, block_size, q.device)
    assert part * splits >= max_blocks * block_size
    ref = paged_decode_attention_reference(q, k, v, tables, lens, 0.1)
    with poisoned():
        out = paged_decode_attention(q, k, v, tables, lens, 0.1)
    assert_close(out, ref, torch.float32, rng.initial_seed(), f"splits={splits}")


def test_decode_launch_shape_ignores_context_lens():
    cpu = torch.device("cpu")
    assert decode_partition(8, 4, 64, 16, cpu) == decode_partition(8, 4, 64, 16, cpu)
    # the partition is a function of shapes only: no context_lens argument at all
    import inspect

    assert "context_lens" not in inspect.signature(decode_partition).parameters


@pytest.mark.parametrize("batch,padded", [(3, 4), (5, 8), (9, 16), (17, 24), (33, 40)])
def test_decode_partition_same_for_graph_padding(batch, padded):
    """A CUDA graph runs a batch padded to its ladder's next rung: the split
    must not change, or graph and eager decode round P in other chunks."""
    cpu = torch.device("cpu")
    for hkv in (1, 2):
        assert decode_partition(batch, hkv, 64, 16, cpu) == decode_partition(padded, hkv, 64, 16, cpu)


def test_decode_strided_query_from_qkv(rng, poisoned):
    batch, hq, hkv, d, bs = 2, 4, 2, 64, 16
    k, v, tables = _paged_cache(rng, batch, 3, bs, hkv, d, torch.float32)
    qkv = torch.randn(batch, (hq + 2 * hkv) * d, generator=rng)
    q = qkv[:, : hq * d].view(batch, hq, d)
    lens = torch.tensor([17, 40], dtype=torch.int32)
    ref = paged_decode_attention_reference(q, k, v, tables, lens, 0.125)
    with poisoned():
        out = paged_decode_attention(q, k, v, tables, lens, 0.125)
    assert_close(out, ref, torch.float32, rng.initial_seed(), "strided q")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", [(4, 4), (7, 1), (8, 2)])
def test_prefill_matches_reference(dtype, block_size, head_dim, heads, rng, poisoned):
    hq, hkv = heads
    # (new tokens, cached prefix): fresh prompt, prefix hit, chunk, single token, empty
    seqs = [(19, 0), (5, 13), (21, 7), (1, 30), (0, 9)]
    batch = len(seqs)
    lens = torch.tensor([n + p for n, p in seqs], dtype=torch.int32)
    max_blocks = int((lens.max() + block_size - 1) // block_size)
    k, v, tables = _paged_cache(rng, batch, max_blocks, block_size, hkv, head_dim, dtype)
    n_new = torch.tensor([n for n, _ in seqs])
    qsl = torch.zeros(batch + 1, dtype=torch.int32)
    qsl[1:] = n_new.cumsum(0)
    q = torch.randn(int(n_new.sum()), hq, head_dim, generator=rng).to(dtype)
    scale = head_dim**-0.5
    ref = paged_prefill_attention_reference(q, k, v, tables, qsl, lens, scale)
    with poisoned():
        out = paged_prefill_attention(q, k, v, tables, qsl, lens, scale)
    assert_close(out, ref, dtype, rng.initial_seed(), "prefill")


# ---------------------------------------------------------------- sliding window and soft-capping

# (new tokens, cached prefix): fresh prompts shorter and longer than the windows, a
# chunk after a prefix longer than every window, single tokens deep in the context, empty
WINDOW_SEQS = [(19, 0), (6, 40), (21, 7), (1, 70), (0, 9), (12, 37)]


def _prefill_inputs(rng, seqs, block_size, hq, hkv, d, dtype):
    """q, k_cache, v_cache, block_tables, query_start_loc, context_lens for (new, prefix) pairs."""
    lens = torch.tensor([n + p for n, p in seqs], dtype=torch.int32)
    max_blocks = int((lens.max() + block_size - 1) // block_size)
    k, v, tables = _paged_cache(rng, len(seqs), max_blocks, block_size, hkv, d, dtype)
    n_new = torch.tensor([n for n, _ in seqs])
    qsl = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    qsl[1:] = n_new.cumsum(0)
    q = torch.randn(int(n_new.sum()), hq, d, generator=rng).to(dtype)
    return q, k, v, tables, qsl, lens


def _dense(q, k, v, qpos, scale, window, softcap):
    """Brute force for one sequence in float64: q [n, Hq, D] at positions qpos, contiguous
    k/v [L, Hkv, D]; the mask spelled out pair by pair (HF: i - W < j <= i)."""
    group = q.shape[1] // k.shape[1]
    kk, vv = (x.double().repeat_interleave(group, dim=1) for x in (k, v))
    scores = torch.einsum("nhd,lhd->hnl", q.double(), kk) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    keep = torch.tensor([[j <= i and (window is None or j > i - window) for j in range(k.shape[0])]
                         for i in qpos.tolist()], dtype=torch.bool)
    probs = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
    return torch.einsum("hnl,lhd->nhd", probs, vv)


def _contiguous(cache, table, length):
    return cache[table.long()].reshape(-1, *cache.shape[2:])[:length]


@pytest.mark.parametrize("softcap", [None, 5.0])
@pytest.mark.parametrize("window", [1, 5, 16, 33])
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_reference_window_and_softcap_match_dense(block_size, window, softcap, rng):
    """Windows inside one block, across block boundaries and longer than some
    contexts; prefill chunks after a prefix longer than the window; decode too."""
    hq, hkv, d, scale = 6, 2, 32, 0.5  # scores of a few units: the cap of 5 bends them
    q, k, v, tables, qsl, lens = _prefill_inputs(rng, WINDOW_SEQS, block_size, hq, hkv, d, torch.float32)
    out = paged_prefill_attention_reference(q, k, v, tables, qsl, lens, scale,
                                            sliding_window=window, softcap=softcap)
    for b, (n, prefix) in enumerate(WINDOW_SEQS):
        s, length = int(qsl[b]), prefix + n
        if n == 0:
            continue
        want = _dense(q[s:s + n], _contiguous(k, tables[b], length), _contiguous(v, tables[b], length),
                      torch.arange(prefix, length), scale, window, softcap)
        assert_close(out[s:s + n], want, torch.float32, rng.initial_seed(), f"prefill seq {b}")
    # decode: the last token of each context, lengths below, at and past the window
    dq = torch.randn(len(WINDOW_SEQS), hq, d, generator=rng)
    out = paged_decode_attention_reference(dq, k, v, tables, lens.clamp_min(1), scale,
                                           sliding_window=window, softcap=softcap)
    for b, length in enumerate(lens.clamp_min(1).tolist()):
        want = _dense(dq[b:b + 1], _contiguous(k, tables[b], length), _contiguous(v, tables[b], length),
                      torch.tensor([length - 1]), scale, window, softcap)
        assert_close(out[b:b + 1], want, torch.float32, rng.initial_seed(), f"decode seq {b} len {length}")


# (window, softcap, block size, (query heads, kv heads))
TRITON_CASES = [(5, None, 8, (8, 2)), (33, None, 16, (7, 1)), (None, 5.0, 16, (8, 2)), (16, 5.0, 32, (4, 4))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window,softcap,block_size,heads", TRITON_CASES)
def test_decode_window_softcap_matches_reference(dtype, window, softcap, block_size, heads, rng, poisoned):
    hq, hkv = heads
    d, batch, max_blocks = 64, 4, 128 // block_size
    k, v, tables = _paged_cache(rng, batch, max_blocks, block_size, hkv, d, dtype)
    lens = torch.tensor([max_blocks * block_size, 3, 70, 37], dtype=torch.int32)
    q = torch.randn(batch, hq, d, generator=rng).to(dtype)
    ref = paged_decode_attention_reference(q, k, v, tables, lens, 0.3, sliding_window=window, softcap=softcap)
    with poisoned():
        out = paged_decode_attention(q, k, v, tables, lens, 0.3, sliding_window=window, softcap=softcap)
    assert_close(out, ref, dtype, rng.initial_seed(), f"decode W={window} cap={softcap}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window,softcap,block_size,heads", TRITON_CASES)
def test_prefill_window_softcap_matches_reference(dtype, window, softcap, block_size, heads, rng, poisoned):
    hq, hkv = heads
    q, k, v, tables, qsl, lens = _prefill_inputs(rng, WINDOW_SEQS, block_size, hq, hkv, 64, dtype)
    ref = paged_prefill_attention_reference(q, k, v, tables, qsl, lens, 0.3, sliding_window=window, softcap=softcap)
    with poisoned():
        out = paged_prefill_attention(q, k, v, tables, qsl, lens, 0.3, sliding_window=window, softcap=softcap)
    assert_close(out, ref, dtype, rng.initial_seed(), f"prefill W={window} cap={softcap}")


def test_prefill_mixed_decode_rows_and_long_prompt(rng, poisoned):
    """Many one-token sequences (decode rows, deep in their contexts) and one long
    prompt after a cached prefix, in one flattened launch; the prompt straddles
    q-block boundaries at an offset that is not a multiple of BLOCK_M."""
    block_size, hq, hkv, d = 8, 4, 2, 32
    seqs = [(1, 5 + 3 * i) for i in range(11)] + [(45, 21)] + [(1, 2), (1, 40)]
    q, k, v, tables, qsl, lens = _prefill_inputs(rng, seqs, block_size, hq, hkv, d, torch.float32)
    ref = paged_prefill_attention_reference(q, k, v, tables, qsl, lens, 0.2)
    with poisoned():
        out = paged_prefill_attention(q, k, v, tables, qsl, lens, 0.2)
    assert_close(out, ref, torch.float32, rng.initial_seed(), "mixed prefill + decode")


@pytest.mark.parametrize("window", [None, 6])
def test_prefill_padding_sequences_and_rows(window, rng, poisoned):
    """A batch padded as a CUDA graph pads it: empty sequences after the real ones
    (query_start_loc repeated, context 0) and q rows past query_start_loc[B]. The
    real rows equal the reference on the unpadded inputs; padding rows are ignored."""
    block_size, hq, hkv, d = 8, 4, 2, 32
    seqs = [(1, 9), (18, 0), (0, 4), (7, 12), (1, 30)]
    q, k, v, tables, qsl, lens = _prefill_inputs(rng, seqs, block_size, hq, hkv, d, torch.float32)
    ref = paged_prefill_attention_reference(q, k, v, tables, qsl, lens, 0.2, sliding_window=window)
    extra_seqs, extra_rows = 37, 21  # B + 1 = 43: BLOCK_B 64, padding programs past every real block
    t = q.shape[0]
    qp = torch.cat([q, torch.randn(extra_rows, hq, d, generator=rng)])
    qslp = torch.cat([qsl, qsl[-1:].repeat(extra_seqs)])
    lensp = torch.cat([lens, torch.zeros(extra_seqs, dtype=torch.int32)])
    tablesp = torch.cat([tables, torch.zeros(extra_seqs, tables.shape[1], dtype=torch.int32)])
    with poisoned():
        out = paged_prefill_attention(qp, k, v, tablesp, qslp, lensp, 0.2, sliding_window=window)
    assert out.shape == qp.shape
    assert_close(out[:t], ref, torch.float32, rng.initial_seed(), f"padded prefill W={window}")


def _poison_unseen_blocks(k, v, tables, first_seen, lens):
    """NaN in every cache block holding no key that some query sees (keys
    [first_seen[b], lens[b]) of sequence b): blocks before the windows, past the
    contexts and in no table. Returns the poisoned copies."""
    block_size = k.shape[1]
    seen = set()
    for b, (lo, length) in enumerate(zip(first_seen, lens.tolist())):
        seen.update(tables[b, lo // block_size: -(-length // block_size)].tolist())
    unseen = torch.tensor(sorted(set(range(k.shape[0])) - seen), dtype=torch.long)
    assert len(unseen) > len(tables), "the case should leave many blocks unseen"
    k, v = k.clone(), v.clone()
    k[unseen] = float("nan")
    v[unseen] = float("nan")
    return k, v


@pytest.mark.parametrize("window,block_size", [(5, 8), (16, 16), (13, 8)])
def test_blocks_outside_every_window_are_not_read(window, block_size, rng):
    """Kernels and references start at the window: NaN before it changes nothing."""
    hq, hkv, d = 4, 2, 32
    q, k, v, tables, qsl, lens = _prefill_inputs(rng, WINDOW_SEQS, block_size, hq, hkv, d, torch.float32)
    n_new = (qsl[1:] - qsl[:-1]).tolist()
    first = [max(0, int(length) - n - window + 1) for n, length in zip(n_new, lens)]
    kn, vn = _poison_unseen_blocks(k, v, tables, first, lens)
    args = (tables, qsl, lens, 0.2)
    clean = paged_prefill_attention_reference(q, k, v, *args, sliding_window=window)
    for fn in (paged_prefill_attention, paged_prefill_attention_reference):
        out = fn(q, kn, vn, *args, sliding_window=window)
        assert_close(out, clean, torch.float32, rng.initial_seed(), f"prefill {fn.__name__}")

    dlens = lens.clamp_min(1)
    dq = torch.randn(len(WINDOW_SEQS), hq, d, generator=rng)
    kn, vn = _poison_unseen_blocks(k, v, tables, [max(0, int(n) - window) for n in dlens], dlens)
    clean = paged_decode_attention_reference(dq, k, v, tables, dlens, 0.2, sliding_window=window)
    for fn in (paged_decode_attention, paged_decode_attention_reference):
        out = fn(dq, kn, vn, tables, dlens, 0.2, sliding_window=window)
        assert_close(out, clean, torch.float32, rng.initial_seed(), f"decode {fn.__name__}")


def test_decode_partition_follows_the_window():
    """A window bounds the span a sequence's splits cover, whatever the table width."""
    cpu = torch.device("cpu")
    for window in (1, 5, 33, 4096):
        part, splits = decode_partition(2, 2, 64, 16, cpu, sliding_window=window)
        assert part * splits >= min(64 * 16, window + 16 - 1)
        assert splits <= decode_partition(2, 2, 64, 16, cpu)[1]


@pytest.mark.parametrize("bad", [dict(sliding_window=0), dict(sliding_window=2.5), dict(softcap=0.0),
                                 dict(softcap=-1.0)])
def test_bad_window_or_softcap_is_refused(bad):
    q = torch.zeros(1, 2, 8)
    k = torch.zeros(2, 8, 1, 8)
    with pytest.raises(ValueError):
        paged_decode_attention(q, k, k, torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32),
                               1.0, **bad)

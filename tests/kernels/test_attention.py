"""Paged decode and prefill attention: Triton (interpreted) against the reference.

bfloat16 is left to the GPU tests: the interpreter's bf16 dot is not usable.
"""
import pytest
import torch
from tests.kernels.kernel_checks import assert_close

from kernels.attention import (
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

"""The CPU path of paged attention (llm_kernels/attention_cpu.py) against the references
(llm_kernels/attention_reference.py): decode and prefill, GQA/MQA, ragged lengths, windows,
FP8-style scales, soft-capping (handed to the reference), and NaN in every cache slot no
query may see (the tail of a last block, blocks before a window, table entries past a
context pointing anywhere) changes nothing. The public calls take this path on CPU tensors
outside the interpreter."""
import pytest
import torch
from tests.kernels.kernel_checks import assert_close

from llm_kernels import attention
from llm_kernels.attention_cpu import paged_decode_attention_cpu, paged_prefill_attention_cpu
from llm_kernels.attention_reference import paged_decode_attention_reference, paged_prefill_attention_reference

HEADS = [(4, 4), (8, 2), (9, 3), (6, 1)]


def _cache(rng, num_blocks, block_size, hkv, d, dtype):
    k = torch.randn(num_blocks, block_size, hkv, d, generator=rng).to(dtype)
    v = torch.randn(num_blocks, block_size, hkv, d, generator=rng).to(dtype)
    return k, v


def _poison_hidden(k, v, tables, lens, first_seen):
    """Copies of k, v with NaN in every slot outside [first_seen[b], lens[b]) of each sequence's
    table (and in every block of no table); the table's entries past a context point at a NaN block."""
    block_size = k.shape[1]
    kn, vn = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
    tables = tables.clone()
    spare = k.shape[0] - 1  # in no table: all NaN
    for b, (lo, length) in enumerate(zip(first_seen, lens.tolist())):
        for pos in range(lo, length):
            blk, off = int(tables[b, pos // block_size]), pos % block_size
            kn[blk, off], vn[blk, off] = k[blk, off], v[blk, off]
        tables[b, -(-length // block_size):] = spare
    return kn, vn, tables


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("block_size,window", [(16, None), (8, None), (16, 20), (8, 5)])
def test_decode_matches_reference_and_ignores_hidden_slots(rng, dtype, heads, block_size, window):
    hq, hkv = heads
    batch, width, d = 5, 9, 32
    k, v = _cache(rng, batch * width + 1, block_size, hkv, d, dtype)
    tables = torch.randperm(batch * width, generator=rng).view(batch, width).to(torch.int32)
    lens = torch.randint(1, width * block_size + 1, (batch,), generator=rng).to(torch.int32)
    lens[0] = width * block_size  # one fills its table
    q = torch.randn(batch, hq, d, generator=rng).to(dtype)
    ref = paged_decode_attention_reference(q, k, v, tables, lens, 0.2, sliding_window=window)
    out = paged_decode_attention_cpu(q, k, v, tables, lens, 0.2, sliding_window=window)
    assert out.dtype == dtype and out.shape == q.shape
    assert_close(out, ref, dtype, rng.initial_seed(), f"decode lens={lens.tolist()}")
    first = [0 if window is None else max(0, n - window) for n in lens.tolist()]
    kn, vn, tn = _poison_hidden(k, v, tables, lens, first)
    poisoned = paged_decode_attention_cpu(q, kn, vn, tn, lens, 0.2, sliding_window=window)
    assert torch.equal(poisoned, out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("block_size,window", [(16, None), (8, None), (8, 6), (16, 30)])
def test_prefill_matches_reference_and_ignores_hidden_slots(rng, dtype, heads, block_size, window):
    """(new tokens, cached prefix) per sequence, one with no new token."""
    hq, hkv = heads
    seqs = [(19, 0), (6, 40), (1, 70), (0, 9), (12, 37)]
    d = 32
    lens = torch.tensor([n + p for n, p in seqs], dtype=torch.int32)
    width = int(-(-lens.max() // block_size))
    k, v = _cache(rng, len(seqs) * width + 1, block_size, hkv, d, dtype)
    tables = torch.randperm(len(seqs) * width, generator=rng).view(len(seqs), width).to(torch.int32)
    qsl = torch.tensor([0] + [n for n, _ in seqs]).cumsum(0).to(torch.int32)
    q = torch.randn(int(qsl[-1]), hq, d, generator=rng).to(dtype)
    ref = paged_prefill_attention_reference(q, k, v, tables, qsl, lens, 0.2, sliding_window=window)
    out = paged_prefill_attention_cpu(q, k, v, tables, qsl, lens, 0.2, sliding_window=window)
    assert out.dtype == dtype
    assert_close(out, ref, dtype, rng.initial_seed(), f"prefill W={window}")
    first = [0 if window is None else max(0, n + p - n - window + 1) for n, p in seqs]
    kn, vn, tn = _poison_hidden(k, v, tables, lens, first)
    assert torch.equal(paged_prefill_attention_cpu(q, kn, vn, tn, qsl, lens, 0.2, sliding_window=window), out)


def test_bfloat16_models_attend_without_a_float32_copy(rng, monkeypatch):
    """A bfloat16 cache of a bfloat16 model reaches SDPA in bfloat16, head-major and contiguous;
    float32 models, and bfloat16 ones over a scaled (FP8-style) cache, in float32."""
    import llm_kernels.attention_cpu as cpu

    seen = []
    real = cpu.F.scaled_dot_product_attention
    monkeypatch.setattr(cpu.F, "scaled_dot_product_attention",
                        lambda q, k, v, **kw: seen.append((k.dtype, k.is_contiguous(), v.is_contiguous())) or real(q, k, v, **kw))
    tables = torch.arange(12, dtype=torch.int32).view(3, 4)
    lens = torch.tensor([30, 3, 17], dtype=torch.int32)
    qsl = torch.tensor([0, 5, 6, 10], dtype=torch.int32)
    for dtype, opts, want in ((torch.bfloat16, {}, torch.bfloat16), (torch.float32, {}, torch.float32),
                              (torch.bfloat16, dict(k_scale=0.5), torch.float32)):
        k, v = _cache(rng, 12, 8, 2, 16, dtype)
        seen.clear()
        paged_decode_attention_cpu(torch.randn(3, 4, 16, generator=rng).to(dtype), k, v, tables, lens, 0.3, **opts)
        paged_prefill_attention_cpu(torch.randn(10, 4, 16, generator=rng).to(dtype), k, v, tables, qsl, lens, 0.3,
                                    **opts)
        assert seen and all(s == (want, True, True) for s in seen), (dtype, opts, seen)


def test_fp8_scales_and_softcap(rng):
    """Scaled caches read as K * k_scale, V * v_scale; a soft cap takes the reference (same numbers)."""
    k, v = _cache(rng, 12, 8, 2, 16, torch.float32)
    tables = torch.arange(12, dtype=torch.int32).view(3, 4)
    lens = torch.tensor([30, 3, 17], dtype=torch.int32)
    q = torch.randn(3, 4, 16, generator=rng)
    for opts in (dict(k_scale=0.5, v_scale=2.0), dict(softcap=3.0), dict(softcap=3.0, sliding_window=7)):
        ref = paged_decode_attention_reference(q, k, v, tables, lens, 0.3, **opts)
        assert_close(paged_decode_attention_cpu(q, k, v, tables, lens, 0.3, **opts), ref, torch.float32,
                     rng.initial_seed(), f"decode {opts}")
        qsl = torch.tensor([0, 5, 6, 10], dtype=torch.int32)
        qp = torch.randn(10, 4, 16, generator=rng)
        ref = paged_prefill_attention_reference(qp, k, v, tables, qsl, lens, 0.3, **opts)
        assert_close(paged_prefill_attention_cpu(qp, k, v, tables, qsl, lens, 0.3, **opts), ref, torch.float32,
                     rng.initial_seed(), f"prefill {opts}")


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_caches(rng, fp8):
    """An FP8 cache (llm_kernels/kv_cache.py) with per-tensor scales, decode and prefill."""
    k, v = (t.to(fp8) for t in _cache(rng, 12, 8, 2, 16, torch.float32))
    tables = torch.arange(12, dtype=torch.int32).view(3, 4)
    lens = torch.tensor([30, 3, 17], dtype=torch.int32)
    q = torch.randn(3, 4, 16, generator=rng).to(torch.bfloat16)
    opts = dict(k_scale=0.5, v_scale=2.0)
    ref = paged_decode_attention_reference(q, k, v, tables, lens, 0.3, **opts)
    assert_close(paged_decode_attention_cpu(q, k, v, tables, lens, 0.3, **opts).float(), ref.float(), torch.bfloat16,
                 rng.initial_seed(), "decode fp8")
    qsl = torch.tensor([0, 5, 6, 10], dtype=torch.int32)
    qp = torch.randn(10, 4, 16, generator=rng).to(torch.bfloat16)
    ref = paged_prefill_attention_reference(qp, k, v, tables, qsl, lens, 0.3, **opts)
    assert_close(paged_prefill_attention_cpu(qp, k, v, tables, qsl, lens, 0.3, **opts).float(), ref.float(),
                 torch.bfloat16, rng.initial_seed(), "prefill fp8")


def test_public_calls_take_it_outside_the_interpreter(rng, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    calls = []
    real = attention.paged_decode_attention_cpu
    monkeypatch.setattr(attention, "paged_decode_attention_cpu", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    k, v = _cache(rng, 4, 8, 1, 16, torch.float32)
    out = attention.paged_decode_attention(torch.randn(2, 2, 16, generator=rng), k, v,
                                           torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
                                           torch.tensor([9, 16], dtype=torch.int32), 0.25)
    assert calls == [1] and out.shape == (2, 2, 16)
    assert paged_decode_attention_cpu(torch.zeros(0, 2, 16), k, v, torch.zeros(0, 2, dtype=torch.int32),
                                      torch.zeros(0, dtype=torch.int32), 0.25).shape == (0, 2, 16)

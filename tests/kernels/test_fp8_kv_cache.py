"""An FP8 KV cache (llm_kernels/kv_cache.py, llm_kernels/attention.py): K / k_scale and V / v_scale
stored as e4m3 or e5m2, saturated, and read back times the scales. Triton (interpreted)
against the references, and the references against attention over the dequantized cache."""
import pytest
import torch
from tests.kernels.kernel_checks import assert_close

from llm_kernels.attention import (
    paged_decode_attention,
    paged_decode_attention_reference,
    paged_prefill_attention,
    paged_prefill_attention_reference,
)
from llm_kernels.kv_cache import write_kv_cache, write_kv_cache_reference

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.mark.parametrize("cache_dtype", FP8)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_write_stores_scaled_saturated_values(cache_dtype, dtype, rng):
    T, H, D, bs = 9, 2, 64, 8
    key = (torch.randn(T, H, D, generator=rng) * 3).to(dtype)
    value = (torch.randn(T, H, D, generator=rng) * 3).to(dtype)
    key[0, 0, :4] = torch.tensor([1e4, -1e4, 0.0, 2.0])  # past e4m3's 448 once scaled: saturate, not inf/NaN
    slots = torch.tensor([3, 0, -1, 12, 17, 8, 30, 31, 1])
    k_scale, v_scale = 0.05, 0.5
    shape = (4, bs, H, D)
    kc, vc = torch.zeros(shape, dtype=cache_dtype), torch.zeros(shape, dtype=cache_dtype)
    kr, vr = kc.clone(), vc.clone()
    write_kv_cache_reference(key, value, kr, vr, slots, k_scale, v_scale)
    write_kv_cache(key, value, kc, vc, slots, k_scale, v_scale)
    top = torch.finfo(cache_dtype).max
    flat_k = kr.view(-1, H, D).float()
    valid = slots >= 0
    expect = (key[valid].float() / k_scale).clamp(-top, top)
    assert torch.isfinite(flat_k).all()
    assert flat_k[slots[valid]][0, 0, 0] == top and flat_k[slots[valid]][0, 0, 1] == -top
    # one FP8 rounding of the scaled value (relative 2^-4 for e4m3, 2^-3 for e5m2)
    rel = 2.0 ** (-4 if cache_dtype == torch.float8_e4m3fn else -3)
    assert ((flat_k[slots[valid]] - expect).abs() <= rel * expect.abs() + 1e-3).all()
    untouched = torch.ones(flat_k.shape[0], dtype=torch.bool)
    untouched[slots[valid]] = False
    assert (flat_k[untouched] == 0).all()
    # the kernel writes what the reference writes (the GPU test asserts the same bytes)
    exact = {}
    for name, x, scale in (("k", key, k_scale), ("v", value, v_scale)):
        exact[name] = torch.zeros(shape)
        write_kv_cache_reference((x.float() * (1 / scale)).clamp(-top, top), x, exact[name], torch.zeros(shape), slots)
    assert_interpreted_fp8_equal(kc, kr, exact["k"])
    assert_interpreted_fp8_equal(vc, vr, exact["v"])


def assert_interpreted_fp8_equal(got, want, exact):
    """Equal FP8 values but where the Triton interpreter's cast from float32 (a numpy
    emulation; the GPU's conversion is exact) differs from torch's: it drops the carry when
    rounding up crosses a power of two (31.8 -> 16, not 32: half the reference's value), and
    rounds an exact tie away from zero where torch rounds it to even (either neighbour), and
    rounds subnormals its own way (within one subnormal step)."""
    g, w, x = got.float(), want.float(), exact
    info = torch.finfo(got.dtype)
    power_of_two = (w != 0) & (torch.frexp(w.abs())[0] == 0.5)
    dropped_carry = power_of_two & (g == w / 2)
    tie = ((g - x).abs() == (w - x).abs()) & ((g - w).abs() <= w.abs() * 2.0**-2)
    step = info.smallest_normal * 2.0 ** -(3 if got.dtype == torch.float8_e4m3fn else 2)  # mantissa bits
    subnormal = (w.abs() <= info.smallest_normal) & ((g - w).abs() <= step)
    ok = (g == w) | dropped_carry | tie | subnormal
    assert ok.all(), torch.stack([x[~ok], g[~ok], w[~ok]], 1)[:8]
    assert (g == w).float().mean() > 0.9  # the exceptions stay exceptions


def _fp8_cache(rng, num_blocks, bs, hkv, d, cache_dtype, k_scale, v_scale):
    """Random FP8 caches and their exact dequantized float32 copies."""
    k = (torch.randn(num_blocks, bs, hkv, d, generator=rng) / k_scale).to(cache_dtype)
    v = (torch.randn(num_blocks, bs, hkv, d, generator=rng) / v_scale).to(cache_dtype)
    return k, v, k.float() * k_scale, v.float() * v_scale


@pytest.mark.parametrize("cache_dtype", FP8)
@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("window,softcap", [(None, None), (13, None), (None, 5.0)])
def test_decode_reads_fp8_times_scales(cache_dtype, block_size, window, softcap, rng, poisoned):
    batch, hq, hkv, d, max_blocks = 3, 8, 2, 64, 5
    k_scale, v_scale = 0.02, 0.3
    num_blocks = batch * max_blocks + 1
    k, v, kf, vf = _fp8_cache(rng, num_blocks, block_size, hkv, d, cache_dtype, k_scale, v_scale)
    tables = torch.randperm(num_blocks, generator=rng)[: batch * max_blocks].view(batch, max_blocks).int()
    lens = torch.tensor([max_blocks * block_size, 7, 2 * block_size + 3], dtype=torch.int32)
    q = torch.randn(batch, hq, d, generator=rng)
    opts = dict(sliding_window=window, softcap=softcap)
    dense = paged_decode_attention_reference(q, kf, vf, tables, lens, d**-0.5, **opts)
    ref = paged_decode_attention_reference(q, k, v, tables, lens, d**-0.5, k_scale=k_scale, v_scale=v_scale, **opts)
    torch.testing.assert_close(ref, dense, rtol=1e-5, atol=1e-5)
    with poisoned():
        out = paged_decode_attention(q, k, v, tables, lens, d**-0.5, k_scale=k_scale, v_scale=v_scale, **opts)
    assert_close(out, ref, torch.float32, rng.initial_seed(), "fp8 decode")


@pytest.mark.parametrize("cache_dtype", FP8)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_prefill_reads_fp8_times_scales(cache_dtype, dtype, rng, poisoned):
    hq, hkv, d, bs = 4, 2, 64, 8
    seqs = [(19, 0), (5, 13), (1, 30)]
    k_scale, v_scale = 0.5, 0.04
    lens = torch.tensor([n + p for n, p in seqs], dtype=torch.int32)
    max_blocks = int((lens.max() + bs - 1) // bs)
    num_blocks = len(seqs) * max_blocks + 2
    k, v, kf, vf = _fp8_cache(rng, num_blocks, bs, hkv, d, cache_dtype, k_scale, v_scale)
    tables = torch.randperm(num_blocks, generator=rng)[: len(seqs) * max_blocks].view(len(seqs), max_blocks).int()
    qsl = torch.tensor([0, 19, 24, 25], dtype=torch.int32)
    q = torch.randn(25, hq, d, generator=rng).to(dtype)
    dense = paged_prefill_attention_reference(q, kf, vf, tables, qsl, lens, d**-0.5)
    ref = paged_prefill_attention_reference(q, k, v, tables, qsl, lens, d**-0.5, k_scale=k_scale, v_scale=v_scale)
    torch.testing.assert_close(ref, dense, rtol=1e-5, atol=1e-5)
    with poisoned():
        out = paged_prefill_attention(q, k, v, tables, qsl, lens, d**-0.5, k_scale=k_scale, v_scale=v_scale)
    assert_close(out, ref, dtype, rng.initial_seed(), "fp8 prefill")

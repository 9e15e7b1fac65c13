"""KV-cache write: Triton (interpreted) writes exactly the mapped slots, skips -1."""
import pytest
import torch

from llm_kernels.kv_cache import write_kv_cache, write_kv_cache_reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("heads,head_dim", [(1, 64), (4, 128), (3, 64)])
def test_write_kv_cache_matches_reference(dtype, block_size, heads, head_dim, rng):
    num_blocks, T = 6, 13
    key = torch.randn(T, heads, head_dim, generator=rng).to(dtype)
    value = torch.randn(T, heads, head_dim, generator=rng).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=rng)[:T]
    slots[torch.randperm(T, generator=rng)[:3]] = -1  # padding tokens
    shape = (num_blocks, block_size, heads, head_dim)
    kc, vc = torch.full(shape, float("nan"), dtype=dtype), torch.full(shape, float("nan"), dtype=dtype)
    kr, vr = kc.clone(), vc.clone()
    write_kv_cache_reference(key, value, kr, vr, slots)
    write_kv_cache(key, value, kc, vc, slots)
    # NaN stays NaN exactly where the reference left it: no stray writes
    assert torch.equal(kc.isnan(), kr.isnan()) and torch.equal(vc.isnan(), vr.isnan())
    assert torch.equal(kc.nan_to_num(0), kr.nan_to_num(0))
    assert torch.equal(vc.nan_to_num(0), vr.nan_to_num(0))


def test_write_kv_cache_strided_key_from_qkv(rng):
    T, H, D = 6, 2, 64
    qkv = torch.randn(T, 3 * H * D, generator=rng)
    key = qkv[:, H * D : 2 * H * D].view(T, H, D)
    value = qkv[:, 2 * H * D :].view(T, H, D)
    slots = torch.tensor([5, 0, -1, 31, 17, 8], dtype=torch.int32)
    kc, vc = torch.zeros(2, 16, H, D), torch.zeros(2, 16, H, D)
    kr, vr = kc.clone(), vc.clone()
    write_kv_cache_reference(key, value, kr, vr, slots)
    write_kv_cache(key, value, kc, vc, slots)
    assert torch.equal(kc, kr) and torch.equal(vc, vr)
